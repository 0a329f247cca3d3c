"""A CVQA run with a `backends` scorer (clip, mclip, mllm, import): batched, sharded, chunked and resumable.

`run_backend(args_dict)` is what `volta-ml cvqa score --backend clip|mclip|mllm|import` calls (the `zoo` backend
runs through `run.run_cvqa`). The questions are cut into chunks, saved as they are scored in
`<output_dir>/chunks/<pass>/<first question index>.npz` (`engine/chunks.ChunkStore`, policy "refuse": a rerun
into the folder with another model, other weights at the same path, other data or settings is refused with one
line naming what changed, see `resume_fingerprint`); under torchrun or Slurm, chunk `k` goes to rank
`k % world_size` and rank 0 gathers the scores (the arrays themselves, so the result is bit-identical to one
process). Within a chunk the photos of each batch are decoded once and scored under every
condition and the text-only control; a photo that fails to decode is listed and scored like the control.
The result folder has the zoo path's layout: `cvqa_results.json`, `predictions_<condition>.csv`,
`submission_<condition>.csv`, tables, plot.
"""
from __future__ import annotations

import hashlib
import io
import sys
import time
from pathlib import Path

import numpy as np
from tqdm import tqdm

from volta_ml.atomic import atomic_write_json
from volta_ml.engine.failures import UsageError
from volta_ml.options import complete_options
from volta_ml.stats import TRUNCATED, Truncation, unique_ids

from volta_ml.hf.base import keep_answers

from .backends import build_scorer
from .data import HIDDEN_LABEL, CVQADataset, load_cvqa
from .prompts import CONDITIONS, parse_condition
from .report import (accuracy_summary, en_loc_gap, plot_pairs, predict, predicted, write_predictions, write_submission,
                     write_tables)

FLAGS = ("score", "parse_failed", "truncated")   # per-question arrays that are not a variant of the rule
DEFAULTS = {
    "revision": None, "conditions": list(CONDITIONS), "template": None, "rule": "letter", "model": None,
    "model_revision": None, "image_model": None, "text_base": None, "dtype": "fp32", "device": "auto",
    "device_map": None, "batch_size": 8, "chunk_size": 256, "text_only": True, "limit": None, "progress": True,
    "predictions": None, "max_side": None, "max_pixels": None, "allow_missing_keys": False, "letter_layout": "paper",
    "letter_spellings": "natural", "adapter": None, "enable_thinking": None, "allow_adapter_base_mismatch": False,
    "tensor_parallel_size": None,
    "extra": None,
}
REQUIRED = ("data", "backend", "output_dir")
# What a resumed run must match (anything else, e.g. batch size or device, may change); the model's and the
# data's contents are added by `resume_fingerprint`.
RESUME_KEYS = ("backend", "model", "model_revision", "rule", "dtype", "template", "prompts_version",
               "chunk_size", "max_side", "max_pixels")


def run_backend(args_dict: dict) -> str | None:
    """Score CVQA with one backend and write every result file; returns the path of `cvqa_results.json` (None on
    ranks other than 0). Keys: `DEFAULTS` and `REQUIRED`; `batch_size` counts questions per forward,
    `chunk_size` questions per resumable chunk."""
    from volta_ml.engine.chunks import ChunkStore
    from volta_ml.engine.distributed import init_distributed, shutdown
    from volta_ml.features.images import DEFAULT_MAX_PIXELS

    args = complete_options("run_backend", args_dict, DEFAULTS, REQUIRED)
    args["max_pixels"] = args_dict.get("max_pixels") or DEFAULT_MAX_PIXELS
    for condition in args["conditions"]:
        parse_condition(condition)
    for key in ("batch_size", "chunk_size"):
        if int(args[key]) < 1:
            raise UsageError(f"--{key.replace('_', '-')} must be at least 1, got {args[key]}")
    dataset = load_cvqa(args["data"], revision=args["revision"], limit=args["limit"])
    info = init_distributed(device=None if args["device_map"] else args["device"])
    try:
        if args["device_map"] and info.world_size > 1:
            raise UsageError(f"--device-map {args['device_map']} spreads one model over every GPU of the node; "
                             f"run one process, not {info.world_size} (torchrun / srun)")
        scorer = build_scorer(args, dataset.questions, str(info.device))
        passes = [(c, False) for c in args["conditions"]]
        if args["text_only"] and scorer.needs_images:
            passes += [(c, True) for c in args["conditions"]]
        header = _header(args, dataset, scorer)
        out_dir = Path(args["output_dir"])
        store = ChunkStore(out_dir / "chunks", resume_fingerprint(header, dataset, args), info, on_mismatch="refuse")
        keep_answers(getattr(scorer, "model", None), store.folder)
        started = time.time()
        scores, failures, timing = score_passes(scorer, dataset, passes, store, info, args)
        if not info.is_main:
            return None
        path = _write_results(args, dataset, scorer, header, scores, failures, timing, out_dir)
        if failures:
            from volta_ml.hf.photos import failure_line
            print(f"CVQA: {failure_line(failures, path)}", file=sys.stderr)
        for line in getattr(scorer, "empty_lines", lambda _: [])(path):   # imported answers that were empty
            print(line, file=sys.stderr)
        print(f"{len(dataset.questions)} questions x {len(passes)} passes in {time.time() - started:.1f} s",
              file=sys.stderr)
        return path
    finally:
        shutdown(info)   # the command ends with engine.distributed.finish_process (see cli.py)


def pass_name(condition: str, blind: bool) -> str:
    return f"{condition}.blind" if blind else condition


def score_passes(scorer, dataset: CVQADataset, passes, store, info, args: dict):
    """({pass name: {name: [N, 4]}}, {image id: decode error}, {pass name: timing}) on rank 0; on other ranks the
    first two are empty. Each rank scores its chunks (skipping those already saved) and rank 0 gathers them."""
    from volta_ml.engine.distributed import gather_objects

    questions, chunk_size = dataset.questions, int(args["chunk_size"])
    mine = list(range(0, len(questions), chunk_size))[info.rank::info.world_size]
    names = [pass_name(c, b) for c, b in passes]
    local: dict[tuple[str, int], dict] = {}
    failures: dict[str, str] = {}
    seconds = dict.fromkeys(names, 0.0)
    computed = dict.fromkeys(names, 0)
    bar = tqdm(total=sum(len(questions[s:s + chunk_size]) for s in mine) * len(passes), unit="q",
               desc=f"CVQA {scorer.backend}", disable=not (args["progress"] and info.is_main), smoothing=0.1)
    for start in mine:
        chunk = questions[start:start + chunk_size]
        todo = []
        for (condition, blind), name in zip(passes, names):
            saved = store.load(f"{name}/{start:08d}", len(chunk))
            if saved is None:
                todo.append((condition, blind, name))
            else:
                local[name, start] = saved
                bar.update(len(chunk))
        need_photos = scorer.needs_images and any(not blind for _, blind, _ in todo)
        chunk_failures = {} if need_photos else (store.load_json(f"photos/{start:08d}") or {})
        parts: dict[str, list[dict]] = {name: [] for *_, name in todo}
        for batch, photos, failed in photo_batches(dataset, chunk, int(args["batch_size"]), need_photos, args):
            chunk_failures.update(failed)
            for condition, blind, name in todo:
                tic = time.perf_counter()
                parts[name].append(_scored(scorer, batch, photos, condition, blind))
                seconds[name] += time.perf_counter() - tic
                computed[name] += len(batch)
                bar.update(len(batch))
        if need_photos:
            store.save_json(f"photos/{start:08d}", chunk_failures)
        for name, pieces in parts.items():
            arrays = {key: np.concatenate([p[key] for p in pieces]) for key in pieces[0]}
            store.save(f"{name}/{start:08d}", arrays)
            local[name, start] = arrays
        failures.update(chunk_failures)
    bar.close()
    gathered = gather_objects((local, failures, seconds, computed), info)
    if not info.is_main:
        return {}, {}, {}
    merged: dict[tuple[str, int], dict] = {}
    for part, failed, _, _ in gathered:
        merged.update(part)
        failures.update(failed)
    starts = range(0, len(questions), chunk_size)
    scores = {name: {key: np.concatenate([merged[name, s][key] for s in starts]) for key in merged[name, 0]}
              for name in names}
    timing = {}
    for name in names:
        spent, done = sum(g[2][name] for g in gathered), sum(g[3][name] for g in gathered)
        timing[name] = {"seconds": round(spent, 3), "questions_scored": done,
                        "questions_per_second": round(done / spent, 2) if spent > 0 else None}
    return scores, dict(sorted(failures.items())), timing


def _scored(scorer, batch, photos, condition: str, blind: bool) -> dict:
    """`scorer.score`; a server's request that failed for good (`EngineError` of one item) names the question."""
    from volta_ml.hf.base import EngineError

    try:
        return scorer.score(batch, photos, condition, blind)
    except EngineError as err:
        if err.item is None:
            raise
        raise EngineError(f"question {batch[err.item].id} ({condition}{', text-only' if blind else ''}): {err}") \
            from None


def photo_batches(dataset: CVQADataset, chunk, batch_size: int, need_photos: bool, args: dict):
    """(questions, {image id: PIL image or None}, {image id: decode error}) per batch of `batch_size` questions;
    each photo is decoded once per batch (and kept for the next batch when it shares it)."""
    if not need_photos:
        for i in range(0, len(chunk), batch_size):
            yield chunk[i:i + batch_size], {}, {}
        return
    encoded = dataset.iter_images(list(dict.fromkeys(q.image_id for q in chunk)))
    fetched: dict[str, bytes] = {}
    photos: dict = {}
    for i in range(0, len(chunk), batch_size):
        batch = chunk[i:i + batch_size]
        wanted = list(dict.fromkeys(q.image_id for q in batch))
        while not all(w in fetched or w in photos for w in wanted):
            image_id, data = next(encoded)
            fetched[image_id] = data
        failed: dict[str, str] = {}
        photos = {w: photos[w] if w in photos else decode_photo(fetched[w], w, args, failed) for w in wanted}
        yield batch, photos, failed


def decode_photo(data: bytes, image_id: str, args: dict, failed: dict):
    """RGB `PIL.Image` (EXIF orientation applied, as `datasets` decodes; transparency on white), or None with the
    reason in `failed` (`hf.photos.decode_photo`, the mechanism iglue-hf shares)."""
    from PIL import Image

    from volta_ml.hf.photos import decode_photo as decode

    return decode(lambda: Image.open(io.BytesIO(data)), image_id, failed=failed, max_pixels=args["max_pixels"],
                  max_side=args["max_side"], exif=True)


def resume_fingerprint(header: dict, dataset: CVQADataset, args: dict) -> dict:
    """What the saved chunks must have been scored with: the settings of `RESUME_KEYS` (and the chat template's
    switches, `template_options`, and the letter rule's `letter_spellings` variant, when set), the model's content
    (weights, config, tokenizer: `digest.content_fingerprint`; the image tower too for mclip, a LoRA adapter's
    files for mllm; the files of
    `--predictions` for import) and the data (revision, question list, shard contents)."""
    from volta_ml.digest import content_fingerprint

    models = {"model": (args["model"], args["model_revision"]), "image_model": (args["image_model"], None),
              "adapter": (args.get("adapter"), None)}
    # settings added after runs were saved without them: in the fingerprint only when set, so that those resume
    options = {"template_options": header["template_options"]} if header.get("template_options") else {}
    if header.get("letter_spellings") not in (None, "natural"):
        options["letter_spellings"] = header["letter_spellings"]
    if args.get("allow_adapter_base_mismatch"):
        options["allow_adapter_base_mismatch"] = True
    if header.get("engine"):    # vllm: the engine, its version and options
        options["engine"] = header["engine"]
    return {"format": 2, **{k: header.get(k) for k in RESUME_KEYS}, **options, "data_revision": dataset.revision,
            "questions_sha1": hashlib.sha1("\n".join(q.id for q in dataset.questions).encode()).hexdigest(),
            **{f"{key}_content": content_fingerprint(name, revision) for key, (name, revision) in models.items()
               if name},
            "data_content": {s.name: content_fingerprint(str(s))["."] for s in dataset.shards}}


def _header(args: dict, dataset: CVQADataset, scorer) -> dict:
    from volta_ml.hf.export import status
    exports = {key: found for key in ("model", "adapter") if (found := status(args.get(key)))}
    return {"backend": scorer.backend, **scorer.header(), "revision": dataset.revision, "data": str(dataset.root),
            "chunk_size": int(args["chunk_size"]), "max_side": args["max_side"], "max_pixels": args["max_pixels"],
            "adapter": args.get("adapter"),
            **({"allow_adapter_base_mismatch": True} if args.get("allow_adapter_base_mismatch") else {}),
            **({"exports": exports} if exports else {})}


def _write_results(args, dataset, scorer, header, scores, failures, timing, out_dir: Path) -> str:
    questions = dataset.questions
    engine = {"engine": scorer.header()["engine"]} if "engine" in header else {}   # as it stands after the run
    results = {**header, **engine, "shards": [s.name for s in dataset.shards], "questions": len(questions),
               "labelled": sum(q.label != HIDDEN_LABEL for q in questions), "hidden_labels": dataset.hidden_labels,
               "images": len(dataset.image_ids), "missing_images": list(failures), "failed_images": failures,
               "settings": {k: args[k] for k in ("batch_size", "limit", "text_only", "device", "conditions")},
               "rendered_prompts": {c: scorer.rendered_prompt(questions[0], c) for c in args["conditions"]},
               "random_baseline": 25.0, "runs": {}, "text_only": {}, "variants": {}, "timing": timing}
    files = []
    for condition in args["conditions"]:
        arrays = scores[condition]
        predictions = _predictions(arrays)
        blind = scores.get(pass_name(condition, True))
        per_question = {k: v for k, v in arrays.items() if k != "score"}     # the rule's variants
        for key, values in (blind or {}).items():                            # the text-only control
            per_question["text_only" if key == "score" else f"text_only_{key}"] = values
        write_predictions(out_dir / f"predictions_{condition}.csv", questions, predictions,
                          arrays["score"] if scorer.needs_images else None, condition, dataset.revision,
                          per_question)
        # EvalAI needs an option for every question: an unparsed answer is submitted as option 0
        write_submission(out_dir / f"submission_{condition}.csv", questions, np.maximum(predictions, 0))
        files += [f"predictions_{condition}.csv", f"submission_{condition}.csv"]
        results["runs"][condition] = accuracy_summary(questions, predictions)
        if "parse_failed" in arrays:                            # the generate rule: unparsed answers, in %
            results.setdefault("parse_failure_rate", {})[condition] = round(
                100.0 * float(arrays["parse_failed"][:, 0].mean()), 3)
        if "truncated" in arrays:                               # the generate rule: answers cut at max tokens
            cut = Truncation.of(unique_ids(q.id for q in questions), arrays["truncated"][:, 0])
            results.setdefault(TRUNCATED, {})[condition] = cut.rate
            results.setdefault("truncated", {})[condition] = cut.record()["truncated"]
            if cut.warning(f"{condition} generate"):
                print(f"CVQA: {cut.warning(f'{condition} generate')}", file=sys.stderr)
        for variant in (k for k in arrays if k not in FLAGS):   # the rule's variants (docs/cvqa.md)
            results["variants"].setdefault(variant, {})[condition] = accuracy_summary(questions,
                                                                                      predict(arrays[variant]))
        if blind is not None:
            results["text_only"][condition] = accuracy_summary(questions, _predictions(blind))
    results["en_loc_gap"] = en_loc_gap(results["runs"])
    results["files"] = [p.name for p in write_tables(results, out_dir)]
    if not dataset.hidden_labels:
        results["files"].append(plot_pairs(results, out_dir / "cvqa_pairs.png").name)
    results["files"] += files
    path = out_dir / "cvqa_results.json"
    atomic_write_json(path, results, indent=2, ensure_ascii=False)
    return str(path)


def _predictions(arrays: dict) -> np.ndarray:
    """The predicted option per question (`report.predicted`: an unparsed answer of the generate rule is -1)."""
    return predicted(arrays["score"], arrays.get("parse_failed"))
