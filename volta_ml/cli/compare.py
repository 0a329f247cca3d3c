"""`volta-ml compare RUN_A RUN_B`: two runs on the same items, cell by cell: A - B, its paired bootstrap interval,
the paired permutation p-value, and the items scored on one side only (named, never dropped silently).

A run is a folder: a sweep's output (or one cell), `volta-ml iglue-hf` output folders, an IGLUE `experiments/`
tree (IGLUE tables: volta_ml/protocols/compare.py) or CVQA result folders (`cvqa_results.json` +
`predictions_<condition>.csv`: volta_ml/cvqa/compare.py). A tree holding both kinds gets both comparisons.
"""
from __future__ import annotations

import sys
from pathlib import Path

from volta_ml.engine.failures import UsageError
from volta_ml.options import int_at_least


def register(subparsers) -> None:
    from volta_ml.protocols.cli import add_stat_flags

    p = subparsers.add_parser("compare", help="paired differences of two runs with intervals and p-values",
                              description=__doc__.split("\n\n")[0])
    p.add_argument("run_a", metavar="RUN_A")
    p.add_argument("run_b", metavar="RUN_B")
    p.add_argument("--row_a", default=None, help="the row (model) of RUN_A to compare, where a table has several")
    p.add_argument("--row_b", default=None, help="the row (model) of RUN_B")
    p.add_argument("--out", default=None, help="also write compare.csv / compare.md (CVQA: cvqa_compare.*) here")
    p.add_argument("--digits", type=int_at_least(0), default=2)
    add_stat_flags(p)
    p.set_defaults(func=cmd_compare)


def cmd_compare(args) -> int:
    from volta_ml.protocols.cli import stat_options
    from volta_ml.protocols.results import collect

    options = stat_options(args)
    runs = [Path(args.run_a), Path(args.run_b)]
    for run in runs:
        if not run.exists():
            raise UsageError(f"{run}: no such file or folder")
    out = Path(args.out) if args.out else None
    done = False
    if all(collect(run) for run in runs):
        from volta_ml.protocols.compare import compare_runs, write_comparison

        cells = compare_runs(runs[0], runs[1], options, args.row_a, args.row_b)
        print(write_comparison(cells, f"A = {runs[0]}, B = {runs[1]}", options, args.digits, out))
        done = bool(cells)
    if all(any(run.rglob("cvqa_results.json")) or run.name == "cvqa_results.json" for run in runs):
        from volta_ml.cvqa.collect import ReportInputError
        from volta_ml.cvqa.compare import compare_cvqa
        from volta_ml.protocols.compare import write_comparison

        try:
            cells = compare_cvqa(runs[0], runs[1], options, args.row_a, args.row_b)
        except ReportInputError as error:
            raise UsageError(str(error)) from None
        print(write_comparison(cells, f"CVQA: A = {runs[0]}, B = {runs[1]}", options, args.digits, out,
                               "cvqa_compare"))
        done = done or bool(cells)
    if not done:
        print(f"compare: {runs[0]} and {runs[1]} have no table cell in common (IGLUE results or CVQA result "
              f"folders on both sides)", file=sys.stderr)
        return 1
    return 0
