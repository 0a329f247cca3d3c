"""One IGLUE evaluation of a Hugging Face backend: (task, language, protocol) -> result files and a table row.

`run_iglue_hf(options)` is what `volta-ml iglue-hf` calls (a sweep cell runs that command). It reads the task's
annotation file (IGLUE's test file, or its `_mt` translation for translate-test), checks that every image is
under the image root, scores with the backend (dual encoders: retrieval; generative: XVNLI, xGQA, MaRVL),
sharded over ranks and resumable by chunks, and writes on rank 0:
- `iglue_hf_results.json`: metrics, rule, prompts version, the rendered prompt of the first example, MaRVL's
  image layout, backend spec, timing, `failed_images` (image files that failed to decode, each with the reason:
  their examples were scored without that image, as `cvqa score` does; one stderr line says so), and for a
  training run's `hf_best/` which best it holds (`exports`);
- `predictions.jsonl` (generative) or eval_retrieval's `<split>_result.json`, `<split>_others.json`,
  `<split>_scores.npy`, `<split>_retrieval.json` (retrieval);
- `<split>_items.jsonl`: each item's score (or each query's recall hits; volta_ml/stats.py), for the report's
  confidence intervals and `volta-ml compare`;
- `result.json` (unless `record=False`): the record `volta-ml report` places into IGLUE's CSVs;
- the zoo's log lines, so a sweep cell's record step reads the score the same way: `Validation [<Title>]:
  loss 0.000 score <acc> ` on stderr (XVNLI, MaRVL), the bare accuracy as the last stdout line (xGQA), the two
  `Final r1:...` lines on stdout (retrieval).
"""
from __future__ import annotations

import hashlib
import shutil
import sys
import time
from pathlib import Path

from volta_ml.atomic import atomic_write_json
from volta_ml.digest import content_fingerprint, file_digest
from volta_ml.engine.distributed import init_distributed, shutdown
from volta_ml.engine.failures import UsageError
from volta_ml.hf import GENERATIVE
from volta_ml.hf.base import answer_options, fold_engine_flags
from volta_ml.hf.export import status as export_status
from volta_ml.hf.loading import loading_report
from volta_ml.hf.photos import failure_line
from volta_ml.options import complete_options
from volta_ml.protocols.iglue import TASKS

from .data import image_refs, read_copy, read_task
from .parquet import is_parquet_release
from .images import DEFAULT_TEMPLATES, ImageSource
from .prompts import PROMPTS_VERSION
from .scoring import DEFAULT_RULES
from .tasks import check_capable, run_generative, run_retrieval

PROTOCOLS = {"zero-shot": "zero_shot", "translate-test": "translate_test"}
DEFAULTS = {"rule": None, "annotations": None, "data_root": None, "images": None, "image_template": None,
            "batch_size": 8, "chunk_size": 64, "max_new_tokens": 10, "marvl_layout": "auto", "name": None,
            "revision": None, "dtype": "fp32", "device": "cpu", "device_map": None, "work_dir": None,
            "no_resume": False, "keep_chunks": False, "record": True, "progress": True, "vocabulary": None,
            "local_rank": -1, "extra": None, "allow_missing_keys": False, "text_base": None, "adapter": None,
            "allow_adapter_base_mismatch": False, "tensor_parallel_size": None}
REQUIRED = ("task", "backend", "model", "lang", "protocol", "output_dir")


def annotation_path(task: str, lang: str, protocol: str, data_root: str | None, explicit: str | None) -> str:
    """The explicit file, else IGLUE's test (or `_mt`) file of `lang` under `data_root`."""
    if explicit:
        return explicit
    if not data_root:
        raise UsageError("give --annotations or --data_root (IGLUE's datasets/ folder)")
    spec = TASKS[task]
    template = spec.mt_file if protocol == "translate-test" else spec.test_file
    if lang == "en" and spec.english_test is not None and protocol == "zero-shot":
        raise UsageError(f"{task}: IGLUE's English test is not in datasets/ (the zoo uses NLVR2's); give --annotations")
    return str(Path(data_root) / template.format(lang=lang))


def load_backend(kind: str, model: str, options: dict):
    from volta_ml.hf import load_backend as load
    from volta_ml.hf.base import ModelSpec

    return load(kind, ModelSpec(model=model, revision=options["revision"], dtype=options["dtype"],
                                device=options["device"], device_map=options["device_map"],
                                extra=dict(options["extra"] or {}),
                                allow_missing_keys=bool(options["allow_missing_keys"]),
                                adapter=options["adapter"],
                                allow_adapter_base_mismatch=bool(options["allow_adapter_base_mismatch"])))


def run_iglue_hf(options: dict, backend=None) -> dict | None:
    """Evaluate and write the result files; returns the results on rank 0 (None elsewhere). `backend` skips
    loading (tests, benchmarks); otherwise `volta_ml.hf.load_backend(backend kind, ModelSpec(model, ...))`."""
    opts = complete_options("run_iglue_hf", options, DEFAULTS, REQUIRED)
    if opts["text_base"]:           # --text_base: M-CLIP's extra["text_base"]
        opts["extra"] = {**(opts["extra"] or {}), "text_base": opts["text_base"]}
    opts["extra"] = fold_engine_flags(opts["backend"], opts["extra"], opts)   # --tensor_parallel_size
    task, lang, protocol = opts["task"], opts["lang"], opts["protocol"]
    if task not in TASKS:
        raise UsageError(f"unknown task {task!r}; known: {', '.join(TASKS)}")
    if protocol not in PROTOCOLS:
        raise UsageError(f"unknown protocol {protocol!r}; known: {', '.join(PROTOCOLS)}")
    rule = opts["rule"] or DEFAULT_RULES[task]
    if opts["adapter"] and opts["backend"] not in GENERATIVE:
        raise UsageError(f"--adapter: only the mllm and vllm backends apply a LoRA adapter (got --backend {opts['backend']})")
    if opts["allow_adapter_base_mismatch"] and not opts["adapter"]:
        raise UsageError("--allow_adapter_base_mismatch: no --adapter to apply")
    annotation = annotation_path(task, lang, protocol, opts["data_root"], opts["annotations"])
    if is_parquet_release(Path(annotation), "*.json*"):     # a hub copy (floschne/...): its images are embedded
        data, source = read_copy(task, annotation, lang, translated=protocol == "translate-test")
        annotation_digest = [file_digest(str(s)) for s in source.shards]
    else:
        if not opts["images"]:
            raise UsageError("give --images (the image root folder); only a hub copy with embedded images (a "
                             "parquet folder or file as --annotations) needs none")
        data = read_task(task, annotation, lang)
        source = ImageSource(opts["images"], opts["image_template"] or DEFAULT_TEMPLATES[task], scoring=True)
        annotation_digest = file_digest(annotation)
    source.check(image_refs(data), annotation)
    out_dir = Path(opts["output_dir"])
    split = f"test_{lang}" + ("_mt" if protocol == "translate-test" else "")
    work_dir = opts["work_dir"] or str(out_dir / f"{split}_chunks")
    fingerprint = {"format": 3, "task": task, "rule": rule, "annotations": annotation_digest,
                   **source.digest(image_refs(data)), "model": opts["model"], "revision": opts["revision"],
                   "dtype": opts["dtype"],
                   "backend": opts["backend"], "prompts": PROMPTS_VERSION, "batch_size": opts["batch_size"],
                   "extra": answer_options(opts["extra"]), "adapter": opts["adapter"], **model_contents(opts)}
    if opts["allow_adapter_base_mismatch"]:   # added later: in the key only when set, so older runs resume
        fingerprint["allow_adapter_base_mismatch"] = True
    info = init_distributed(opts["local_rank"], None if opts["device_map"] else opts["device"])
    try:
        if backend is None:       # each rank on its own device (cuda:<local rank> under torchrun / srun)
            backend = load_backend(opts["backend"], opts["model"], dict(opts, device=str(info.device)))
        check_capable(task, opts["backend"], backend)
        engine = record_engine(backend, fingerprint)
        if info.is_main:
            out_dir.mkdir(parents=True, exist_ok=True)
            if opts["no_resume"]:
                import shutil
                shutil.rmtree(work_dir, ignore_errors=True)
        started = time.time()
        common = dict(info=info, work_dir=work_dir, fingerprint=fingerprint, opts=opts, out_dir=out_dir, split=split)
        if task in ("xflickrco", "wit"):
            result = run_retrieval(backend, data, source, **common)
        else:
            if task == "xgqa" and rule == "closed":
                opts["vocabulary"] = opts["vocabulary"] or _gqa_vocabulary(opts["data_root"])
                fingerprint["vocabulary"] = hashlib.sha1("\n".join(opts["vocabulary"]).encode()).hexdigest()
            result = run_generative(backend, task, rule, data, source, **common)
        if not info.is_main:
            return None
        seconds = time.time() - started
        results = {
            "task": task, "title": TASKS[task].title, "lang": lang, "protocol": PROTOCOLS[protocol],
            "model": opts["name"] or _model_name(opts["model"], opts["adapter"]), "backend": opts["backend"],
            "spec": {"model": opts["model"], "revision": opts["revision"], "dtype": opts["dtype"],
                     "extra": opts["extra"] or {}, "adapter": opts["adapter"],
                     **({"allow_adapter_base_mismatch": True} if opts["allow_adapter_base_mismatch"] else {})},
            "rule": rule, "prompts_version": PROMPTS_VERSION, "annotations": annotation,
            "image_root": str(opts["images"] or source.root), "image_template": source.template, "split": split,
            "world_size": info.world_size, "seconds": round(seconds, 3), **engine, **result,
        }
        accepted = loading_report(backend)
        if accepted:      # --allow_missing_keys, --allow_adapter_base_mismatch: what was accepted at load
            results["loading_report"] = accepted
        exports = {key: found for key in ("model", "adapter") if (found := export_status(opts[key]))}
        if exports:       # a training run's hf_best: which best it holds, and whether the run has a newer one
            results["exports"] = exports
        results["examples_per_second"] = round(results["n_examples"] / max(seconds, 1e-9), 3)
        atomic_write_json(out_dir / "iglue_hf_results.json", results, indent=1, ensure_ascii=False)
        if results["failed_images"]:
            print(f"iglue-hf: {failure_line(results['failed_images'], out_dir / 'iglue_hf_results.json')}",
                  file=sys.stderr)
        finish_cell(out_dir, work_dir, opts, {
            "id": f"iglue_hf/{results['model']}/{task}/{lang}/{PROTOCOLS[protocol]}", "stage": PROTOCOLS[protocol],
            "protocol": PROTOCOLS[protocol], "model": results["model"], "task": task, "lang": lang,
            "metrics": result["metrics"], "items": f"{split}_items.jsonl", "rule": rule,
            "engine": results.get("engine", {"engine": "transformers"})["engine"]})
        return results
    finally:
        shutdown(info)


def finish_cell(out_dir: Path, work_dir: Path, opts: dict, record: dict) -> None:
    """A finished run: the grid's record of it (`result.json`, read by the sweep and `volta-ml report`) when
    `record` is set, and its chunk store removed unless `keep_chunks` (the results are written by then)."""
    if opts["record"]:
        atomic_write_json(out_dir / "result.json", {
            "shot": None, "lr": None, "seed": None, **record, "backend": opts["backend"], "status": "done",
            "finished": time.strftime("%Y-%m-%dT%H:%M:%S%z")}, indent=1, sort_keys=True)
    if not opts["keep_chunks"]:
        shutil.rmtree(work_dir, ignore_errors=True)


def record_engine(backend, fingerprint: dict) -> dict:
    """`{"engine": ...}`: the engine that runs the backend, its version and options (`backend.engine`: vllm), put
    into the resume key too; empty for backends without one (so their older runs resume)."""
    engine = getattr(backend, "engine", None)
    if not engine:
        return {}
    fingerprint["engine"] = engine
    return {"engine": engine}


def model_contents(opts: dict) -> dict:
    """The resume key of the model: its files' sizes and hashes (local folder) or resolved commit (hub id), and
    the same for M-CLIP's image tower (`extra.image_model`) and a LoRA adapter (`adapter`): new weights at the
    same path are never mixed in."""
    extra = opts["extra"] or {}
    out = {"model_content": content_fingerprint(opts["model"], opts["revision"])}
    if opts.get("adapter"):
        out["adapter_content"] = content_fingerprint(opts["adapter"])
    if extra.get("image_model"):
        out["image_model_content"] = content_fingerprint(extra["image_model"], extra.get("image_revision"))
    return out


def _model_name(model: str, adapter: str | None = None) -> str:
    """The row name: the model folder's name, + the training run's folder name with an adapter (`hf_best`'s parent)."""
    name = Path(model.rstrip("/")).name or model
    if adapter:
        folder = Path(adapter.rstrip("/"))
        name += "+" + (folder.parent.name if folder.name == "hf_best" else folder.name)
    return name


def _gqa_vocabulary(data_root: str | None) -> list[str]:
    if not data_root:
        raise UsageError("--rule closed needs the GQA answer vocabulary: give --data_root holding "
                       "gqa/annotations/trainval_ans2label.json and trainval_label2ans.json (or the .pkl twins)")
    from volta_ml.tasks.gqa import load_vocabulary

    return load_vocabulary(str(Path(data_root) / "gqa" / "annotations"))[1]
