"""`volta-ml report` and `volta-ml compare` on result trees whose cells have per-item files (as eval_task,
gqa-score, eval-retrieval and iglue-hf write them): IGLUE's CSVs stay byte for byte what they were, the Markdown
cells carry intervals equal to volta_ml/stats.py's over the cell's items, seeds are summarised, format errors
reported, and the report's baseline comparison shows the same numbers as `volta-ml compare`."""
from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np
import pytest
import yaml

from volta_ml import stats
from volta_ml.cli import main as volta_ml
from volta_ml.protocols.report import write_report
from volta_ml.protocols.results import cell_items, collect

from helpers_stats import plain_holm

LANGS = ("en", "ar", "fr")


def write_cell(root: Path, protocol: str, model: str, task: str, lang: str, seed: int, items: dict[str, dict],
               extra: dict | None = None, digits: int | None = None) -> None:
    """A finished cell: result.json with the metrics (the mean of each item column; `digits`: rounded as a log
    prints them, eval_task's 3) and its per-item file."""
    shot = (extra or {}).get("shot")
    cell = root / protocol / model / task / lang / ("" if shot is None else shot) / f"seed{seed}"
    stats.write_items(cell / "eval" / "test_items.jsonl", [{"id": k, **v} for k, v in items.items()])
    metrics = {}
    for values in items.values():
        for metric in [m for m in values if m not in stats.RESERVED]:
            column = [v[metric] for v in items.values() if metric in v]
            metrics[metric] = sum(column) / len(column) if digits is None else round(sum(column) / len(column), digits)
    cell.mkdir(parents=True, exist_ok=True)
    (cell / "result.json").write_text(json.dumps({
        "protocol": protocol, "model": model, "task": task, "lang": lang, "shot": None, "seed": seed,
        "metrics": metrics, "items": "eval/test_items.jsonl", "status": "done", **(extra or {})}))


def correct(rng, n: int, p: float, drop: set[int] = frozenset()) -> dict[str, dict]:
    return {f"q{i}": {"score": 100.0 * (rng.random() < p)} for i in range(n) if i not in drop}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """runs/a: uc2 (two seeds), runs/b: m3p (one seed), 40 XVNLI items per language; B misses q3 in ar; a
    retrieval cell each; a generate-rule cell with format errors in a."""
    root = tmp_path_factory.mktemp("uncertainty") / "runs"
    rng = np.random.default_rng(0)
    for lang in LANGS:
        for seed in (0, 1):
            write_cell(root / "a", "zero_shot", "uc2", "xvnli", lang, seed, correct(rng, 40, 0.7))
        write_cell(root / "b", "zero_shot", "m3p", "xvnli", lang, 0,
                   correct(rng, 40, 0.5, drop={3} if lang == "ar" else set()))
    for side, model in (("a", "uc2"), ("b", "m3p")):
        items = {f"caption:{i}": {"ir_r1": 100.0 * (rng.random() < 0.4)} for i in range(30)}
        items.update({f"image:{i}": {"tr_r1": 100.0 * (rng.random() < 0.5)} for i in range(15)})
        write_cell(root / side, "zero_shot", model, "xflickrco", "de", 0, items)
    generate = {f"q{i}": {"score": 100.0 * (i % 3 == 0), "parse_failure_rate": 100.0 * (i % 5 == 0)} for i in range(40)}
    write_cell(root / "a", "zero_shot", "llava", "xvnli", "ar", 0, generate, {"rule": "generate"})
    for lang in ("ar", "fr"):            # few-shot: uc2 with 1 and 5 shots, the same 40 test items
        for shot, p in (("1", 0.55), ("5", 0.65)):
            write_cell(root / "a", "few_shot", "uc2", "xvnli", lang, 0, correct(rng, 40, p), {"shot": shot})
    return root


def rows(path: Path) -> list[dict]:
    with open(path, newline="", encoding="utf-8") as f:
        return list(csv.DictReader(f))


def seed_mean_items(root: Path, model: str, lang: str) -> dict[str, float]:
    per_seed = [stats.read_items(p) for p in sorted(root.glob(f"zero_shot/{model}/xvnli/{lang}/seed*/eval/*_items.jsonl"))]
    return {k: np.mean([s[k]["score"] for s in per_seed]) for k in per_seed[0]}


def test_report_intervals_seeds_and_format_errors(runs, tmp_path):
    assert volta_ml(["report", str(runs / "a"), "--out", str(tmp_path / "r"), "--no_plots"]) == 0
    out = tmp_path / "r"
    # IGLUE's CSVs are exactly those of the same records without per-item files
    plain = [{k: v for k, v in r.items() if k != "items"} for r in collect(runs / "a")]
    write_report(plain, tmp_path / "plain")
    for name in ("XVNLI_0.csv", "xFlickrCO_ir_0.csv", "xFlickrCO_tr_0.csv", "XVNLI_summary.csv"):
        assert (out / name).read_bytes() == (tmp_path / "plain" / name).read_bytes()
    assert "±" not in (tmp_path / "plain" / "XVNLI_0.md").read_text()
    # each cell's interval: the bootstrap over its items averaged over the seeds; avg: stratified by language
    cells = {(r["model"], r["column"]): r for r in rows(out / "uncertainty" / "XVNLI_0.csv")}
    for lang in LANGS:
        iv = stats.interval(list(seed_mean_items(runs / "a", "uc2", lang).values()))
        row = cells[("uc2", lang)]
        assert (float(row["ci_low"]), float(row["ci_high"]), int(row["items"])) == (iv.low, iv.high, 40)
        assert row["seeds"] == "2" and len(row["per_seed"].split()) == 2
    targets = [seed_mean_items(runs / "a", "uc2", lang) for lang in ("ar", "fr")]
    avg = stats.interval([v for t in targets for v in t.values()], ["ar"] * 40 + ["fr"] * 40, average="macro")
    assert (float(cells[("uc2", "avg")]["ci_low"]), float(cells[("uc2", "avg")]["ci_high"])) == (avg.low, avg.high)
    md = (out / "XVNLI_0.md").read_text()
    uc2 = next(line for line in md.splitlines() if line.startswith("| uc2 |"))
    assert f"± {avg.half_width:.2f} |" in uc2 and uc2.count("±") == 4
    assert "± " in (out / "xFlickrCO_ir_0.md").read_text() and "± " in (out / "XVNLI_summary.md").read_text()
    # seeds: mean ± standard deviation with n beside the per-seed numbers
    seeds = {(r["model"], r["column"]): r for r in rows(out / "seeds.csv")}
    ar = [json.loads(p.read_text())["metrics"]["score"]
          for p in sorted((runs / "a" / "zero_shot/uc2/xvnli/ar").glob("seed*/result.json"))]
    assert float(seeds[("uc2", "ar")]["std"]) == pytest.approx(np.std(ar, ddof=1))
    assert seeds[("uc2", "ar")]["n"] == "2" and seeds[("uc2", "ar")]["per_seed"] == " ".join(map(repr, ar))
    assert ("uc2", "avg") in seeds and ("llava", "ar") not in seeds
    # the generate rule's unparsed answers: a rate per cell, with its interval
    errors = rows(out / "format_errors.csv")
    assert [(r["model"], r["column"], float(r["format_error_rate"])) for r in errors] == [("llava", "ar", 20.0)]
    assert float(errors[0]["ci_low"]) < 20.0 < float(errors[0]["ci_high"])


def test_few_shot_auc_intervals_and_no_bare_cell(runs, tmp_path):
    """The few-shot AUC (table and summary) with its interval: each test item's AUC over the shots (linear, so
    their mean is the cell's AUC), bootstrapped; the average over languages resampled within each language. No
    score cell of any table is left without its interval (p-values are not scores)."""
    from helpers_report_cells import bare_cells

    assert volta_ml(["report", str(runs), "--out", str(tmp_path / "r"), "--no_plots", "--baseline", "m3p"]) == 0
    out = tmp_path / "r"
    per_lang = {}
    for lang in ("ar", "fr"):
        shots = [stats.read_items(runs / "a" / f"few_shot/uc2/xvnli/{lang}/{shot}/seed0/eval/test_items.jsonl")
                 for shot in ("1", "5")]
        per_lang[lang] = [(shots[0][k]["score"] + shots[1][k]["score"]) / 2 for k in shots[0]]   # trapezoid / 4
    cells = {(r["model"], r["column"]): r for r in rows(out / "uncertainty" / "XVNLI_fewshot_auc.csv")}
    for lang, values in per_lang.items():
        iv = stats.interval(values)
        row = cells[("uc2", lang)]
        assert float(row["value"]) == pytest.approx(np.mean(values))
        assert (float(row["ci_low"]), float(row["ci_high"]), row["items"]) == (iv.low, iv.high, "40")
    mean = stats.interval(per_lang["ar"] + per_lang["fr"], ["ar"] * 40 + ["fr"] * 40, average="macro")
    assert (float(cells[("uc2", "avg")]["ci_low"]), float(cells[("uc2", "avg")]["ci_high"])) == (mean.low, mean.high)
    summary = next(line for line in (out / "XVNLI_summary.md").read_text().splitlines() if line.startswith("| uc2 |"))
    assert summary.endswith(f"| {mean.estimate:.2f} ± {mean.half_width:.2f} |"), summary
    assert bare_cells(out, exempt_columns=("p", "p (Holm)")) == []


def test_few_shot_auc_compared_paired_and_spread_over_seeds(tmp_path, capsys):
    """The few-shot AUC cells are compared as every cell is (baseline.* and `volta-ml compare`): the paired test of
    the items' AUCs, computed here the obvious way (an item's AUC over shots 1 and 5: the mean of its two scores,
    each averaged over seeds; `avg` stratified by language), and listed in seeds.* (each seed's own AUC)."""
    root, rng = tmp_path / "runs", np.random.default_rng(1)
    for side, model, p in (("a", "uc2", 0.6), ("b", "m3p", 0.45)):
        for lang in ("ar", "fr"):
            for shot in ("1", "5"):
                for seed in (0, 1):
                    write_cell(root / side, "few_shot", model, "xvnli", lang, seed, correct(rng, 30, p),
                               {"shot": shot})

    def item_aucs(side: str, model: str, lang: str) -> dict[str, float]:
        cell = lambda shot, seed: stats.read_items(  # noqa: E731
            root / side / f"few_shot/{model}/xvnli/{lang}/{shot}/seed{seed}/eval/test_items.jsonl")
        per_shot = [{k: (cell(shot, 0)[k]["score"] + cell(shot, 1)[k]["score"]) / 2 for k in cell(shot, 0)}
                    for shot in ("1", "5")]
        return {k: (per_shot[0][k] + per_shot[1][k]) / 2 for k in per_shot[0]}

    assert volta_ml(["report", str(root), "--out", str(tmp_path / "r"), "--no_plots", "--baseline", "m3p"]) == 0
    baseline = {r["column"]: r for r in rows(tmp_path / "r" / "baseline.csv") if r["table"] == "XVNLI_fewshot_auc"}
    assert set(baseline) == {"ar", "fr", "avg"}
    a = {lang: item_aucs("a", "uc2", lang) for lang in ("ar", "fr")}
    b = {lang: item_aucs("b", "m3p", lang) for lang in ("ar", "fr")}
    for column, expected in (("ar", stats.compare_items(a["ar"], b["ar"])),
                             ("avg", stats.compare_items(
                                 {f"{l}/{k}": v for l in a for k, v in a[l].items()},
                                 {f"{l}/{k}": v for l in b for k, v in b[l].items()},
                                 {f"{l}/{k}": l for l in a for k in a[l]}, average="macro"))):
        row = baseline[column]
        assert (row["A"], row["B"], row["paired_items"]) == ("uc2", "m3p", str(expected.n))
        assert (float(row["difference"]), float(row["ci_low"]), float(row["ci_high"]), float(row["p_value"])) == \
            (expected.difference, expected.low, expected.high, expected.p_value)
    assert volta_ml(["compare", str(root / "a"), str(root / "b"), "--out", str(tmp_path / "c")]) == 0
    capsys.readouterr()
    assert [r for r in rows(tmp_path / "c" / "compare.csv") if r["table"] == "XVNLI_fewshot_auc"] == \
        list(baseline.values())
    seeds = {(r["model"], r["column"]): r for r in rows(tmp_path / "r" / "seeds.csv") if r["table"] == "XVNLI_fewshot_auc"}
    logged = lambda lang, seed: [json.loads((root / "a" / f"few_shot/uc2/xvnli/{lang}/{shot}/seed{seed}/result.json")  # noqa: E731
                                            .read_text())["metrics"]["score"] for shot in ("1", "5")]
    per_seed = [sum(logged("ar", seed)) / 2 for seed in (0, 1)]
    assert seeds[("uc2", "ar")]["n"] == "2" and seeds[("uc2", "ar")]["per_seed"] == " ".join(map(repr, per_seed))
    assert float(seeds[("uc2", "ar")]["std"]) == pytest.approx(np.std(per_seed, ddof=1))
    assert ("uc2", "avg") in seeds and ("m3p", "fr") in seeds


def test_report_baseline_shows_the_numbers_of_compare(runs, tmp_path, capsys):
    assert volta_ml(["compare", str(runs / "a"), str(runs / "b"), "--row_a", "uc2", "--row_b", "m3p",
                     "--out", str(tmp_path / "c")]) == 0
    printed = capsys.readouterr().out
    assert "| XVNLI_0 | ar | uc2 | m3p |" in printed and "1 only in A (q3)" in printed
    compared = rows(tmp_path / "c" / "compare.csv")
    assert volta_ml(["report", str(runs), "--out", str(tmp_path / "r"), "--no_plots", "--baseline", "m3p"]) == 0
    baseline = [r for r in rows(tmp_path / "r" / "baseline.csv") if r["A"] == "uc2"]
    assert baseline == compared
    by_cell = {(r["table"], r["column"]): r for r in compared}
    assert set(by_cell) == {("XVNLI_0", c) for c in (*LANGS, "avg")} | {("xFlickrCO_ir_0", "de"),
                                                                       ("xFlickrCO_ir_0", "avg"),
                                                                       ("xFlickrCO_tr_0", "de"),
                                                                       ("xFlickrCO_tr_0", "avg")}
    # the difference is the paired test of the items both scored; the item only A has is named
    ar = by_cell[("XVNLI_0", "ar")]
    a, b = seed_mean_items(runs / "a", "uc2", "ar"), seed_mean_items(runs / "b", "m3p", "ar")
    expected = stats.compare_items(a, b)
    assert (float(ar["difference"]), float(ar["ci_low"]), float(ar["p_value"])) == \
        (expected.difference, expected.low, expected.p_value)
    assert ar["only_in_A"] == "q3" and ar["only_in_B"] == "" and ar["paired_items"] == "39"
    # (#44) Holm's adjustment across the cells of one table (XVNLI_0: en, ar, fr, avg), beside the raw p
    xvnli = [by_cell[("XVNLI_0", c)] for c in (*LANGS, "avg")]
    raw = [float(r["p_value"]) for r in xvnli]
    assert [float(r["p_holm"]) for r in xvnli] == pytest.approx(plain_holm(raw), abs=1e-15)
    assert all(float(r["p_holm"]) >= float(r["p_value"]) for r in compared)
    assert "| p | p (Holm) |" in printed


def test_cells_show_the_mean_of_their_items_as_the_comparisons_do(tmp_path):
    """eval_task logs 3 decimals: 2 right of 17 items, 11.7647..., is logged 11.765. The tables' cell, the summary
    and the baseline comparison's value column show one number for it, the items' 11.76 (rounding the logged value
    again gave 11.77 in the tables beside 11.76 in baseline.md); IGLUE's CSV keeps the logged value."""
    root = tmp_path / "runs"
    write_cell(root, "zero_shot", "uc2", "xvnli", "ar", 0, {f"q{i}": {"score": 100.0 * (i < 2)} for i in range(17)},
               digits=3)
    write_cell(root, "zero_shot", "m3p", "xvnli", "ar", 0, {f"q{i}": {"score": 100.0 * (i < 5)} for i in range(17)},
               digits=3)
    assert volta_ml(["report", str(root), "--out", str(tmp_path / "r"), "--no_plots", "--baseline", "m3p"]) == 0
    out = tmp_path / "r"
    assert {"model": "uc2", "ar": "11.765", "avg": "11.765"} in rows(out / "XVNLI_0.csv")
    shown = lambda name: next(l for l in (out / name).read_text().splitlines() if "| uc2 |" in l)  # noqa: E731
    table, summary, baseline = shown("XVNLI_0.md"), shown("XVNLI_summary.md"), shown("baseline.md")
    assert table.startswith("| uc2 | 11.76 ± ") and table.count("| 11.76 ± ") == 2, table     # ar, avg
    assert "| 11.76 ± " in summary and "11.77" not in summary, summary
    assert baseline.startswith("| XVNLI_0 | ar | uc2 | m3p | 11.76 ± "), baseline


def test_grid_baseline_and_usage_errors(runs, tmp_path, capsys):
    grid = tmp_path / "grid.yml"
    grid.write_text(yaml.safe_dump({"name": "g", "data_root": str(tmp_path), "output_dir": str(runs),
                                    "tasks": ["xvnli"], "baseline": "m3p",
                                    "models": {"m3p": {"config": "m3p_base", "finetuned": "x"},
                                               "uc2": {"config": "uc2_base", "finetuned": "x"}}}))
    assert volta_ml(["report", "--grid", str(grid), "--out", str(tmp_path / "r"), "--no_plots"]) == 0
    assert (tmp_path / "r" / "baseline.csv").exists()
    assert volta_ml(["report", str(runs), "--out", str(tmp_path / "r2"), "--no_plots", "--baseline", "bert"]) == 2
    assert "baseline 'bert' is not a row of any table (rows: llava, m3p, uc2)" in capsys.readouterr().err
    grid.write_text(grid.read_text().replace("baseline: m3p", "baseline: bert"))
    assert volta_ml(["report", "--grid", str(grid)]) == 2
    assert "baseline: expected the report row of one of the grid's models (m3p, uc2), got 'bert'" in capsys.readouterr().err
    assert volta_ml(["compare", str(runs / "a"), str(runs / "b")]) == 2      # two rows in A: which one?
    assert "XVNLI_0: A has rows uc2, llava and B has rows m3p; choose with --row_a / --row_b" in capsys.readouterr().err
    assert volta_ml(["compare", str(runs / "a"), str(runs / "b"), "--confidence", "95"]) == 2
    assert "--confidence 95.0: expected a level between 0 and 1" in capsys.readouterr().err


def test_record_step_keeps_only_the_items_of_this_run(tmp_path):
    cell = tmp_path / "cell"
    stats.write_items(cell / "eval" / "ckpt-" / "test_items.jsonl", [{"id": "a", "score": 100.0}, {"id": "b", "score": 0.0}])
    assert cell_items(cell, {"score": 50.0, "loss": 0.7}) == ("eval/ckpt-/test_items.jsonl", "")
    assert cell_items(cell, {"score": 50.0004}) == ("eval/ckpt-/test_items.jsonl", "")     # the logs' 3 decimals
    path, why = cell_items(cell, {"score": 75.0})
    assert path is None and "the mean of its score items, 50.0000, is not the logged 75.0" in why
    assert cell_items(tmp_path / "empty", {"score": 1.0}) == (None, "no per-item file")


@pytest.mark.parametrize("damage, where", [
    ('{"id": "q1", "score": "abc"}\n', "line 2: not an item record"),
    ("", "an empty per-item file"),
])
def test_a_damaged_or_empty_per_item_file_stops_report_and_compare(tmp_path, capsys, damage, where):
    """(#42.1) The cell showed a bare number as if it had never had items, `avg` lost its interval and `compare`
    showed `–`, exit 0 and nothing said; now: exit 2, one line naming the file, the line and the cause."""
    root = tmp_path / "runs"
    for side, model in (("a", "uc2"), ("b", "m3p")):
        for lang in ("ar", "fr"):
            write_cell(root / side, "zero_shot", model, "xvnli", lang, 0,
                       {f"q{i}": {"score": 100.0 * (i % 2)} for i in range(6)})
    path = root / "a" / "zero_shot" / "uc2" / "xvnli" / "ar" / "seed0" / "eval" / "test_items.jsonl"
    path.write_text('{"id": "q0", "score": 0.0}\n' + damage if damage else "")
    for argv in (["report", str(root / "a"), "--out", str(tmp_path / "r"), "--no_plots"],
                 ["compare", str(root / "a"), str(root / "b")]):
        capsys.readouterr()
        assert volta_ml(argv) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and f"{path}" in err[0] and where in err[0], err
        assert "Traceback" not in err[0]
    assert "could not convert string to float: 'abc'" in err[0] if damage else True


def test_latex_tables_write_pm_as_latex(runs, tmp_path):
    """(#42.6) IGLUE's .tex wrote the literal `±` (CVQA's `$\\pm$`): one valid LaTeX form for both."""
    assert volta_ml(["report", str(runs / "a"), "--out", str(tmp_path / "r"), "--no_plots"]) == 0
    tex = (tmp_path / "r" / "XVNLI_0.tex").read_text()
    assert r" $\pm$ " in tex and "±" not in tex and "−" not in tex, tex
    assert "-0.00" not in "".join(p.read_text() for p in (tmp_path / "r").rglob("*.tex"))


def test_truncated_answers_per_cell_in_report_and_compare(tmp_path, capsys):
    """(#44) the generate rule's answers cut at max_new_tokens: `truncated.*` per cell with its interval over the
    items, the uncertainty CSV's columns, each side's rate in `compare`; a run whose backend does not say shows
    "unknown", never 0."""
    root = tmp_path / "runs"
    items = {f"q{i}": {"score": 100.0 * (i % 2), "parse_failure_rate": 0.0, "truncated_rate": 100.0 * (i < 3)}
             for i in range(12)}
    write_cell(root / "a", "zero_shot", "llava", "xvnli", "ar", 0, items, {"rule": "generate"})
    plain = {k: {"score": v["score"]} for k, v in items.items()}
    write_cell(root / "b", "zero_shot", "imported", "xvnli", "ar", 0, plain, {"rule": "generate"})
    result = root / "b" / "zero_shot" / "imported" / "xvnli" / "ar" / "seed0" / "result.json"
    record = json.loads(result.read_text())
    record["metrics"]["truncated_rate"] = None                     # imported answers: unknown
    result.write_text(json.dumps(record))
    assert volta_ml(["report", str(root), "--out", str(tmp_path / "r"), "--no_plots"]) == 0
    cut = {r["model"]: r for r in rows(tmp_path / "r" / "truncated.csv")}
    expected = stats.interval([v["truncated_rate"] for v in items.values()])
    assert cut["llava"]["truncated_rate"] == "25.0" and float(cut["llava"]["ci_low"]) == expected.low
    assert cut["imported"]["truncated_rate"] == "unknown" and cut["imported"]["ci_low"] == ""
    uncertainty = {(r["model"], r["column"]): r for r in rows(tmp_path / "r" / "uncertainty" / "XVNLI_0.csv")}
    assert uncertainty[("llava", "ar")]["truncated_rate"] == "25.0"
    assert float(uncertainty[("llava", "ar")]["truncated_high"]) == expected.high
    assert uncertainty[("imported", "ar")]["truncated_rate"] == "unknown"
    assert "| XVNLI_0 | imported | ar | unknown |" in (tmp_path / "r" / "truncated.md").read_text()
    capsys.readouterr()
    assert volta_ml(["compare", str(root / "a"), str(root / "b"), "--out", str(tmp_path / "c")]) == 0
    assert "truncated: A 25.00%, B unknown" in capsys.readouterr().out
    compared = {r["column"]: r for r in rows(tmp_path / "c" / "compare.csv")}
    assert (compared["ar"]["A_truncated_rate"], compared["ar"]["B_truncated_rate"]) == ("25.0", "unknown")
    assert (compared["avg"]["A_truncated_rate"], compared["avg"]["B_truncated_rate"]) == ("25.0", "unknown")


def test_cells_resample_the_images_their_items_name(tmp_path, capsys):
    """(#44) items that name their image (`cluster`) are resampled image by image within each language, in the
    cells, the `avg` and the comparisons, and the CSVs record it; a cell without cluster keys falls back to items,
    recorded as such."""
    root = tmp_path / "runs"
    rng = np.random.default_rng(4)
    for side, model, p in (("a", "uc2", 0.7), ("b", "m3p", 0.5)):
        for lang in ("ar", "fr"):
            items = {f"q{i}": {"score": 100.0 * (rng.random() < p), "cluster": f"img{i // 4}"} for i in range(24)}
            if lang == "fr" and side == "b":
                items = {k: {"score": v["score"]} for k, v in items.items()}      # no image named: items
            write_cell(root / side, "zero_shot", model, "xvnli", lang, 0, items)
    assert volta_ml(["report", str(root / "a"), "--out", str(tmp_path / "r"), "--no_plots"]) == 0
    cells = {r["column"]: r for r in rows(tmp_path / "r" / "uncertainty" / "XVNLI_0.csv")}
    ar = stats.read_items(root / "a/zero_shot/uc2/xvnli/ar/seed0/eval/test_items.jsonl")
    expected = stats.interval([v["score"] for v in ar.values()], clusters=[v["cluster"] for v in ar.values()])
    assert (float(cells["ar"]["ci_low"]), float(cells["ar"]["ci_high"])) == (expected.low, expected.high)
    assert cells["ar"]["resampling"] == "image clusters (6)" and cells["avg"]["resampling"] == "image clusters (12)"
    assert volta_ml(["compare", str(root / "a"), str(root / "b"), "--out", str(tmp_path / "c")]) == 0
    compared = {r["column"]: r for r in rows(tmp_path / "c" / "compare.csv")}
    b = stats.read_items(root / "b/zero_shot/m3p/xvnli/ar/seed0/eval/test_items.jsonl")
    expected = stats.compare_items({k: v["score"] for k, v in ar.items()}, {k: v["score"] for k, v in b.items()},
                                   clusters={k: v["cluster"] for k, v in ar.items()})
    assert (float(compared["ar"]["ci_low"]), float(compared["ar"]["p_value"])) == (expected.low, expected.p_value)
    assert compared["ar"]["resampling"] == "image clusters (6)" and compared["fr"]["resampling"] == "image clusters (6)"
    assert volta_ml(["report", str(root / "b"), "--out", str(tmp_path / "rb"), "--no_plots"]) == 0
    cells = {r["column"]: r for r in rows(tmp_path / "rb" / "uncertainty" / "XVNLI_0.csv")}
    assert cells["fr"]["resampling"] == "items" and cells["avg"]["resampling"] == "items"
    assert volta_ml(["report", str(root / "a"), "--out", str(tmp_path / "ri"), "--no_plots", "--resample", "items"]) == 0
    cells = {r["column"]: r for r in rows(tmp_path / "ri" / "uncertainty" / "XVNLI_0.csv")}
    plain = stats.interval([v["score"] for v in ar.values()])
    assert cells["ar"]["resampling"] == "items" and float(cells["ar"]["ci_low"]) == plain.low
