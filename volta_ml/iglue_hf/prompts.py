"""The user turns IGLUE examples are asked with, per task and scoring rule (versioned: results depend on them).

The backend renders each through the model's chat template with the image tokens in place (`render`); a model
without a chat template gets the backend's documented fallback (see docs/hf_models.md), and the rendered text
of the first example is written into every result file, so what the model saw is on record.

Rules:
- `letter`: the options are listed as letters and the next-token logits of the letters decide.
- `likelihood`: the sum of log-probabilities of each label word as the answer decides.
- `generate` (xGQA): greedy short answer, normalised and matched exactly against the GQA answer;
  (XVNLI, MaRVL): the letter prompt, the greedy answer parsed to a letter or matched to a label word, as
  generation-based harnesses score multiple choice (the parse-failure rate is reported beside the accuracy).
- `closed` (xGQA): the GQA answer vocabulary ranked by the likelihood of each answer (for models that ramble).
- `embedding` (retrieval): no prompt; the caption itself is embedded.
A backend may carry `vqa_frame`, the frame its family's paper used for short-answer VQA; xGQA's user turn is then
that frame around the question instead of the instruction above (BLIP-2 and InstructBLIP, whose LMs were not
instruction-tuned on it: "Question: {} Answer:" for decoder-only LMs (OPT, BLOOM), "Question: {} Short answer:"
for T5 LMs, BLIP-2 paper §4.1, "Zero-shot VQA").
Changing any text here changes results: bump PROMPTS_VERSION (v2: the BLIP-family VQA frames).
"""
from __future__ import annotations

from volta_ml.engine.failures import UsageError

from .data import Example

PROMPTS_VERSION = "iglue-hf-prompts-v2"

XVNLI_LABELS = ("entailment", "neutral", "contradiction")
MARVL_LABELS = ("true", "false")
LETTERS = "ABCDEFGHIJ"

TEMPLATES = {
    ("xvnli", "letter"): (
        "Statement: {text}\n"
        "Does the image show that the statement is true, false, or can it not be told?\n"
        "A. entailment (the image shows it is true)\n"
        "B. neutral (it cannot be told from the image)\n"
        "C. contradiction (the image shows it is false)\n"
        "Answer with the option's letter from the given choices directly."),
    ("xvnli", "likelihood"): (
        "Statement: {text}\n"
        "Is the statement entailed by the image, contradicted by it, or neutral? "
        "Answer with one word: entailment, neutral or contradiction."),
    ("xgqa", "generate"): "{text}\nAnswer the question using a single word or phrase.",
    ("xgqa", "closed"): "{text}\nAnswer the question using a single word or phrase.",
    ("marvl", "letter"): (
        "{layout}\nStatement: {text}\nIs the statement true or false for the two pictures?\n"
        "A. true\nB. false\nAnswer with the option's letter from the given choices directly."),
    ("marvl", "likelihood"): (
        "{layout}\nStatement: {text}\nIs the statement true or false for the two pictures? "
        "Answer with one word: true or false."),
}
TEMPLATES[("xvnli", "generate")] = TEMPLATES[("xvnli", "letter")]
TEMPLATES[("marvl", "generate")] = TEMPLATES[("marvl", "letter")]
MARVL_LAYOUTS = {
    "canvas": "The image shows two pictures side by side: the left picture and the right picture.",
    "multi": "The first image is the left picture and the second image is the right picture.",
}
OPTIONS = {"xvnli": XVNLI_LABELS, "marvl": MARVL_LABELS}


def user_turn(task: str, rule: str, example: Example, layout: str | None = None, vqa_frame: str | None = None) -> str:
    """The user turn for `example` (MaRVL also needs the image `layout`: canvas | multi; xGQA takes the model
    family's `vqa_frame`, e.g. "Question: {} Answer:", when it has one)."""
    if task == "xgqa" and vqa_frame and (task, rule) in TEMPLATES:
        return vqa_frame.format(example.text)
    try:
        template = TEMPLATES[(task, rule)]
    except KeyError:
        known = sorted(r for t, r in TEMPLATES if t == task)
        raise UsageError(f"no prompt for task {task!r} with rule {rule!r}; known rules: {', '.join(known)}") from None
    return template.format(text=example.text, layout=MARVL_LAYOUTS.get(layout or "", ""))


def letter_choices(task: str) -> list[str]:
    """The letters of `task`'s options, in the order of `OPTIONS[task]`."""
    return list(LETTERS[:len(OPTIONS[task])])
