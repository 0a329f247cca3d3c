"""The PTB step of CIDEr in Python, for machines without Java (the `cider-pyptb` rule): the tokens that
pycocoevalcap's `PTBTokenizer` (the Stanford CoreNLP 3.4.1 jar, options -preserveLines -lowerCase) gives one
caption, lower-cased, without the punctuation tokens pycocoevalcap removes.

Written from the jar's behaviour, measured character by character and on hard cases (tests/test_suite_ptb.py
runs the jar beside it; docs/suite.md lists what still differs). Every character of a caption is
- a word character: letters, combining marks, decimal digits (and a few spacing modifiers and signs the jar
  counts as letters);
- a symbol that stands alone as a token ("%", "&", "。", "、", "，", "،", "।", "¿", "€" -> "$", ...);
- whitespace; or
- one the jar deletes ("untokenizable"): emoji and everything else outside the Basic Multilingual Plane, format
  characters such as the zero-width (non-)joiners, CJK corner and angle brackets 「」『』【】《》〈〉, the wave dash 〜,
  and other symbols its tables do not list. A deleted character ends a token like a space.
Tokens are read as a lexer reads them: at each position the longest of the forms below that matches wins (the
first one listed of equally long ones); some forms match more than they take (a clitic after a word, a digit
after "no."), as a lexer's trailing context does.
"""
from __future__ import annotations

import re
import unicodedata

# pycocoevalcap removes these tokens (its list also has -LRB- -RRB- -LCB- -RCB-, upper case, which the jar's
# lower-cased -lrb- ... never equal: brackets stay as tokens)
PUNCTUATION = frozenset({"''", "'", "``", "`", ".", "?", "!", ",", ":", "-", "--", "...", ";"})
APOS = "'\u2019\x92"
APOS_ETC = APOS + "`\u2018\u201b\x91"
HYPHEN = "-_\u058a\u2010\u2011"
VOWELS = "aeiouyAEIOUY"
UPPER = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"
# single characters the jar writes otherwise ("": deleted where no number holds it)
REWRITE = {"(": "-lrb-", ")": "-rrb-", "[": "-lsb-", "]": "-rsb-", "{": "-lcb-", "}": "-rcb-", "\u00a2": "cents",
           "\u00a3": "#", "\u00a4": "$", "\u20ac": "$", "\u20a0": "$", "\x80": "$", "\u00bc": "1/4", "\u00bd": "1/2",
           "\u00be": "3/4", "\u2153": "1/3", "\u2154": "2/3", "\u2013": "--", "\u2014": "--", "\u2015": "--",
           "\x96": "--", "\x97": "--", "\u2026": "...", "\u066b": "", "\u066c": ""}
# quotation marks, as the jar writes them (one or two in a row make one token)
QUOTES = {"\u00ab": "``", "\u00bb": "''", "\u201c": "``", "\u201d": "''", "\u2018": "`", "\u2019": "'", "\u201b": "`",
          "\u2039": "`", "\u203a": "'", "`": "`", "\u201a": "\u201a", "\u201e": "\u201e", "\u201f": "\u201f",
          "\x91": "`", "\x92": "'", "\x93": "``", "\x94": "''"}
# non-letters the jar counts as letters (spacing modifiers, Greek / Armenian / Arabic / Syriac signs)
WORD_SYMBOLS = set("\u02c2\u02c3\u02c4\u02c5\u0375\u0384\u0385\u03f6\u06dd\u06de\u06e9\u06fd\u06fe\u070f") | {
    chr(c) for a, b in ((0x2D2, 0x2DF), (0x2E5, 0x2FF), (0x55A, 0x55F)) for c in range(a, b + 1)}
# punctuation, symbols and other numbers the jar keeps as one-character tokens (the others of those it deletes)
KEPT_SYMBOLS = re.compile(
    "[$-&*-,:-><>\\\\^`|\u007e-\u00a1\u00a5-\u00a9\u00ac-\u00b9\u00bf-\u00f7\u037e\u0387\u0589\u05be-\u060c\u061b"
    "\u061e-\u066a\u066d-\u06d4\u0700-\u07f8\u0964\u0965\u0e3f-\u0e4f\u1fbd\u2016\u2017\u201a\u201e-\u2023"
    "\u2030-\u2038\u203b\u203e-\u2042\u2044\u2070-\u208e\u20a4\u2100-\u214f\u2155-\u215e\u2190-\u2bff\u3001\u3002"
    "\u3012\u30fb\uff01-\uffe1\uffe5\uffe6]")
SPACE = set("\x00\u200b\u200e\u200f\ufeff")             # besides str.isspace(): what the jar skips as space
FORMED = set("!\"#'-./?@_\u0600\u0601\u0602\u0603") | set(REWRITE) | set(QUOTES)   # handled by the forms below

# words that keep a following period (the jar's abbreviations; its lexer ignores case in them, except for the
# first letter of CAPITALISED ones): any period, before a digit only (NUMBERED)
ABBREVIATIONS = frozenset((
    "jan feb mar apr jun jul aug sep sept oct nov dec mon tue tues wed thu thurs fri "
    "ala ariz calif colo conn ct dak fla ga ind kan kans ky md mich minn mo mont neb nev okla penn tenn va vt wis wisc "
    "wyo inc co cos corp pty pte ptys ptes ppty ppte pptys pptes ltd plc rt bancorp bhd assn univ intl sys tel est "
    "ext sq jr sr bros ed.d ph.d blvd rd esq etc al seq bldg mr mrs ms dr drs prof profs sen sens rep reps atty attys "
    "lt col gen messrs gov govs adm rev maj sgt cpl pvt capt st ste ave pres lieut hon brig cmdr comdr pfc spc "
    "supt supts det mt ft adj adv asst assoc ens insp mlle mme msgr sfc vs alex wm jos cie cf treas ph invt "
    "elec natl mfg mtg dept").split())
CAPITALISED = frozenset("Az Ark Del Ill La Mass Miss Ore Pa Tex Wash".split())
NUMBERED = frozenset("ca fig figs prop no nos art bldg pp op".split())
ABBREVIATION = re.compile(r"[A-Za-z]+(?:\.[A-Za-z]+)?(?=\.)")
# a one-letter (or dotted) abbreviation before one of these words ends a sentence: "B. The" -> "b", "."
SENTENCE_STARTS = frozenset(
    "About According Additionally After An A As At But Earlier He Her Here However If In It Last Many More Mr. Ms. "
    "Now Once One Other Our She Since So Some Such That The Their Then There These They This We When While What Yet "
    "You".split())

# forms at a position (regular expressions), in the lexer's order of preference
URLS = [re.compile(p) for p in (
    r"https?://[^\s\"<>|(){}]*[^\s\"<>|.!?(){},-]",                                 # a URL
    r"<?[a-zA-Z0-9][^\s\"<>|(){}]*@(?:[^\s\"<>|(){}.]+\.)*[^\s\"<>|(){}.]+>?",       # an e-mail address
    r"@[a-zA-Z_][a-zA-Z_0-9]*")]                                                      # @name
FORMS = [re.compile(p) for p in (
    f"(?i:c[{APOS}]est|cap[{APOS}]n|pro-|anti-)",                                     # the jar's few special words
    r"[-+]?(?:\d+(?:[.:,\u066b\u066c]\d+)*|(?:[.:,\u066b\u066c]\d+)+)",               # a number: 3.50 1,000 12:30 -5
    r"[A-Za-z0-9]+(?:-[A-Za-z]+){0,2}(?:\\?/[A-Za-z0-9]+(?:-[A-Za-z]+){0,2}){1,2}",  # and/or, 3/4, 12/05/2020
    r"[A-Z]*\$",                                                                     # $, US$
    r"[A-Za-z](?:\.[A-Za-z])*\.",                                                     # u.s.a. e.g. c.
    r"[A-Za-z0-9][A-Za-z0-9.,]*(?:-(?:[A-Za-z0-9]+|[A-Za-z](?:\.[A-Za-z])+\.))+",     # 3-year-old, a.b-c
    r"[A-Z]+(?:[+&][A-Z]+)+",                                                         # AT&T
)]
RUNS = [re.compile(p) for p in (r"\*+|(?:\\\*){1,3}", r"#+", r"@+", r"_+", r"[?!]+", r"<<|>>")]
NAME = r"[A-Za-z][A-Za-z0-9_:.-]*"
TAG = re.compile(f"<(?:[!?][A-Za-z-][^>\\r\\n]*|{NAME}(?: +(?:{NAME}|{NAME} *= *(?:'[^']*'|\"[^\"]*\")))* */?|/{NAME}) *>")
FACES = re.compile(r"[-^x=~<>']_[-^x=~<>']|\([-^x=~<>'][_.]?[-^x=~<>']\)|\([\^x=~<>']-[\^x=~<>'`]\)")
SMILEY = re.compile(r"[<>]?[:;=][-o*']?[()DPdpO\\{@|\[\]](?![A-Za-z0-9])")
# forms that match more than their token
CLITIC = re.compile(f"[{APOS}](?:[sSmMdD]|(?i:re|ve|ll))")                        # 's 'm 'd 're 've 'll
NOT = re.compile(f"(?i:n[{APOS_ETC}]t)")                                            # n't
BEFORE_NOT = re.compile(r"[A-Za-z]*[A-MO-Za-mo-z]")
TWO_DIGITS = re.compile(f"[{APOS}][0-9][0-9](?=\\s|$)")                                # '90 (+ a space)
LITERALS = {"c++": 3, "c#": 2, "f#": 2, "cannot": 3, "gonna": 3, "gotta": 3, "lemme": 3, "gimme": 3, "wanna": 3,
            "'tis": 2, "'twas": 2}         # matched ignoring case; the token is the first k characters


def _category(c: str) -> str:
    return unicodedata.category(c) if ord(c) <= 0xFFFF else "Cn"


def is_letter(c: str) -> bool:
    return _category(c)[0] == "L" or _category(c) in ("Mn", "Mc") or c in WORD_SYMBOLS


def is_word(c: str) -> bool:
    return is_letter(c) or _category(c) == "Nd"


def _ascii_letter(c: str) -> bool:
    return c.isascii() and c.isalpha()


def _letter(c: str) -> bool:
    """A letter as the jar's words with apostrophes take them (no combining marks)."""
    return _category(c)[0] == "L"


def _plain(c: str) -> bool:
    """A letter or digit as the jar's hyphenated words take them (no combining marks)."""
    return _category(c)[0] == "L" or _category(c) == "Nd"


def deleted(c: str) -> bool:
    """The jar deletes c (or skips it as whitespace): either way it ends a token."""
    if ord(c) > 0xFFFF or c in SPACE or c.isspace():
        return True
    if is_word(c) or c in FORMED:
        return False
    category = unicodedata.category(c)
    return not (category[0] in "PS" or category == "No") or KEPT_SYMBOLS.fullmatch(c) is None


def _run(text: str, i: int, test) -> int:
    while i < len(text) and test(text[i]):
        i += 1
    return i


def _word(text: str, i: int) -> int:
    """A word from i: a letter, then letters and digits, and . ! ? between letters ("u.s", "a!b"); i if none."""
    if not is_letter(text[i]):
        return i
    end = _run(text, i, is_word)
    while end + 1 < len(text) and text[end] in ".!?" and is_letter(text[end + 1]):
        end = _run(text, end + 1, is_word)
    return end


def _hyphenated(text: str, i: int) -> int:
    """Letters / digits joined by hyphens, each part optionally after an elided d' o' l' ("l'homme-objet")."""
    def part(j: int) -> int:
        if j + 1 < len(text) and text[j] in "dDoOlL" and text[j + 1] in APOS_ETC and _run(text, j + 2, _plain) > j + 3:
            j += 2
        return _run(text, j, _plain)

    end = part(i)
    while end > i and end + 1 < len(text) and text[end] in HYPHEN and part(end + 1) > end + 1:
        end = part(end + 1)
    return end


def _apostrophe_word(text: str, i: int) -> int:
    """Words with an apostrophe the jar keeps whole: j' l' d' (and y' before a letter), n'est, qu'il, 'n'
    (rock'n'roll), '90s; i if none."""
    n, best = len(text), i
    if i + 1 < n and text[i] in APOS and text[i + 1] in "nN":
        return i + 3 if i + 2 < n and text[i + 2] in APOS else i + 2
    if i + 3 < n and text[i] in APOS and text[i + 1] in "23456789" and text[i + 2:i + 4] in ("0s", "0S"):
        return i + 4
    if i + 1 < n and text[i] in "lLdDjJ" and text[i + 1] in APOS:
        best = i + 2
    if i + 2 < n and text[i] in "yY" and text[i + 1] in APOS and _letter(text[i + 2]):
        best = i + 2
    if i + 3 < n and (text[i] in "ABCDEFGHJKLMNOPQRSTUVWXZn") and text[i + 1] in APOS_ETC:
        end = _run(text, i + 2, _letter)
        if end - (i + 2) >= 2:
            best = max(best, end)
    letters = _run(text, i, _letter)
    if (letters - i >= 2 and text[letters - 1] in VOWELS and letters + 1 < n and text[letters] in APOS_ETC
            and (text[letters + 1] in "aeiou" or text[letters + 1] in UPPER)):
        best = max(best, _run(text, letters + 2, _letter))
    return best


def _abbreviation(text: str, i: int):
    """(length, token) of an abbreviation that keeps its period at i ("mar.", "Mr.", "no." before a digit)."""
    match = ABBREVIATION.match(text, i)
    if not match:
        return None
    word = match.group()
    end = match.end() + 1                                     # the period
    if word.lower() in ABBREVIATIONS or word[:1].upper() + word[1:].lower() in CAPITALISED and word[0] in UPPER:
        return end - i, text[i:end]
    if word.lower() in NUMBERED:
        after = end + 1 if end < len(text) and text[end].isspace() else end
        if after < len(text) and text[after].isdigit():
            return after + 1 - i, text[i:end]
    return None


def _sentence_end(text: str, i: int):
    """A one-letter abbreviation ("B.") before spaces and a word that starts sentences ("The"): (length, the
    letter alone; the period is then a token of its own)."""
    if not (i + 1 < len(text) and text[i] in UPPER + UPPER.lower() and text[i + 1] == "."):
        return None
    start = _run(text, i + 2, str.isspace)
    if start == i + 2:
        return None
    for word in SENTENCE_STARTS:
        end = start + len(word)
        if (text[start:start + 1] == word[0] and text[start:end].lower() == word.lower()
                and (end == len(text) or text[end].isspace())):
            return end + 1 - i, text[i]
    return None


def _candidates(text: str, i: int):
    """(length matched, token, end) of every form that applies at i, in the lexer's order of preference."""
    for literal, keep in LITERALS.items():
        if text[i:i + len(literal)].lower() == literal:
            yield len(literal), text[i:i + keep], i + keep
    word = _word(text, i)
    if word > i:
        clitic = CLITIC.match(text, word)
        if clitic:
            yield clitic.end() - i, text[i:word], word
    before_not = BEFORE_NOT.match(text, i)
    if before_not and NOT.match(text, before_not.end()):
        yield before_not.end() + 3 - i, text[i:before_not.end()], before_not.end()
    if word > i:
        yield word - i, text[i:word], word
    for end in (word, _hyphenated(text, i)):            # "word.," keeps its period before , ; : 、
        if end > i and text[end:end + 1] == "." and text[end + 1:end + 2] in (",", ";", ":", "\u3001"):
            yield end + 2 - i, text[i:end + 1], end + 1
    apostrophe = _apostrophe_word(text, i)
    if apostrophe > i:
        yield apostrophe - i, text[i:apostrophe], apostrophe
    for pattern in URLS:
        match = pattern.match(text, i)
        if match:
            yield match.end() - i, match.group(), match.end()
    if text[i] == "#" and _run(text, i + 1, is_letter) > i + 1:
        end = _run(text, i + 1, is_letter)
        yield end - i, text[i:end], end
    clitics = [(m.end() - i, re.sub(f"[{APOS_ETC}]", "'", m.group()), m.end())
               for m in (CLITIC.match(text, i), NOT.match(text, i)) if m]
    for length, token, end in clitics:           # ... followed by a non-letter
        if end == len(text) or not _ascii_letter(text[end]):
            yield length + 1, token, end
    for pattern in (TWO_DIGITS, *FORMS):
        match = pattern.match(text, i)
        if match and match.end() > i:
            yield match.end() - i + (pattern is TWO_DIGITS), match.group(), match.end()
    for special in (_sentence_end(text, i), _abbreviation(text, i)):
        if special:
            yield special[0], special[1], i + len(special[1])
    thing = _hyphenated(text, i)
    if thing > i:
        yield thing - i, text[i:thing], thing
    if text[i] == '"':
        yield 1, "``", i + 1
    tag = TAG.match(text, i)
    if tag:
        yield tag.end() - i, tag.group(), tag.end()
    for pattern, context in ((SMILEY, 1), (FACES, 0)):
        match = pattern.match(text, i)
        if match:
            yield match.end() - i + context, match.group().replace("(", "-lrb-").replace(")", "-rrb-"), match.end()
    for pattern in RUNS:
        match = pattern.match(text, i)
        if match:
            yield match.end() - i, match.group(), match.end()
    hyphens = _run(text, i, lambda c: c == "-")
    if hyphens > i:
        yield hyphens - i, "--" if 3 <= hyphens - i <= 4 else text[i:hyphens], hyphens
    dots = _run(text, i, lambda c: c == ".")
    if dots - i >= 3:
        yield min(dots - i, 5), "...", i + min(dots - i, 5)
    if text[i] == "'" and i + 2 < len(text) and _ascii_letter(text[i + 1]) and text[i + 2] not in " \t\u00a0":
        yield 3, "`", i + 1                       # an opening quote before a word
    yield from clitics
    if text.startswith("''", i):
        yield 2, "''", i + 2
    if text[i] in QUOTES:
        pair = i + 1 < len(text) and text[i + 1] in QUOTES
        yield 1 + pair, QUOTES[text[i]] + (QUOTES[text[i + 1]] if pair else ""), i + 1 + pair
    yield 1, REWRITE.get(text[i], text[i]), i + 1


def tokens(line: str) -> list[str]:
    """The jar's tokens of one caption, lower-cased, without pycocoevalcap's punctuation tokens, split at
    whitespace as CIDEr splits them (the jar writes a space inside a token as a no-break space)."""
    text = line.replace("\u00ad", "")
    out: list[str] = []
    i = 0
    while i < len(text):
        if deleted(text[i]):
            i += 1
            continue
        _, token, i = max(_candidates(text, i), key=lambda c: c[0])
        token = token.lower()
        if token and token not in PUNCTUATION:
            out += token.split()
    return out
