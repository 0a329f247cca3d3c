"""`eval_task.py` / `volta-ml eval`: evaluate a fine-tuned checkpoint on one VOLTA task.

Output contract (IGLUE scripts and result scrapers depend on it):
- `<output_dir>/<basename(--from_pretrained)>-<save_name>/<split>_result.json`, `<split>_others.json` (`[]`)
  and `eval.txt` (the Validation line);
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
from volta_ml.data import TokenCache, default_cache_dir, load_tokenizer
from volta_ml.engine.evaluate import EvalResult, evaluate
from volta_ml.cli.flags import VoltaArgumentParser, add_eval_task_flags, resolve_tokenizer_args
from volta_ml.tasks import family_for
from volta_ml.tasks.config import PathResolver, entry_path, get_task_entry, load_task_config
from volta_ml.tasks.regions import open_region_view

logger = logging.getLogger("volta_ml.eval_task")
LOG_FORMAT = "%(asctime)s - %(levelname)s - %(name)s -   %(message)s"


def setup_logging() -> None:
    """Log lines go to the *current* stderr (the IGLUE scrapers read them from the job's .err file)."""
    if not logger.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter(LOG_FORMAT, datefmt="%m/%d/%Y %H:%M:%S"))
        logger.addHandler(handler)
        logger.setLevel(logging.INFO)
        logger.propagate = False
    for handler in logger.handlers:
        if isinstance(handler, logging.StreamHandler):
            handler.stream = sys.stderr


def result_dir(output_dir: str, from_pretrained: str, save_name: str) -> str:
    """VOLTA's naming: `<output_dir>/<basename(checkpoint)>-<save_name>` (a bare trailing `-` by default)."""
    return os.path.join(output_dir, os.path.basename(from_pretrained) + "-" + save_name)


def validation_line(name: str, loss: float, score: float) -> str:
    return "Validation [%s]: loss %.3f score %.3f " % (name.replace("+", "plus"), loss, score)


def write_json(path: str, data) -> None:
    """Atomic write, so a crash never leaves a truncated result file for the scrapers."""
    atomic_write_json(path, data, ensure_ascii=False)


def pick_device(requested: str | None) -> torch.device:
    if requested:
        return torch.device(requested)
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def load_model(args, model_config, task_config: dict, task_id: str, device: torch.device):
    from volta_ml.models import build_model, load_checkpoint

    model = build_model(model_config, task_config, [task_id], kind="tasks")
    if not os.path.isfile(args.from_pretrained):
        raise FileNotFoundError(f"--from_pretrained {args.from_pretrained}: checkpoint not found")
    report = load_checkpoint(model, args.from_pretrained)
    missing = list(getattr(report, "missing_keys", None) or getattr(report, "missing", None) or [])
    unexpected = list(getattr(report, "unexpected_keys", None) or getattr(report, "unexpected", None) or [])
    head = f"clfs_dict.{task_id}."
    if any(head in key for key in missing):
        present = sorted({k.split("clfs_dict.")[1].split(".")[0] for k in unexpected if "clfs_dict." in k})
        logger.warning("the checkpoint has no %s head: it is randomly initialised, so scores are meaningless "
                       "(heads in the checkpoint: %s). Check --task.", task_id, ", ".join(present) or "none")
    if missing:
        logger.info("weights not in the checkpoint: %d (e.g. %s)", len(missing), ", ".join(missing[:5]))
    if unexpected:
        logger.info("checkpoint weights not used: %d (e.g. %s)", len(unexpected), ", ".join(unexpected[:5]))
    return model.to(device)


def run_eval(args) -> EvalResult:
    from volta_ml.models import load_config

    setup_logging()
    random.seed(args.seed)
    np.random.seed(args.seed)
    torch.manual_seed(args.seed)

    task_config = load_task_config(args.tasks_config_file)
    task_id, entry = get_task_entry(task_config, args.task)
    entry = PathResolver(args.data_root, args.path_map).resolve_entry(entry)
    family = family_for(entry)
    model_config = load_config(args.config_file, is_m3p=args.is_m3p or None)
    if entry.get("fusion_method"):
        model_config.fusion_method = entry["fusion_method"]
    bert_model, do_lower_case = resolve_tokenizer_args(args, model_config)
    tokenizer = load_tokenizer(bert_model, do_lower_case)

    split = args.split or entry.get("val_split") or "test"
    annotation = entry_path(entry, "val_annotations_jsonpath", args.val_annotations_jsonpath)
    features = entry_path(entry, "features_h5path1", args.val_features_lmdbpath)
    view = open_region_view(features, model_config, entry)
    cache = TokenCache(None if args.no_cache else (args.cache_dir or default_cache_dir()))
    dataset = family.build_dataset(entry, split, tokenizer, view, annotation_path=annotation, token_cache=cache,
                                   seed=args.seed)

    device = pick_device(args.device)
    model = load_model(args, model_config, task_config, task_id, device)
    batch_size = int(entry.get("eval_batch_size") or args.batch_size)  # the config wins, as in VOLTA
    num_iters = (len(dataset) + batch_size - 1) // batch_size
    print("***** Running evaluation *****")
    print("  Num Iters: ", num_iters)
    print("  Batch size: ", batch_size)
    sys.stdout.flush()

    started = time.time()
    result = evaluate(model, dataset, family, task_id, batch_size=batch_size, num_workers=args.num_val_workers,
                      amp=args.amp, loss_name=args.loss or entry.get("loss"), desc=f"Eval {entry['name']}")
    elapsed = time.time() - started
    print(f"{result.n_examples} examples in {elapsed:.1f}s ({result.n_examples / max(elapsed, 1e-9):.1f}/s)")

    out_dir = result_dir(args.output_dir, args.from_pretrained, args.save_name)
    os.makedirs(out_dir, exist_ok=True)
    write_json(os.path.join(out_dir, f"{split}_result.json"), result.predictions)
    write_json(os.path.join(out_dir, f"{split}_others.json"), [])
    is_gqa = entry["type"] == "VL-classifier-GQA"
    line = validation_line(entry["name"], 0.0 if is_gqa else result.loss, 0.0 if is_gqa else result.score)
    with open(os.path.join(out_dir, "eval.txt"), "a", encoding="utf-8") as handle:
        handle.write(line + "\n")
    sys.stdout.flush()
    logger.info(line)
    if "consistency" in result.metrics:
        logger.info("Consistency: %r", result.metrics["consistency"])
    return result


def user_errors() -> tuple[type[BaseException], ...]:
    """Errors caused by inputs (files, flags, configs): reported as one clear line instead of a traceback."""
    from volta_ml.data import AnnotationError, TokenizerLoadError
    from volta_ml.tasks.common import MissingImageError
    from volta_ml.tasks.config import TaskConfigError
    errors = [AnnotationError, TokenizerLoadError, MissingImageError, TaskConfigError, FileNotFoundError]
    try:
        from volta_ml.models import CheckpointError, ConfigError
        errors += [CheckpointError, ConfigError]
    except ImportError:
        pass
    try:
        from volta_ml.features import FeatureStoreError
        errors.append(FeatureStoreError)
    except ImportError:
        pass
    return tuple(errors)


def run_checked(args, prog: str) -> int:
    try:
        run_eval(args)
    except user_errors() as err:
        message = err.args[0] if isinstance(err, KeyError) and err.args else err
        print(f"{prog}: error: {message}", file=sys.stderr)
        return 2
    return 0


def register(subparsers) -> None:
    parser = subparsers.add_parser("eval", help="evaluate a checkpoint on a VOLTA/IGLUE task (eval_task.py)",
                                   description=__doc__.split("\n")[0])
    parser.__class__ = VoltaArgumentParser  # unknown flags get a nearest-match suggestion
    add_eval_task_flags(parser)
    parser.set_defaults(func=lambda args: run_checked(args, "volta-ml eval"))


def main(argv: list[str] | None = None) -> int:
    parser = VoltaArgumentParser(prog="eval_task.py", description="Evaluate a fine-tuned model on a VOLTA task.")
    add_eval_task_flags(parser)
    return run_checked(parser.parse_args(argv), "eval_task.py")
