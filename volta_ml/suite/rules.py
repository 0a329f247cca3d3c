"""The suite's scoring rules, each written from the benchmark's paper or official code (docs/suite.md lists the
source of each and every difference between the harnesses that run them).

A rule has two halves: `score(backend, images, prompts, context)` turns a batch into arrays (the greedy answers,
or the option letters' next-token logits), which the chunk store saves, and `judge(arrays, items, context)`
turns the arrays of all items into one `Judged` per item: its score (1 / 0, or the item's CIDEr), whether a
generated answer named an option at all (`parsed`; None where the question is open) and what was scored. A
generated multiple-choice answer that names no option is wrong and counted in the format-error rate; nothing
is ever guessed for it (harnesses that draw a random letter there are matched by the deterministic
`score_random_fallback_expected`: the expected score of that draw).
"""
from __future__ import annotations

import ast
import json
import re
from dataclasses import dataclass, field
from difflib import SequenceMatcher
from importlib import metadata
from typing import Callable

import numpy as np

from volta_ml.engine.failures import UsageError
from volta_ml.stats import truncation
from volta_ml.hf.base import EngineError

from . import ptb
from .text import (ARTICLES, INSTALL, NUMBER_WORDS, jar_versions, normalise_answer, prepare, ptb_jar,
                   segmenter_versions)

LETTERS = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"


@dataclass(frozen=True)
class Judged:
    score: float                     # 1.0 / 0.0, or the item's CIDEr (pycocoevalcap's scale)
    parsed: bool | None = None       # multiple choice by generation: the answer named an option
    prediction: str = ""             # what was compared: the option letter, the normalised answer, the tokens
    chance: float | None = None      # multiple choice: the expected score of a random letter had it been unparsed
    flags: tuple[str, ...] = ()      # rule-specific observations counted as rates (M3Exam: "illformat")


@dataclass(frozen=True)
class Rule:
    name: str
    kind: str                        # generate | letter (what the backend is asked; which prompt is used)
    judge: Callable
    describe: str
    source: str = ""
    extra: dict = field(default_factory=dict)
    tools: Callable | None = None    # (language) -> what the rule runs with (versions), checked before any work:
                                     # one UsageError line naming what to install when something is missing

    def score(self, backend, images, prompts, context) -> dict:
        return SCORERS[self.kind](backend, images, prompts, context)


def gold_indices(item) -> set[int]:
    return {item.answer, *item.meta.get("also_correct", ())}


# --- what the backend is asked ----------------------------------------------------------------------------------
def _generate(backend, images, prompts, context) -> dict:
    answers = backend.generate(images, prompts, context["max_new_tokens"])
    return {"answers": np.array(answers, dtype=str), "truncated": truncation(answers)}


def _letters(backend, images, prompts, context) -> dict:
    """The CVQA paper's letter rule: next-token logits of the option letters (one call per number of options in
    the batch, -inf beyond a question's options); open questions in the batch (xMMMU) are answered greedily."""
    items = context["batch_items"]
    width = context.get("letter_width") or max((len(it.options) for it in items), default=0)
    scores = np.full((len(items), max(width, 1)), -np.inf, dtype=np.float32)   # one width for every batch
    answers = [""] * len(items)
    by_count: dict[int, list[int]] = {}
    for i, item in enumerate(items):
        by_count.setdefault(len(item.options), []).append(i)
    for count, rows in by_count.items():
        try:
            if count == 0:
                generated = backend.generate([images[i] for i in rows], [prompts[i] for i in rows],
                                             context["max_new_tokens"])
                for i, answer in zip(rows, generated):
                    answers[i] = answer
                continue
            logits = backend.choice_logits([images[i] for i in rows], [prompts[i] for i in rows],
                                           list(LETTERS[:count]))
        except EngineError as err:       # a server's failed item: named by its place in the batch
            raise err.within(rows) from None
        scores[rows, :count] = logits.float().numpy()
    return {"scores": scores, "answers": np.array(answers, dtype=str)}


SCORERS = {"generate": _generate, "letter": _letters}


def answers_of(arrays) -> list[str]:
    return [str(a) for a in arrays["answers"].tolist()]


def _choice_judged(index: int | None, item, n: int) -> Judged:
    letter = "" if index is None else LETTERS[index]
    correct = index is not None and index in gold_indices(item)
    return Judged(float(correct), index is not None, letter, float(correct) if index is not None else 1.0 / n)


def _letter_judge(open_judge: Callable | None = None):
    def judge(arrays, items, context):
        out = []
        answers = answers_of(arrays)
        for k, (row, item) in enumerate(zip(arrays["scores"], items)):
            if not item.options:
                out.append(open_judge(answers[k], item))
                continue
            index = int(np.argmax(row[:len(item.options)]))
            out.append(Judged(float(index in gold_indices(item)), None, LETTERS[index]))
        return out
    return judge


def _per_item(fn: Callable):
    """A judge applying `fn(generated answer, item) -> Judged` to every item."""
    def judge(arrays, items, context):
        return [fn(answer, item) for answer, item in zip(answers_of(arrays), items)]
    return judge


# --- MaXM -------------------------------------------------------------------------------------------------------
def maxm_exact(answer: str, item) -> Judged:
    pred = normalise_answer(answer, item.lang)
    golds = {normalise_answer(a, item.lang) for a in list(item.meta["processed_answers"]) + list(item.references)}
    return Judged(float(bool(pred) and pred in golds), None, pred)


def maxm_relaxed(answer: str, item) -> Judged:
    pred = normalise_answer(answer, item.lang)
    golds = {normalise_answer(a, item.lang) for a in list(item.meta["processed_answers"]) + list(item.references)}
    hit = bool(pred) and any(g and (pred.startswith(g) or pred.endswith(g)) for g in golds)
    return Judged(float(hit), None, pred)


def maxm_mblip(answer: str, item) -> Judged:
    pred = answer.strip().lower()
    return Judged(float(pred in [a.lower().strip() for a in item.meta["processed_answers"]]), None, pred)


def maxm_pangea_exact(answer: str, item) -> Judged:
    return Judged(float(answer in list(item.references)), None, answer)


VQA_PUNCT = (";", "/", "[", "]", '"', "{", "}", "(", ")", "=", "+", "\\", "_", "-", ">", "<", "@", "`", ",", "?", "!")
VQA_PERIOD = re.compile(r"(?!<=\d)(\.)(?!\d)")     # as written in the VQA evaluation: a period not before a digit
VQA_COMMA = re.compile(r"(\d)(,)(\d)")


def vqa_clean(text: str) -> str:
    """The VQA evaluation's answer cleaning as the harnesses apply it to predictions: punctuation removed (or a
    space), periods not before a digit dropped (at most 32: the `re.UNICODE` flag passed as the count), lower
    case, number words zero-ten as digits, articles dropped, outer apostrophes stripped. (LAVIS's table of
    contractions typed without an apostrophe is not applied: it only rewrites English forms such as "dont".)"""
    text = text.replace("\n", "").replace("\t", "").strip()
    out = text
    for p in VQA_PUNCT:
        if (p + " " in text or " " + p in text) or VQA_COMMA.search(text) is not None:
            out = out.replace(p, "")
        else:
            out = out.replace(p, " ")
    out = VQA_PERIOD.sub("", out, count=re.UNICODE)
    words = [NUMBER_WORDS.get(w, w) for w in out.lower().split()]
    return " ".join(w for w in words if w not in ARTICLES).strip("'")


def _yes_no(value: str) -> str:
    return {"true": "yes", "false": "no"}.get(value.lower(), value)


def maxm_pangea_relaxed(answer: str, item) -> Judged:
    pred = vqa_clean(answer.rstrip("."))
    golds = [_yes_no(a.strip()) for a in item.references]          # never lower-cased: PangeaBench's quirk
    return Judged(float(any(pred.startswith(g) or pred.endswith(g) for g in golds)), None, pred)


# --- MTVQA ------------------------------------------------------------------------------------------------------
def mtvqa_official(answer: str, item) -> Judged:
    pred = answer.strip().lower().replace(".", "")
    return Judged(float(any(g.strip().lower() in pred for g in item.references)), None, pred)


def mtvqa_lmms_eval(answer: str, item) -> Judged:
    pred = answer.strip().lower().replace(".", "")
    return Judged(float(any(g.strip().lower().replace(".", "") in pred for g in item.references)), None, pred)


# --- MMMU (xMMMU) -----------------------------------------------------------------------------------------------
def parse_mmmu_choice(response: str, options) -> int | None:
    """MMMU's multiple-choice parser (its eval_utils `parse_multi_choice_response`): a bracketed letter "(B)", a
    letter followed by a space, a letter followed by a period, then (answers longer than 5 words) an option's
    text; several candidates: the one found last. None where MMMU draws a random letter."""
    letters = LETTERS[:len(options)]
    for char in (",", ".", "!", "?", ";", ":", "'"):
        response = response.strip(char)
    response = f" {response} "
    brackets = [c for c in letters if f"({c})" in response]
    candidates, index_answer = brackets, True
    if not candidates:
        candidates = [c for c in letters if f"{c} " in response]
    if not candidates:
        candidates = [c for c in letters if f"{c}." in response]
    if not candidates and len(response.split()) > 5:
        candidates = [c for c, o in zip(letters, options) if o.lower() in response.lower()]
        index_answer = not candidates
    if not candidates:
        return None
    if len(candidates) > 1:
        if index_answer:
            starts = [response.rfind(f"({c})") if brackets else response.rfind(f" {c} ") for c in candidates]
        else:
            starts = [response.lower().rfind(options[letters.index(c)].lower()) for c in candidates]
        return letters.index(candidates[int(np.argmax(starts))])
    return letters.index(candidates[0])


NUMBER_PATTERNS = (re.compile(r"-?\b\d{1,3}(?:,\d{3})+\b"), re.compile(r"-?\d+(?:\.\d+)?[eE][+-]?\d+"),
                   re.compile(r"-?(?:\d+\.\d+|\.\d+|\d+\b)(?![eE][+-]?\d+)(?![,\d])"))
KEY_INDICATORS = ("could be ", "so ", "is ", "thus ", "therefore ", "final ", "answer ", "result ")


def _is_number(text: str) -> bool:
    try:
        float(text.replace(",", ""))
        return True
    except ValueError:
        return False


def mmmu_normalise(text: str) -> list:
    """MMMU's `normalize_str`: a number as a float rounded to 2 decimals, else lower case (a single character
    padded by a space on either side, against trivial matches)."""
    text = text.strip()
    if _is_number(text):
        return [round(float(text.replace(",", "")), 2)]
    text = text.lower()
    return [" " + text, text + " "] if len(text) == 1 else [text]


def parse_mmmu_open(response: str) -> list:
    """MMMU's `parse_open_response`: the tails after key phrases ("is ", "therefore ", "=" in the last sentence,
    ...), the numbers in them, normalised."""
    response = response.strip().strip(".").lower()
    sentences = re.split(r"\.\s(?=[A-Z])|\n", response)
    keys = []
    for index, sentence in enumerate(sentences):
        indicators = KEY_INDICATORS + (("=",) if index == len(sentences) - 1 else ())
        shortest = None
        for indicator in indicators:
            if indicator in sentence:
                tail = sentence.split(indicator)[-1].strip()
                if not shortest or len(tail) < len(shortest):
                    shortest = tail
        if shortest and shortest.strip() not in (":", ",", ".", "!", "?", ";", "'"):
            keys.append(shortest)
    keys = keys or [response]
    predictions = list(keys)
    for key in keys:
        for pattern in NUMBER_PATTERNS:
            predictions += pattern.findall(key)
    return list({value for p in predictions for value in mmmu_normalise(p)})


def mmmu_open_correct(gold: str, predictions: list) -> bool:
    """MMMU's `eval_open`: a string answer contained in a string prediction, or a number equal to one."""
    answers = mmmu_normalise(gold)
    for pred in predictions:
        if isinstance(pred, str):
            if any(isinstance(a, str) and a in pred for a in answers):
                return True
        elif pred in answers:
            return True
    return False


def mmmu_open(answer: str, item) -> Judged:
    predictions = parse_mmmu_open(answer)
    return Judged(float(mmmu_open_correct(item.references[0], predictions)), None, answer.strip())


def mmmu_generate(answer: str, item) -> Judged:
    if not item.options:
        return mmmu_open(answer, item)
    return _choice_judged(parse_mmmu_choice(answer, item.options), item, len(item.options))


# --- M3Exam -----------------------------------------------------------------------------------------------------
def m3exam_official(answer: str, item) -> Judged:
    """M3Exam's eval.py: an answer longer than one character is ill-formatted and read as its first character
    (its second after an opening parenthesis); correct when that equals the gold label exactly."""
    pred = answer.strip()
    flags = ()
    if len(pred) > 1:
        flags = ("illformat",)
        pred = pred[0] if pred[0] != "(" else pred[1]
    letters = LETTERS[:len(item.options)]
    index = letters.index(pred) if len(pred) == 1 and pred in letters else None
    judged = _choice_judged(index, item, len(item.options))
    return Judged(judged.score, judged.parsed, pred, judged.chance, flags)


PANGEA_LETTER = re.compile(r"\(?([A-D])[).:\s]", re.IGNORECASE)
PANGEA_ANY = re.compile(r"[ABCD]", re.IGNORECASE)


def parse_pangea_m3exam(response: str, options) -> int | None:
    """PangeaBench's M3Exam parser: a letter A-D before ) . : or a space (any case), else the first A-D anywhere
    (any case), else the option whose "(X) text" is more than 70% similar (difflib); None where it draws a
    random letter."""
    response = response.strip()
    for pattern in (PANGEA_LETTER, PANGEA_ANY):
        match = pattern.search(response)
        if match:
            return LETTERS.index((match.group(1) if pattern is PANGEA_LETTER else match.group(0)).upper())
    best, best_ratio = None, 0.0
    for i, option in enumerate(options):
        content = re.sub(r"^[A-D]\.\s*", "", f"({LETTERS[i]}) {option}").strip()
        ratio = SequenceMatcher(None, response, content).ratio()
        if ratio > best_ratio:
            best, best_ratio = i, ratio
    return best if best_ratio > 0.7 else None


def m3exam_pangea(answer: str, item) -> Judged:
    return _choice_judged(parse_pangea_m3exam(answer, item.options), item, len(item.options))


# --- Kaleidoscope -----------------------------------------------------------------------------------------------
NON_LATIN = {"Б": "B", "Ц": "C", "Д": "D", "Г": "D", "أ": "A", "ب": "B", "ج": "C", "د": "D"}
CHOICE_JSON = re.compile(r"\{\s*\"choice\"\s*:\s*.*?\s*\}", re.DOTALL)
CHOICE_JSON_LINE = re.compile(r"\{\s*\"choice\":\s*.*?\s*\}")


def _literal_dict(text: str):
    try:
        value = ast.literal_eval(text)
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        return None
    return value if isinstance(value, dict) else None


def parse_kaleidoscope(response: str, n: int) -> int | None:
    """Kaleidoscope's direct-answer format, `{"choice": "B"}` (the whole reply as JSON, else the first such
    object, over several lines too), or a one-character reply; the letter may be written in the question's
    script (Б, ب, ...) and may carry the option text ("B. Ribosome"); any letter of the question's options."""
    letters = LETTERS[:n]

    def index(value: str) -> int | None:
        value = NON_LATIN.get(value.strip(), value.strip()).upper()
        return letters.index(value) if len(value) == 1 and value in letters else None

    payload = response.strip().removeprefix("```json").removeprefix("```").removesuffix("```").strip()
    candidates = []
    try:
        parsed = json.loads(payload)
        if isinstance(parsed, dict) and isinstance(parsed.get("choice"), str):
            candidates.append(parsed["choice"])
    except ValueError:
        pass
    if not candidates:
        match = CHOICE_JSON.search(payload)
        parsed = _literal_dict(match.group()) if match else None
        if parsed is not None and isinstance(parsed.get("choice"), str):
            candidates.append(parsed["choice"])
    for candidate in candidates:
        found = index(candidate)
        if found is not None:
            return found
        valid = [i for i in (index(part) for part in candidate.strip().upper().split(".")) if i is not None]
        if len(valid) == 1:
            return valid[0]
    return index(response.strip()) if len(response.strip()) == 1 else None


def parse_kaleidoscope_reference(response: str) -> int | None:
    """The reference repository's `format_answer.py` first pass, literally: a one-character reply as is, else the
    first `{"choice": ...}` on one line, read with `ast.literal_eval`; a choice longer than one character is
    split on "." and kept when exactly one part is a letter; only A-D count."""
    if len(response) == 1:
        choice = response
    else:
        match = CHOICE_JSON_LINE.search(response)
        parsed = _literal_dict(match.group()) if match else None
        if not parsed or not isinstance(parsed.get("choice", ""), str):
            return None
        choice = parsed.get("choice", "").strip().upper()
    if len(choice) > 1:
        valid = [c for c in (part.strip() for part in choice.split(".")) if c in {"A", "B", "C", "D"}]
        choice = valid[0] if len(valid) == 1 else ""
    choice = NON_LATIN.get(choice, choice)
    return "ABCD".index(choice) if len(choice) == 1 and choice in {"A", "B", "C", "D"} else None


def kaleidoscope_generate(answer: str, item) -> Judged:
    return _choice_judged(parse_kaleidoscope(answer, len(item.options)), item, len(item.options))


def kaleidoscope_reference(answer: str, item) -> Judged:
    """A letter A-D is a valid answer even beyond the question's options (the reference counts 0-3 as valid)."""
    return _choice_judged(parse_kaleidoscope_reference(answer), item, len(item.options))


# --- VLMEvalKit multiple choice (MMMB, MMBench-style TSVs) -------------------------------------------------------
VLMEVALKIT_REFUSALS = ("Sorry, I can't help with images of people yet.", "I can't process this file.",
                       "I'm sorry, but without the image provided", "Cannot determine the answer")
VLMEVALKIT_API_FAILURE = "Failed to obtain answer via API"
VLMEVALKIT_SEPARATORS = ".()[],:;!*#{}"
VLMEVALKIT_ANSWER_IS = re.compile(r"(?i)(?:correct\s+)?answer\s+is\s+\**([ABCD])\**")
DECLINED = "Z"          # what VLMEvalKit's matcher returns for a refusal (never an option letter: scored wrong)


def vlmevalkit_option(answer: str, letters: str) -> str | None:
    """VLMEvalKit's `can_infer_option`: a refusal phrase is "Z"; the reply with . ( ) [ ] , : ; ! * # { } as
    spaces, split into tokens; exactly one option letter among the tokens and it among the last four: that
    letter; no option letter but a token "Z": "Z"; else the first "(correct) answer is X" (any case, X in A-D and
    an option). None: no letter inferred (the API-failure marker included). VLMEvalKit's extra check that an "A"
    among more than three tokens might be an article runs only with its VERBOSE switch set: not applied."""
    if VLMEVALKIT_API_FAILURE in answer:
        return None
    if any(phrase in answer for phrase in VLMEVALKIT_REFUSALS):
        return DECLINED
    tokens = answer.translate(str.maketrans(VLMEVALKIT_SEPARATORS, " " * len(VLMEVALKIT_SEPARATORS))).split()
    named = [c for c in letters if c in tokens]
    if len(named) == 1:
        if tokens.index(named[0]) > len(tokens) - 5:
            return named[0]
    elif not named and DECLINED in tokens:
        return DECLINED
    match = VLMEVALKIT_ANSWER_IS.search(answer)
    if match and match.group(1).upper() in letters:
        return match.group(1).upper()
    return None


def vlmevalkit_text(answer: str, options) -> str | None:
    """VLMEvalKit's `can_infer_text`: a reply (lower-cased, then measured: "İ" lower-cases to two characters) no
    longer than twice the options' total length that contains exactly one option's text (lower-cased) names it."""
    answer = answer.lower()
    if len(answer) > 2 * sum(len(o) for o in options):
        return None
    named = [LETTERS[i] for i, o in enumerate(options) if o.lower() in answer]
    return named[0] if len(named) == 1 else None


def vlmevalkit_infer(answer: str, options) -> str | None:
    """VLMEvalKit's `can_infer` (its exact-matching policy, no judge model): the option rule, else the text rule."""
    return vlmevalkit_option(answer, LETTERS[:len(options)]) or vlmevalkit_text(answer, options)


def vlmevalkit_generate(answer: str, item) -> Judged:
    """A reply the matcher reads as no option, or as "Z" (declined), is wrong and a format error, as VLMEvalKit's
    exact matching scores both ("Z": a miss). `chance` is VLMEvalKit's last resort after a judge model failed on
    an unread reply, a random choice among the option letters and "Z" (1 / (n + 1)); a declined reply never
    reaches the judge (0)."""
    letter = vlmevalkit_infer(answer, item.options)
    index = LETTERS.index(letter) if letter and letter != DECLINED else None
    judged = _choice_judged(index, item, len(item.options))
    chance = judged.chance if index is not None else (0.0 if letter == DECLINED else 1.0 / (len(item.options) + 1))
    return Judged(judged.score, judged.parsed, letter or "", chance)


# --- XM3600 captions --------------------------------------------------------------------------------------------
PTB_STEPS = {"jar": ptb_jar, "python": lambda captions: [" ".join(ptb.tokens(c)) for c in captions]}


def cider_judge(segment: bool, step: str):
    """CIDEr-D as pycocoevalcap's `Cider` scorer computes it (n = 4, sigma = 6, document frequencies over the
    run's references: one language) on the captions `prepare`d (segmented, NFC) and tokenised by the PTB `step`:
    the references in one call and the predictions in another, in item order, as the reference evaluation
    tokenises them; an item's score is its own CIDEr on that corpus."""
    def judge(arrays, items, context):
        from pycocoevalcap.cider.cider import Cider

        tokenise = PTB_STEPS[step]
        predictions = tokenise([prepare(a, it.lang, segment) for a, it in zip(answers_of(arrays), items)])
        references = tokenise([prepare(r, it.lang, segment) for it in items for r in it.references])
        gts, start = {}, 0
        for i, item in enumerate(items):
            gts[i], start = references[start:start + len(item.references)], start + len(item.references)
        res = {i: [p] for i, p in enumerate(predictions)}
        _, scores = Cider().compute_score(gts, res)
        return [Judged(float(s), None, res[i][0]) for i, s in enumerate(scores)]
    return judge


def cider_tools(segment: bool, step: str):
    """What a CIDEr rule runs with for a language (pycocoevalcap, the jar and Java, the segmenter's packages)."""
    def tools(lang: str) -> dict:
        try:
            out = {"pycocoevalcap": metadata.version("pycocoevalcap")}
            __import__("pycocoevalcap.cider.cider")
        except (ImportError, metadata.PackageNotFoundError):
            raise UsageError(f"CIDEr needs the pycocoevalcap package: {INSTALL}") from None
        out["ptb_step"] = {"jar": "pycocoevalcap PTBTokenizer (Java)", "python": "volta_ml.suite.ptb (Python)"}[step]
        if step == "jar":
            out.update(jar_versions())
        if segment:
            out.update(segmenter_versions(lang))
        return out
    return tools


# --- the rules of each task -------------------------------------------------------------------------------------
def _rule(name, kind, fn, describe, source, per_item=True):
    return Rule(name, kind, _per_item(fn) if per_item else fn, describe, source)


LETTER_RULE = Rule("letter", "letter", _letter_judge(), "next-token logits of the option letters after the lettered "
                   "question (the CVQA paper's letter rule); batch = one at a time", "CVQA paper, MMLU-style")
MAXM_RULES = {
    "exact": _rule("exact", "generate", maxm_exact,
                   "greedy answer, normalised (NFKC, lower case, punctuation removed; English: number words as "
                   "digits, articles dropped) equals one of the processed_answers or answers normalised the same way",
                   "MaXM release (processed_answers) and paper: exact-match accuracy"),
    "relaxed": _rule("relaxed", "generate", maxm_relaxed,
                     "normalised answer starts or ends with a normalised gold answer (relaxed accuracy)",
                     "mBLIP / Centurio / PangeaBench relaxed accuracy, on MaXM's normalisation"),
    "mblip": _rule("mblip", "generate", maxm_mblip, "answer stripped and lower-cased equals a processed_answer "
                   "stripped and lower-cased", "gregor-ge/mBLIP and Centurio vqa_maxm_classification_evaluation"),
    "pangea-exact": _rule("pangea-exact", "generate", maxm_pangea_exact,
                          "the answer as generated is one of the raw answers (no normalisation)",
                          "neulab/Pangea lmms-eval maxm exact_match"),
    "pangea-relaxed": _rule("pangea-relaxed", "generate", maxm_pangea_relaxed,
                            "VQA-cleaned answer starts or ends with a raw answer (stripped, true/false as yes/no, "
                            "never lower-cased)", "neulab/Pangea lmms-eval maxm relaxed_accuracy"),
}
MTVQA_RULES = {
    "mtvqa": _rule("mtvqa", "generate", mtvqa_official,
                   "the gold answer (stripped, lower-cased) is contained in the answer (stripped, lower-cased, "
                   "periods removed: from the answer only)", "bytedance/MTVQA scripts/acc.py"),
    "lmms-eval": _rule("lmms-eval", "generate", mtvqa_lmms_eval,
                       "containment with periods removed from both the gold answer and the answer",
                       "EvolvingLMMs-Lab/lmms-eval tasks/mtvqa"),
}
XMMMU_RULES = {
    "generate": _rule("generate", "generate", mmmu_generate,
                      "greedy answer parsed by MMMU's rules (multiple choice: bracketed letter, letter, option text; "
                      "open: key phrases and numbers); an unparsed choice is wrong (no random letter)",
                      "MMMU eval_utils as PangeaBench's xMMMU runs it, without the random fallback"),
    "letter": Rule("letter", "letter", _letter_judge(mmmu_open), LETTER_RULE.describe + "; open questions: greedy "
                   "answer, MMMU's open-answer rule", LETTER_RULE.source),
}
M3EXAM_RULES = {
    "generate": _rule("generate", "generate", m3exam_official,
                      "greedy answer's first character (second after '('), equal to the gold option's letter; "
                      "answers longer than one character are counted as ill-formatted",
                      "DAMO-NLP-SG/M3Exam eval.py"),
    "letter": LETTER_RULE,
    "pangea": _rule("pangea", "generate", m3exam_pangea,
                    "PangeaBench's parser (letters A-D only, any case, then option similarity > 0.7); unparsed is "
                    "wrong instead of a random letter", "neulab/Pangea lmms-eval m3exam"),
}
KALEIDOSCOPE_RULES = {
    "generate": _rule("generate", "generate", kaleidoscope_generate,
                      "greedy answer to the direct prompt, {\"choice\": X} (or a one-letter reply) read as one of "
                      "the question's option letters", "Kaleidoscope paper, direct regime"),
    "letter": LETTER_RULE,
    "reference": _rule("reference", "generate", kaleidoscope_reference,
                       "the reference format_answer.py first pass: one-line {\"choice\": X} or a one-character reply, "
                       "A-D only", "israfelsr/kaleidoscope dataset/answer_formating.py"),
}
VLMEVALKIT_RULES = {
    "vlmevalkit": _rule("vlmevalkit", "generate", vlmevalkit_generate,
                        "greedy answer matched by VLMEvalKit's exact-matching rules (one option letter among the "
                        "reply's last tokens, \"answer is X\", or the one option whose text a short reply contains); "
                        "unmatched or declined answers are wrong and counted as format errors (VLMEvalKit's "
                        "GPT judge fallback needs an API: not run)",
                        "open-compass/VLMEvalKit vlmeval/utils/matching_util.py can_infer, "
                        "dataset/utils/multiple_choice.py (judge model exact_matching), read at commit e8e78f0"),
    "letter": LETTER_RULE,
}
CIDER_SOURCE = "XM3600 paper; mBLIP / Centurio caption_evaluation (spaCy segmentation, pycocoevalcap PTBTokenizer, Cider)"
CIDER_RULES = {
    "cider": Rule("cider", "generate", cider_judge(True, "jar"),
                  "CIDEr-D (pycocoevalcap Cider) of the greedy caption against the language's references; zh / ja / th "
                  "segmented into words as spaCy does (characters / SudachiPy mode A / PyThaiNLP newmm), NFC, "
                  "pycocoevalcap's PTBTokenizer (the CoreNLP jar); corpus = this language", CIDER_SOURCE,
                  tools=cider_tools(True, "jar")),
    "cider-pyptb": Rule("cider-pyptb", "generate", cider_judge(True, "python"),
                        "as cider, the PTB tokenizer's step done in Python (no Java; docs/suite.md lists where its "
                        "tokens differ from the jar's)", CIDER_SOURCE + "; PTB step re-implemented",
                        tools=cider_tools(True, "python")),
    "cider-nosegment": Rule("cider-nosegment", "generate", cider_judge(False, "jar"),
                            "CIDEr-D without word segmentation of zh / ja / th (what PangeaBench's xm100 scores: its "
                            "segmented words are joined back without spaces), pycocoevalcap's PTBTokenizer",
                            "neulab/Pangea lmms-eval xm100", tools=cider_tools(False, "jar")),
}
