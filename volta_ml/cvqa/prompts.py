"""The texts CVQA questions are scored with, and their tokenisation with the option protected from truncation.

Conditions are EN / LOC (English translation or local-language question and options) x location-aware /
location-agnostic (with or without the `Location: {country}.` sentence). The `paper` templates are the CVQA
paper's prompts; an image-text matching model sees one text per option, so `{options}` holds that one option:

    aware:    Location: {country}. Question: {question} Options: {option} Short Answer:
    agnostic: Question: {question} Options: {option} Short Answer:

The `plain` templates are the paper's CLIP protocol ("question + option"). Each text is a head (location and
question) and a tail (the option with its frame); truncation shortens the head only, so the option survives.
Changing a template changes results: bump PROMPTS_VERSION (it is written into every result file).

Generative models (`mllm` backend) see one prompt per question, the paper's text as the user turn (rendered
through the model's chat template by the backend). The `letter` rule lists the lettered options on the paper's
one line (`Options: A. x B. y C. z D. w Short Answer:`) and reads the next-token logits of A-D; the `generate`
rule asks the same text and parses the greedy answer; the `open` rule leaves the options out and scores each
option's full answer text as the continuation. `LETTER_LAYOUTS["lines"]` (one lettered option per line, this
project's layout before prompts v2) is a named variant, never the default. Changing these: bump
GENERATIVE_PROMPTS_VERSION (v2: the paper's one-line options, the natural letter token, continuations scored
as the tokens prompt + option adds after the prompt).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from volta_ml.engine.failures import UsageError

from .data import CVQAQuestion

PROMPTS_VERSION = "cvqa-prompts-v1"
CONDITIONS = ("en-aware", "en-agnostic", "loc-aware", "loc-agnostic")
TEMPLATES = {
    "paper": {
        "aware": ("Location: {country}. Question: {question}", "Options: {option} Short Answer:"),
        "agnostic": ("Question: {question}", "Options: {option} Short Answer:"),
    },
    "plain": {
        "aware": ("Location: {country}. {question}", "{option}"),
        "agnostic": ("{question}", "{option}"),
    },
}

GENERATIVE_PROMPTS_VERSION = "cvqa-mllm-prompts-v2"
LETTERS = ("A", "B", "C", "D")
LETTER_TEMPLATE = {
    "aware": "Location: {country}. Question: {question} Options: {options} Short Answer:",
    "agnostic": "Question: {question} Options: {options} Short Answer:",
}
GENERATIVE_TEMPLATES = {
    "letter": LETTER_TEMPLATE,
    "generate": LETTER_TEMPLATE,       # the same question, scored by parsing the greedy answer
    "open": {
        "aware": "Location: {country}. Question: {question} Short Answer:",
        "agnostic": "Question: {question} Short Answer:",
    },
}
OPEN_ANSWER = " {option}"   # the continuation scored for each option under the `open` rule
# how the lettered options are laid out in `{options}`: the paper's one line (default) or one per line
LETTER_LAYOUTS = {"paper": ("{options}", " "), "lines": ("\n{options}\n", "\n")}


def parse_condition(condition: str) -> tuple[str, str]:
    """`"loc-aware"` -> ("loc", "aware")."""
    if condition not in CONDITIONS:
        raise ValueError(f"unknown CVQA condition {condition!r}; known: {', '.join(CONDITIONS)}")
    language, location = condition.split("-")
    return language, location


def option_texts(question: CVQAQuestion, condition: str, template: str = "paper") -> list[tuple[str, str]]:
    """The four (head, tail) text pieces of `question` under `condition`; the full text is `head + " " + tail`."""
    _, location = parse_condition(condition)
    if template not in TEMPLATES:
        raise ValueError(f"unknown CVQA template set {template!r}; known: {', '.join(TEMPLATES)}")
    head_format, tail_format = TEMPLATES[template][location]
    text, options = question_and_options(question, condition)
    head = head_format.format(country=question.country, question=text)
    return [(head, tail_format.format(option=option)) for option in options]


def question_and_options(question: CVQAQuestion, condition: str) -> tuple[str, tuple[str, ...]]:
    """The question text and its 4 options in the condition's language (EN: the translations)."""
    language, _ = parse_condition(condition)
    return (question.question_en, question.options_en) if language == "en" else (question.question, question.options)


def generative_prompt(question: CVQAQuestion, condition: str, rule: str, layout: str = "paper") -> str:
    """The user turn a generative model sees for `question` (the chat template is applied by the backend);
    `layout` places the lettered options (LETTER_LAYOUTS: paper = one line, lines = one per line)."""
    if rule not in GENERATIVE_TEMPLATES:
        raise ValueError(f"unknown CVQA rule {rule!r}; known: {', '.join(GENERATIVE_TEMPLATES)}")
    if layout not in LETTER_LAYOUTS:
        raise ValueError(f"unknown letter layout {layout!r}; known: {', '.join(LETTER_LAYOUTS)}")
    _, location = parse_condition(condition)
    text, options = question_and_options(question, condition)
    frame, sep = LETTER_LAYOUTS[layout]
    lettered = frame.format(options=sep.join(f"{letter}. {option}" for letter, option in zip(LETTERS, options)))
    template = GENERATIVE_TEMPLATES[rule][location].replace(" {options} ", "{options}" if layout == "lines"
                                                            else " {options} ")
    return template.format(country=question.country, question=text, options=lettered)


def open_answers(question: CVQAQuestion, condition: str) -> list[str]:
    """The 4 continuations the `open` rule scores, index-aligned with the options."""
    return [OPEN_ANSWER.format(option=option) for option in question_and_options(question, condition)[1]]


def full_texts(question: CVQAQuestion, condition: str, template: str = "paper") -> list[str]:
    return [f"{head} {tail}" for head, tail in option_texts(question, condition, template)]


@dataclass
class EncodedTexts:
    ids: np.ndarray           # [N, max_len] int64, padded with the tokenizer's pad id
    lengths: np.ndarray       # [N] real lengths (special tokens included)
    head_cut: np.ndarray      # [N] bool: the question (head) lost tokens to truncation
    option_cut: np.ndarray    # [N] bool: even the option (tail) did not fit
    unk: np.ndarray           # [N] number of unknown-token ids


def special_tokens_around(tokenizer) -> tuple[list[int], list[int]]:
    """The ids the tokenizer puts before and after one sequence (`[CLS]`/`[SEP]`, `<s>`/`</s>`)."""
    probe = "a"
    plain = tokenizer(probe, add_special_tokens=False)["input_ids"]
    full = tokenizer(probe, add_special_tokens=True)["input_ids"]
    for i in range(len(full) - len(plain) + 1):
        if full[i:i + len(plain)] == plain:
            return list(full[:i]), list(full[i + len(plain):])
    raise ValueError(f"cannot tell where {type(tokenizer).__name__} puts its special tokens")


def encode_option_texts(tokenizer, pieces: list[tuple[str, str]], max_len: int) -> EncodedTexts:
    """Tokenise (head, tail) pairs into `[CLS] head tail [SEP]` (or the tokenizer's own special tokens) of at
    most `max_len` ids, dropping tokens from the end of the head first."""
    prefix, suffix = special_tokens_around(tokenizer)
    budget = max_len - len(prefix) - len(suffix)
    if budget < 1:
        raise UsageError(f"--max_seq_length {max_len} leaves no room for text")
    heads = tokenizer([h for h, _ in pieces], add_special_tokens=False)["input_ids"]
    tails = tokenizer([t for _, t in pieces], add_special_tokens=False)["input_ids"]
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    unk_id = tokenizer.unk_token_id
    n = len(pieces)
    out = EncodedTexts(np.full((n, max_len), pad, dtype=np.int64), np.zeros(n, dtype=np.int64),
                       np.zeros(n, dtype=bool), np.zeros(n, dtype=bool), np.zeros(n, dtype=np.int64))
    for i, (head, tail) in enumerate(zip(heads, tails)):
        if len(tail) > budget:
            out.option_cut[i] = True
            tail = tail[:budget]
        keep = budget - len(tail)
        out.head_cut[i] = len(head) > keep
        row = prefix + list(head[:keep]) + list(tail) + suffix
        out.ids[i, :len(row)] = row
        out.lengths[i] = len(row)
        if unk_id is not None:
            out.unk[i] = sum(1 for t in row if t == unk_id)
    return out
