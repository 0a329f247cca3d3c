"""Paired comparisons of CVQA runs: `volta-ml compare RUN_A RUN_B` on CVQA result folders and the `--baseline` table
of `volta-ml cvqa report`. Per prompt (condition) both runs have, micro and macro accuracy of A minus B on the
questions both scored (labelled ones; the others are named), with the paired bootstrap interval (questions resampled
within their country-language pair) and the paired permutation p-value (volta_ml/stats.py).
"""
from __future__ import annotations

from pathlib import Path

from volta_ml.engine.failures import UsageError
from volta_ml.protocols.uncertainty import HOLM_COLUMN, TRUNCATED_SIDES, CellComparison, holm_adjust, row_pairs
from volta_ml.stats import Options

from .collect import Run, load_runs
from .prompts import CONDITIONS
from .tables import Measured, Table

AVERAGES = ("micro", "macro")


def compare_two(run_a: Run, run_b: Run, options: Options) -> list[CellComparison]:
    """A minus B for each prompt of both runs, micro and macro, with Holm's p-values across them."""
    out = []
    for condition in [c for c in CONDITIONS if c in run_a.conditions and c in run_b.conditions]:
        (a, pairs), (b, _) = run_a.conditions[condition].items(), run_b.conditions[condition].items()
        for average in AVERAGES:
            cell = CellComparison("cvqa", f"{condition} {average}", run_a.label, run_b.label)
            if not a or not b:
                cell.note = "labels hidden (no accuracy)"
            elif not set(a) & set(b):
                cell.note = f"no question in common ({len(a)} in A, {len(b)} in B)"
            else:
                cell.result = options.compare(a, b, pairs, average=average,
                                              clusters=run_a.conditions[condition].clusters())
            cell.extra.update(zip(TRUNCATED_SIDES, (run_a.conditions[condition].truncated_rate(),
                                                    run_b.conditions[condition].truncated_rate())))
            out.append(cell)
    return holm_adjust(out)


def compare_cvqa(path_a: Path, path_b: Path, options: Options, row_a: str | None = None,
                 row_b: str | None = None) -> list[CellComparison]:
    """The runs (rows) of two result trees, paired by label (or the only run of each, or `row_a` / `row_b`)."""
    runs_a, runs_b = {r.label: r for r in load_runs([path_a])}, {r.label: r for r in load_runs([path_b])}
    return [cell for a, b in row_pairs("cvqa", list(runs_a), list(runs_b), row_a, row_b)
            for cell in compare_two(runs_a[a], runs_b[b], options)]


def baseline_table(runs: list[Run], baseline: str, options: Options) -> Table:
    """`baseline_comparison`: every other run minus the baseline run (by label), as `compare` prints it."""
    base = next((r for r in runs if r.label == baseline), None)
    if base is None:
        raise UsageError(f"--baseline {baseline!r}: no run with that label (runs: {', '.join(r.label for r in runs)})")
    table = Table("baseline_comparison", f"Paired differences from the baseline {baseline} (A − B, B = baseline)",
                  ["prompt", "average", "A", "B", "A value", "B value", "A − B", "p", HOLM_COLUMN, "paired questions",
                   "missing questions / note"],
                  note=f"A and B: each run's accuracy over the paired questions with its {options.confidence:.0%} "
                       f"bootstrap interval; A − B with its paired bootstrap interval (questions resampled within "
                       f"their country-language pair); p: paired permutation test; p (Holm): Holm-adjusted across "
                       f"the cells of one run's comparison (its prompts, micro and macro); `volta-ml compare` gives "
                       f"the same numbers.")
    for run in runs:
        if run is base:
            continue
        for cell in compare_two(run, base, options):
            condition, average = cell.column.split()
            r = cell.result
            if r is None:
                table.rows.append([condition, average, cell.a, cell.b, None, None, None, None, None, None, cell.note])
                continue
            table.rows.append([condition, average, cell.a, cell.b, Measured(r.a, r.a_low, r.a_high),
                               Measured(r.b, r.b_low, r.b_high), Measured(r.difference, r.low, r.high),
                               f"{r.p_value:.4f}", f"{cell.p_holm:.4f}", r.n, r.missing_text() or "-"])
    return table
