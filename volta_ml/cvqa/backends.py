"""CVQA scoring backends: one interface, one table.

A scorer turns a batch of questions (with their decoded photos) into per-option scores under one prompt
condition; higher is better and the prediction is the best option (ties to the lowest index, `report.predict`):

    scorer.score(questions, photos, condition, blind) -> {"score": [N, 4] float64, <variant>: [N, 4], ...}

`photos` maps image id -> `PIL.Image` (RGB), or None for a photo that failed to decode (scored like the blind
control, as the zoo path scores a photo missing from its feature store). `blind=True` is the text-only control:
every image is None (the backend's blank image / no image). The backends:

- `zoo`: a VOLTA-zoo checkpoint's matching head over region features (`zoo.py`, run by `run.py`).
- `clip` / `mclip`: a dual encoder (`volta_ml.hf`); each photo is embedded once per batch for every condition,
  the 4 "question + option" texts of a question are embedded together, score = cosine similarity.
- `mllm`: a generative model (`volta_ml.hf`), rule `letter` (the paper's MMLU-style prompt with the lettered
  options on one line; score = next-token logit of the letter token the model writes as its answer, one forward
  per question; `letter_spellings="all"`: logsumexp over the letter's single-token spellings; `letter_layout=
  "lines"`: the options one per line, a named variant recorded in `template`), `open` (no options in the
  prompt; score = total log-probability of the option's full text; variant `length_normalised` = per token) or
  `generate` (the letter prompt, greedy answer parsed to a letter or matched to an option text, as
  generation-based harnesses score multiple choice; score = one-hot of the parsed option, all zeros when the
  answer names none; `parse_failed` [N, 4] (1 = unparsed) gives the parse-failure rate beside the accuracy).
- `import`: predictions made elsewhere (GPT-4o, Gemini, ...) as a CSV `ID,Prediction`; score = one-hot (an empty
  Prediction: all zeros and `parse_failed`, as an unparsed generated answer).
"""
from __future__ import annotations

import csv
import hashlib
import io
from pathlib import Path
from typing import Protocol, Sequence

import numpy as np
import torch

from volta_ml.engine.failures import UsageError
from volta_ml.stats import truncation
from volta_ml.hf.base import engine_record

from .data import CVQAQuestion
from .prompts import (GENERATIVE_PROMPTS_VERSION, LETTERS, PROMPTS_VERSION, full_texts, generative_prompt,
                      open_answers, question_and_options)

NUM_OPTIONS = 4
BACKENDS = {
    "zoo": "a VOLTA-zoo checkpoint's image-text matching head over region features (--checkpoint, --features)",
    "clip": "a transformers CLIP-family dual encoder (CLIP, SigLIP): cosine of image and 'question + option'",
    "mclip": "M-CLIP: XLM-R text tower + projection, with the OpenAI CLIP image tower it was trained against",
    "mllm": "a generative image-text model (docs/hf_backends.md lists the tested families): --rule letter | open | "
            "generate",
    "vllm": "the mllm rules (same prompts) run by vLLM's offline engine (docs/engines.md); --tensor_parallel_size",
    "openai": "a model behind an OpenAI-compatible chat-completions server (--base_url; docs/serving.md): --rule "
              "letter (the server's top_logprobs) | generate",
    "import": "predictions made elsewhere: --predictions CONDITION=ID,Prediction CSV",
}
RULES = ("letter", "open", "generate")
GENERATE_TOKENS = 10                  # greedy tokens of the `generate` rule's answer


class CVQAScorer(Protocol):
    backend: str
    needs_images: bool

    def header(self) -> dict:
        """model, model_revision, rule, dtype, score_convention, template, prompts_version (result files)."""

    def rendered_prompt(self, question: CVQAQuestion, condition: str) -> str:
        """The exact text the model sees for `question` (recorded for the first question of each condition)."""

    def score(self, questions: Sequence[CVQAQuestion], photos: dict, condition: str, blind: bool) -> dict:
        """{"score": [N, 4] float64, optional variants}: higher = better option."""


def _spec_header(backend) -> dict:
    """The model's settings, and `loading_report`: the tensors its weights lacked or added, accepted by
    --allow-missing-keys (empty for a complete checkpoint; an incomplete one is refused without the flag)."""
    from volta_ml.hf.loading import loading_report

    spec = backend.spec
    engine = {"engine": backend.engine} if getattr(backend, "engine", None) else {}   # vllm: engine, version, options
    return {"model": spec.model, "model_revision": spec.revision, "dtype": spec.dtype,
            "device_map": spec.device_map, "loading_report": loading_report(backend), **engine}


class DualEncoderScorer:
    """Cosine similarity of the image embedding with each "question + option" text embedding."""
    needs_images = True

    def __init__(self, encoder, backend: str, template: str = "plain"):
        self.encoder, self.backend, self.template = encoder, backend, template
        self._photos: dict | None = None
        self._image_rows: dict[str, torch.Tensor] = {}
        self._blank: torch.Tensor | None = None

    def header(self) -> dict:
        return {**_spec_header(self.encoder), "rule": None, "template": self.template,
                "prompts_version": PROMPTS_VERSION, "score_convention": "cosine(image, question + option)"}

    def rendered_prompt(self, question: CVQAQuestion, condition: str) -> str:
        return "\n".join(full_texts(question, condition, self.template))

    def _image_embeddings(self, questions, photos: dict, blind: bool) -> torch.Tensor:
        if blind:
            if self._blank is None:
                self._blank = self.encoder.embed_images([None])[0]
            return self._blank.expand(len(questions), -1)
        if photos is not self._photos:   # a new batch of photos: embed each one once, reused by every condition
            ids = list(dict.fromkeys(q.image_id for q in questions))
            self._image_rows = dict(zip(ids, self.encoder.embed_images([photos.get(i) for i in ids])))
            self._photos = photos
        return torch.stack([self._image_rows[q.image_id] for q in questions])

    def score(self, questions, photos, condition, blind=False) -> dict:
        images = self._image_embeddings(questions, photos, blind)
        texts = self.encoder.embed_texts([t for q in questions for t in full_texts(q, condition, self.template)])
        scores = (texts.view(len(questions), NUM_OPTIONS, -1) * images[:, None, :]).sum(-1)
        return {"score": scores.double().numpy()}


class GenerativeScorer:
    """The paper's rules for generative models: `letter` (next-token logits of A-D) or `open` (answer log-prob);
    and `generate` (the greedy answer parsed to an option)."""
    needs_images = True

    def __init__(self, model, rule: str, layout: str = "paper", backend: str = "mllm"):
        if rule not in RULES:
            raise UsageError(f"--rule {rule!r}: known rules: {', '.join(RULES)}")
        self.model, self.rule, self.backend, self.layout = model, rule, backend, layout

    def header(self) -> dict:
        spellings = getattr(self.model, "letter_spellings", "natural")
        convention = {
            "letter": "next-token logit of the letter token the model writes as its answer" if spellings == "natural"
            else "logsumexp of the next-token logits of every single-token spelling of the letter",
            "open": "total log-probability of the option text (variant length_normalised: per token)",
            "generate": f"greedy answer ({GENERATE_TOKENS} tokens) parsed to a letter or an option text (one-hot; "
                        "parse_failed marks the unparsed)"}[self.rule]
        convention = getattr(self.model, "score_conventions", {}).get(self.rule, convention)   # a server's own
        template = self.rule if self.layout == "paper" or self.rule == "open" else f"{self.rule}-{self.layout}"
        return {**_spec_header(self.model), "rule": self.rule, "template": template,
                "letter_spellings": spellings if self.rule == "letter" else None,
                "template_options": dict(getattr(self.model, "template_options", {})),
                "prompts_version": GENERATIVE_PROMPTS_VERSION, "score_convention": convention,
                "engine": engine_record(self.model)}

    def _prompt(self, question: CVQAQuestion, condition: str) -> str:
        return generative_prompt(question, condition, self.rule, self.layout)

    def rendered_prompt(self, question: CVQAQuestion, condition: str) -> str:
        return self.model.render(self._prompt(question, condition), 1)

    def score(self, questions, photos, condition, blind=False) -> dict:
        from volta_ml.hf.base import ChoiceTokenError

        images = [[None if blind else photos.get(q.image_id)] for q in questions]
        prompts = [self._prompt(q, condition) for q in questions]
        if self.rule == "generate":
            return self._generated(questions, images, prompts, condition)
        if self.rule == "letter":
            try:
                logits = self.model.choice_logits(images, prompts, LETTERS)
            except ChoiceTokenError as err:
                if "--rule open" in str(err):
                    raise
                raise ChoiceTokenError(f"{err}; score this model with --rule open (full option text)") from None
            return {"score": logits.double().numpy()}
        sums, counts = self.model.continuation_logprobs(images, prompts, [open_answers(q, condition)
                                                                          for q in questions])
        sums = sums.double()
        return {"score": sums.numpy(), "length_normalised": (sums / counts.double().clamp(min=1)).numpy()}

    def _generated(self, questions, images, prompts, condition) -> dict:
        from volta_ml.hf.mllm import parse_choice

        answers = self.model.generate(images, prompts, GENERATE_TOKENS)
        scores, failed = np.zeros((len(questions), NUM_OPTIONS)), np.zeros((len(questions), NUM_OPTIONS))
        for i, (q, answer) in enumerate(zip(questions, answers)):
            choice = parse_choice(answer, LETTERS, question_and_options(q, condition)[1])
            if choice is None:
                failed[i] = 1.0
            else:
                scores[i, choice] = 1.0
        cut = np.repeat(truncation(answers)[:, None], NUM_OPTIONS, axis=1)    # the flag in every column, as above
        return {"score": scores, "parse_failed": failed, "truncated": cut}


class ImportedPredictions:
    """Predictions made elsewhere, one CSV `ID,Prediction` (option index 0-3) per condition. An empty Prediction is
    what the other harness produced (an answer that named no option): it predicts nothing and counts as wrong, as
    the generate rule's unparsed answers (`parse_failed` of that condition; `empty_predictions` in the header)."""
    needs_images = False
    backend = "import"

    def __init__(self, files: dict[str, str], questions: Sequence[CVQAQuestion], strict_ids: bool = True):
        known = {q.id for q in questions}
        self.files = {c: str(p) for c, p in files.items()}
        self.predictions = {c: read_predictions(p, known, strict_ids) for c, p in files.items()}
        order = {q.id: i for i, q in enumerate(questions)}
        self.empty = {c: sorted((qid for qid, value in table.items() if value is None), key=order.get)
                      for c, table in self.predictions.items()}
        digest = hashlib.sha1()
        for condition in sorted(files):
            digest.update(condition.encode() + Path(files[condition]).read_bytes())
        self.digest = digest.hexdigest()[:16]

    def header(self) -> dict:
        return {"model": ",".join(Path(p).stem for p in dict.fromkeys(self.files.values())),
                "model_revision": f"sha1:{self.digest}", "dtype": None, "device_map": None, "rule": None,
                "template": None, "prompts_version": None, "score_convention": "imported prediction (one-hot)",
                "prediction_files": self.files,
                "empty_predictions": {c: len(empty) for c, empty in self.empty.items()}}

    def empty_lines(self, results: str) -> list[str]:
        """One stderr line per condition whose file has empty predictions."""
        return [f"CVQA: {len(empty)} of {len(self.predictions[c])} imported predictions are empty in {self.files[c]} "
                f"(first ID {empty[0]!r}); counted wrong, as answers that named no option (Prediction -1, "
                f"parse_failure_rate), and in {results} (empty_predictions)" for c, empty in self.empty.items() if empty]

    def rendered_prompt(self, question: CVQAQuestion, condition: str) -> str:
        return f"(imported from {self.files[condition]})"

    def score(self, questions, photos, condition, blind=False) -> dict:
        if blind:
            raise UsageError("the import backend has no text-only control; run it with --no-text-only")
        if condition not in self.predictions:
            raise UsageError(f"--predictions has no file for condition {condition!r} "
                             f"(given: {', '.join(self.predictions)})")
        table = self.predictions[condition]
        missing = [q.id for q in questions if q.id not in table]
        if missing:
            raise UsageError(f"{self.files[condition]}: no prediction for {len(missing)} question(s), "
                             f"first ID {missing[0]!r}")
        scores = np.zeros((len(questions), NUM_OPTIONS))
        named = [(i, table[q.id]) for i, q in enumerate(questions) if table[q.id] is not None]
        if named:
            rows, options = zip(*named)
            scores[list(rows), list(options)] = 1.0
        if not self.empty[condition]:
            return {"score": scores}
        failed = np.zeros((len(questions), NUM_OPTIONS))   # every chunk of this condition has the column
        failed[[i for i, q in enumerate(questions) if table[q.id] is None]] = 1.0
        return {"score": scores, "parse_failed": failed}


def read_predictions(path: str, known_ids: set[str], strict_ids: bool = True) -> dict[str, int | None]:
    """`ID,Prediction` rows -> {ID: option index, or None for an empty Prediction}; a bad row is a one-line error
    naming the file and line (a file that is not UTF-8: the byte offset, `data.annotations.read_text`)."""
    from volta_ml.data.annotations import read_text

    if not Path(path).is_file():
        raise FileNotFoundError(f"--predictions {path}: no such file")
    out: dict[str, int | None] = {}
    reader = csv.reader(io.StringIO(read_text(path, "prediction file"), newline=""))
    try:
        header = [h.strip() for h in next(reader, [])]
        if header[:2] != ["ID", "Prediction"]:
            raise UsageError(f"{path} line 1: expected the header ID,Prediction, got {','.join(header)!r}")
        for line, row in enumerate(reader, start=2):
            if not row:
                continue
            qid, value = (row + [""])[:2]
            qid, value = qid.strip(), value.strip()
            if qid not in known_ids:
                if strict_ids:
                    raise UsageError(f"{path} line {line}: unknown ID {qid!r} (not a question of this release)")
                continue
            if value not in ("", "0", "1", "2", "3"):
                raise UsageError(f"{path} line {line}: Prediction {value!r} for ID {qid!r} is not an option "
                                 "index 0-3 (or empty: no answer)")
            if qid in out:
                raise UsageError(f"{path} line {line}: ID {qid!r} appears twice")
            out[qid] = int(value) if value else None
    except csv.Error as err:
        raise UsageError(f"{path} line {reader.line_num}: not CSV ({err})") from None
    return out


def parse_prediction_files(values: Sequence[str], conditions: Sequence[str]) -> dict[str, str]:
    """`--predictions CONDITION=PATH ...`, or one bare PATH when one condition is scored."""
    files = {}
    for value in values:
        condition, sep, path = value.partition("=")
        if not sep:
            if len(conditions) != 1:
                raise UsageError(f"--predictions {value}: name the condition (CONDITION=PATH) when scoring "
                                 f"{len(conditions)} conditions")
            condition, path = conditions[0], value
        if condition not in conditions:
            raise UsageError(f"--predictions {value}: condition {condition!r} is not among --conditions "
                             f"{' '.join(conditions)}")
        files[condition] = path
    missing = [c for c in conditions if c not in files]
    if missing:
        raise UsageError(f"--predictions: no file for condition(s) {', '.join(missing)}")
    return files


def _dual_encoder(model, args: dict) -> CVQAScorer:
    return DualEncoderScorer(model, args["backend"], args["template"] or "plain")


def _generative(model, args: dict) -> CVQAScorer:
    return GenerativeScorer(model, args["rule"], args.get("letter_layout") or "paper", args["backend"])


BUILDERS = {"clip": _dual_encoder, "mclip": _dual_encoder, "mllm": _generative, "vllm": _generative,   # hf kinds
            "openai": _generative}


def build_scorer(args: dict, questions: Sequence[CVQAQuestion], device: str) -> CVQAScorer:
    """The scorer for `args["backend"]` (any key of BACKENDS except `zoo`, which `run.run_cvqa` runs)."""
    backend = args["backend"]
    if backend == "import":
        return ImportedPredictions(parse_prediction_files(args["predictions"] or [], args["conditions"]),
                                   questions, strict_ids=args["limit"] is None)
    if backend not in BUILDERS:
        raise UsageError(f"unknown CVQA backend {backend!r}; supported: {', '.join(BACKENDS)}")
    if not args.get("model"):
        raise UsageError(f"--backend {backend} needs --model (a local folder or a hub id)")
    from volta_ml.hf import GENERATIVE, load_backend
    from volta_ml.hf.base import ModelSpec, fold_engine_flags

    extra = {**(args.get("extra") or {}), **{key: args[key] for key in ("image_model", "text_base") if args.get(key)}}
    if backend in GENERATIVE and args.get("letter_spellings"):
        extra["letter_spellings"] = args["letter_spellings"]
    if args.get("enable_thinking") is not None:
        if backend not in GENERATIVE:
            raise UsageError(f"--enable_thinking: only the mllm / vllm backends have a chat template (got --backend {backend})")
        extra["enable_thinking"] = args["enable_thinking"]
    if args.get("adapter") and backend not in GENERATIVE:
        raise UsageError(f"--adapter: only the mllm and vllm backends apply a LoRA adapter (got --backend {backend})")
    if args.get("allow_adapter_base_mismatch") and not args.get("adapter"):
        raise UsageError("--allow-adapter-base-mismatch: no --adapter to apply")
    spec = ModelSpec(model=args["model"], revision=args["model_revision"], dtype=args["dtype"], device=device,
                     device_map=args["device_map"], extra=fold_engine_flags(backend, extra, args) or {},
                     allow_missing_keys=bool(args.get("allow_missing_keys")), adapter=args.get("adapter"),
                     allow_adapter_base_mismatch=bool(args.get("allow_adapter_base_mismatch")))
    return BUILDERS[backend](load_backend(backend, spec), args)
