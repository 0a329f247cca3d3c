"""PNG figures of the CVQA paper report: Figure 3 (accuracy per country-language pair, EN and LOC, one line per
model, pairs grouped by continent), Table 3 as bars with the paper's values marked, and the question types."""
from __future__ import annotations

from pathlib import Path

import numpy as np

from . import paper
from .report import RANDOM_ACCURACY
from .tables import Table


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def _save(fig, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=130)
    _pyplot().close(fig)
    return path


def _column(table: Table, name: str) -> int:
    return table.header.index(name)


def plot_figure3(table: Table, path: Path) -> Path:
    """Two panels (EN over LOC); x: pairs in continent order, separated by dotted lines; one line per model."""
    plt = _pyplot()
    pair_i, model_i = _column(table, "pair"), _column(table, "model")
    pairs = list(dict.fromkeys(row[pair_i] for row in table.rows))
    models = list(dict.fromkeys(row[model_i] for row in table.rows))
    x = {p: i for i, p in enumerate(pairs)}
    fig, axes = plt.subplots(2, 1, figsize=(max(8.0, 0.32 * len(pairs) + 2), 7.5), sharex=True)
    for ax, language in zip(axes, ("EN", "LOC")):
        value_i = _column(table, language)
        for k, model in enumerate(models):     # one colour per model in both panels
            points = sorted((x[r[pair_i]], r[value_i]) for r in table.rows if r[model_i] == model
                            and r[value_i] is not None)
            if points:
                ax.plot(*zip(*points), marker="o", markersize=3, linewidth=1.2, label=model, color=f"C{k % 10}")
        ax.axhline(RANDOM_ACCURACY, color="black", linestyle="--", linewidth=0.8, label="random (25%)")
        ax.set_ylabel(f"{language} accuracy (%)")
        ax.set_ylim(0, 112)
        start = 0
        for continent in paper.CONTINENT_ORDER:
            members = [p for p in pairs if paper.continent(p) == continent]
            if not members:
                continue
            end = start + len(members)
            if start:
                ax.axvline(start - 0.5, color="grey", linestyle=":", linewidth=0.8)
            ax.text((start + end - 1) / 2, 110, continent, ha="center", va="top", fontsize=8)
            start = end
    axes[-1].set_xticks(range(len(pairs)))
    axes[-1].set_xticklabels(pairs, rotation=75, ha="right", fontsize=7)
    axes[0].legend(fontsize=7, loc="best", ncol=2)
    axes[0].set_title("CVQA accuracy per country-language pair (location-aware prompt)", fontsize=10)
    return _save(fig, path)


def plot_bars(table: Table, group_column: str | None, path: Path, title: str) -> Path:
    """Grouped bars of EN and LOC per model (per group when `group_column`), the paper's values as black ticks."""
    plt = _pyplot()
    model_i = _column(table, "model")
    labels = [f"{row[_column(table, group_column)]}: {row[model_i]}" if group_column else row[model_i]
              for row in table.rows]
    y = np.arange(len(labels))
    fig, ax = plt.subplots(figsize=(8, max(2.5, 0.3 * len(labels) + 1.2)))
    for offset, language in ((-0.2, "EN"), (0.2, "LOC")):
        values = [row[_column(table, language)] for row in table.rows]
        ax.barh(y + offset, [v or 0.0 for v in values], height=0.4, label=language)
        if f"{language} paper" in table.header:
            theirs = [(i + offset, row[_column(table, f"{language} paper")]) for i, row in enumerate(table.rows)]
            theirs = [(i, v) for i, v in theirs if v is not None]
            if theirs:
                ax.plot([v for _, v in theirs], [i for i, _ in theirs], "k|", markersize=9,
                        label="paper" if language == "EN" else None)
    ax.axvline(RANDOM_ACCURACY, color="black", linestyle="--", linewidth=0.8)
    ax.set_yticks(y)
    ax.set_yticklabels(labels, fontsize=7)
    ax.invert_yaxis()
    ax.set_xlim(0, 100)
    ax.set_xlabel("accuracy (%)")
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=7, loc="lower right")
    return _save(fig, path)


# table name -> how it is drawn (group column for the bars; Figure 3 has its own plot)
FIGURES = {
    "table3_overall": lambda t, p: plot_bars(t, None, p, "Table 3: CVQA accuracy, location-aware prompt"),
    "table5_category": lambda t, p: plot_bars(t, "category", p, "Table 5: accuracy per category"),
    "table6_image_source": lambda t, p: plot_bars(t, "image source", p, "Table 6: accuracy per image source"),
    "table7_prompt": lambda t, p: plot_bars(t, "prompt", p, "Table 7: location-aware vs agnostic prompt"),
    "figure3_pairs": plot_figure3,
    "question_types": lambda t, p: plot_bars(t, "question type", p, "Accuracy per question type"),
}


def write_figures(tables: list[Table], out_dir: Path) -> list[Path]:
    return [FIGURES[t.name](t, out_dir / f"{t.name}.png") for t in tables if t.rows and t.name in FIGURES]
