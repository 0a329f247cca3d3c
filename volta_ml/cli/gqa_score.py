"""`scripts/GQA_score.py` / `volta-ml gqa-score`: xGQA exact-match accuracy with IGLUE's semantics.

Prints one bare float (accuracy × 100) as the last stdout line, which the IGLUE scrapers read. Predictions
whose questionId is missing from the truth file are skipped, so the denominator counts matched ids only
(IGLUE's copy; VOLTA-HEAD divides by all predictions and crashes on a missing id). The skipped count is
reported on stderr so the quirk is visible. Each scored question's 100 or 0 goes to `<split>_items.jsonl` beside
the predictions file (volta_ml/stats.py; the report's confidence intervals).
"""
from __future__ import annotations

import argparse
import sys

from volta_ml.data.annotations import AnnotationError, read_json
from volta_ml.cli.flags import VoltaArgumentParser
from volta_ml.stats import items_path, write_items
from volta_ml.tasks.gqa import gqa_accuracy, gqa_items


def add_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--preds_file", required=True, help="eval_task <split>_result.json")
    parser.add_argument("--truth_file", required=True, help="GQA-format question JSON (questionId -> {answer,...})")


def run(args) -> int:
    predictions = read_json(args.preds_file, "GQA predictions")
    truth = read_json(args.truth_file, "GQA truth file")
    if not isinstance(predictions, list) or not isinstance(truth, dict):
        raise AnnotationError(f"expected a prediction list in {args.preds_file} and a questionId dict in "
                              f"{args.truth_file}")
    for position, row in enumerate(predictions):
        if not isinstance(row, dict) or "questionId" not in row or "prediction" not in row:
            raise AnnotationError(f"{args.preds_file}: entry {position + 1} lacks questionId/prediction")
    accuracy, matched = gqa_accuracy(predictions, truth)
    if matched == 0:
        print(f"GQA_score: none of the {len(predictions)} predictions has a questionId in {args.truth_file}",
              file=sys.stderr)
        return 1
    if matched < len(predictions):
        print(f"GQA_score: skipped {len(predictions) - matched} predictions not in the truth file "
              f"(denominator {matched}, as IGLUE)", file=sys.stderr)
    write_items(items_path(args.preds_file), gqa_items(predictions, truth))
    print(accuracy)
    return 0


def register(subparsers) -> None:
    parser = subparsers.add_parser("gqa-score", help="xGQA accuracy of eval results (scripts/GQA_score.py)",
                                   description=__doc__.split("\n")[0])
    parser.__class__ = VoltaArgumentParser
    add_flags(parser)
    parser.set_defaults(func=run)


def main(argv: list[str] | None = None) -> int:
    parser = VoltaArgumentParser(prog="GQA_score.py", description=__doc__.split("\n")[0])
    add_flags(parser)
    return run(parser.parse_args(argv))
