"""Scoring rules for generative backends on XVNLI, xGQA and MaRVL: one table entry per (task, rule).

A rule turns a batch of examples (their images and user turns) into arrays (`score`), and the arrays of all
examples into predictions (`predict`); accuracy = 100 * mean(prediction == gold label). Arrays rather than
predictions are what is saved per chunk, so a resumed or sharded run predicts from the same numbers.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Callable

import numpy as np

from volta_ml.stats import truncation

from volta_ml.engine.failures import UsageError

from .prompts import OPTIONS, letter_choices

ARTICLES = re.compile(r"^(a|an|the)\s+")
EDGE_PUNCTUATION = ".,!?;:\"'`()[]{}"


def normalise_answer(text: str) -> str:
    """GQA-style answer normalisation of a generated answer: the first line, lower case, surrounding
    punctuation and whitespace removed, a leading article dropped, inner whitespace collapsed
    ("The red car." -> "red car"). GQA's answers are lower-case words or short phrases without articles."""
    line = (text.strip().splitlines() or [""])[0].lower().strip().strip(EDGE_PUNCTUATION).strip()
    return " ".join(ARTICLES.sub("", line).split())


@dataclass(frozen=True)
class Rule:
    name: str
    score: Callable          # (backend, images, prompts, context) -> dict[str, np.ndarray]
    predict: Callable        # (arrays, context) -> list[str]
    describe: str


def _letter_score(task):
    def score(backend, images, prompts, context):
        logits = backend.choice_logits(images, prompts, letter_choices(task))
        return {"scores": logits.float().numpy()}
    return score


def answer_continuations(words) -> list[str]:
    """The answer words as continuations of the rendered prompt: with the leading space a reply starts with
    (the backend tokenises continuations alone; SentencePiece models read the space as the word boundary)."""
    return [" " + w for w in words]


def _likelihood_score(task):
    def score(backend, images, prompts, context):
        continuations = answer_continuations(OPTIONS[task])
        sums, counts = backend.continuation_logprobs(images, prompts, [continuations] * len(prompts))
        return {"scores": sums.float().numpy(), "tokens": counts.numpy().astype(np.int64)}
    return score


def _argmax_options(task):
    def predict(arrays, context):
        return [OPTIONS[task][i] for i in np.argmax(arrays["scores"], axis=1).tolist()]
    return predict


def _generate_score(backend, images, prompts, context):
    answers = backend.generate(images, prompts, context["max_new_tokens"])
    return {"answers": np.array(answers, dtype=str), "truncated": truncation(answers)}


def _generate_predict(arrays, context):
    return [normalise_answer(a) for a in arrays["answers"].tolist()]


def _closed_score(backend, images, prompts, context):
    vocabulary = answer_continuations(context["vocabulary"])
    sums, _ = backend.continuation_logprobs(images, prompts, [vocabulary] * len(prompts))
    sums = sums.float().numpy()
    best = np.argmax(sums, axis=1)
    return {"best": best.astype(np.int64), "best_logprob": sums[np.arange(len(best)), best]}


def _closed_predict(arrays, context):
    return [context["vocabulary"][i] for i in arrays["best"].tolist()]


def _parsed_predict(task):
    """The label a generated answer names (its letter or a label word); "" when it names none (counted wrong)."""
    def predict(arrays, context):
        from volta_ml.hf.mllm import parse_choice
        out = []
        for answer in arrays["answers"].tolist():
            choice = parse_choice(answer, letter_choices(task), OPTIONS[task])
            out.append("" if choice is None else OPTIONS[task][choice])
        return out
    return predict


def _choice_rules(task: str) -> dict[str, Rule]:
    labels = ", ".join(OPTIONS[task])
    return {
        "generate": Rule("generate", _generate_score, _parsed_predict(task),
                         f"greedy answer to the letter prompt, parsed to a letter or a label word ({labels}); "
                         "unparsed answers count wrong (parse_failure_rate)"),
        "letter": Rule("letter", _letter_score(task), _argmax_options(task),
                       f"next-token logits of the option letters {', '.join(letter_choices(task))} ({labels})"),
        "likelihood": Rule("likelihood", _likelihood_score(task), _argmax_options(task),
                           f"sum of log-probabilities of the label words ({labels}) after a space"),
    }


RULES: dict[str, dict[str, Rule]] = {
    "xvnli": _choice_rules("xvnli"),
    "marvl": _choice_rules("marvl"),
    "xgqa": {
        "generate": Rule("generate", _generate_score, _generate_predict,
                         "greedy short answer, GQA-normalised, exact match"),
        "closed": Rule("closed", _closed_score, _closed_predict,
                       "GQA answer vocabulary ranked by the sum of log-probabilities"),
    },
}
DEFAULT_RULES = {"xvnli": "letter", "marvl": "letter", "xgqa": "generate", "xflickrco": "embedding",
                 "wit": "embedding"}


def get_rule(task: str, rule: str) -> Rule:
    if task not in RULES:
        raise UsageError(f"task {task!r} is not scored by a generative rule")
    if rule not in RULES[task]:
        raise UsageError(f"--rule {rule!r} does not apply to {task}; known: {', '.join(RULES[task])}")
    return RULES[task][rule]


def accuracy(predictions: list[str], gold: list[str]) -> float:
    """100 * share of exact matches (a gold label `-` never matches, as VOLTA counts it wrong)."""
    if not gold:
        return 0.0
    return 100.0 * sum(p == g for p, g in zip(predictions, gold)) / len(gold)
