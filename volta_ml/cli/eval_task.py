"""`eval_task.py` / `volta-ml eval`: evaluate a fine-tuned checkpoint on one VOLTA task.

Output contract (IGLUE scripts and result scrapers depend on it):
- `<output_dir>/<basename(--from_pretrained)>-<save_name>/<split>_result.json`, `<split>_others.json` (`[]`)
  and `eval.txt` (the Validation line); beside them volta-ml's `<split>_items.jsonl`, each item's score (100 or
  0, whose mean is the score; volta_ml/stats.py), for the report's confidence intervals (not for xGQA, scored by
  GQA_score, which writes its own);
- stdout: `***** Running evaluation *****`, `  Num Iters:  <n>`, `  Batch size:  <b>`, progress;
- stderr, last: `Validation [<Name>]: loss <l> score <s> ` then, for TASK12, `Consistency: <float>`.
  GQA logs `loss 0.000 score 0.000` as VOLTA (the real score comes from `GQA_score.py`).
"""
from __future__ import annotations

import logging
import os
import random
import sys
import time

import numpy as np
import torch

from volta_ml.atomic import atomic_write_json
from volta_ml.cli.flags import VoltaArgumentParser, add_eval_task_flags, eval_task_parser
from volta_ml.devices import pick_device
from volta_ml.engine.evaluate import EvalResult, amp_precision, evaluate
from volta_ml.engine.failures import fail
from volta_ml.engine.logs import attach_stderr_handler
from volta_ml.engine.run_setup import task_setup
from volta_ml.stats import items_path, write_items
from volta_ml.tasks.config import entry_path

logger = logging.getLogger("volta_ml.eval_task")


def setup_logging() -> None:
    """Log lines go to the *current* stderr (the IGLUE scrapers read them from the job's .err file);
    only volta-ml's own handler is touched (pytest's or an embedding program's stay as they are)."""
    attach_stderr_handler(logger, logging.INFO)
    logger.propagate = False


def result_dir(output_dir: str, from_pretrained: str, save_name: str) -> str:
    """VOLTA's naming: `<output_dir>/<basename(checkpoint)>-<save_name>` (a bare trailing `-` by default)."""
    return os.path.join(output_dir, os.path.basename(from_pretrained) + "-" + save_name)


def validation_line(name: str, loss: float, score: float) -> str:
    return "Validation [%s]: loss %.3f score %.3f " % (name.replace("+", "plus"), loss, score)


def write_json(path: str, data) -> None:
    """Atomic write, so a crash never leaves a truncated result file for the scrapers."""
    atomic_write_json(path, data, ensure_ascii=False)


def run_eval(args) -> EvalResult:
    setup_logging()
    random.seed(args.seed)
    np.random.seed(args.seed)
    torch.manual_seed(args.seed)

    device = pick_device(args.device)  # a bad --device fails before any data or model is read
    setup = task_setup(args)
    entry, family, task_id = setup.entry, setup.family, setup.task_id
    split = args.split or entry.get("val_split") or "test"
    annotation = entry_path(entry, "val_annotations_jsonpath", args.val_annotations_jsonpath)
    features = entry_path(entry, "features_h5path1", args.val_features_lmdbpath)
    view = setup.region_view(features)
    dataset = family.build_dataset(entry, split, setup.model.tokenizer, view, annotation_path=annotation,
                                   token_cache=setup.token_cache, seed=args.seed)

    model, _ = setup.load_model(args.from_pretrained, log=logger)
    model.to(device)
    batch_size = int(entry.get("eval_batch_size") or args.batch_size)  # the config wins, as in VOLTA
    num_iters = (len(dataset) + batch_size - 1) // batch_size
    print("***** Running evaluation *****")
    print("  Num Iters: ", num_iters)
    print("  Batch size: ", batch_size)
    sys.stdout.flush()

    started = time.time()
    result = evaluate(model, dataset, family, task_id, batch_size=batch_size, num_workers=args.num_val_workers,
                      precision=amp_precision(args.amp, device), loss_name=args.loss or entry.get("loss"), desc=f"Eval {entry['name']}")
    elapsed = time.time() - started
    print(f"{result.n_examples} examples in {elapsed:.1f}s ({result.n_examples / max(elapsed, 1e-9):.1f}/s)")

    out_dir = result_dir(args.output_dir, args.from_pretrained, args.save_name)
    os.makedirs(out_dir, exist_ok=True)
    write_json(os.path.join(out_dir, f"{split}_result.json"), result.predictions)
    items = family.item_scores(result.predictions, dataset)
    if items is not None:
        write_items(items_path(os.path.join(out_dir, f"{split}_result.json")), items)
    write_json(os.path.join(out_dir, f"{split}_others.json"), [])
    is_gqa = entry["type"] == "VL-classifier-GQA"
    line = validation_line(entry["name"], 0.0 if is_gqa else result.loss, 0.0 if is_gqa else result.score_percent)
    with open(os.path.join(out_dir, "eval.txt"), "a", encoding="utf-8") as handle:
        handle.write(line + "\n")
    sys.stdout.flush()
    logger.info(line)
    if "consistency" in result.metrics:
        logger.info("Consistency: %r", result.metrics["consistency"])
    return result


def run_checked(args, prog: str) -> int:
    """Exit status: 0, or `volta_ml.engine.failures.EXIT_CODES` with the cause as the last stderr line."""
    try:
        run_eval(args)
    except (Exception, KeyboardInterrupt) as error:
        return fail(error, prog)
    return 0


def register(subparsers) -> None:
    parser = subparsers.add_parser("eval", help="evaluate a checkpoint on a VOLTA/IGLUE task (eval_task.py)",
                                   description=__doc__.split("\n")[0])
    parser.__class__ = VoltaArgumentParser  # unknown flags get a nearest-match suggestion
    add_eval_task_flags(parser)
    parser.set_defaults(func=lambda args: run_checked(args, "volta-ml eval"))


def main(argv: list[str] | None = None) -> int:
    return run_checked(eval_task_parser().parse_args(argv), "eval_task.py")
