"""The suite's tables for `volta-ml report`: per task (and metric) one model x language table with English,
the other languages in the benchmark's order, `mul` (the unweighted mean over the table's non-English
languages, as mBLIP, Centurio and PangeaBench report) and, for benchmarks whose paper averages every language
(Kaleidoscope, MTVQA), `avg` (the unweighted mean over all of the table's languages). An aggregate needs every
language of the table (else "–", never a mean of what happens to be there); the caption says how many of the
benchmark's languages the table has. The numbers the benchmarks' authors and the suite papers published
(`protocols/suite.PUBLISHED`, sources in docs/suite.md) are rows `<name> (published)` of the same tables (those
with a number in the table), their aggregates computed over the same columns, or the source's own `mul` / `avg`
where it gives no per-language numbers and the table has every language of the benchmark. Generation rules on
multiple choice also get `<Title>_format_errors` (the share of answers that named no option), every generation
rule `<Title>_truncated` (the share of answers cut at max_new_tokens; a run whose backend does not say, imported
answers, has no cell there), and `suite_summary` puts every task's English and aggregate side by side.

Files: `<Title>.csv|md|tex` (retrieval: `<Title>_ir_r1`, `<Title>_tr_r1`), `<Title>_format_errors.*`,
`<Title>_truncated.*`,
`suite_summary.*`. Scores of one model, rule and language from several runs are averaged; different rules of a
model are different rows (`<model> (<rule>)`).

Uncertainty (uncertainty.py, volta_ml/stats.py), as for IGLUE's tables: the Markdown/LaTeX cells of runs with
per-item files carry their bootstrap interval (`mul` / `avg`: resampled within each language; a caption score:
over the images' CIDEr with the corpus' document frequencies fixed), `uncertainty/<stem>.csv` every cell's bounds
and seeds, and with a baseline row `suite_baseline.*` the paired differences from it. The CSVs keep their
columns; published rows have no interval."""
from __future__ import annotations

import csv
import io
from collections import defaultdict
from pathlib import Path

import numpy as np

from volta_ml.stats import TRUNCATED, Options

from .report import latex, markdown, row_names
from .suite import PUBLISHED, SUITE
from .uncertainty import (
    COMPARE_HEADER, UNCERTAINTY_HEADER, ItemFiles, cell_text, compare_md_header, compare_rows, table_stats,
    uncertainty_rows,
)


def _csv(rows: list[list]) -> str:
    buf = io.StringIO()
    csv.writer(buf, lineterminator="\n").writerows(rows)
    return buf.getvalue()


class SuiteTable:
    def __init__(self, task: str, metric: str, values: dict[str, dict[str, float]], published: dict | None = None,
                 sources: dict[str, dict[str, list[dict]]] | None = None):
        spec = SUITE[task]
        self.task, self.metric, self.spec = task, metric, spec
        self.sources = sources or {}          # row -> language -> the records behind the value (not published rows)
        langs = {l for row in values.values() for l in row}
        self.columns = [l for l in spec.languages if l in langs] if spec.languages else \
            sorted(langs, key=lambda l: (l != "en", l))          # a format without languages of its own
        self.targets = [l for l in self.columns if l != "en"]
        self.values = dict(values)
        self.aggregates = ["mul"] + (["avg"] if spec.aggregate == "all" else [])
        self.own: dict[str, dict] = {}           # published rows: the source's own aggregates
        for name, (_, scores, own) in (published or {}).items():
            row = f"{name} (published)"
            self.values[row], self.own[row] = {l: scores[l] for l in self.columns if l in scores}, own
            if not self.values[row] and all(self.aggregate(row, k) is None for k in self.aggregates):
                del self.values[row], self.own[row]        # nothing of it in this table

    def aggregate(self, model: str, kind: str) -> float | None:
        """The mean over the table's languages the aggregate spans; for a published row without them, the
        source's own aggregate when the table has every language of the benchmark (then both span the same)."""
        langs = self.targets if kind == "mul" else self.columns
        row = self.values[model]
        if langs and all(l in row for l in langs):
            return float(np.mean([row[l] for l in langs]))
        spans = [l for l in self.spec.languages if kind == "avg" or l != "en"]
        if kind in self.own.get(model, {}) and set(spans) <= set(langs):
            return float(self.own[model][kind])
        return None

    def header(self) -> list[str]:
        return ["model"] + self.columns + self.aggregates

    @property
    def models(self) -> list[str]:
        return list(self.values)

    def aggregate_columns(self) -> list[tuple[str, list[str]]]:
        """`mul` over the non-English languages, `avg` over all (uncertainty.py's intervals and comparisons)."""
        return [(kind, self.targets if kind == "mul" else self.columns) for kind in self.aggregates]

    def aggregate_value(self, model: str, name: str) -> float | None:
        return self.aggregate(model, name)

    def rows(self) -> list[list[float | None]]:
        return [[m] + [self.values[m].get(l) for l in self.columns] + [self.aggregate(m, k) for k in self.aggregates]
                for m in self.values]

    def caption(self) -> str:
        have, total = len(self.targets), len([l for l in self.spec.languages if l != "en"])
        part = "" if have == total or not self.spec.languages else \
            f" (partial: {have} of the benchmark's {total} non-English languages)"
        avg = "; avg: unweighted mean over all languages of the table" if "avg" in self.aggregates else ""
        what = {"score": self.spec.metric_name, "format_error_rate": "share of generated answers naming no option, %",
                TRUNCATED: "share of generated answers cut at max_new_tokens, %; – where the backend does not say"}
        return (f"{self.spec.title}, {self.metric} ({what.get(self.metric, self.spec.metric_name)}); mul: unweighted "
                f"mean over {have} non-English language(s){part}{avg}")


def suite_sources(records: list[dict], metric_key: str) -> dict[str, dict[str, dict[str, list[dict]]]]:
    """task -> row name -> language -> the records with a value of `metric_key` (runs of the same row and language)."""
    mine = [r for r in records if r.get("task") in SUITE and r.get("protocol") == "zero_shot"]
    found: dict = defaultdict(lambda: defaultdict(lambda: defaultdict(list)))
    for record, row in zip(mine, row_names(mine)):
        if record.get("metrics", {}).get(metric_key) is not None:
            found[record["task"]][row][record["lang"]].append(record)
    return found


def suite_values(records: list[dict], metric_key: str) -> dict[str, dict[tuple, dict[str, float]]]:
    """task -> row name -> language -> mean value of `metric_key` (over runs of the same row and language)."""
    return {t: {m: {l: float(np.mean([float(r["metrics"][metric_key]) for r in recs])) for l, recs in langs.items()}
                for m, langs in models.items()} for t, models in suite_sources(records, metric_key).items()}


RATE_TABLES = {"format_error_rate": "format_errors", TRUNCATED: "truncated"}   # per-cell rates: metric -> stem suffix


def build_suite_tables(records: list[dict]) -> list[tuple[str, SuiteTable]]:
    out = []
    for task, spec in SUITE.items():
        for metric in spec.metrics + tuple(RATE_TABLES):
            sources = suite_sources(records, metric).get(task)
            if not sources:
                continue
            values = suite_values(records, metric)[task]
            if metric in RATE_TABLES:
                out.append((f"{spec.title}_{RATE_TABLES[metric]}", SuiteTable(task, metric, values, sources=sources)))
            else:
                stem = spec.title if metric == "score" else f"{spec.title}_{metric}"
                out.append((stem, SuiteTable(task, metric, values, PUBLISHED.get(task), sources)))
    return out


def write_suite_report(records: list[dict], out_dir: Path, digits: int = 2, options: Options | None = None,
                       baseline: str | None = None) -> list[Path]:
    """The suite's tables (module docstring); `baseline` (a row name) adds `suite_baseline.*` when a table has it."""
    tables = build_suite_tables(records)
    if not tables:
        return []
    options = options or Options()
    out_dir.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []
    files = ItemFiles()
    stats = {stem: table_stats(table, table.metric, files, options) for stem, table in tables}

    def emit(stem: str, header: list[str], rows: list[list], caption: str, cells=lambda model, column: None) -> None:
        csv_rows = [header] + [[r[0]] + ["" if v is None else repr(float(v)) for v in r[1:]] for r in rows]
        shown = [[r[0]] + [cell_text(v, cells(r[0], c), digits, options.style) for v, c in zip(r[1:], header[1:])]
                 for r in rows]
        for suffix, text in ((".csv", _csv(csv_rows)), (".md", markdown(header, shown, caption)),
                             (".tex", latex(header, shown, caption))):
            path = out_dir / f"{stem}{suffix}"
            path.write_text(text, encoding="utf-8")
            written.append(path)

    summary: dict = defaultdict(dict)
    columns: dict[str, tuple[str, str]] = {}          # summary column -> (table stem, its column)
    for stem, table in tables:
        emit(stem, table.header(), table.rows(), table.caption(), lambda m, c, s=stats[stem]: s.get((m, c)))
        path = out_dir / "uncertainty" / f"{stem}.csv"
        path.parent.mkdir(exist_ok=True)
        path.write_text(_csv([UNCERTAINTY_HEADER] + uncertainty_rows(table, stats[stem], options)), encoding="utf-8")
        written.append(path)
        if table.metric in ("score", "ir_r1"):
            for model in table.values:
                for kind in (["en"] if "en" in table.columns else []) + table.aggregates:
                    column = f"{table.spec.title}{'' if table.metric == 'score' else ' ' + table.metric} {kind}"
                    columns[column] = (stem, kind)
                    summary[model][column] = table.values[model].get("en") if kind == "en" else \
                        table.aggregate(model, kind)
    ours = {m for _, table in tables for m in table.sources}
    order = [m for m in summary if m in ours] + [m for m in summary if m not in ours]     # published rows last
    emit("suite_summary", ["model"] + list(columns), [[m] + [summary[m].get(c) for c in columns] for m in order],
         "the suite side by side: English and the aggregates of each task",
         lambda m, c: stats[columns[c][0]].get((m, columns[c][1])))
    if baseline is not None and any(baseline in table.sources for _, table in tables):
        cells = [cell for stem, table in tables if baseline in table.sources for row in table.sources
                 if row != baseline
                 for cell in compare_rows(stem, table, row, table, baseline, table.metric, files, options)]
        emit_comparison = [c.markdown_row(digits, options.style) for c in cells]
        for suffix, text in ((".csv", _csv([COMPARE_HEADER] + [c.csv_row() for c in cells])),
                             (".md", markdown(compare_md_header(options), emit_comparison,
                                              f"the suite: paired differences from the baseline row {baseline}")),
                             (".tex", latex(compare_md_header(options), emit_comparison,
                                            f"the suite: paired differences from the baseline row {baseline}"))):
            path = out_dir / f"suite_baseline{suffix}"
            path.write_text(text, encoding="utf-8")
            written.append(path)
    return written
