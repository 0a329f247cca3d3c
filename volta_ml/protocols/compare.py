"""`volta-ml compare RUN_A RUN_B` for IGLUE and suite result trees: every table cell both runs have, A minus B, with the
paired bootstrap interval of the difference, the permutation p-value and the items found on one side only
(uncertainty.compare_rows, the same computation as the report's `baseline.*`), the few-shot AUC's included.

Rows are paired by name (the same model in both trees), or, when the trees share no row name, the only row of
each side; `--row_a` / `--row_b` choose them where a table has several.
"""
from __future__ import annotations

from pathlib import Path

from volta_ml.stats import Options

from .report import _csv, auc_comparisons, auc_sets, build_tables, markdown
from .results import collect
from .suite_report import build_suite_tables
from .uncertainty import COMPARE_HEADER, CellComparison, ItemFiles, compare_md_header, compare_rows, row_pairs


def compare_runs(run_a: Path, run_b: Path, options: Options, row_a: str | None = None,
                 row_b: str | None = None) -> list[CellComparison]:
    records_a, records_b = collect(run_a), collect(run_b)
    tables_a = dict(build_tables(records_a) + build_suite_tables(records_a))
    tables_b = dict(build_tables(records_b) + build_suite_tables(records_b))
    files = ItemFiles()
    out = []
    for stem, table_a in tables_a.items():
        table_b = tables_b.get(stem)
        if table_b is None:
            continue
        ours = lambda table: [m for m in table.models if m in table.sources]  # noqa: E731   (not published rows)
        for a, b in row_pairs(stem, ours(table_a), ours(table_b), row_a, row_b):
            out += compare_rows(stem, table_a, a, table_b, b, table_a.metric, files, options)
    aucs_b = {a.stem: a for a in auc_sets(records_b, files)}
    for aucs_a in auc_sets(records_a, files):
        other = aucs_b.get(aucs_a.stem)
        if other is not None:
            for a, b in row_pairs(aucs_a.stem, aucs_a.table.models, other.table.models, row_a, row_b):
                out += auc_comparisons(aucs_a, a, other, b, options)
    return out


def write_comparison(comparisons: list[CellComparison], title: str, options: Options, digits: int,
                     out_dir: Path | None, stem: str = "compare") -> str:
    """The Markdown table (returned) and, with `out_dir`, `<stem>.csv` and `<stem>.md` there."""
    text = markdown(compare_md_header(options), [c.markdown_row(digits, options.style) for c in comparisons],
                    title)
    if out_dir is not None:
        out_dir.mkdir(parents=True, exist_ok=True)
        (out_dir / f"{stem}.csv").write_text(_csv([COMPARE_HEADER] + [c.csv_row() for c in comparisons]),
                                             encoding="utf-8")
        (out_dir / f"{stem}.md").write_text(text, encoding="utf-8")
    return text
