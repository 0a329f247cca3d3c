"""`volta-ml report RESULTS_DIR`: IGLUE's tables from sweep results and old IGLUE/VOLTA logs.

Per task (and per retrieval direction), files named like IGLUE's `results/<task>/*.csv`:
- `<Title>_0.csv` zero-shot, `<Title>_0.mt.csv` translate-test, `<Title>_<shot>.csv` few-shot,
  `<Title>_0.translate-train.csv`; retrieval tasks add `_ir` / `_tr` (`xFlickrCO_ir_0.csv`).
  Rows are models, columns `model, en, <target languages>, avg`, exactly IGLUE's CSV layout: `avg` is the
  numpy mean over the target languages (English excluded) and a missing score is written as -1.0 and
  still averaged, as IGLUE's scrapers do. The same tables as Markdown (`.md`) and LaTeX (`.tex`), where a
  missing score shows as "–" and makes the average "–" rather than a misleading number.
- `<Title>_summary.*`: zero-shot / translate-test / few-shot averages side by side, with the few-shot AUC.
- `<Title>_fewshot_auc.*`: AUC per model and language (its interval: over the test items' own AUCs, `auc_stats`).
Scores of several seeds are averaged. Scores of different scoring rules never are: a model with records of more
than one rule for a task (e.g. `volta-ml iglue-hf` XVNLI runs with `--rule letter` and `--rule likelihood`,
both named after the model folder) gets one row per rule, `<model> (<rule>)`.

Uncertainty (uncertainty.py, volta_ml/stats.py): the Markdown/LaTeX cells of records with per-item files show
`value ± half-width` of a bootstrap interval (or `value [low, high]`); the CSVs stay IGLUE's, and
`uncertainty/<stem>.csv` has every cell's interval, items, seeds (n, mean, std, per seed) and format-error rate;
`seeds.*` lists the cells run with several seeds, `format_errors.*` the generate rule's unparsed answers per cell,
`truncated.*` its answers cut at max_new_tokens per cell, `baseline.*` every row's paired difference from the
baseline row (with Holm's p-values across each table's cells).
"""
from __future__ import annotations

import csv
import io
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from volta_ml.stats import Options, fixed, latex_text, seed_spread

from .iglue import TASKS, shot_count
from .uncertainty import (
    AVG, COMPARE_HEADER, UNCERTAINTY_HEADER, CellComparison, CellStats, ItemFiles, cell_text, compare_items,
    compare_md_header, compare_rows, rate_text, seed_items, table_stats, truncation_text, uncertainty_rows,
)

MISSING = -1.0
MODEL_ORDER = ["ctrl_muniter", "ctrl_xuniter", "uc2", "m3p", "ctrl_lxmert", "ctrl_uniter", "ctrl_vilbert",
               "ctrl_visualbert", "ctrl_vl-bert"]


def metrics_of(task: str) -> list[tuple[str, str]]:
    """(file-name infix, metric key) per table of a task: retrieval has image and text retrieval R@1."""
    if TASKS[task].scorer == "retrieval":
        return [("_ir", "ir_r1"), ("_tr", "tr_r1")]
    return [("", "score")]


def auc(points: list[tuple[float, float]]) -> float | None:
    """Normalised area under a few-shot curve (IGLUE appendix C.3): the trapezoidal area over the shot
    axis divided by the shot range, i.e. the mean score over the range; None with fewer than 2 points."""
    pts = sorted(points)
    if len(pts) < 2 or pts[-1][0] == pts[0][0]:
        return None
    area = sum((x1 - x0) * (y0 + y1) / 2 for (x0, y0), (x1, y1) in zip(pts, pts[1:]))
    return area / (pts[-1][0] - pts[0][0])


def _model_key(name: str):
    return (MODEL_ORDER.index(name) if name in MODEL_ORDER else len(MODEL_ORDER), name)


def _lang_key(task: str):
    order = list(TASKS[task].languages) if task in TASKS else []
    return lambda l: (0 if l == "en" else 1, order.index(l) if l in order else len(order), l)


class Table:
    """model x language scores of one task, metric and protocol (and shot)."""

    def __init__(self, task: str, title: str, values: dict[str, dict[str, float]], with_english: bool,
                 sources: dict[str, dict[str, list[dict]]] | None = None, metric: str = "score"):
        self.task, self.title, self.values, self.metric = task, title, values, metric
        self.sources = sources or {}          # model -> lang -> the records (seeds) behind the value
        langs = {l for row in values.values() for l in row}
        self.targets = sorted((l for l in langs if l != "en"), key=_lang_key(task))
        self.columns = (["en"] if with_english and "en" in langs else []) + self.targets
        self.models = sorted(values, key=_model_key)

    def value(self, model: str, lang: str) -> float | None:
        return self.values.get(model, {}).get(lang)

    def avg(self, model: str) -> float:
        """IGLUE's `avg`: np.mean over the target languages, a missing one counting as -1.0."""
        if not self.targets:
            return MISSING
        return float(np.mean([self._csv_value(model, l) for l in self.targets]))

    def complete(self, model: str) -> bool:
        return all(self.value(model, l) is not None for l in self.targets)

    def _csv_value(self, model: str, lang: str) -> float:
        v = self.value(model, lang)
        return MISSING if v is None else float(v)

    def to_csv(self) -> str:
        buf = io.StringIO()
        writer = csv.writer(buf, lineterminator="\n")
        writer.writerow(["model"] + self.columns + ["avg"])
        for m in self.models:
            # repr(float) is how pandas.to_csv wrote IGLUE's files (53.72280000000001, -1.0)
            writer.writerow([m] + [repr(self._csv_value(m, l)) for l in self.columns] + [repr(self.avg(m))])
        return buf.getvalue()

    def rows_for_display(self, digits: int, stats: dict | None = None, style: str = "none") -> list[list[str]]:
        """Markdown/LaTeX rows; with `stats` ((row, column) -> CellStats) each value with its interval."""
        stats = stats or {}
        fmt = lambda m, l, v: cell_text(v, stats.get((m, l)), digits, style)  # noqa: E731
        return [[m] + [fmt(m, l, self.value(m, l)) for l in self.columns]
                + [fmt(m, AVG, self.avg(m) if self.complete(m) else None)] for m in self.models]

    def header(self) -> list[str]:
        return ["model"] + self.columns + ["avg"]

    def aggregate_columns(self) -> list[tuple[str, list[str]]]:
        """IGLUE's `avg` over the target languages (uncertainty.py's intervals and comparisons)."""
        return [(AVG, self.targets)] if self.targets else []

    def aggregate_value(self, model: str, name: str) -> float | None:
        return self.avg(model) if self.targets and self.complete(model) else None


def markdown(header: list[str], rows: list[list[str]], title: str = "") -> str:
    lines = [f"**{title}**", ""] if title else []
    lines.append("| " + " | ".join(header) + " |")
    lines.append("|" + "|".join(["---"] + ["---:"] * (len(header) - 1)) + "|")
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines) + "\n"


def latex(header: list[str], rows: list[list[str]], caption: str = "") -> str:
    lines = [r"\begin{table}[t]", r"\centering", r"\begin{tabular}{l" + "r" * (len(header) - 1) + "}",
             r"\toprule", " & ".join(latex_text(h) for h in header) + r" \\", r"\midrule"]
    lines += [" & ".join(latex_text(c) for c in r) + r" \\" for r in rows]
    lines += [r"\bottomrule", r"\end{tabular}"]
    if caption:
        lines.append(r"\caption{" + latex_text(caption) + "}")
    lines.append(r"\end{table}")
    return "\n".join(lines) + "\n"


def row_names(records: list[dict]) -> list[str]:
    """Each record's row: its model, `<model> (<variant>)` for a Hugging Face model the sweep fine-tuned (its
    zero-shot transfer and few-shot scores share the row; the model as published keeps `<model>`), and
    `<row> (<rule>)` when that row has records of several scoring rules for the record's task (their scores must
    not be averaged as if they were seeds)."""
    models = [r["model"] + (f" ({r['variant']})" if r.get("variant") else "") for r in records]
    rules: dict = defaultdict(set)
    for r, model in zip(records, models):
        rules[(r.get("task"), model)].add(r.get("rule"))
    return [model if len(rules[(r.get("task"), model)]) == 1 else f"{model} ({r.get('rule') or 'default'})"
            for r, model in zip(records, models)]


def grouped(records: list[dict]) -> dict:
    """(protocol, task, metric, shot) -> row (model, per rule) -> lang -> the records with a score (its seeds)."""
    cells: dict = defaultdict(lambda: defaultdict(lambda: defaultdict(list)))
    for r, row in zip(records, row_names(records)):
        task = r.get("task")
        if task not in TASKS:
            continue
        for _, metric in metrics_of(task):
            if r.get("metrics", {}).get(metric) is None:
                continue
            shot = str(r["shot"]) if r.get("protocol") == "few_shot" else None
            cells[(r["protocol"], task, metric, shot)][row][r["lang"]].append(r)
    return cells


def _means(cells: dict, metric: str) -> dict:
    return {m: {l: float(np.mean([float(r["metrics"][metric]) for r in recs])) for l, recs in langs.items()}
            for m, langs in cells.items()}


def aggregate(records: list[dict]) -> dict:
    """(protocol, task, metric, shot) -> row (model, per rule) -> lang -> mean score over seeds."""
    return {key: _means(models, key[2]) for key, models in grouped(records).items()}


def build_tables(records: list[dict]) -> list[tuple[str, Table]]:
    """(file stem, table) for every table the records support; each table keeps the records behind its cells."""
    cells = grouped(records)
    out = []

    def table(key, with_english, english_from=None):
        sources = {m: dict(langs) for m, langs in cells.get(key, {}).items()}
        if english_from is not None:
            # IGLUE's .mt tables take English from the English test (test.en), not from a translation
            for m in sources:
                if "en" in cells.get(english_from, {}).get(m, {}):
                    sources[m]["en"] = cells[english_from][m]["en"]
        return Table(key[1], TASKS[key[1]].title, _means(sources, key[2]), with_english, sources, key[2])

    for task in TASKS:
        title = TASKS[task].title
        for infix, metric in metrics_of(task):
            zero = ("zero_shot", task, metric, None)
            if cells.get(zero):
                out.append((f"{title}{infix}_0", table(zero, True)))
            if cells.get(("translate_test", task, metric, None)):
                out.append((f"{title}{infix}_0.mt", table(("translate_test", task, metric, None), True, zero)))
            shots = sorted({k[3] for k in cells if k[:3] == ("few_shot", task, metric)}, key=shot_count)
            for shot in shots:
                out.append((f"{title}{infix}_{shot}", table(("few_shot", task, metric, shot), False)))
            if cells.get(("translate_train", task, metric, None)):
                out.append((f"{title}{infix}_0.translate-train", table(("translate_train", task, metric, None), False)))
    return out


def few_shot_curves(by_cell: dict, task: str, metric: str) -> dict:
    """model -> lang -> [(shot count, what `by_cell` holds for that shot: a score, or the records)]; `by_cell` is
    keyed (protocol, task, metric, shot) -> model -> lang, as `aggregate` and `grouped` are."""
    curves: dict = defaultdict(lambda: defaultdict(list))
    for (protocol, t, m, shot), models in by_cell.items():
        if protocol == "few_shot" and t == task and m == metric:
            for model, langs in models.items():
                for lang, v in langs.items():
                    curves[model][lang].append((shot_count(shot), v))
    return curves


def auc_table(agg: dict, task: str, metric: str) -> tuple[list[str], dict[str, dict[str, float]]] | None:
    """model -> lang -> few-shot AUC over the shots that have a score."""
    values = {model: {l: a for l, pts in langs.items() if (a := auc(pts)) is not None}
              for model, langs in few_shot_curves(agg, task, metric).items()}
    values = {m: v for m, v in values.items() if v}
    return values or None


AUC_MEAN = "mean"   # the summary's few-shot AUC: the mean over every language the model has an AUC in


@dataclass
class AucSet:
    """One task's (and retrieval direction's) few-shot AUCs, as the report, its baseline and `volta-ml compare`
    read them. The AUC is linear in the scores, so a cell's AUC is the mean of its test items' AUCs (each item's
    curve over the shots, its values averaged over seeds as a cell's are), and a seed's AUC is the AUC of that
    seed's scores."""
    stem: str                # `<Title>_fewshot_auc`
    table: Table             # model -> language -> the AUC of the cells' scores (averaged over seeds)
    items: dict              # model -> language -> ({test item: its AUC}, why none: every shot must score the same)
    seeds: dict              # model -> language -> {seed: its AUC}, where every shot ran the same >= 2 seeds


def auc_sets(records: list[dict], files: ItemFiles) -> list[AucSet]:
    agg, cells, out = aggregate(records), grouped(records), []
    for task in TASKS:
        for infix, metric in metrics_of(task):
            values = auc_table(agg, task, metric)
            if not values:
                continue
            items, seeds = defaultdict(dict), defaultdict(dict)
            for model, langs in few_shot_curves(cells, task, metric).items():
                for lang, points in langs.items():
                    if lang in values.get(model, {}):
                        items[model][lang] = _auc_items(points, metric, files)
                        if (per_seed := _auc_seeds(points, metric)) is not None:
                            seeds[model][lang] = per_seed
            title = TASKS[task].title
            out.append(AucSet(f"{title}{infix}_fewshot_auc", Table(task, title, values, False), items, seeds))
    return out


def auc_stats(aucs: AucSet, options: Options) -> dict[tuple[str, str], CellStats]:
    """(model, language | `avg` | `mean`) -> CellStats of the few-shot AUC: the interval bootstraps the items'
    AUCs (none, with the reason, where the shots scored different items), the seed spread is over the seeds'
    AUCs. `avg` (the AUC table's, over its targets, only where the model has them all) and `mean` (the summary's,
    over the model's languages) resample within each language and average each seed over the languages."""
    out: dict[tuple[str, str], CellStats] = {}
    table = aucs.table
    for model in table.models:
        per_lang = table.values[model]
        for lang, value in per_lang.items():
            stats = CellStats(value)
            items, stats.note = aucs.items[model][lang]
            if items:
                stats.interval, stats.items = options.interval(list(items.values())), len(items)
            if lang in aucs.seeds.get(model, {}):
                per_seed = aucs.seeds[model][lang]
                stats.seeds = seed_spread([per_seed[k] for k in sorted(per_seed, key=str)])
            out[(model, lang)] = stats
        spans = [(AVG, table.targets if set(table.targets) <= set(per_lang) else []), (AUC_MEAN, list(per_lang))]
        for name, over in spans:
            if not over:
                continue
            stats = CellStats(float(np.mean([per_lang[l] for l in over])))
            if all(aucs.items[model][l][0] for l in over):
                values = {f"{l}/{i}": v for l in over for i, v in aucs.items[model][l][0].items()}
                stats.interval = options.interval(list(values.values()), [k.split("/", 1)[0] for k in values],
                                                  average="macro")
                stats.items = len(values)
            else:
                stats.note = "a language without an interval"
            seeds = [aucs.seeds.get(model, {}).get(l) for l in over]
            if all(seeds) and all(set(s) == set(seeds[0]) for s in seeds):
                stats.seeds = seed_spread([float(np.mean([s[k] for s in seeds])) for k in sorted(seeds[0], key=str)])
            out[(model, name)] = stats
    return out


def auc_comparisons(aucs: AucSet, row_a: str, other: AucSet, row_b: str, options: Options) -> list[CellComparison]:
    """The few-shot AUC of `row_a` minus `other`'s `row_b`, per language and `avg`, paired over the test items."""
    return compare_items(aucs.stem, row_a, row_b, aucs.items.get(row_a, {}), other.items.get(row_b, {}),
                         aucs.table.aggregate_columns(), other.table.aggregate_columns(), options)


def _auc_items(points: list[tuple[float, list[dict]]], metric: str, files: ItemFiles) -> tuple[dict | None, str]:
    """{item: the AUC of its scores over the shots}, or (None, why not)."""
    per_shot = []
    for x, recs in points:
        items, why = seed_items(recs, metric, files)
        if items is None:
            return None, why
        per_shot.append((x, items))
    ids = per_shot[0][1]
    if any(set(items) != set(ids) for _, items in per_shot[1:]):
        return None, "the shots scored different items"
    return {i: auc([(x, items[i]) for x, items in per_shot]) for i in ids}, ""


def _auc_seeds(points: list[tuple[float, list[dict]]], metric: str) -> dict | None:
    """{seed: the AUC of that seed's scores over the shots}, where every shot ran the same two or more seeds."""
    per_shot = [{r.get("seed"): float(r["metrics"][metric]) for r in recs} for _, recs in points]
    seeds = set(per_shot[0])
    if len(seeds) < 2 or any(set(s) != seeds or len(s) != len(recs) for s, (_, recs) in zip(per_shot, points)):
        return None
    return {k: auc([(x, s[k]) for (x, _), s in zip(points, per_shot)]) for k in seeds}


def summary_rows(task: str, metric: str, agg: dict, tables: dict[str, Table], infix: str):
    """Header, rows of values, and per column the (table stem, column) a value comes from (None: the model
    name); the few-shot AUC's is (`<Title>_fewshot_auc`, `mean`)."""
    title = TASKS[task].title
    zero, mt = tables.get(f"{title}{infix}_0"), tables.get(f"{title}{infix}_0.mt")
    shots = sorted({k[3] for k in agg if k[:3] == ("few_shot", task, metric)}, key=shot_count)
    aucs = auc_table(agg, task, metric) or {}
    models = sorted({m for stem, t in tables.items() if stem.startswith(f"{title}{infix}_") for m in t.models}
                    | set(aucs), key=_model_key)
    header = ["model", "en", "zero-shot", "translate-test"] + [f"{s}-shot" for s in shots] + \
             (["few-shot AUC"] if aucs else [])
    refs = [None, (f"{title}{infix}_0", "en"), (f"{title}{infix}_0", AVG), (f"{title}{infix}_0.mt", AVG)]
    refs += [(f"{title}{infix}_{s}", AVG) for s in shots]
    refs += [(f"{title}{infix}_fewshot_auc", AUC_MEAN)] if aucs else []
    rows = []
    for m in models:
        def avg_of(table):
            if table is None or m not in table.values or not table.complete(m) or not table.targets:
                return None
            return table.avg(m)
        row = [m, zero.value(m, "en") if zero else None, avg_of(zero), avg_of(mt)]
        row += [avg_of(tables.get(f"{title}{infix}_{s}")) for s in shots]
        if aucs:
            langs = aucs.get(m, {})
            row.append(float(np.mean(list(langs.values()))) if langs else None)
        rows.append(row)
    return header, rows, refs


def write_report(records: list[dict], out_dir: Path, digits: int = 2, options: Options | None = None,
                 baseline: str | None = None) -> list[Path]:
    """IGLUE's CSVs, their Markdown/LaTeX with intervals, summaries, and the uncertainty files (module docstring).
    `baseline`: a row name; every other row of its tables is compared with it (`baseline.*`)."""
    options = options or Options()
    out_dir.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []

    def emit(stem: str, csv_text: str, header: list[str], rows: list[list[str]], caption: str, folder: Path = out_dir):
        folder.mkdir(parents=True, exist_ok=True)
        for suffix, text in ((".csv", csv_text), (".md", markdown(header, rows, caption)),
                             (".tex", latex(header, rows, caption))):
            path = folder / f"{stem}{suffix}"
            path.write_text(text, encoding="utf-8")
            written.append(path)

    tables = build_tables(records)
    files = ItemFiles()
    stats = {stem: table_stats(table, table.metric, files, options) for stem, table in tables}
    for stem, table in tables:
        emit(stem, table.to_csv(), table.header(), table.rows_for_display(digits, stats[stem], options.style), stem)
        uncertain = out_dir / "uncertainty"
        uncertain.mkdir(exist_ok=True)
        path = uncertain / f"{stem}.csv"
        path.write_text(_csv([UNCERTAINTY_HEADER] + uncertainty_rows(table, stats[stem], options)), encoding="utf-8")
        written.append(path)
    by_stem = dict(tables)
    agg = aggregate(records)
    aucs = {a.stem: a for a in auc_sets(records, files)}
    for task in TASKS:
        title = TASKS[task].title
        for infix, metric in metrics_of(task):
            if not any(t.task == task and stem.startswith(f"{title}{infix}_") for stem, t in tables):
                continue
            auc_stem = f"{title}{infix}_fewshot_auc"
            if auc_stem in aucs:
                table = aucs[auc_stem].table
                stats[auc_stem] = auc_stats(aucs[auc_stem], options)
                emit(auc_stem, table.to_csv(), table.header(), table.rows_for_display(digits, stats[auc_stem],
                                                                                        options.style),
                     f"{title}{infix}: few-shot AUC")
                path = out_dir / "uncertainty" / f"{auc_stem}.csv"
                path.parent.mkdir(exist_ok=True)
                path.write_text(_csv([UNCERTAINTY_HEADER] + uncertainty_rows(table, stats[auc_stem], options)),
                                encoding="utf-8")
                written.append(path)
            header, rows, refs = summary_rows(task, metric, agg, by_stem, infix)
            csv_rows = [[r[0]] + ["" if v is None else repr(float(v)) for v in r[1:]] for r in rows]
            shown = [[r[0]] + [cell_text(v, stats.get(ref[0], {}).get((r[0], ref[1])) if ref else None, digits,
                                         options.style) for v, ref in zip(r[1:], refs[1:])] for r in rows]
            emit(f"{title}{infix}_summary", _csv([header] + csv_rows), header, shown,
                 f"{title}{infix}: protocols side by side")
    write_seeds(tables + [(a.stem, a.table) for a in aucs.values()], stats, digits, emit)
    write_format_errors(tables, stats, digits, emit)
    if baseline is not None:
        write_baseline(tables, baseline, files, options, digits, emit, list(aucs.values()))
    return written


def write_seeds(tables, stats, digits: int, emit) -> None:
    """`seeds.*`: every cell with more than one seed: mean ± standard deviation over seeds, n, per-seed values."""
    header = ["table", "model", "column", "n", "mean ± std", "per seed"]
    rows, csv_rows = [], [["table", "model", "column", "n", "mean", "std", "per_seed"]]
    for stem, table in tables:
        for model in table.models:
            for column in table.columns + [AVG]:
                s = stats[stem].get((model, column))
                if s is None or s.seeds is None or s.seeds.n < 2:
                    continue
                seeds = s.seeds
                rows.append([stem, model, column, str(seeds.n),
                             f"{fixed(seeds.mean, digits)} ± {fixed(seeds.std, digits)}",
                             ", ".join(fixed(v, digits) for v in seeds.values)])
                csv_rows.append([stem, model, column, str(seeds.n), repr(seeds.mean), repr(seeds.std),
                                 " ".join(repr(v) for v in seeds.values)])
    if rows:
        emit("seeds", _csv(csv_rows), header, rows, "cells run with several seeds: mean ± standard deviation over seeds")


def write_format_errors(tables, stats, digits: int, emit) -> None:
    """`format_errors.*`: the generate rule's unparsed answers, % of the items of each cell (with its interval);
    `truncated.*`: its answers cut at max_new_tokens, % of the items of each cell (with its interval, or "unknown"
    where the backend does not say)."""
    header = ["table", "model", "column", "format errors (%)"]
    rows, csv_rows = [], [["table", "model", "column", "format_error_rate", "ci_low", "ci_high"]]
    cut_rows, cut_csv = [], [["table", "model", "column", "truncated_rate", "ci_low", "ci_high"]]
    for stem, table in tables:
        for model in table.models:
            for column in table.columns:
                s = stats[stem].get((model, column))
                if s is None:
                    continue
                if s.format_errors is not None:
                    fe = s.format_interval
                    rows.append([stem, model, column, rate_text(s.format_errors, fe, digits)])
                    csv_rows.append([stem, model, column, repr(s.format_errors), "" if fe is None else repr(fe.low),
                                     "" if fe is None else repr(fe.high)])
                shown = truncation_text(s, digits)
                if shown is not None:
                    tr = s.truncated_interval
                    cut_rows.append([stem, model, column, shown])
                    cut_csv.append([stem, model, column, shown if s.truncated_unknown else repr(s.truncated),
                                    "" if tr is None else repr(tr.low), "" if tr is None else repr(tr.high)])
    if rows:
        emit("format_errors", _csv(csv_rows), header, rows, "generate rule: answers that named no option (%)")
    if cut_rows:
        emit("truncated", _csv(cut_csv), ["table", "model", "column", "truncated answers (%)"], cut_rows,
             "generate rule: answers cut at max_new_tokens (%); unknown: the backend does not say")


def write_baseline(tables, baseline: str, files, options: Options, digits: int, emit,
                   aucs: list[AucSet] = ()) -> None:
    """`baseline.*`: each row minus the baseline row, per cell of every table holding both (compare_rows) and of
    the few-shot AUC tables (auc_comparisons); nothing when no table has the row (`volta-ml report` checks the
    name against every table, the suite's too)."""
    if not any(baseline in table.models for _, table in tables):
        return
    comparisons = [cell for stem, table in tables if baseline in table.models for row in table.models
                   if row != baseline
                   for cell in compare_rows(stem, table, row, table, baseline, table.metric, files, options)]
    comparisons += [cell for a in aucs if baseline in a.table.models for row in a.table.models if row != baseline
                    for cell in auc_comparisons(a, row, a, baseline, options)]
    emit("baseline", _csv([COMPARE_HEADER] + [c.csv_row() for c in comparisons]), compare_md_header(options),
         [c.markdown_row(digits, options.style) for c in comparisons],
         f"paired differences from the baseline row {baseline}")


def _csv(rows: list[list[str]]) -> str:
    buf = io.StringIO()
    csv.writer(buf, lineterminator="\n").writerows(rows)
    return buf.getvalue()
