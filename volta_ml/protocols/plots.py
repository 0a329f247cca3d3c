"""PNG figures for `volta-ml report` (matplotlib, no display needed):
- `<Title>[_ir|_tr]_fewshot_<lang>.png`: few-shot curves per task and language, one line per model, the
  zero-shot score as a dashed line of the same colour;
- `<Title>[_ir|_tr]_languages.png`: per-language zero-shot bars, grouped by language;
- `<Title>[_ir|_tr]_mt_gap.png`: translate-test minus zero-shot per language and model.
"""
from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from .iglue import TASKS, shot_count  # noqa: E402
from .report import _lang_key, _model_key, aggregate, metrics_of  # noqa: E402


def _save(fig, path: Path, written: list[Path]) -> None:
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    written.append(path)


def _bar_size(langs, models) -> tuple[float, float]:
    return min(16.0, max(6.0, 0.3 * len(langs) * max(1, len(models)))), 4.0


def _grouped_bars(ax, langs, models, value):
    width = 0.8 / max(len(models), 1)
    x = np.arange(len(langs))
    for i, model in enumerate(models):
        heights = [value(model, l) for l in langs]
        ax.bar(x + i * width - 0.4 + width / 2, [np.nan if h is None else h for h in heights], width, label=model)
    ax.set_xticks(x, langs)
    ax.axhline(0, color="black", linewidth=0.5)
    ax.legend(fontsize="small", ncol=max(1, len(models) // 5))


def write_plots(records: list[dict], out_dir: Path) -> list[Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    agg = aggregate(records)
    written: list[Path] = []
    for task in TASKS:
        title = TASKS[task].title
        for infix, metric in metrics_of(task):
            label = f"{title}{infix}"
            ylabel = {"score": "accuracy (%)", "ir_r1": "IR R@1", "tr_r1": "TR R@1"}[metric]
            zero = agg.get(("zero_shot", task, metric, None), {})
            mt = agg.get(("translate_test", task, metric, None), {})
            few = {k[3]: v for k, v in agg.items() if k[:3] == ("few_shot", task, metric)}

            if few:
                langs = sorted({l for models in few.values() for langs in models.values() for l in langs},
                               key=_lang_key(task))
                models = sorted({m for models in few.values() for m in models}, key=_model_key)
                for lang in langs:
                    fig, ax = plt.subplots(figsize=(5, 3.5))
                    for i, model in enumerate(models):
                        pts = sorted((shot_count(s), v[model][lang]) for s, v in few.items()
                                     if lang in v.get(model, {}))
                        if not pts:
                            continue
                        color = f"C{i % 10}"
                        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", color=color, label=model)
                        if lang in zero.get(model, {}):
                            ax.axhline(zero[model][lang], color=color, linestyle="--", linewidth=0.8)
                    xs = sorted({shot_count(s) for s in few})
                    ax.set_xscale("log")
                    ax.set_xticks(xs, [f"{x:g}" for x in xs])
                    ax.minorticks_off()
                    ax.set_xlabel("shots")
                    ax.set_ylabel(ylabel)
                    ax.set_title(f"{label} few-shot, {lang} (dashed: zero-shot)")
                    ax.legend(fontsize="small")
                    _save(fig, out_dir / f"{label}_fewshot_{lang}.png", written)

            if zero:
                langs = sorted({l for langs in zero.values() for l in langs}, key=_lang_key(task))
                models = sorted(zero, key=_model_key)
                fig, ax = plt.subplots(figsize=_bar_size(langs, models))
                _grouped_bars(ax, langs, models, lambda m, l: zero.get(m, {}).get(l))
                ax.set_ylabel(ylabel)
                ax.set_title(f"{label} zero-shot per language")
                _save(fig, out_dir / f"{label}_languages.png", written)

            if zero and mt:
                langs = sorted({l for langs in mt.values() for l in langs if l != "en"}, key=_lang_key(task))
                models = sorted(set(mt) & set(zero), key=_model_key)
                if langs and models:
                    def gap(m, l):
                        a, b = mt.get(m, {}).get(l), zero.get(m, {}).get(l)
                        return None if a is None or b is None else a - b
                    fig, ax = plt.subplots(figsize=_bar_size(langs, models))
                    _grouped_bars(ax, langs, models, gap)
                    ax.set_ylabel(f"translate-test − zero-shot ({ylabel})")
                    ax.set_title(f"{label}: translate-test gain over zero-shot")
                    _save(fig, out_dir / f"{label}_mt_gap.png", written)
    return written
