"""Text processing of the suite's rules: answer normalisation and the tokenisation CIDEr is computed on.

CIDEr's tokens (`caption_tokens`), as the reference evaluation of the mBLIP / Centurio line computes XM3600 (its
`convert_xm3600_to_coco.py` + `caption_evaluation`): Chinese, Japanese and Thai captions are first segmented into
words joined by spaces, every caption is put in Unicode NFC, then tokenised as pycocoevalcap's PTBTokenizer does
before scoring (lower case, punctuation split off and dropped). Java is not needed: PTBTokenizer runs the
Stanford CoreNLP jar, so the PTB step is re-done here in Python (`ptb_tokens`; same tokens on ordinary sentences:
words lower-cased, punctuation at word edges split off and dropped, English clitics `'s n't 're 've 'll 'd 'm`
split off; it differs from the jar on bracket escapes such as `-LSB-`, which the jar keeps as words).

Segmenters (`SEGMENTERS`):
- zh: one token per non-space character: spaCy's default Chinese tokenizer (`segmenter = "char"`), which the
  reference evaluation uses (no package needed);
- ja: TinySegmenter (`tinysegmenter` on PyPI, 17 kB, pure Python, no dictionary): the reference uses spaCy's
  Japanese tokenizer, i.e. SudachiPy with its ~70 MB dictionary (a Rust extension), not installable as a small
  pure-Python dependency; TinySegmenter's words differ from Sudachi's in places, so Japanese CIDEr is close to, not
  identical with, the reference's;
- th: PyThaiNLP's `newmm` word tokenizer (`pythainlp`, pure Python, no dependencies), exactly what spaCy's Thai
  tokenizer calls, so Thai tokens equal the reference's.
"""
from __future__ import annotations

import re
import unicodedata
from functools import lru_cache

CLITICS = re.compile(r"^(.+?)(n't|'s|'re|'ve|'ll|'d|'m)$")
ARTICLES = {"a", "an", "the"}
NUMBER_WORDS = {"none": "0", "zero": "0", "one": "1", "two": "2", "three": "3", "four": "4", "five": "5",
                "six": "6", "seven": "7", "eight": "8", "nine": "9", "ten": "10"}


def is_punct(char: str) -> bool:
    return unicodedata.category(char).startswith("P")


def ptb_tokens(text: str) -> list[str]:
    """pycocoevalcap's PTBTokenizer step without Java: lower case, whitespace split, punctuation at word edges
    split off, English clitics split off, punctuation tokens dropped."""
    out: list[str] = []
    for word in text.lower().replace("’", "'").split():
        start, end = 0, len(word)
        while start < end and is_punct(word[start]):
            start += 1
        while end > start and is_punct(word[end - 1]):
            end -= 1
        core = word[start:end]
        if not core:
            continue
        match = CLITICS.match(core)
        out += [match.group(1), match.group(2)] if match and not all(map(is_punct, match.group(1))) else [core]
    return out


def _chinese(text: str) -> list[str]:
    return [c for c in text if not c.isspace()]


@lru_cache(maxsize=1)
def _tinysegmenter():
    import tinysegmenter

    return tinysegmenter.TinySegmenter()


def _japanese(text: str) -> list[str]:
    return [w for w in _tinysegmenter().tokenize(text) if w.strip()]


def _thai(text: str) -> list[str]:
    from pythainlp.tokenize import word_tokenize

    return [w for w in word_tokenize(text, engine="newmm") if w.strip()]


SEGMENTERS = {"zh": _chinese, "ja": _japanese, "th": _thai}


def caption_tokens(text: str, lang: str, segment: bool = True) -> list[str]:
    """The CIDEr tokens of a caption in `lang`: NFC, word segmentation for zh / ja / th (`segment`), PTB step."""
    text = unicodedata.normalize("NFC", text.replace("\n", " "))
    if segment and lang in SEGMENTERS:
        text = " ".join(SEGMENTERS[lang](text))
    return ptb_tokens(text)


def answer_words(text: str) -> list[str]:
    """An answer's words for exact matching: NFKC (full-width forms folded), lower case, every punctuation mark a
    space."""
    text = unicodedata.normalize("NFKC", text).lower()
    return "".join(" " if is_punct(c) else c for c in text).split()


def normalise_answer(text: str, lang: str) -> str:
    """The answer normalisation of the `exact` MaXM rule: `answer_words`, and for English the VQA conventions
    (number words zero-ten as digits, articles a / an / the dropped). Idempotent."""
    words = answer_words(text)
    if lang == "en":
        words = [NUMBER_WORDS.get(w, w) for w in words if w not in ARTICLES]
    return " ".join(words)
