"""The retrieval evaluation job of `eval_retrieval.py` / `volta-ml eval-retrieval` (front end: cli/eval_retrieval.py).

`run_eval_retrieval(args)`: task setup -> captions (tokenised, cached) and the gallery (every image's padded
regions, read once) -> the scoring model (the fine-tuned retrieval head, or with --zero_shot the pretraining
model's matching head) -> the score matrix (`engine/retrieval.compute_score_matrix`, resumable in chunks keyed
by `fingerprint`: the checkpoint's content, annotations, features, tokenizer and every flag that changes
scores) -> IGLUE's output files and stdout lines (`print_report`, also used by `volta-ml iglue-hf`).
"""
from __future__ import annotations

import json
import os
import shutil
import sys
import time

import numpy as np
import torch

from volta_ml.atomic import atomic_write_json

STARS = "*" * 50


def result_dir(output_dir: str, from_pretrained: str) -> str:
    """VOLTA's eval_retrieval naming: the second path component (`home` for `/home/...`)."""
    name = from_pretrained.split("/")[1] if "/" in from_pretrained else from_pretrained
    return os.path.join(output_dir, name)


def caption_tensors(text) -> dict:
    ids = torch.from_numpy(np.asarray(text.ids, dtype=np.int64))
    mask = (torch.arange(ids.shape[1])[None, :] < torch.from_numpy(np.asarray(text.lengths))[:, None]).long()
    return {"input_txt": ids, "attention_mask": mask, "token_type_ids": torch.zeros_like(ids)}


def gallery_tensors(region_view, images: list[str], progress: bool) -> dict:
    """Every image's padded regions, read once, float32 (VOLTA holds them as float64)."""
    from tqdm import tqdm
    from volta_ml.tasks.common import region_arrays

    first = region_arrays(region_view, images[0])
    out = {k: np.empty((len(images),) + v.shape, dtype=v.dtype) for k, v in first.items()}
    for index, key in enumerate(tqdm(images, desc="reading image features", unit="img", file=sys.stderr,
                                     disable=not progress, mininterval=1.0)):
        for name, value in region_arrays(region_view, key).items():
            out[name][index] = value
    return {k: torch.from_numpy(v) for k, v in out.items()}


def load_scoring_model(args, setup, device: torch.device):
    """The fine-tuned retrieval head, or with --zero_shot the pretraining model's image-text matching head."""
    if not args.zero_shot:
        model, _ = setup.load_model(args.from_pretrained)
        return model.to(device).eval()
    if setup.model.config.image_embeddings == "m3p":
        from volta_ml.engine.retrieval_scorer import ScorerSetupError
        raise ScorerSetupError("--zero_shot needs a pretraining matching head, which VOLTA's M3P port does not have")
    model, report = setup.load_model(args.from_pretrained, kind="pretraining")
    missing = [k for k in report.missing_keys if "bi_seq_relationship" in k]
    if missing:
        print(f"warning: {args.from_pretrained} has no image-text matching head ({missing[0]}): zero-shot "
              "scores come from a random head", file=sys.stderr)
    return model.to(device).eval()


def fingerprint(args, model_config, tokenizer, annotation: str, features: str, images, n_captions: int,
                task_id: str, precision: str) -> dict:
    """Everything that changes the scores: saved chunks are reused only when all of it matches."""
    from volta_ml.digest import content_fingerprint, file_digest, stat_digest, text_digest

    config_json = json.dumps(model_config.to_dict(), sort_keys=True, default=str)
    return {
        "format": 2, "checkpoint": os.path.abspath(args.from_pretrained),
        "checkpoint_content": content_fingerprint(args.from_pretrained),
        "model_config": text_digest(config_json), "annotations": file_digest(annotation),
        "features": os.path.abspath(features), "features_stat": stat_digest([features]),
        "images": text_digest("\n".join(images)),
        "n_captions": n_captions, "tokenizer": getattr(tokenizer, "volta_fingerprint", type(tokenizer).__name__),
        "task": task_id, "zero_shot": bool(args.zero_shot), "precision": precision, "pair_batch": args.pair_batch,
        "captions_per_chunk": args.captions_per_chunk, "score_dtype": args.score_dtype,
        "shortlist": args.shortlist, "shortlist_regions": args.shortlist_regions,
        "prefix_reuse": not args.no_prefix_reuse,
    }


def print_report(scores: np.ndarray, caption_image: np.ndarray, args, items_file: str | None = None) -> dict:
    """IGLUE's stdout lines; with `items_file`, each query's hits as volta-ml's per-item file (volta_ml/stats.py)."""
    from volta_ml.stats import write_items
    from volta_ml.tasks.retrieval_metrics import (
        final_line, image_retrieval_ranks, query_items, recall_metrics, running_ir_lines, text_retrieval_ranks,
    )

    ir_ranks = image_retrieval_ranks(scores, caption_image)
    tr_ranks = text_retrieval_ranks(scores, caption_image)
    if items_file:
        write_items(items_file, query_items(ir_ranks, tr_ranks))
    if not args.no_running_lines:
        for line in running_ir_lines(ir_ranks, max(1, args.num_subiters)):
            print(line)
    ir, tr = recall_metrics(ir_ranks), recall_metrics(tr_ranks)
    note = ""
    if args.shortlist:
        note = f" (NON-STANDARD fast mode: top-{args.shortlist} shortlist re-ranked; not comparable to IGLUE)"
        print(f"NOTE: scores below come from the non-standard fast mode: each caption's {args.shortlist} best "
              f"images by a cheap score ({args.shortlist_regions} regions) were re-ranked with the full model.")
    for title, metrics in (("Image Retrieval", ir), ("Text Retrieval", tr)):
        print(STARS)
        print(STARS)
        print(STARS)
        print(title + note)
        print(final_line(metrics))
    sys.stdout.flush()
    return {"image_retrieval": ir, "text_retrieval": tr}


def run_eval_retrieval(args) -> dict | None:
    from volta_ml.engine.distributed import abort, barrier, init_distributed, shutdown
    from volta_ml.engine.retrieval import compute_score_matrix, save_array
    from volta_ml.engine.run_setup import task_setup
    from volta_ml.tasks.common import TextSource
    from volta_ml.tasks.config import entry_path
    from volta_ml.tasks.retrieval import read_captions
    from volta_ml.tasks.retrieval_metrics import top_images

    info = init_distributed(args.local_rank, args.device)
    try:
        torch.manual_seed(args.seed)
        setup = task_setup(args)
        task_id, entry, tokenizer = setup.task_id, setup.entry, setup.model.tokenizer
        split = args.split or entry.get("val_split") or "test"
        annotation = entry_path(entry, "val_annotations_jsonpath", args.val_annotations_jsonpath)
        if not annotation:
            raise FileNotFoundError(f"{task_id}: no annotation file (val_annotations_jsonpath in the task config "
                                    "or --val_annotations_jsonpath)")
        features = entry_path(entry, "features_h5path1", args.val_features_lmdbpath)
        view = setup.region_view(features)
        images, captions = read_captions(annotation, view)
        text = TextSource.encode(tokenizer, [c["text"] for c in captions], entry.get("max_seq_length", 80),
                                 annotation, setup.token_cache)
        caption_image = np.array([c["image"] for c in captions], dtype=np.int64)
        gallery = gallery_tensors(view, images, progress=info.is_main)
        model = load_scoring_model(args, setup, info.device)
        if not args.pair_batch:
            args.pair_batch = 1024 if info.device.type == "cuda" else 256
        precision = args.precision or ("fp32" if not args.amp else "fp16" if info.device.type == "cuda" else "bf16")

        out_dir = result_dir(args.output_dir, args.from_pretrained)
        work_dir = args.work_dir or os.path.join(out_dir, f"{split}_chunks")
        if info.is_main:
            os.makedirs(out_dir, exist_ok=True)
            if args.no_resume and os.path.isdir(work_dir):
                shutil.rmtree(work_dir)
        barrier(info)
        if info.is_main:
            print(f"{len(captions)} captions x {len(images)} images = {len(captions) * len(images)} pairs, "
                  f"{info.world_size} rank(s), {info.device}, {precision}", file=sys.stderr)
        started = time.time()
        scores = compute_score_matrix(
            model, caption_tensors(text), gallery, task_id=task_id, zero_shot=args.zero_shot, info=info,
            work_dir=work_dir, captions_per_chunk=args.captions_per_chunk, pair_batch=args.pair_batch,
            fingerprint=fingerprint(args, setup.model.config, tokenizer, annotation, features, images, len(captions),
                                    task_id, precision),
            precision=precision, score_dtype=args.score_dtype, shortlist=args.shortlist or None,
            shortlist_regions=args.shortlist_regions, reuse_prefix=not args.no_prefix_reuse, progress=info.is_main)
        elapsed = time.time() - started
        if not info.is_main:
            return None
        print(f"score matrix ready in {elapsed:.1f}s", file=sys.stderr)
        report = print_report(scores, caption_image, args, os.path.join(out_dir, f"{split}_items.jsonl"))
        save_array(os.path.join(out_dir, f"{split}_scores.npy"), scores.astype(args.score_dtype))
        atomic_write_json(os.path.join(out_dir, f"{split}_result.json"), top_images(scores), ensure_ascii=False)
        atomic_write_json(os.path.join(out_dir, f"{split}_others.json"), [], ensure_ascii=False)
        report.update(split=split, n_captions=len(captions), n_images=len(images), world_size=info.world_size,
                      precision=precision, seconds=elapsed, zero_shot=bool(args.zero_shot),
                      standard=not args.shortlist, shortlist=args.shortlist or None)
        atomic_write_json(os.path.join(out_dir, f"{split}_retrieval.json"), report)
        if not args.keep_chunks:
            shutil.rmtree(work_dir, ignore_errors=True)   # everything it held is in <split>_scores.npy now
        return report
    except BaseException:
        abort()  # no barrier with ranks that are still working: they fail at their next collective
        raise
    finally:
        shutdown(info)  # nothing left to do after abort()
