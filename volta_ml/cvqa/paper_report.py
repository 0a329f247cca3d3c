"""`volta-ml cvqa report`'s output: every table of `tables.py` as CSV/Markdown/LaTeX, the figures of `figures.py`
and `cvqa_paper_report.md` with all tables and the list of runs (tables -> figures -> this module)."""
from __future__ import annotations

from pathlib import Path

from volta_ml.atomic import atomic_open

from volta_ml.stats import Options

from .collect import Run
from .compare import baseline_table
from .figures import write_figures
from .tables import build_tables, markdown, write_table


def write_paper_report(runs: list[Run], out_dir: str | Path, digits: int = 2, plots: bool = True,
                       data_revisions: list[str] | None = None, options: Options | None = None,
                       baseline: str | None = None) -> list[Path]:
    """Every table as CSV/Markdown/LaTeX (and PNG with `plots`) in `out_dir`, plus `cvqa_paper_report.md`
    holding all tables and the list of runs with their folders; with `baseline` (a run's label) the
    `baseline_comparison` table of paired differences."""
    options = options or Options()
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    tables = build_tables(runs, options)
    if baseline is not None:
        tables.append(baseline_table(runs, baseline, options))
    written = [p for table in tables for p in write_table(table, out_dir, digits, options.style)]
    if plots:
        written += write_figures(tables, out_dir)
    lines = ["# CVQA: the paper's tables", ""]
    if data_revisions:
        warning = " (several: these runs scored different data)" if len(data_revisions) > 1 else ""
        lines += [f"Data revision(s): {', '.join(f'`{r}`' for r in data_revisions)}{warning}.", ""]
    lines += ["| model | backend | model revision | rule | paper model | conditions | folders |", "|---|---|---|---|---|---|---|"]
    lines += [f"| {r.label} | {r.backend} | {r.revision or '-'} | {r.rule or '-'} | {r.paper or '-'} | "
              f"{', '.join(r.conditions)} | {', '.join(str(f) for f in r.folders)} |" for r in runs]
    lines.append("")
    for table in tables:
        lines += markdown(table, digits, options.style)
    path = out_dir / "cvqa_paper_report.md"
    with atomic_open(path, "w", encoding="utf-8") as f:
        f.write("\n".join(lines))
    return written + [path]
