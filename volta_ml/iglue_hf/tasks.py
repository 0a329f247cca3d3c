"""The two ways a backend meets an IGLUE task: retrieval with a dual encoder, scoring rules with a generative model.

`NEEDS` is the table of which backend kind a task needs; `check_capable` turns a mismatch into an error that
names the backend, the task, and what the backend can do instead.
"""
from __future__ import annotations

import json
import sys
from types import SimpleNamespace

import numpy as np
import torch

from volta_ml.atomic import atomic_open, atomic_write_json
from volta_ml.engine.chunks import map_chunks
from volta_ml.engine.failures import UsageError
from volta_ml.engine.retrieval import save_array
from volta_ml.hf.base import DualEncoder, EngineError, Generative, engine_record, keep_answers
from volta_ml.protocols.hf_kinds import NEEDS
from volta_ml.protocols.iglue import TASKS
from volta_ml.stats import TRUNCATED, Truncation, unique_ids, write_items
from volta_ml.tasks.retrieval_metrics import top_images

from .images import side_by_side
from .prompts import OPTIONS, user_turn
from .scoring import accuracy, get_rule

KIND_OF = (("dual encoder", DualEncoder), ("generative", Generative))
FAILED = "image_failures"   # the chunk array of images that failed to decode (ImageSource.failures)


class BackendTaskError(ValueError):
    """The backend's kind cannot do the task."""


def backend_kind(backend) -> str | None:
    return next((name for name, protocol in KIND_OF if isinstance(backend, protocol)), None)


def check_capable(task: str, kind_name: str, backend) -> None:
    has = backend_kind(backend)
    if has != NEEDS[task]:
        can = [t for t, need in NEEDS.items() if need == has]
        raise BackendTaskError(
            f"backend {kind_name!r} ({type(backend).__name__}) is a {has or 'unknown kind of'} model and cannot do "
            f"{task}, which needs a {NEEDS[task]} backend; {kind_name!r} can do: {', '.join(can) or 'none'}")


# --- generative: XVNLI, xGQA, MaRVL ----------------------------------------------------------------------------
def marvl_layout(backend, requested: str) -> str:
    """`multi` (both images in the prompt) when the model takes two images, else `canvas` (side by side)."""
    takes_two = backend.max_images is None or backend.max_images >= 2       # None: no limit
    if requested == "auto":
        return "multi" if takes_two else "canvas"
    if requested == "multi" and not takes_two:
        raise UsageError(f"--marvl_layout multi: this model takes at most {backend.max_images} image per prompt")
    return requested


def example_images(example, source, layout: str | None) -> list:
    images = [source.load(ref) for ref in example.images]
    if layout == "canvas":
        return [side_by_side(images[0], images[1])]
    return images


def run_generative(backend, task, rule_name, examples, source, *, info, work_dir, fingerprint, opts, out_dir, split):
    rule = get_rule(task, rule_name)
    layout = marvl_layout(backend, opts["marvl_layout"]) if task == "marvl" else None
    frame = getattr(backend, "vqa_frame", None)
    prompts = [user_turn(task, rule_name, e, layout, frame) for e in examples]
    context = {"max_new_tokens": opts["max_new_tokens"], "vocabulary": opts["vocabulary"]}

    def score_batch(rows: range) -> dict:
        images = [example_images(examples[i], source, layout) for i in rows]
        scored = rule.score(backend, images, prompts[rows.start:rows.stop], context)
        return {**scored, FAILED: source.failures([examples[i].images for i in rows])}

    arrays = score_items(len(examples), score_batch, batch_size=opts["batch_size"], chunk_size=opts["chunk_size"],
                         work_dir=work_dir, fingerprint=dict(fingerprint, layout=layout,
                                                             max_new_tokens=opts["max_new_tokens"]),
                         info=info, desc=f"{task} {rule_name}", progress=opts["progress"], backend=backend)
    if not info.is_main:
        return None
    failed = source.failed_paths(arrays.pop(FAILED), [e.images for e in examples])
    truncated = Truncation.of(unique_ids(e.id for e in examples), arrays.pop("truncated", None)) \
        if rule_name == "generate" else None
    predictions = rule.predict(arrays, context)
    gold = [e.label for e in examples]
    score = accuracy(predictions, gold)
    metrics = {"score": score}
    if rule_name == "generate" and task in OPTIONS:          # multiple choice by generation: unparsed answers
        metrics["parse_failure_rate"] = 100.0 * sum(p == "" for p in predictions) / max(1, len(predictions))
    if truncated is not None:                   # answers cut at max_new_tokens (None: the backend does not say)
        metrics[TRUNCATED] = truncated.rate
    rows = [{"id": e.id, "line": e.line, "prediction": p, "label": e.label}
            for e, p in zip(examples, predictions)]
    if "answers" in arrays:
        for k, (row, raw) in enumerate(zip(rows, arrays["answers"].tolist())):
            row["generated"] = raw
            if truncated is not None and truncated.flags is not None:
                row["truncated"] = bool(truncated.flags[k])
    write_predictions(out_dir / "predictions.jsonl", rows)
    write_items(out_dir / f"{split}_items.jsonl", generative_items(rows, "parse_failure_rate" in metrics, truncated,
                                                                   [image_cluster(e.images) for e in examples]))
    log_score(task, score)
    if truncated is not None and truncated.warning(f"{task} {rule_name}"):
        print(truncated.warning(f"{task} {rule_name}"), file=sys.stderr)
    n_images = 1 if layout == "canvas" else len(examples[0].images)   # a MaRVL canvas is one image
    return {"metrics": metrics, "n_examples": len(examples), "failed_images": failed, "rule_description": rule.describe,
            "marvl_layout": layout, "first_prompt": prompts[0],
            "first_prompt_rendered": backend.render(prompts[0], n_images),
            "prompt_format": getattr(backend, "prompt_format", None), "engine": engine_record(backend),
            "qformer_truncated": getattr(backend, "qformer_truncated", None),
            **(truncated.record() if truncated is not None else {})}


def image_cluster(images) -> str | None:
    """The cluster key of an item (volta_ml/stats.py): the image it asks about (XVNLI's Flickr30k photo, xGQA's
    scene: several questions share one), `a+b` for MaRVL's pair; None without images."""
    return "+".join(ref.id for ref in images) or None


def generative_items(rows: list[dict], parsed: bool, truncated: Truncation | None = None,
                     clusters: list[str | None] | None = None) -> list[dict]:
    """Per-item rows (volta_ml/stats.py): `score` 100 for an exact match, and with the generate rule of a multiple
    choice task `parse_failure_rate` 100 for an answer that named no option, and with the generate rule
    `truncated_rate` 100 for an answer cut at max_new_tokens (where the backend says); `cluster`: the image(s)
    the item asks about (the intervals resample images); ids as the zoo's eval names them."""
    out = []
    for k, (item, row) in enumerate(zip(unique_ids(r["id"] for r in rows), rows)):
        values = {"id": item, "score": 100.0 * (row["prediction"] == row["label"]),
                  "cluster": clusters[k] if clusters else None}
        if parsed:
            values["parse_failure_rate"] = 100.0 * (row["prediction"] == "")
        out.append({**values, **(truncated.item(k) if truncated is not None else {})})
    return out


def score_items(n: int, score_batch, *, batch_size: int, chunk_size: int, work_dir: str, fingerprint: dict,
                info, desc: str, progress: bool = True, backend=None) -> dict:
    """The one scoring loop of the Hugging Face tasks (IGLUE's and the suite's): `score_batch(rows) -> {name:
    array with len(rows) rows}` over `n` items in batches of `batch_size`, saved per chunk of `chunk_size` items in
    the resumable chunk store (`engine/chunks.map_chunks`: chunk k on rank k % world size); every rank gets the
    arrays of all items, in item order. A server backend (`backend`) journals its answers beside the chunks
    (`hf.base.keep_answers`); its request that failed for good is named by the item's row."""
    batch = max(1, batch_size)
    keep_answers(backend, work_dir)

    def compute(rows: range) -> dict:
        parts = []
        for start in range(rows.start, rows.stop, batch):
            with torch.inference_mode():
                try:
                    parts.append(score_batch(range(start, min(start + batch, rows.stop))))
                except EngineError as err:
                    if err.item is None:
                        raise
                    raise EngineError(f"{desc}: item {start + err.item} (row of {n}, from 0): {err}") from None
        return {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}

    return map_chunks(n, chunk_size, compute, work_dir=work_dir, fingerprint=fingerprint, info=info, desc=desc,
                      progress=progress)


def write_predictions(path, rows: list[dict]) -> None:
    with atomic_open(path, "w", encoding="utf-8") as handle:
        for row in rows:
            handle.write(json.dumps(row, ensure_ascii=False) + "\n")


def log_score(task: str, score: float) -> None:
    """The zoo's score line for this task (what IGLUE's scrapers and the sweep's record step read)."""
    if TASKS[task].scorer == "gqa":
        print(score)
        sys.stdout.flush()
    else:
        print("Validation [%s]: loss %.3f score %.3f " % (TASKS[task].title, 0.0, score), file=sys.stderr)


# --- dual encoders: xFlickr&CO, WIT ----------------------------------------------------------------------------
def run_retrieval(backend, data, source, *, info, work_dir, fingerprint, opts, out_dir, split):
    from volta_ml.engine.retrieval_job import print_report

    batch = max(1, opts["batch_size"])

    def embedder(items, embed, images=False):
        def compute(rows: range) -> dict:
            parts = []
            for start in range(rows.start, rows.stop, batch):
                with torch.inference_mode():
                    parts.append(embed(items[start:min(start + batch, rows.stop)]).float().cpu().numpy())
            out = {"embeddings": np.concatenate(parts)}
            return {**out, FAILED: source.failures([[items[i]] for i in rows])} if images else out
        return compute

    texts = map_chunks(len(data.captions), opts["chunk_size"], embedder(data.captions, backend.embed_texts),
                       work_dir=f"{work_dir}/texts", fingerprint=fingerprint, info=info, desc="embedding captions",
                       progress=opts["progress"])["embeddings"]
    embedded = map_chunks(len(data.images), opts["chunk_size"],
                          embedder(data.images, lambda refs: backend.embed_images([source.load(r) for r in refs]),
                                   images=True),
                          work_dir=f"{work_dir}/images", fingerprint=fingerprint, info=info,
                          desc="embedding images", progress=opts["progress"])
    if not info.is_main:
        return None
    images = embedded["embeddings"]
    failed = source.failed_paths(embedded[FAILED], [[ref] for ref in data.images])
    scores = texts @ images.T                      # captions x images cosine similarities
    caption_image = np.asarray(data.caption_image, dtype=np.int64)
    report = print_report(scores, caption_image, SimpleNamespace(no_running_lines=True, num_subiters=1, shortlist=0),
                          str(out_dir / f"{split}_items.jsonl"))
    save_array(str(out_dir / f"{split}_scores.npy"), scores.astype(np.float32))
    atomic_write_json(out_dir / f"{split}_result.json", top_images(scores))
    atomic_write_json(out_dir / f"{split}_others.json", [])
    report.update(split=split, n_captions=len(data.captions), n_images=len(data.images), standard=True)
    atomic_write_json(out_dir / f"{split}_retrieval.json", report)
    sys.stdout.flush()
    metrics = {f"{prefix}_{k}": v for prefix, key in (("ir", "image_retrieval"), ("tr", "text_retrieval"))
               for k, v in report[key].items()}
    return {"metrics": metrics, "n_examples": len(data.captions), "n_images": len(data.images), "failed_images": failed,
            "rule_description": "cosine similarity of L2-normalised embeddings, each image and caption embedded once"}
