"""`eval_retrieval.py` / `volta-ml eval-retrieval`: caption x image retrieval evaluation (TASK8, TASK20).

Output contract (IGLUE scripts and scrapers depend on it):
- `<output_dir>/<dir>/<split>_result.json`: per caption in file order, its top-20 image indices; `<dir>` is
  `from_pretrained.split("/")[1]` when the path has a `/` (so `home` for `/home/...`), else the whole string;
- `<split>_others.json` = `[]`;
- stdout: a running `<i> Final ...` line per caption, then three lines of asterisks, `Image Retrieval`, the
  IR `Final r1:…, r5:…, r10:…, mder:…, meanr:…` line, and the same for `Text Retrieval`. Scrapers read the
  last two lines starting with `Final`.
volta-ml adds `<split>_scores.npy` (the score matrix, captions x images) and `<split>_retrieval.json`
(metrics and how they were computed). Progress and logs go to stderr.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time

import numpy as np
import torch

from volta_ml.cli.flags import (
    VoltaArgumentParser, add_model_flags, add_task_flags, add_volta_ml_flags,
)

STARS = "*" * 50


def add_eval_retrieval_flags(parser: argparse.ArgumentParser) -> None:
    """IGLUE-VOLTA's eval_retrieval.py flags (dead ones accepted and ignored) plus volta-ml's."""
    add_model_flags(parser)
    add_task_flags(parser)
    group = parser.add_argument_group("retrieval evaluation (IGLUE-VOLTA flags)")
    group.add_argument("--output_dir", type=str, default="results")
    group.add_argument("--save_name", type=str, default="", help="unused (as VOLTA)")
    group.add_argument("--val_annotations_jsonpath", type=str, default="")
    group.add_argument("--val_features_lmdbpath", type=str, default="")
    group.add_argument("--split", type=str, default="",
                       help="result-file prefix (default: the task config's val_split; VOLTA requires it)")
    group.add_argument("--num_subiters", type=int, default=2,
                       help="VOLTA's gallery chunks per forward; only numbers the running lines here")
    group.add_argument("--caps_per_image", type=int, default=5, help="unused (as VOLTA): taken from the file")
    group.add_argument("--zero_shot", action="store_true",
                       help="score with the pretraining image-text matching head (probability of 'match')")
    group.add_argument("--batch_size", type=int, default=1,
                       help="accepted for compatibility (VOLTA needs 1); pairs per forward is --pair_batch")
    group.add_argument("--num_workers", type=int, default=16, help="unused (as VOLTA)")
    group.add_argument("--num_val_workers", type=int, default=10, help="unused: features are read once up front")
    group.add_argument("--use_chunk", type=float, default=0, help="unused (as VOLTA)")
    # torch.distributed.launch in torch 2.x passes the hyphenated spelling
    group.add_argument("--local-rank", dest="local_rank", type=int, help=argparse.SUPPRESS)
    add_volta_ml_flags(parser)
    extra = parser.add_argument_group("volta-ml retrieval extras")
    extra.add_argument("--pair_batch", type=int, default=None,
                       help="(caption, image) pairs per forward (default 256 on CPU, 1024 on CUDA)")
    extra.add_argument("--captions_per_chunk", type=int, default=64,
                       help="captions per saved chunk of the score matrix (the unit of resuming and sharding)")
    extra.add_argument("--precision", choices=["fp32", "bf16", "fp16"], default=None,
                       help="autocast precision (default fp32; --amp means fp16 on CUDA, bf16 on CPU)")
    extra.add_argument("--score_dtype", choices=["float32", "float16"], default="float32",
                       help="storage of saved chunks and <split>_scores.npy")
    extra.add_argument("--work_dir", type=str, default=None,
                       help="where finished chunks are kept for resuming (default <result dir>/<split>_chunks)")
    extra.add_argument("--no_resume", action="store_true", help="discard saved chunks and start over")
    extra.add_argument("--keep_chunks", action="store_true", help="keep the chunk folder after success")
    extra.add_argument("--shortlist", type=int, default=0,
                       help="NON-STANDARD fast mode: re-rank only the K best images per caption by a cheap "
                            "score (the cross-encoder on --shortlist_regions regions); not comparable to IGLUE")
    extra.add_argument("--shortlist_regions", type=int, default=10)
    extra.add_argument("--no_prefix_reuse", action="store_true",
                       help="run every sub-layer per pair even for dual-stream models (for checking)")
    extra.add_argument("--no_running_lines", action="store_true", help="skip the per-caption '<i> Final' lines")


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
    from volta_ml.digest import content_fingerprint, file_digest, text_digest

    config_json = json.dumps(model_config.to_dict(), sort_keys=True, default=str)
    return {
        "format": 2, "checkpoint": os.path.abspath(args.from_pretrained),
        "checkpoint_content": content_fingerprint(args.from_pretrained),
        "model_config": text_digest(config_json), "annotations": file_digest(annotation),
        "features": os.path.abspath(features), "images": text_digest("\n".join(images)),
        "n_captions": n_captions, "tokenizer": getattr(tokenizer, "volta_fingerprint", type(tokenizer).__name__),
        "task": task_id, "zero_shot": bool(args.zero_shot), "precision": precision, "pair_batch": args.pair_batch,
        "captions_per_chunk": args.captions_per_chunk, "score_dtype": args.score_dtype,
        "shortlist": args.shortlist, "shortlist_regions": args.shortlist_regions,
        "prefix_reuse": not args.no_prefix_reuse,
    }


def print_report(scores: np.ndarray, caption_image: np.ndarray, args) -> dict:
    from volta_ml.tasks.retrieval_metrics import (
        final_line, image_retrieval_ranks, recall_metrics, running_ir_lines, text_retrieval_ranks,
    )

    ir_ranks = image_retrieval_ranks(scores, caption_image)
    tr_ranks = text_retrieval_ranks(scores, caption_image)
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
    from volta_ml.cli.eval_task import write_json
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
        report = print_report(scores, caption_image, args)
        save_array(os.path.join(out_dir, f"{split}_scores.npy"), scores.astype(args.score_dtype))
        write_json(os.path.join(out_dir, f"{split}_result.json"), top_images(scores))
        write_json(os.path.join(out_dir, f"{split}_others.json"), [])
        report.update(split=split, n_captions=len(captions), n_images=len(images), world_size=info.world_size,
                      precision=precision, seconds=elapsed, zero_shot=bool(args.zero_shot),
                      standard=not args.shortlist, shortlist=args.shortlist or None)
        write_json(os.path.join(out_dir, f"{split}_retrieval.json"), report)
        if not args.keep_chunks:
            shutil.rmtree(work_dir, ignore_errors=True)   # everything it held is in <split>_scores.npy now
        return report
    except BaseException:
        abort()  # no barrier with ranks that are still working: they fail at their next collective
        raise
    finally:
        shutdown(info)  # nothing left to do after abort()


def run_checked(args, prog: str) -> int:
    """Exit status: 0, or `volta_ml.engine.failures.EXIT_CODES` with the cause as the last stderr line."""
    from volta_ml.engine.distributed import finish_process
    from volta_ml.engine.failures import fail

    try:
        run_eval_retrieval(args)
    except (Exception, KeyboardInterrupt) as error:
        return finish_process(fail(error, prog))
    return finish_process(0)


def register(subparsers) -> None:
    parser = subparsers.add_parser("eval-retrieval", help="caption x image retrieval evaluation (eval_retrieval.py)",
                                   description=__doc__.split("\n")[0])
    parser.__class__ = VoltaArgumentParser
    add_eval_retrieval_flags(parser)
    parser.set_defaults(func=lambda args: run_checked(args, "volta-ml eval-retrieval"))


def main(argv: list[str] | None = None) -> int:
    parser = VoltaArgumentParser(prog="eval_retrieval.py", description=__doc__.split("\n")[0])
    add_eval_retrieval_flags(parser)
    return run_checked(parser.parse_args(argv), "eval_retrieval.py")
