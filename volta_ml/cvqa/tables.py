"""The CVQA paper's tables over several runs, with the paper's numbers beside ours: Table 3 (EN/LOC per model),
Table 5 (per category), Table 6 (image source), Table 7 (location-aware vs agnostic), Figure 3's numbers (per
country-language pair, grouped by continent) and the question types, each as CSV, Markdown and LaTeX.

Every table is long-format: one row per (group, run), columns EN / EN paper / EN diff / LOC / LOC paper /
LOC diff, where diff = ours - paper, taken from unrounded accuracies. CSV keeps 4 decimals, Markdown and LaTeX
`digits`. A "paper" cell is filled only where the run is the paper's model (see `paper.paper_row`) scored with
the paper's rule.

Every accuracy computed from per-question predictions carries its bootstrap interval (`Measured`,
volta_ml/stats.py): questions resampled within their country-language pair (by image, the cluster bootstrap, where
the predictions file names each question's image); micro = over questions, macro = over pairs; the EN-LOC gap's is the paired interval (the same questions in both prompts). Markdown/LaTeX show
`56.30 ± 1.20` (or `56.30 [55.10, 57.50]`), the CSV adds `<column> ci_low` / `<column> ci_high` columns after the
existing ones. The text-only control's and the rule variants' rows (`<model> text-only`, `<model> length_normalised`)
come from their per-question scores in the same predictions files and carry intervals the same way; only a folder
written before those columns existed shows its summaries without. The paper's numbers, the differences from them,
an EN-LOC gap over prompts that scored different questions, and the random row (the expected 25%) have none.
`format_errors` (only when a run has unparsed answers or the generate rule): % of questions whose answer named no
option, per run and prompt; `truncated` (the generate rule): % of questions whose answer stopped at
max_new_tokens, or "unknown" where the backend does not say.
"""
from __future__ import annotations

import csv
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from volta_ml.atomic import atomic_open
from volta_ml.stats import Options, fixed, format_estimate, latex_text

from . import paper
from .collect import QUESTION_TYPES, TEXT_ONLY, Predictions, Run
from .report import RANDOM_ACCURACY

RUN_COLUMNS = ["model", "backend", "rule", "paper model"]
EN_LOC = ["EN", "EN paper", "EN diff", "LOC", "LOC paper", "LOC diff"]


class Measured(float):
    """A table number with its bootstrap interval; arithmetic on it gives plain floats (differences from the paper
    carry no interval)."""

    def __new__(cls, value: float, low: float, high: float):
        number = super().__new__(cls, value)
        number.low, number.high = float(low), float(high)
        return number


def measured(preds: Predictions | None, options: Options, group: str | None = None, key: str | None = None,
             average: str = "micro") -> Measured | None:
    """The accuracy of the labelled questions (in `group` == `key`) with its interval, resampled within pairs."""
    if preds is None:
        return None
    values, pairs = preds.items(group, key)
    if not values:
        return None
    return _measured(preds, values, pairs, options, average)


def _measured(preds: Predictions, values: dict[str, float], pairs: dict[str, str], options: Options,
              average: str = "micro") -> Measured:
    """The mean of `values` with its interval: questions resampled within pairs, by image where the file names
    each question's image (the cluster bootstrap), else one by one."""
    images = preds.clusters()
    iv = options.interval(list(values.values()), list(pairs.values()), average=average,
                          clusters=None if images is None else [images[i] for i in values])
    return Measured(_average(values, pairs, average), iv.low, iv.high)


def _average(values: dict[str, float], pairs: dict[str, str], average: str) -> float:
    """The accuracy as `report.accuracy_summary` computes it (100 * correct / n; macro: numpy's mean over the pairs
    in key order), so a cell reads the same with or without its interval."""
    if average == "micro":
        return sum(values.values()) / len(values)
    by_pair: dict[str, list[float]] = {}
    for item, value in values.items():
        by_pair.setdefault(pairs[item], []).append(value)
    return float(np.mean([sum(v) / len(v) for _, v in sorted(by_pair.items())]))


def gap(en: Predictions | None, loc: Predictions | None, options: Options):
    """EN - LOC accuracy over the same questions, with the paired interval (plain difference where the two
    prompts' questions differ)."""
    en_v, loc_v = measured(en, options), measured(loc, options)
    if en_v is None or loc_v is None:
        return None
    (a, pairs), (b, _) = en.items(), loc.items()
    if set(a) != set(b):
        return en_v - loc_v
    diff = options.compare(a, b, pairs, clusters=en.clusters())
    return Measured(en_v - loc_v, diff.low, diff.high)


@dataclass
class Table:
    name: str                      # file stem
    title: str
    header: list[str]
    rows: list[list] = field(default_factory=list)
    note: str = ""


def _diff(ours, theirs):
    return None if ours is None or theirs is None else ours - theirs


def _en_loc(en, loc, reference) -> list:
    p_en, p_loc = reference or (None, None)
    return [en, p_en, _diff(en, p_en), loc, p_loc, _diff(loc, p_loc)]


def _run_cells(run: Run) -> list:
    return [run.label, run.backend, run.rule or "-", run.paper or "-"]


def paper_rule(run: Run) -> str | None:
    """Which of the paper's results a run compares with: "main" (letter / similarity rows), "open", or None."""
    if run.paper is None or "+" in run.rule:           # a variant (e.g. length-normalised) the paper did not run
        return None
    return "open" if run.rule in paper.OPEN_RULES else "main"


def _micro(run: Run, condition: str, options: Options):
    return measured(run.conditions.get(condition), options)


def _macro(run: Run, condition: str, options: Options):
    return measured(run.conditions.get(condition), options, average="macro")


def table3(runs: list[Run], options: Options) -> Table:
    table = Table("table3_overall", "Table 3: accuracy (%) per model, location-aware prompt",
                  RUN_COLUMNS + EN_LOC + ["EN-LOC gap", "EN macro", "LOC macro", "questions"],
                  note="EN / LOC: average over questions; macro: over country-language pairs. The paper gives "
                       "the open-ended LLaVA-1.5-7B result as about 30% (EN). Rows `<model> text-only` are the "
                       "blind control, rows `<model> <variant>` a variant of the model's rule (e.g. the open "
                       "rule's length_normalised).")
    for run in runs:
        en, loc = _micro(run, "en-aware", options), _micro(run, "loc-aware", options)
        reference = {"main": paper.TABLE3, "open": paper.TABLE3_OPEN}.get(paper_rule(run), {}).get(run.paper)
        any_preds = next(iter(run.conditions.values()))
        table.rows.append(_run_cells(run) + _en_loc(en, loc, reference) +
                          [gap(run.conditions.get("en-aware"), run.conditions.get("loc-aware"), options),
                           _macro(run, "en-aware", options), _macro(run, "loc-aware", options),
                           len(any_preds.label)])
        for name in run.extras():                               # text-only control, rule variants
            row = _control_row(run, name, options)
            if row is not None:
                table.rows.append([f"{run.label} {name}", "blind" if name == TEXT_ONLY else run.backend,
                                   run.rule or "-", "-"] + row)
    table.rows.append(["random", "-", "-", "-"] + _en_loc(RANDOM_ACCURACY, RANDOM_ACCURACY, None)
                      + [0.0, RANDOM_ACCURACY, RANDOM_ACCURACY, ""])
    return table


def _control_row(run: Run, name: str, options: Options) -> list | None:
    """Table 3's cells (EN / LOC with the paper's empty columns, gap, macros, questions) of the text-only control
    or a rule variant: from the per-question predictions, with intervals as the run's own row; from the summaries
    of an older folder (no per-question scores), without."""
    cells = {}
    for condition in ("en-aware", "loc-aware"):
        preds = run.controls.get(name, {}).get(condition)
        summary = run.summaries.get(name, {}).get(condition)
        if preds is not None:
            cells[condition] = (preds, measured(preds, options), measured(preds, options, average="macro"),
                                len(preds.label))
        elif summary:
            cells[condition] = (None, summary["micro"], summary["macro"], summary["questions"])
    if not cells:
        return None
    (en_p, en, en_macro, _), (loc_p, loc, loc_macro, _) = (cells.get(c, (None,) * 4) for c in ("en-aware", "loc-aware"))
    difference = gap(en_p, loc_p, options) if en_p is not None and loc_p is not None else _diff(en, loc)
    return _en_loc(en, loc, None) + [difference, en_macro, loc_macro, next(iter(cells.values()))[3]]


def _breakdown(name: str, title: str, column: str, group: str, runs: list[Run], reference: dict | None,
               order: list[str], options: Options, note: str = "") -> Table:
    """Rows (group key, run) for one breakdown of the location-aware runs; `reference` maps (key, paper row) to
    the paper's (EN, LOC); None: a table without paper columns."""
    table = Table(name, title, [column] + RUN_COLUMNS + ["n"] + (EN_LOC if reference is not None else ["EN", "LOC"]),
                  note=note)
    found = {k for run in runs for c in ("en-aware", "loc-aware") if c in run.conditions
             for k in run.conditions[c].by(group)}
    keys = [k for k in order if k in found] + sorted(found - set(order))
    for key in keys:
        for run in runs:
            cells = {c: run.conditions[c].by(group).get(key) if c in run.conditions else None
                     for c in ("en-aware", "loc-aware")}
            if not any(cells.values()):
                continue
            n = next(v["n"] for v in cells.values() if v)
            acc = {c: measured(run.conditions.get(c), options, group, key) if v else None for c, v in cells.items()}
            if reference is None:
                table.rows.append([key] + _run_cells(run) + [n, acc["en-aware"], acc["loc-aware"]])
                continue
            theirs = reference.get((key, run.paper)) if paper_rule(run) == "main" else None
            table.rows.append([key] + _run_cells(run) + [n] + _en_loc(acc["en-aware"], acc["loc-aware"], theirs))
    return table


def table5(runs: list[Run], options: Options) -> Table:
    return _breakdown("table5_category", "Table 5: accuracy (%) per category, location-aware prompt", "category",
                      "category", runs, paper.TABLE5, sorted({k for k, _ in paper.TABLE5}), options)


def table6(runs: list[Run], options: Options) -> Table:
    return _breakdown("table6_image_source", "Table 6: accuracy (%) per image source, location-aware prompt",
                      "image source", "image_type", runs, paper.TABLE6, ["Self-made", "Web"], options)


def figure3(runs: list[Run], options: Options) -> Table:
    pairs = {k for run in runs for preds in run.conditions.values() for k in preds.groups["pair"]}
    order = sorted(pairs, key=lambda p: (paper.CONTINENT_ORDER.index(paper.continent(p)), p))
    table = _breakdown("figure3_pairs", "Figure 3: accuracy (%) per country-language pair, location-aware prompt",
                       "pair", "pair", runs, paper.FIGURE3, order, options,
                       note="The paper quotes two of Figure 3's values in its text; the others are only plotted.")
    table.header.insert(1, "continent")
    for row in table.rows:
        row.insert(1, paper.continent(row[0]))
    return table


def question_types(runs: list[Run], options: Options) -> Table:
    return _breakdown("question_types", "Accuracy (%) per question type (first what/how/why/where/who/which "
                      "word of the English question), location-aware prompt", "question type", "question_type",
                      runs, None, list(QUESTION_TYPES) + ["other"], options,
                      note="The paper's Figure 2 counts these types; it reports no accuracy per type. Runs whose "
                           "predictions files lack the English question (written before it was added) are absent.")


def table7(runs: list[Run], options: Options) -> Table:
    table = Table("table7_prompt", "Table 7: location-aware vs location-agnostic prompt, accuracy (%)",
                  ["prompt"] + RUN_COLUMNS + EN_LOC + ["EN-LOC gap"])
    for location in ("aware", "agnostic"):
        for run in runs:
            en, loc = _micro(run, f"en-{location}", options), _micro(run, f"loc-{location}", options)
            if en is None and loc is None:
                continue
            theirs = paper.TABLE7.get((location, run.paper)) if paper_rule(run) == "main" else None
            table.rows.append([location] + _run_cells(run) + _en_loc(en, loc, theirs) +
                              [gap(run.conditions.get(f"en-{location}"), run.conditions.get(f"loc-{location}"), options)])
    return table


def format_errors(runs: list[Run], options: Options) -> Table:
    """The generate rule's unparsed answers (% of all questions of a prompt), per run and prompt."""
    table = Table("format_errors", "Format errors: answers that named no option (%), generate rule",
                  ["prompt"] + RUN_COLUMNS + ["questions", "format errors"],
                  note="An unparsed answer predicts nothing (Prediction -1): it counts as wrong in every accuracy.")
    for run in runs:
        for condition, preds in run.conditions.items():
            if "generate" not in run.rule and not preds.unparsed.any():
                continue
            values, pairs = preds.items(values=100.0 * preds.unparsed)
            table.rows.append([condition] + _run_cells(run) + [len(values), _measured(preds, values, pairs, options)])
    return table


def truncated(runs: list[Run], options: Options) -> Table:
    """The generate rule's answers cut at max_new_tokens (% of all questions of a prompt), per run and prompt;
    "unknown" where the backend does not say."""
    table = Table("truncated", "Truncated answers: generation stopped at max_new_tokens (%), generate rule",
                  ["prompt"] + RUN_COLUMNS + ["questions", "truncated"],
                  note="A truncated answer is cut short, not the model's whole answer; unknown: the backend does not "
                       "say.")
    for run in runs:
        for condition, preds in run.conditions.items():
            flags = preds.truncated
            if flags is None:
                continue
            if np.isnan(flags).any():
                table.rows.append([condition] + _run_cells(run) + [len(flags), "unknown"])
                continue
            values, pairs = preds.items(values=flags)
            table.rows.append([condition] + _run_cells(run) + [len(values), _measured(preds, values, pairs, options)])
    return table


TABLES = (table3, table5, table6, table7, figure3, question_types, format_errors, truncated)
OPTIONAL = {"format_errors", "truncated"}          # written only when they have rows


def build_tables(runs: list[Run], options: Options | None = None) -> list[Table]:
    options = options or Options()
    tables = [build(runs, options) for build in TABLES]
    return [t for t in tables if t.rows or t.name not in OPTIONAL]


# --- writing --------------------------------------------------------------------------------
def _fmt(value, digits: int, style: str = "pm") -> str:
    if value is None:
        return "-"
    if isinstance(value, Measured):
        return format_estimate(value, value.low, value.high, digits, style)
    return fixed(value, digits) if isinstance(value, float) else str(value)


def markdown(table: Table, digits: int, style: str = "pm") -> list[str]:
    lines = [f"## {table.title}", ""]
    if table.note:
        lines += [table.note, ""]
    lines += ["| " + " | ".join(table.header) + " |", "|" + "---|" * len(table.header)]
    lines += ["| " + " | ".join(_fmt(v, digits, style) for v in row) + " |" for row in table.rows]
    return lines + [""]


def latex(table: Table, digits: int, style: str = "pm") -> str:
    numeric = [all(isinstance(r[i], (int, float)) or r[i] in (None, "") for r in table.rows)
               for i in range(len(table.header))]
    spec = "".join("r" if n else "l" for n in numeric)
    lines = [r"\begin{table}[t]", r"\centering", r"\small", rf"\begin{{tabular}}{{{spec}}}", r"\toprule",
             " & ".join(latex_text(h) for h in table.header) + r" \\", r"\midrule"]
    lines += [" & ".join(latex_text(_fmt(v, digits, style)) for v in row) + r" \\"
              for row in table.rows]
    lines += [r"\bottomrule", r"\end{tabular}", rf"\caption{{{latex_text(table.title)}}}",
              rf"\label{{tab:cvqa-{table.name.replace('_', '-')}}}", r"\end{table}", ""]
    return "\n".join(lines)


def write_table(table: Table, out_dir: Path, digits: int, style: str = "pm") -> list[Path]:
    """`<name>.csv` (4 decimals; the intervals in `<column> ci_low` / `ci_high` columns after the others),
    `<name>.md` and `<name>.tex` (`digits` decimals, values with their intervals)."""
    paths = [out_dir / f"{table.name}.{ext}" for ext in ("csv", "md", "tex")]
    measured_columns = [i for i in range(len(table.header)) if any(isinstance(r[i], Measured) for r in table.rows)]
    number = lambda v: round(v, 4) if isinstance(v, float) else ("" if v is None else v)  # noqa: E731
    with atomic_open(paths[0], "w", encoding="utf-8") as f:
        writer = csv.writer(f, lineterminator="\n")
        writer.writerow(table.header + [f"{table.header[i]} {end}" for i in measured_columns
                                        for end in ("ci_low", "ci_high")])
        writer.writerows([number(float(v)) if isinstance(v, Measured) else number(v) for v in row]
                         + [number(getattr(row[i], end, None)) for i in measured_columns for end in ("low", "high")]
                         for row in table.rows)
    with atomic_open(paths[1], "w", encoding="utf-8") as f:
        f.write("\n".join(markdown(table, digits, style)))
    with atomic_open(paths[2], "w", encoding="utf-8") as f:
        f.write(latex(table, digits, style))
    return paths
