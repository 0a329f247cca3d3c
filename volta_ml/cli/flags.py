"""VOLTA/IGLUE command-line flags, shared by the entry points (`eval_task.py`, `train_task.py`, ...).

Flags keep IGLUE-VOLTA's names, types and defaults. Differences, all additive:
- an unknown flag is rejected with the nearest valid one suggested;
- a single trailing bare `deactivate` token (present in several committed IGLUE scripts) is dropped with a
  warning instead of failing;
- `--bert_model`/`--do_lower_case` may come from the command line (IGLUE-VOLTA) or from the model config JSON
  keys `bert_model`/`do_lower_case` (VOLTA-HEAD); the command line wins;
- volta-ml extras: `--data_root`, `--path_map`, `--device`, `--amp`, `--cache_dir`, `--no_cache`.
"""
from __future__ import annotations

import argparse

from volta_ml.data.text import VOLTA_DEFAULT_TOKENIZER
# the bounded argparse types, used here and by every command line (imported from here or from volta_ml.options)
from volta_ml.options import SEED, OneLineParser, VoltaArgumentParser, float_in, int_at_least, json_object  # noqa: F401


def add_model_flags(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("model and tokenizer")
    group.add_argument("--from_pretrained", type=str, default="bert-base-uncased",
                       help="checkpoint (.bin state_dict or .safetensors)")
    group.add_argument("--bert_model", type=str, default=None,
                       help="tokenizer directory for AutoTokenizer (never downloaded); default: the model "
                            f"config's bert_model key, else {VOLTA_DEFAULT_TOKENIZER}")
    group.add_argument("--do_lower_case", action="store_true", default=None,
                       help="lower-case text (passed explicitly to AutoTokenizer, as IGLUE-VOLTA)")
    group.add_argument("--config_file", type=str, default="config/bert_config.json", help="model config JSON")
    group.add_argument("--is_m3p", action="store_true", help="use the M3P config class")


def add_task_flags(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("task")
    group.add_argument("--tasks_config_file", type=str, default="config_tasks/vilbert_trainval_tasks.yml",
                       help="VOLTA task YAML (TASK<n> entries)")
    group.add_argument("--task", type=str, default="", help="task number; the YAML key is TASK<task>")
    group.add_argument("--loss", type=str, default="", help="override the config loss")
    group.add_argument("--in_memory", default=False, type=bool,
                       help="VOLTA's in-RAM feature cache switch (type=bool: any value turns it on); "
                            "accepted for compatibility, volta-ml's stores need no separate path")
    group.add_argument("--drop_last", action="store_true")
    group.add_argument("--seed", type=SEED, default=42)
    group.add_argument("--local_rank", type=int, default=-1)


def add_volta_ml_flags(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("volta-ml extras")
    group.add_argument("--data_root", type=str, default=None,
                       help="data root for {data_root} paths in shipped task configs (env VOLTA_ML_DATA_ROOT)")
    group.add_argument("--path_map", type=str, default=None,
                       help="OLD=NEW[;OLD2=NEW2] prefix rewrites for absolute paths in VOLTA task configs "
                            "(env VOLTA_ML_PATH_MAP)")
    group.add_argument("--device", type=str, default=None, help="cpu, cuda, cuda:1 ... (default: cuda if available)")
    group.add_argument("--amp", action="store_true", help="autocast (fp16 on CUDA, bf16 on CPU)")
    group.add_argument("--cache_dir", type=str, default=None,
                       help="tokenised-text cache (default $VOLTA_ML_CACHE or ~/.cache/volta_ml/tokens)")
    group.add_argument("--no_cache", action="store_true", help="do not read or write the tokenised-text cache")


def add_eval_task_flags(parser: argparse.ArgumentParser) -> None:
    """`eval_task.py`'s flags: IGLUE-VOLTA's plus volta-ml's extras."""
    add_model_flags(parser)
    add_task_flags(parser)
    group = parser.add_argument_group("evaluation")
    group.add_argument("--output_dir", type=str, default="results")
    group.add_argument("--save_name", type=str, default="", help="result dir = <output_dir>/<ckpt>-<save_name>")
    group.add_argument("--val_annotations_jsonpath", type=str, default="")
    group.add_argument("--val_features_lmdbpath", type=str, default="")
    group.add_argument("--split", type=str, default="", help="split name and result-file prefix")
    group.add_argument("--batch_size", type=int_at_least(1), default=30,
                       help="used only when the task config has no eval_batch_size (as VOLTA)")
    group.add_argument("--num_workers", type=int, default=16, help="unused by evaluation (as VOLTA)")
    group.add_argument("--num_val_workers", type=int_at_least(0), default=2, help="evaluation DataLoader workers")
    group.add_argument("--use_chunk", type=float, default=0, help="unused (as VOLTA)")
    add_volta_ml_flags(parser)


def eval_task_parser(prog: str = "eval_task.py", parser=None) -> argparse.ArgumentParser:
    parser = parser or VoltaArgumentParser(prog=prog, description="Evaluate a fine-tuned model on a VOLTA task.")
    add_eval_task_flags(parser)
    return parser
