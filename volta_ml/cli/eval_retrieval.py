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
The job itself (gallery, scoring model, resume fingerprint, report lines) is `engine/retrieval_job.py`.
"""
from __future__ import annotations

import argparse

from volta_ml.cli.flags import (
    VoltaArgumentParser, add_model_flags, add_task_flags, add_volta_ml_flags, int_at_least,
)
from volta_ml.engine.retrieval_job import run_eval_retrieval


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
    group.add_argument("--num_subiters", type=int_at_least(1), default=2,
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
    extra.add_argument("--pair_batch", type=int_at_least(1), default=None,
                       help="(caption, image) pairs per forward (default 256 on CPU, 1024 on CUDA)")
    extra.add_argument("--captions_per_chunk", type=int_at_least(1), default=64,
                       help="captions per saved chunk of the score matrix (the unit of resuming and sharding)")
    extra.add_argument("--precision", choices=["fp32", "bf16", "fp16"], default=None,
                       help="autocast precision (default fp32; --amp means fp16 on CUDA, bf16 on CPU)")
    extra.add_argument("--score_dtype", choices=["float32", "float16"], default="float32",
                       help="storage of saved chunks and <split>_scores.npy")
    extra.add_argument("--work_dir", type=str, default=None,
                       help="where finished chunks are kept for resuming (default <result dir>/<split>_chunks)")
    extra.add_argument("--no_resume", action="store_true", help="discard saved chunks and start over")
    extra.add_argument("--keep_chunks", action="store_true", help="keep the chunk folder after success")
    extra.add_argument("--shortlist", type=int_at_least(0), default=0,
                       help="NON-STANDARD fast mode: re-rank only the K best images per caption by a cheap "
                            "score (the cross-encoder on --shortlist_regions regions); not comparable to IGLUE")
    extra.add_argument("--shortlist_regions", type=int_at_least(1), default=10)
    extra.add_argument("--no_prefix_reuse", action="store_true",
                       help="run every sub-layer per pair even for dual-stream models (for checking)")
    extra.add_argument("--no_running_lines", action="store_true", help="skip the per-caption '<i> Final' lines")


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
