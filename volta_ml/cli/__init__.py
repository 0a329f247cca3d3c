"""The `volta-ml` console command, and the command-line front ends of the VOLTA-compatible scripts.

This package holds `train_task.py`, `eval_task.py`, `eval_retrieval.py` and `GQA_score.py` (their flags, their
output contracts) as `volta-ml train | eval | eval-retrieval | gqa-score`; the pipelines with their own room
own their subcommands in their `cli` module (`features`, `models`, `cvqa`, `protocols`, `demo`). Every such
module has a `register(subparsers)` function that adds parsers and sets `func` on them; this file only lists
them, so adding a command never touches another area.
"""
from __future__ import annotations

import argparse
import importlib

from volta_ml.options import OneLineParser

# Modules that register subcommands: the VOLTA-compatible front ends in this package, then each area's cli.
COMMAND_MODULES = [
    "volta_ml.models.cli",
    "volta_ml.features.cli",
    "volta_ml.cli.train_task",
    "volta_ml.cli.eval_task",
    "volta_ml.cli.eval_retrieval",
    "volta_ml.cli.gqa_score",
    "volta_ml.cvqa.cli",
    "volta_ml.iglue_hf.cli",
    "volta_ml.suite.cli",
    "volta_ml.protocols.cli",
    "volta_ml.cli.compare",
    "volta_ml.demo.cli",
    "volta_ml.pretrain.cli",
]


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(        # usage errors of every subcommand: one line (volta_ml/options.py)
        prog="volta-ml",
        description="Train and evaluate vision-and-language BERTs on VOLTA/IGLUE files.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMAND_MODULES:
        importlib.import_module(name).register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    from volta_ml.engine.failures import fail
    try:
        return int(args.func(args) or 0)
    except (Exception, KeyboardInterrupt) as error:  # one line (exit 2 for usage errors), never a bare traceback
        return fail(error, f"volta-ml {args.command}")
