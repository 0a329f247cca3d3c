"""One suite task, one language, one backend: read the released files, score every item through the shared loop
(resumable chunk store, data parallel under torchrun / srun), judge each item by the task's rule, write the
results.

Files in `--output_dir`:
- `suite_results.json`: task, language, rule (name, description, source, and `rule_tools`: the versions of the
  tools it ran with, e.g. CIDEr's tokenizers and dictionaries), prompts version, the first prompt as the model
  saw it, model / adapter / template options, metrics, counts, what was skipped, seconds, `failed_images`
  (images that are there but failed to decode, each with the reason: their questions were scored without them,
  as `cvqa score` and `iglue-hf` do; `volta_ml.hf.photos`); with `--backend import`, `empty_predictions` (how
  many imported answers were empty: scored as they are, `ImportedAnswers`);
- `predictions.jsonl`: one record per item: id, lang, score, correct (1 / 0, or the CIDEr), parsed (whether a
  generated multiple-choice answer named an option; null for open answers), prediction, gold, generated answer,
  user turn;
- `test_<lang>_items.jsonl`: the per-item file (volta_ml/stats.py) `volta-ml report`'s intervals and `volta-ml
  compare` read: each item's `score` (100 x its score) and, for generated multiple-choice answers,
  `format_error_rate` (100 when it named no option);
- `result.json` (unless `--no_result_json`): the record `volta-ml report` tabulates.
Retrieval (xm3600_retrieval, dual encoders) writes IGLUE's retrieval files instead of predictions.jsonl (with the
per-query items of eval_retrieval).
"""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import numpy as np

from volta_ml.atomic import atomic_open, atomic_write_json
from volta_ml.digest import file_digest
from volta_ml.engine.distributed import init_distributed, shutdown
from volta_ml.engine.failures import UsageError
from volta_ml.hf import GENERATIVE
from volta_ml.hf.base import answer_options, engine_record, fold_engine_flags
from volta_ml.hf.loading import loading_report
from volta_ml.hf.photos import failure_line
from volta_ml.iglue_hf.run import finish_cell, load_backend, model_contents, record_engine, _model_name
from volta_ml.iglue_hf.tasks import FAILED, BackendTaskError, backend_kind, run_retrieval, score_items
from volta_ml.options import complete_options
from volta_ml.protocols.suite import SUITE, language_problem
from volta_ml.stats import TRUNCATED, Truncation, unique_ids, write_items

from .data import resolve
from .images import stack
from .prompts import PROMPTS_VERSION
from .table import TASKS

DEFAULTS = {"rule": None, "images": None, "split": None, "subset": None, "data_revision": None, "revision": None,
            "dtype": "fp32", "device": "cpu", "device_map": None, "batch_size": 8, "chunk_size": 64,
            "max_new_tokens": None, "name": None, "work_dir": None, "no_resume": False, "keep_chunks": False,
            "record": True, "progress": True, "local_rank": -1, "extra": None, "allow_missing_keys": False,
            "text_base": None, "adapter": None, "allow_adapter_base_mismatch": False, "enable_thinking": None,
            "predictions": None, "tensor_parallel_size": None}
REQUIRED = ("task", "backend", "model", "lang", "data", "output_dir")


def check_task(task: str, lang: str, rule: str | None):
    """The task's row, its rule and the language, or one UsageError line saying what is known."""
    row = TASKS.get(task)
    if row is None or row.command != "suite":
        if row is not None:
            raise UsageError(f"{task} is an IGLUE task: run it with volta-ml iglue-hf")
        suite = [t for t, r in TASKS.items() if r.command == "suite"]
        raise UsageError(f"unknown task {task!r}; known: {', '.join(suite)}")
    problem = language_problem(task, lang)
    if problem:
        raise UsageError(problem)
    rule = rule or row.default_rule
    if rule not in row.rules:
        raise UsageError(f"--rule {rule!r} does not apply to {task}; known: {', '.join(row.rules)}")
    return row, rule


def run_suite(options: dict, backend=None) -> dict | None:
    """Evaluate and write the result files; returns the results on rank 0 (None elsewhere). `backend` skips
    loading (tests); otherwise `volta_ml.hf.load_backend(backend kind, ModelSpec(model, ...))`."""
    opts = complete_options("run_suite", options, DEFAULTS, REQUIRED)
    extra = dict(opts["extra"] or {})
    if opts["text_base"]:
        extra["text_base"] = opts["text_base"]
    if opts["enable_thinking"] is not None:
        extra["enable_thinking"] = opts["enable_thinking"]
    opts["extra"] = fold_engine_flags(opts["backend"], extra, opts)   # --tensor_parallel_size
    task, lang = opts["task"], opts["lang"]
    row, rule_name = check_task(task, lang, opts["rule"])
    needs = getattr(row.rules[rule_name], "tools", None)
    tools = needs(lang) if needs else None          # missing packages / Java: one line before any work
    for key in ("batch_size", "chunk_size"):
        if int(opts[key]) < 1:
            raise UsageError(f"--{key} must be at least 1, got {opts[key]}")
    if opts["allow_adapter_base_mismatch"] and not opts["adapter"]:
        raise UsageError("--allow_adapter_base_mismatch: no --adapter to apply")
    if opts["adapter"] and opts["backend"] not in GENERATIVE:
        raise UsageError(f"--adapter: only the mllm and vllm backends apply a LoRA adapter (got --backend {opts['backend']})")
    importing = opts["backend"] == IMPORT
    if importing and (not opts["predictions"] or row.rules[rule_name].kind != "generate"):
        raise UsageError(f"--backend {IMPORT} scores the answers of --predictions FILE with a generation rule of "
                         f"{task} ({', '.join(n for n, r in row.rules.items() if r.kind == 'generate')})")
    root = resolve(opts["data"], opts["data_revision"])
    data = row.reader(root, lang, opts)
    if data.store is not None and not importing:
        data.store.check([k for item in data.items for k in item.images], f"the {task} {lang} questions")
    max_new_tokens = int(opts["max_new_tokens"] or row.max_new_tokens)
    out_dir = Path(opts["output_dir"])
    work_dir = opts["work_dir"] or str(out_dir / f"{task}_{lang}_chunks")
    image_keys = [k for item in data.items for k in item.images]
    fingerprint = {"format": 2, "task": task, "lang": lang, "rule": rule_name, "prompts": PROMPTS_VERSION,
                   "data": [file_digest(str(f)) for f in data.files], "n_items": len(data.items),
                   **(data.store.digest(image_keys) if data.store is not None else {}),
                   "model": opts["model"], "revision": opts["revision"], "dtype": opts["dtype"],
                   "backend": opts["backend"], "extra": answer_options(opts["extra"]), "adapter": opts["adapter"],
                   "batch_size": opts["batch_size"], "max_new_tokens": max_new_tokens}
    contents = {}
    if importing:
        backend = ImportedAnswers(opts["predictions"], data.items)
        contents = {"predictions": str(opts["predictions"]), "predictions_content": file_digest(opts["predictions"])}
    else:
        contents = model_contents(opts)
    fingerprint.update(contents)
    if opts["allow_adapter_base_mismatch"]:
        fingerprint["allow_adapter_base_mismatch"] = True
    info = init_distributed(opts["local_rank"], None if opts["device_map"] else opts["device"])
    try:
        if opts["device_map"] and info.world_size > 1:
            raise UsageError(f"--device_map {opts['device_map']} spreads one model over the GPUs of a node; run one "
                             f"process, not {info.world_size}")
        if backend is None:
            backend = load_backend(opts["backend"], opts["model"], dict(opts, device=str(info.device)))
        has = "generative" if isinstance(backend, ImportedAnswers) else backend_kind(backend)
        if has != row.kind:
            raise BackendTaskError(f"backend {opts['backend']!r} ({type(backend).__name__}) is a {has or 'unknown kind of'}"
                                   f" model and cannot do {task}, which needs a {row.kind} backend")
        engine = record_engine(backend, fingerprint)
        if info.is_main:
            out_dir.mkdir(parents=True, exist_ok=True)
            if opts["no_resume"]:
                import shutil
                shutil.rmtree(work_dir, ignore_errors=True)
        started = time.time()
        common = dict(info=info, work_dir=work_dir, fingerprint=fingerprint, opts=opts)
        split = f"test_{lang}"
        if data.retrieval is not None:
            result = run_retrieval(backend, data.retrieval, data.store.source, out_dir=out_dir, split=split, **common)
        else:
            result = _generative(backend, row, rule_name, data, max_new_tokens, out_dir, split=split, **common)
        if not info.is_main:
            return None
        seconds = time.time() - started
        name = opts["name"] or _model_name(opts["model"], opts["adapter"])
        results = {"task": task, "title": SUITE[task].title, "lang": lang, "model": name, "backend": opts["backend"],
                   "spec": {"model": opts["model"], "revision": opts["revision"], "dtype": opts["dtype"],
                            "extra": opts["extra"] or {}, "adapter": opts["adapter"],
                            **({"allow_adapter_base_mismatch": True} if opts["allow_adapter_base_mismatch"] else {})},
                   "rule": rule_name, "prompts_version": PROMPTS_VERSION, "data": str(root),
                   "data_files": [str(f) for f in data.files], "n_items": len(data.items), "skipped": data.skipped,
                   "world_size": info.world_size, "seconds": round(seconds, 3),
                   "template_options": getattr(backend, "template_options", None), **engine, **contents, **result}
        if importing:
            results["empty_predictions"] = len(backend.empty)
        if tools:
            results["rule_tools"] = tools
        accepted = loading_report(backend)
        if accepted:
            results["loading_report"] = accepted
        atomic_write_json(out_dir / "suite_results.json", results, indent=1, ensure_ascii=False)
        if results["failed_images"]:
            print(f"suite: {failure_line(results['failed_images'], out_dir / 'suite_results.json')}", file=sys.stderr)
        if importing and backend.empty:
            print(backend.empty_line(out_dir / "suite_results.json"), file=sys.stderr)
        metric = results["metrics"].get("score", results["metrics"].get("ir_r1"))
        print(f"{SUITE[task].title} {lang} {rule_name}: {metric:.3f} ({len(data.items)} items)", file=sys.stderr)
        finish_cell(out_dir, work_dir, opts, {
            "id": f"suite/{name}/{task}/{lang}", "stage": "suite", "protocol": "zero_shot", "model": name,
            "task": task, "lang": lang, "metrics": results["metrics"], "items": f"{split}_items.jsonl",
            "rule": rule_name, "engine": results.get("engine", {"engine": "transformers"})["engine"]})
        return results
    finally:
        shutdown(info)


def _item_images(item, store, backend) -> list:
    images = [store.load(k) for k in item.images]
    limit = getattr(backend, "max_images", None)
    if limit is not None and len(images) > limit:
        return [stack(images)]
    return images


def _generative(backend, row, rule_name, data, max_new_tokens, out_dir, *, split, info, work_dir, fingerprint, opts):
    rule = row.rules[rule_name]
    items = data.items
    frame = getattr(backend, "vqa_frame", None)
    prompts = [row.prompt(item, rule.kind, frame) for item in items]
    width = max((len(item.options) for item in items), default=0)
    context = {"max_new_tokens": max_new_tokens, "letter_width": width}

    most = max(len(item.images) for item in items)

    def score_batch(rows: range) -> dict:
        images = [_item_images(items[i], data.store, backend) for i in rows]
        scored = rule.score(backend, images, prompts[rows.start:rows.stop],
                            dict(context, batch_items=[items[i] for i in rows]))
        if data.store is None:
            return scored
        return {**scored, FAILED: data.store.failures([items[i].images for i in rows], most)}

    if isinstance(backend, ImportedAnswers):
        arrays = {"answers": np.array(backend.answers, dtype=str)}
    else:
        arrays = score_items(len(items), score_batch, batch_size=opts["batch_size"], chunk_size=opts["chunk_size"],
                             work_dir=work_dir, fingerprint=fingerprint, info=info, desc=f"{row.name} {rule_name}",
                             progress=opts["progress"], backend=backend)
    if not info.is_main:
        return None
    reasons = arrays.pop(FAILED, None)
    failed = data.store.failed_in(reasons, [item.images for item in items]) if reasons is not None else {}
    flags = arrays.pop("truncated", None)      # absent: imported answers, whose truncation is unknown
    truncated = Truncation.of(unique_ids(item.id for item in items), flags) if rule.kind == "generate" else None
    judged = rule.judge(arrays, items, context)
    metrics = summarise(judged)
    if truncated is not None:
        metrics[TRUNCATED] = truncated.rate
    answers = [str(a) for a in arrays["answers"].tolist()]
    with atomic_open(out_dir / "predictions.jsonl", "w", encoding="utf-8") as handle:
        for k, (item, j) in enumerate(zip(items, judged)):
            gold = ("ABCDEFGHIJKLMNOPQRSTUVWXYZ"[item.answer] if item.answer is not None else list(item.references))
            line = {"id": item.id, "lang": item.lang, "score": j.score, "correct": j.score, "parsed": j.parsed,
                    "prediction": j.prediction, "gold": gold, "generated": answers[k], "prompt": prompts[k]}
            if truncated is not None and truncated.flags is not None:
                line["truncated"] = bool(truncated.flags[k])
            handle.write(json.dumps(line, ensure_ascii=False) + "\n")
    write_items(out_dir / f"{split}_items.jsonl", judged_items(items, judged, truncated))
    if truncated is not None and truncated.warning(f"{row.name} {rule_name}"):
        print(truncated.warning(f"{row.name} {rule_name}"), file=sys.stderr)
    limit = getattr(backend, "max_images", None)
    stacked = sum(1 for item in items if limit is not None and len(item.images) > limit)
    n_images = min(len(items[0].images), limit) if limit is not None else len(items[0].images)
    return {"metrics": metrics, "failed_images": failed, "rule_description": rule.describe, "rule_source": rule.source,
            "max_new_tokens": max_new_tokens, "first_prompt": prompts[0],
            "first_prompt_rendered": backend.render(prompts[0], n_images),
            "prompt_format": getattr(backend, "prompt_format", None), "engine": engine_record(backend),
            "stacked_images": stacked,
            "qformer_truncated": getattr(backend, "qformer_truncated", None),
            **(truncated.record() if truncated is not None else {})}


IMPORT = "import"


class ImportedAnswers:
    """`--backend import`: the answers another run (another harness) generated, read from `--predictions`, a JSON
    lines file with one `{"id": <item id>, "prediction": <the generated text>}` per item of the task and language,
    scored by the task's generation rule. An empty answer ("", only spaces, or null) is what that harness
    generated: scored as it is (wrong; a format error for multiple choice) and counted (`empty`: the items' ids,
    `empty_predictions` in suite_results.json). A missing, repeated or unknown item, a record without
    "prediction" or with one that is not text, is one line naming the file, line and item."""

    def __init__(self, path: str, items):
        from volta_ml.data.annotations import read_jsonl

        from .data import SuiteDataError

        wanted = {item.id for item in items}
        found: dict[str, str] = {}
        for line, row in read_jsonl(path, "predictions file"):
            where = f"{path}:{line}"
            if "id" not in row or str(row["id"]) not in wanted:
                raise SuiteDataError(f"{where}: id {row.get('id')!r} is not an item of this task and language")
            item = str(row["id"])
            if item in found:
                raise SuiteDataError(f"{where}: a second prediction for item {item!r}")
            if "prediction" not in row:
                raise SuiteDataError(f"{where}: item {item!r} has no \"prediction\"")
            prediction = row["prediction"]
            if prediction is not None and not isinstance(prediction, str):
                raise SuiteDataError(f"{where}: item {item!r}: the prediction is not text ({prediction!r})")
            found[item] = prediction or ""
        missing = [item.id for item in items if item.id not in found]
        if missing:
            raise SuiteDataError(f"{path}: no prediction for {len(missing)} item(s), e.g. {missing[0]!r}")
        self.path = path
        self.answers = [found[item.id] for item in items]
        self.empty = [item.id for item, answer in zip(items, self.answers) if not answer.strip()]
        self.spec, self.max_images, self.prompt_format = None, None, "imported answers"

    def empty_line(self, results: Path) -> str:
        """The stderr line of a run whose imported answers include empty ones."""
        return (f"suite: {len(self.empty)} of {len(self.answers)} imported predictions are empty (first: item "
                f"{self.empty[0]!r}) in {self.path}; scored as given (wrong; a format error for multiple choice), "
                f"counted in {results} (empty_predictions)")

    def render(self, prompt: str, num_images: int) -> str:
        return prompt


def judged_items(items, judged, truncated: Truncation | None = None) -> list[dict]:
    """The per-item file's rows (volta_ml/stats.py): `score` 100 x the item's score (1 / 0, or its CIDEr: their
    mean is `summarise`'s score) and, for an item whose answer was parsed or not, `format_error_rate` (100 when it
    named no option), and with a generation rule `truncated_rate` (100 for an answer cut at max_new_tokens, where
    the backend says), so the report bootstraps them; `cluster`: the image(s) the item asks about (MaXM, MTVQA,
    xMMMU: several questions share one), which the intervals resample as a whole."""
    rows = []
    for k, (item, j) in enumerate(zip(unique_ids(item.id for item in items), judged)):
        row = {"id": item, "score": 100.0 * float(j.score),
               "cluster": "+".join(map(str, items[k].images)) or None}   # the image(s) it asks about
        if j.parsed is not None:
            row["format_error_rate"] = 0.0 if j.parsed else 100.0
        rows.append({**row, **(truncated.item(k) if truncated is not None else {})})
    return rows


def summarise(judged) -> dict:
    """The run's metrics from its items: `score` (100 x the mean item score: accuracy, or the corpus CIDEr),
    and for multiple choice by generation the format-error rate, the accuracy over parsed answers and the
    expected score had a random letter been drawn for the unparsed ones; rule flags as rates."""
    scores = np.array([j.score for j in judged], dtype=np.float64)
    metrics = {"score": 100.0 * float(scores.mean()), "n": len(judged)}
    parsed = [j.parsed for j in judged if j.parsed is not None]
    if parsed:
        ok = [j for j in judged if j.parsed]
        metrics["format_error_rate"] = 100.0 * (1.0 - float(np.mean(parsed)))
        metrics["valid_score"] = 100.0 * float(np.mean([j.score for j in ok])) if ok else None
        chance = [j.chance if j.chance is not None else j.score for j in judged]
        metrics["score_random_fallback_expected"] = 100.0 * float(np.mean(chance))
    for flag in sorted({f for j in judged for f in j.flags}):
        metrics[f"{flag}_rate"] = 100.0 * float(np.mean([flag in j.flags for j in judged]))
    return metrics
