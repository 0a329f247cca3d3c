"""`volta-ml report RESULTS_DIR`: IGLUE's tables from sweep results and old IGLUE/VOLTA logs.

Per task (and per retrieval direction), files named like IGLUE's `results/<task>/*.csv`:
- `<Title>_0.csv` zero-shot, `<Title>_0.mt.csv` translate-test, `<Title>_<shot>.csv` few-shot,
  `<Title>_0.translate-train.csv`; retrieval tasks add `_ir` / `_tr` (`xFlickrCO_ir_0.csv`).
  Rows are models, columns `model, en, <target languages>, avg`, exactly IGLUE's CSV layout: `avg` is the
  numpy mean over the target languages (English excluded) and a missing score is written as -1.0 and
  still averaged, as IGLUE's scrapers do. The same tables as Markdown (`.md`) and LaTeX (`.tex`), where a
  missing score shows as "–" and makes the average "–" rather than a misleading number.
- `<Title>_summary.*`: zero-shot / translate-test / few-shot averages side by side, with the few-shot AUC.
- `<Title>_fewshot_auc.*`: AUC per model and language.
Scores of several seeds are averaged. Scores of different scoring rules never are: a model with records of more
than one rule for a task (e.g. `volta-ml iglue-hf` XVNLI runs with `--rule letter` and `--rule likelihood`,
both named after the model folder) gets one row per rule, `<model> (<rule>)`.
"""
from __future__ import annotations

import csv
import io
from collections import defaultdict
from pathlib import Path

import numpy as np

from .iglue import TASKS, shot_count

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

    def __init__(self, task: str, title: str, values: dict[str, dict[str, float]], with_english: bool):
        self.task, self.title, self.values = task, title, values
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

    def rows_for_display(self, digits: int) -> list[list[str]]:
        fmt = lambda v: "–" if v is None else f"{v:.{digits}f}"  # noqa: E731
        return [[m] + [fmt(self.value(m, l)) for l in self.columns] + [fmt(self.avg(m) if self.complete(m) else None)]
                for m in self.models]

    def header(self) -> list[str]:
        return ["model"] + self.columns + ["avg"]


def markdown(header: list[str], rows: list[list[str]], title: str = "") -> str:
    lines = [f"**{title}**", ""] if title else []
    lines.append("| " + " | ".join(header) + " |")
    lines.append("|" + "|".join(["---"] + ["---:"] * (len(header) - 1)) + "|")
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines) + "\n"


def latex(header: list[str], rows: list[list[str]], caption: str = "") -> str:
    esc = lambda s: s.replace("_", r"\_").replace("%", r"\%").replace("&", r"\&").replace("–", "--")  # noqa: E731
    lines = [r"\begin{table}[t]", r"\centering", r"\begin{tabular}{l" + "r" * (len(header) - 1) + "}",
             r"\toprule", " & ".join(esc(h) for h in header) + r" \\", r"\midrule"]
    lines += [" & ".join(esc(c) for c in r) + r" \\" for r in rows]
    lines += [r"\bottomrule", r"\end{tabular}"]
    if caption:
        lines.append(r"\caption{" + esc(caption) + "}")
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


def aggregate(records: list[dict]) -> dict:
    """(protocol, task, metric, shot) -> row (model, per rule) -> lang -> mean score over seeds."""
    sums: dict = defaultdict(lambda: defaultdict(lambda: defaultdict(list)))
    for r, row in zip(records, row_names(records)):
        task = r.get("task")
        if task not in TASKS:
            continue
        for _, metric in metrics_of(task):
            value = r.get("metrics", {}).get(metric)
            if value is None:
                continue
            shot = str(r["shot"]) if r.get("protocol") == "few_shot" else None
            sums[(r["protocol"], task, metric, shot)][row][r["lang"]].append(float(value))
    return {key: {m: {l: float(np.mean(v)) for l, v in langs.items()} for m, langs in models.items()}
            for key, models in sums.items()}


def build_tables(records: list[dict]) -> list[tuple[str, Table]]:
    """(file stem, table) for every table the records support."""
    agg = aggregate(records)
    out = []
    for task in TASKS:
        title = TASKS[task].title
        for infix, metric in metrics_of(task):
            zero = agg.get(("zero_shot", task, metric, None), {})
            if zero:
                out.append((f"{title}{infix}_0", Table(task, title, zero, True)))
            mt = agg.get(("translate_test", task, metric, None), {})
            if mt:
                # IGLUE's .mt tables take English from the English test (test.en), not from a translation
                merged = {m: dict(langs, **({"en": zero[m]["en"]} if "en" in zero.get(m, {}) else {}))
                          for m, langs in mt.items()}
                out.append((f"{title}{infix}_0.mt", Table(task, title, merged, True)))
            shots = sorted({k[3] for k in agg if k[:3] == ("few_shot", task, metric)}, key=shot_count)
            for shot in shots:
                out.append((f"{title}{infix}_{shot}", Table(task, title, agg[("few_shot", task, metric, shot)], False)))
            tt = agg.get(("translate_train", task, metric, None), {})
            if tt:
                out.append((f"{title}{infix}_0.translate-train", Table(task, title, tt, False)))
    return out


def auc_table(agg: dict, task: str, metric: str) -> tuple[list[str], dict[str, dict[str, float]]] | None:
    """model -> lang -> few-shot AUC over the shots that have a score."""
    curves: dict = defaultdict(lambda: defaultdict(list))
    for (protocol, t, m, shot), models in agg.items():
        if protocol == "few_shot" and t == task and m == metric:
            for model, langs in models.items():
                for lang, v in langs.items():
                    curves[model][lang].append((shot_count(shot), v))
    values = {model: {l: a for l, pts in langs.items() if (a := auc(pts)) is not None}
              for model, langs in curves.items()}
    values = {m: v for m, v in values.items() if v}
    return values or None


def summary_rows(task: str, metric: str, agg: dict, tables: dict[str, Table], infix: str):
    title = TASKS[task].title
    zero, mt = tables.get(f"{title}{infix}_0"), tables.get(f"{title}{infix}_0.mt")
    shots = sorted({k[3] for k in agg if k[:3] == ("few_shot", task, metric)}, key=shot_count)
    aucs = auc_table(agg, task, metric) or {}
    models = sorted({m for stem, t in tables.items() if stem.startswith(f"{title}{infix}_") for m in t.models}
                    | set(aucs), key=_model_key)
    header = ["model", "en", "zero-shot", "translate-test"] + [f"{s}-shot" for s in shots] + \
             (["few-shot AUC"] if aucs else [])
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
    return header, rows


def write_report(records: list[dict], out_dir: Path, digits: int = 2) -> list[Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []

    def emit(stem: str, csv_text: str, header: list[str], rows: list[list[str]], caption: str):
        for suffix, text in ((".csv", csv_text), (".md", markdown(header, rows, caption)),
                             (".tex", latex(header, rows, caption))):
            path = out_dir / f"{stem}{suffix}"
            path.write_text(text, encoding="utf-8")
            written.append(path)

    tables = build_tables(records)
    for stem, table in tables:
        emit(stem, table.to_csv(), table.header(), table.rows_for_display(digits), stem)
    by_stem = dict(tables)
    agg = aggregate(records)
    fmt = lambda v: "–" if v is None else f"{v:.{digits}f}"  # noqa: E731
    for task in TASKS:
        title = TASKS[task].title
        for infix, metric in metrics_of(task):
            if not any(t.task == task and stem.startswith(f"{title}{infix}_") for stem, t in tables):
                continue
            header, rows = summary_rows(task, metric, agg, by_stem, infix)
            csv_rows = [[r[0]] + ["" if v is None else repr(float(v)) for v in r[1:]] for r in rows]
            emit(f"{title}{infix}_summary", _csv([header] + csv_rows), header,
                 [[r[0]] + [fmt(v) for v in r[1:]] for r in rows], f"{title}{infix}: protocols side by side")
            aucs = auc_table(agg, task, metric)
            if aucs:
                table = Table(task, title, aucs, False)
                emit(f"{title}{infix}_fewshot_auc", table.to_csv(), table.header(),
                     table.rows_for_display(digits), f"{title}{infix}: few-shot AUC")
    return written


def _csv(rows: list[list[str]]) -> str:
    buf = io.StringIO()
    csv.writer(buf, lineterminator="\n").writerows(rows)
    return buf.getvalue()
