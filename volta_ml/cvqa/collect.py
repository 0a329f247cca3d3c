"""Reading CVQA result folders for the paper tables: one folder is one run of one model with one rule
(`cvqa_results.json` + `predictions_<condition>.csv`); folders of the same backend, model, revision and rule
(e.g. one sweep cell per condition) are merged into one table row.

Accuracies are recomputed from the per-question predictions, so every breakdown (also ones a run did not
write, like the question types) is available and comes from unrounded counts. The text-only control and the rule's
variants (e.g. the open rule's length_normalised) are recomputed the same way from their per-question scores in
the same files (`text_only_<k>`, `<variant>_<k>` columns, written since issue 23, turned into predictions by the
rule `cvqa score` applies: `report.predicted`); a folder written before has only their summaries in
`cvqa_results.json`, which are shown without an interval.
"""
from __future__ import annotations

import csv
import dataclasses
import json
import re
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from volta_ml.stats import unique_ids

from .data import HIDDEN_LABEL
from .paper import paper_category, paper_image_source, paper_row
from .prompts import CONDITIONS
from .report import PREDICTION_COLUMNS, group_accuracy, macro, predicted

RESULTS_FILE = "cvqa_results.json"
UNPARSED = -1          # the Prediction of an answer the generate rule could not parse (backend_run.py)
QUESTION_TYPES = ("what", "how", "why", "where", "who", "which")
_WH = re.compile(r"\b(" + "|".join(QUESTION_TYPES) + r")\b", re.IGNORECASE)
_OPTION_COLUMN = re.compile(r"^(.+)_([0-3])$")
TEXT_ONLY = "text-only"          # the blind control's name in the tables; its columns are `text_only_<k>`


class ReportInputError(ValueError):
    """A result folder that cannot be tabulated; the message names the folder or file."""


def question_type(question_en: str) -> str:
    """The first of what/how/why/where/who/which in the English question (whole words, any case), else other."""
    match = _WH.search(question_en or "")
    return match.group(1).casefold() if match else "other"


@dataclass
class Predictions:
    """One condition of one run, per question."""
    source: Path
    prediction: np.ndarray
    label: np.ndarray
    groups: dict[str, list[str]]          # pair, category, image_type, question_type -> one key per question
    revisions: frozenset[str] = frozenset()   # the data revision(s) named in the file
    ids: list[str] = field(default_factory=list)   # the question IDs (pair two runs question by question)
    scores: dict[str, np.ndarray] = field(default_factory=dict)   # more per-option scores: name -> [Q, 4]

    def control(self, name: str) -> "Predictions | None":
        """The same questions as predicted by the text-only control (`TEXT_ONLY`) or a variant of the rule, from
        their per-question scores in this file (None when the file has none): the prediction `cvqa score` made
        of them (`report.predicted`; the blind generate rule's unparsed answers are -1)."""
        column = "text_only" if name == TEXT_ONLY else name
        if column not in self.scores:
            return None
        flags = self.scores.get(f"{column}_parse_failed") if name == TEXT_ONLY else None
        return dataclasses.replace(self, prediction=predicted(self.scores[column], flags), scores={})

    @property
    def labelled(self) -> np.ndarray:
        return self.label != HIDDEN_LABEL

    @property
    def unparsed(self) -> np.ndarray:
        """The generate rule's answers that named no option (Prediction -1)."""
        return self.prediction == UNPARSED

    @property
    def truncated(self) -> np.ndarray | None:
        """The generate rule's answers cut at max_new_tokens (100 / 0 per question, NaN where the backend does not
        say), from the file's `truncated_<k>` columns; None for other rules and older files."""
        flags = self.scores.get("truncated")
        return None if flags is None else flags[:, 0]

    def truncated_rate(self) -> str:
        """The truncated rate as the comparison CSVs write it: repr of the %, "unknown", or "" (not generated)."""
        flags = self.truncated
        if flags is None:
            return ""
        return "unknown" if np.isnan(flags).any() else repr(float(flags.mean()))

    def items(self, group: str | None = None, key: str | None = None,
              values: np.ndarray | None = None) -> tuple[dict[str, float], dict[str, str]]:
        """Per-question values (in `group` == `key` when given): {ID: 100 | 0} for correct / wrong over the labelled
        questions, or `values`' entries over all questions; and {ID: country-language pair} (the intervals'
        strata)."""
        keep = self.labelled.copy() if values is None else np.ones(len(self.label), dtype=bool)
        if group is not None:
            keys = self.groups.get(group)
            if keys is None:
                return {}, {}
            keep &= np.array([k == key for k in keys], dtype=bool)
        values = 100.0 * self.correct if values is None else values
        chosen = np.flatnonzero(keep)
        return ({self.ids[i]: float(values[i]) for i in chosen}, {self.ids[i]: self.groups["pair"][i] for i in chosen})

    def clusters(self) -> dict[str, str] | None:
        """{ID: the image it asks about} (the intervals resample images within pairs), or None for a file written
        without its image column (then questions are resampled one by one)."""
        images = self.groups.get("image")
        return None if images is None else dict(zip(self.ids, images))

    @property
    def correct(self) -> np.ndarray:
        return (self.prediction == self.label) & self.labelled

    def micro(self) -> float | None:
        n = int(self.labelled.sum())
        return 100.0 * int(self.correct.sum()) / n if n else None

    def by(self, group: str) -> dict[str, dict]:
        """{key: {n, labelled, accuracy}}; empty when the files lack this group's column."""
        keys = self.groups.get(group)
        return group_accuracy(keys, self.correct, self.labelled) if keys is not None else {}

    def macro(self) -> float | None:
        return macro(self.by("pair"))


@dataclass
class Run:
    """One table row: a model with one rule (all its conditions, possibly from several folders)."""
    backend: str
    model: str
    revision: str
    rule: str
    paper: str | None
    folders: list[Path] = field(default_factory=list)
    conditions: dict[str, Predictions] = field(default_factory=dict)
    # the text-only control (`TEXT_ONLY`) and the rule's variants (e.g. the open rule's length_normalised), each
    # {condition: Predictions} from the per-question scores of the predictions files (`controls`), or, for a
    # folder written before those columns existed, {condition: accuracy_summary} from cvqa_results.json
    controls: dict[str, dict[str, Predictions]] = field(default_factory=dict)
    summaries: dict[str, dict[str, dict]] = field(default_factory=dict)

    def extras(self) -> list[str]:
        """The names of the text-only control and the variants this run has, in the order the run wrote them."""
        return list(dict.fromkeys(list(self.controls) + list(self.summaries)))

    @property
    def label(self) -> str:
        name = self.paper or Path(self.model.rstrip("/")).name or self.model
        return name if self.rule in ("", "-") else f"{name} ({self.rule})"


def _str(value) -> str:
    return "" if value is None else str(value)


def read_predictions(path: Path) -> Predictions:
    try:
        with open(path, newline="", encoding="utf-8") as f:
            rows = list(csv.DictReader(f))
    except (OSError, UnicodeDecodeError, csv.Error) as err:
        raise ReportInputError(f"{path}: cannot read ({err})") from None
    needed = ("ID", "Prediction", "Label", "pair", "category", "image_type")
    missing = [c for c in needed if rows and c not in rows[0]]
    if not rows or missing:
        raise ReportInputError(f"{path}: " + (f"missing column(s) {missing}" if rows else "no predictions"))
    try:
        prediction = np.array([int(r["Prediction"]) for r in rows])
        label = np.array([int(r["Label"]) for r in rows])
    except ValueError as err:
        line = next((i + 2 for i, r in enumerate(rows) if not (r["Prediction"].lstrip("-").isdigit()
                                                                and r["Label"].lstrip("-").isdigit())), "?")
        raise ReportInputError(f"{path} line {line}: Prediction and Label must be integers ({err})") from None
    scores = {}
    names = [m.group(1) for c in rows[0] if c not in PREDICTION_COLUMNS and (m := _OPTION_COLUMN.match(c))]
    for name in dict.fromkeys(names):
        columns = [f"{name}_{k}" for k in range(4)]
        if not all(c in rows[0] for c in columns):
            continue
        try:
            scores[name] = np.array([[float(r[c]) for c in columns] for r in rows], dtype=np.float64)
        except (TypeError, ValueError) as err:
            line = next((i + 2 for i, r in enumerate(rows) if not _floats(r, columns)), "?")
            raise ReportInputError(f"{path} line {line}: {name}_0..3 must be numbers ({err})") from None
    groups = {"pair": [r["pair"] for r in rows], "category": [paper_category(r["category"]) for r in rows],
              "image_type": [paper_image_source(r["image_type"]) for r in rows]}
    if "question_en" in rows[0]:
        groups["question_type"] = [question_type(r["question_en"]) for r in rows]
    if all(r.get("image") for r in rows):         # written since issue 44: the image, the intervals' cluster
        groups["image"] = [r["image"] for r in rows]
    return Predictions(path, prediction, label, groups, frozenset(r.get("revision") or "unknown" for r in rows),
                       unique_ids(r["ID"] for r in rows), scores)


def _floats(row: dict, columns: list[str]) -> bool:
    try:
        [float(row[c]) for c in columns]
    except (TypeError, ValueError):
        return False
    return True


def _condition(path: Path) -> tuple[str, str] | None:
    """`predictions_en-aware.csv` -> ("en-aware", ""); `predictions_en-aware_norm.csv` -> ("en-aware", "norm")."""
    stem = path.stem[len("predictions_"):]
    for condition in CONDITIONS:
        if stem == condition:
            return condition, ""
        if stem.startswith(condition) and stem[len(condition)] in "_-.":
            return condition, stem[len(condition) + 1:]
    return None


def result_folders(paths: list[str | Path]) -> list[Path]:
    """The folders holding `cvqa_results.json` at or below each path, in the order given."""
    folders: list[Path] = []
    for path in map(Path, paths):
        if not path.exists():
            raise ReportInputError(f"{path}: no such file or folder")
        found = [path.parent] if path.name == RESULTS_FILE else sorted(p.parent for p in path.rglob(RESULTS_FILE))
        if not found:
            raise ReportInputError(f"{path}: no {RESULTS_FILE} at or below this folder")
        folders += [f for f in found if f not in folders]
    return folders


def load_runs(paths: list[str | Path], aliases: dict[str, str] | None = None) -> list[Run]:
    """Every run under `paths`, merged by (backend, model, revision, rule); a condition found twice for one
    run is an error naming both folders."""
    runs: dict[tuple, Run] = {}
    for folder in result_folders(paths):
        try:
            results = json.loads((folder / RESULTS_FILE).read_text(encoding="utf-8"))
        except (OSError, ValueError) as err:
            raise ReportInputError(f"{folder / RESULTS_FILE}: not readable JSON ({err})") from None
        backend = _str(results.get("backend")) or "zoo"
        model = _str(results.get("model")) or folder.name
        # "revision" is the data's commit; the checkpoint's is "model_revision" (zoo runs: the checkpoint file)
        revision, rule = _str(results.get("model_revision")), _str(results.get("rule"))
        files = sorted(folder.glob("predictions_*.csv"))
        if not files:
            raise ReportInputError(f"{folder}: {RESULTS_FILE} but no predictions_<condition>.csv beside it")
        for path in files:
            parsed = _condition(path)
            if parsed is None:
                raise ReportInputError(f"{path}: the file name names no condition ({', '.join(CONDITIONS)})")
            condition, variant = parsed
            run_rule = "+".join(x for x in (rule, variant) if x)
            key = (backend, model, revision, run_rule)
            run = runs.setdefault(key, Run(backend, model, revision, run_rule, paper_row(backend, model, aliases)))
            if condition in run.conditions:
                raise ReportInputError(f"{path}: {condition} of {model} ({run_rule or backend}) is also in "
                                       f"{run.conditions[condition].source.parent}; give one of the two folders")
            run.conditions[condition] = read_predictions(path)
            if folder not in run.folders:
                run.folders.append(folder)
            if not variant:
                extra = {TEXT_ONLY: results.get("text_only") or {}, **(results.get("variants") or {})}
                for name, by_condition in extra.items():
                    if condition not in by_condition:
                        continue
                    control = run.conditions[condition].control(name)
                    if control is not None:
                        run.controls.setdefault(name, {})[condition] = control
                    else:
                        run.summaries.setdefault(name, {})[condition] = by_condition[condition]
    return list(runs.values())


def data_revisions(runs: list[Run]) -> list[str]:
    """The data revisions named in the predictions files (one expected; several mean runs on different data)."""
    return sorted({rev for run in runs for preds in run.conditions.values() for rev in preds.revisions})
