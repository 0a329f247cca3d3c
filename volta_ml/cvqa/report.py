"""CVQA accuracy reports: micro/macro accuracy, breakdowns, EN-LOC gap, baselines, tables, plot, submission CSV.

Accuracies are percentages over the labelled questions. "micro" is over all questions (what the toolkits call
Overall); "macro" is the unweighted mean over country-language pairs (pairs have unequal sizes; which one the
paper's headline uses is unverified, so both are reported). The random baseline is the expected 25%.
"""
from __future__ import annotations

import csv
from collections import OrderedDict
from pathlib import Path

import numpy as np

from volta_ml.atomic import atomic_open

from .data import HIDDEN_LABEL, CVQAQuestion

RANDOM_ACCURACY = 25.0
PREDICTION_COLUMNS = ["ID", "Prediction", "Label", "pair", "category", "image_type", "score_0", "score_1", "score_2",
                      "score_3", "condition", "revision", "question_en", "image"]   # image: the intervals' cluster
BREAKDOWNS = {"pair": lambda q: q.pair, "category": lambda q: q.category, "image_type": lambda q: q.image_type}


def predict(scores: np.ndarray) -> np.ndarray:
    """Best option per row of `scores [Q, 4]`; ties (and NaN rows) go to the lowest index."""
    scores = np.where(np.isnan(scores), -np.inf, np.asarray(scores, dtype=np.float64))
    return np.argmax(scores, axis=1)   # numpy returns the first maximal index


def predicted(scores: np.ndarray, parse_failed: np.ndarray | None = None) -> np.ndarray:
    """The predicted option per question. With the generate rule (`parse_failed [Q, 4]`, the flag in column 0)
    an unparsed answer predicts nothing (-1): it is counted wrong, as generation-based harnesses count it (not
    option A by the all-zero scores' tie rule)."""
    predictions = predict(scores)
    if parse_failed is not None:
        predictions = np.where(np.asarray(parse_failed)[:, 0] > 0, -1, predictions)
    return predictions


def _percent(correct: int, total: int) -> float | None:
    """Unrounded: averages and differences are taken from these, and only printing rounds."""
    return 100.0 * correct / total if total else None


def group_accuracy(keys, correct, labelled) -> dict[str, dict]:
    """{key: {"n", "labelled", "accuracy"}} over the questions' group keys, keys sorted."""
    groups: dict[str, list[int]] = OrderedDict()
    for key, ok, has in zip(keys, correct, labelled):
        tally = groups.setdefault(key, [0, 0, 0])
        tally[0] += int(ok)
        tally[1] += int(has)
        tally[2] += 1
    return {k: {"n": n, "labelled": m, "accuracy": _percent(c, m)} for k, (c, m, n) in sorted(groups.items())}


def macro(per_pair: dict[str, dict]) -> float | None:
    """Unweighted mean of the pairs' (unrounded) accuracies; pairs without labels are left out."""
    values = [v["accuracy"] for v in per_pair.values() if v["accuracy"] is not None]
    return float(np.mean(values)) if values else None


def group_keys(questions: list[CVQAQuestion], by: str) -> list[str]:
    """Group key per question. Categories are grouped case-insensitively (the data's casing varies between
    revisions) and shown with their first spelling."""
    raw = [BREAKDOWNS[by](q) for q in questions]
    if by != "category":
        return raw
    display: dict[str, str] = {}
    return [display.setdefault(k.casefold(), k) for k in raw]


def accuracy_summary(questions: list[CVQAQuestion], predictions: np.ndarray) -> dict:
    """Micro / macro accuracy and the per-pair, per-category and per-image-type breakdowns of one run."""
    labels = np.array([q.label for q in questions])
    labelled = labels != HIDDEN_LABEL
    correct = (np.asarray(predictions) == labels) & labelled
    out: dict = {"questions": len(questions), "labelled": int(labelled.sum()),
                 "micro": _percent(int(correct.sum()), int(labelled.sum()))}
    for by in BREAKDOWNS:
        out[by] = group_accuracy(group_keys(questions, by), correct, labelled)
    out["macro"] = macro(out["pair"])
    return out


def en_loc_gap(summaries: dict[str, dict]) -> dict:
    """EN minus LOC accuracy (micro and macro) for each location setting present in both languages."""
    gap = {}
    for location in ("aware", "agnostic"):
        en, loc = summaries.get(f"en-{location}"), summaries.get(f"loc-{location}")
        if en and loc and en["micro"] is not None and loc["micro"] is not None:
            gap[location] = {"micro": en["micro"] - loc["micro"], "macro": en["macro"] - loc["macro"]}
    return gap


def write_predictions(path: str | Path, questions: list[CVQAQuestion], predictions, scores, condition: str,
                      revision: str, extra_scores: dict | None = None) -> Path:
    """`predictions_<condition>.csv`: one row per question with its prediction, label, groups, the four option
    scores at full precision (shortest round-trip repr: ties are real ties), the English question (for the
    question-type breakdown) and the image (several questions share one: the intervals resample images). `scores`
    may be None (imported predictions): the score cells stay empty.
    `extra_scores` {name: [N, 4]} adds columns `<name>_0..<name>_3` after those, e.g. the open rule's
    `length_normalised` and the text-only control's `text_only` scores of each question."""
    extra_scores = extra_scores or {}
    with atomic_open(path, "w", encoding="utf-8") as f:
        writer = csv.writer(f, lineterminator="\n")
        writer.writerow(PREDICTION_COLUMNS + [f"{name}_{k}" for name in extra_scores for k in range(4)])
        for i, (q, pred) in enumerate(zip(questions, predictions)):
            row_scores = [repr(float(s)) for s in scores[i]] if scores is not None else [""] * 4
            writer.writerow([q.id, int(pred), q.label, q.pair, q.category, q.image_type] + row_scores
                            + [condition, revision, q.question_en, q.image_id]
                            + [repr(float(s)) for values in extra_scores.values() for s in values[i]])
    return Path(path)


def write_submission(path: str | Path, questions: list[CVQAQuestion], predictions: np.ndarray) -> Path:
    """The EvalAI submission file: columns `ID`, `Prediction` (option index 0-3), one row per question."""
    path = Path(path)
    with atomic_open(path, "w", encoding="utf-8", newline="") as f:
        writer = csv.writer(f, lineterminator="\n")
        writer.writerow(["ID", "Prediction"])
        for q, p in zip(questions, predictions):
            writer.writerow([q.id, int(p)])
    return path


def breakdown_rows(results: dict, by: str) -> tuple[list[str], list[list]]:
    """Table rows for one breakdown: group, n, then each run's accuracy, then the baselines."""
    runs = list(results["runs"])
    header = [by, "n"] + runs + [f"text-only {c}" for c in results.get("text_only", {})] + ["random"]
    first = results["runs"][runs[0]][by]
    rows = []
    for key, info in first.items():
        row = [key, info["n"]] + [results["runs"][r][by][key]["accuracy"] for r in runs]
        row += [results["text_only"][c][by][key]["accuracy"] for c in results.get("text_only", {})]
        rows.append(row + [RANDOM_ACCURACY])
    overall = ["micro", results["runs"][runs[0]]["questions"]] + [results["runs"][r]["micro"] for r in runs]
    overall += [results["text_only"][c]["micro"] for c in results.get("text_only", {})] + [RANDOM_ACCURACY]
    macro = ["macro (pairs)", ""] + [results["runs"][r]["macro"] for r in runs]
    macro += [results["text_only"][c]["macro"] for c in results.get("text_only", {})] + [RANDOM_ACCURACY]
    return header, rows + [overall, macro]


def _csv_cell(value):
    return round(value, 4) if isinstance(value, float) else value


def _cell(value) -> str:
    if value is None:
        return "-"
    return f"{value:.2f}" if isinstance(value, float) else str(value)


def write_tables(results: dict, out_dir: str | Path) -> list[Path]:
    """`cvqa_<breakdown>.csv` for each breakdown and one `cvqa_report.md` with all tables."""
    out_dir = Path(out_dir)
    written = []
    md = [f"# CVQA results ({results['model']})", "",
          f"revision `{results['revision']}`, prompts `{results['prompts_version']}` ({results['template']}), "
          f"{results['questions']} questions, scores: {results['score_convention']}", ""]
    if results["hidden_labels"]:
        md += ["Labels are hidden in this release: no accuracy; upload the submission CSVs to EvalAI.", ""]
    for by in BREAKDOWNS:
        header, rows = breakdown_rows(results, by)
        path = out_dir / f"cvqa_{by}.csv"
        with open(path, "w", newline="", encoding="utf-8") as f:   # the revision on every row: files travel alone
            csv.writer(f).writerows([header + ["revision"]] + [[_csv_cell(v) for v in row] + [results["revision"]]
                                                               for row in rows])
        written.append(path)
        md += [f"## Accuracy (%) per {by.replace('_', ' ')}", "", "| " + " | ".join(header) + " |",
               "|" + "---|" * len(header)]
        md += ["| " + " | ".join(_cell(v) for v in row) + " |" for row in rows]
        md.append("")
    if results.get("en_loc_gap"):
        md += ["## EN - LOC gap (points)", "", "| prompt | micro | macro |", "|---|---|---|"]
        md += [f"| {k} | {_cell(v['micro'])} | {_cell(v['macro'])} |" for k, v in results["en_loc_gap"].items()]
        md.append("")
    path = out_dir / "cvqa_report.md"
    path.write_text("\n".join(md), encoding="utf-8")
    return written + [path]


def plot_pairs(results: dict, path: str | Path) -> Path:
    """Grouped horizontal bars: accuracy per country-language pair for each run, random baseline dashed."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = list(results["runs"])
    pairs = list(results["runs"][runs[0]]["pair"])
    height = 0.8 / len(runs)
    fig, ax = plt.subplots(figsize=(8, max(3.0, 0.28 * len(pairs) * max(1, len(runs)) ** 0.5 + 1)))
    y = np.arange(len(pairs))
    for i, run in enumerate(runs):
        values = [results["runs"][run]["pair"][p]["accuracy"] or 0.0 for p in pairs]
        ax.barh(y + i * height, values, height=height, label=run)
    ax.axvline(RANDOM_ACCURACY, color="black", linestyle="--", linewidth=1, label="random (25%)")
    ax.set_yticks(y + height * (len(runs) - 1) / 2)
    ax.set_yticklabels(pairs, fontsize=7)
    ax.invert_yaxis()
    ax.set_xlabel("accuracy (%)")
    ax.set_xlim(0, 100)
    ax.set_title(f"CVQA per country-language pair ({results['model']}, revision {results['revision'][:12]})",
                 fontsize=9)
    ax.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=120, metadata={"Description": f"CVQA revision {results['revision']}, prompts "
                                                        f"{results['prompts_version']}"})
    plt.close(fig)
    return Path(path)
