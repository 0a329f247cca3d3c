"""`volta-ml report`: IGLUE's CSV layout and `avg` rule, reading IGLUE/VOLTA log files, the few-shot AUC,
Markdown/LaTeX tables and plots."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from conftest import shared_path
from volta_ml.protocols.cli import main as protocols_cli
from volta_ml.protocols.report import Table, auc, build_tables, write_report
from volta_ml.protocols.results import iglue_log_records, retrieval_metrics

# Lines of IGLUE's results/<task>/*.csv (written by pandas from the same logs the results spec harvested).
IGLUE_CSV = {
    "XVNLI_0": """model,en,ar,es,fr,ru,avg
ctrl_muniter,76.375,46.735,56.959,59.364,51.718,53.694
ctrl_xuniter,75.773,51.976,58.935,63.316,59.708,58.48375
uc2,76.375,56.186,57.474,69.674,64.863,62.04925
m3p,76.89,55.241,58.849,56.357,62.543,58.2475
""",
    "MaRVL_0": """model,en,id,sw,ta,tr,zh,avg
ctrl_muniter,71.91,54.787,51.173,52.657,54.661,55.336,53.72280000000001
ctrl_xuniter,71.552,55.142,55.505,53.06,56.186,53.063,54.5912
uc2,70.561,56.738,52.617,60.467,56.695,59.881,57.2796
m3p,68.222,56.472,55.686,56.039,56.78,55.04,56.0034
""",
    "MaRVL_0.mt": """model,en,id,sw,ta,tr,zh,avg
ctrl_muniter,71.91,60.904,61.282,62.641,71.017,63.241,63.81699999999999
ctrl_xuniter,71.552,62.5,62.906,61.675,68.983,64.13,64.03880000000001
uc2,70.561,60.461,62.365,62.721,68.729,61.166,63.0884
m3p,68.222,60.461,62.365,62.721,68.475,58.597,62.523799999999994
ctrl_lxmert,68.954,59.752,62.274,59.984,68.305,62.253,62.51360000000001
ctrl_uniter,71.107,60.55,59.657,60.064,69.153,60.178,61.920399999999994
ctrl_vilbert,71.021,59.84,60.83,60.628,69.068,61.561,62.38539999999999
ctrl_visualbert,71.178,59.309,60.108,61.836,68.136,62.352,62.3482
ctrl_vl-bert,71.724,62.677,62.455,63.607,69.407,62.648,64.15880000000001
""",
    "XVNLI_1": """model,ar,es,fr,ru,avg
ctrl_muniter,46.993,56.787,59.45,51.718,53.73700000000001
""",
}


def spec_table(heading: str) -> list[dict[str, str]]:
    """Rows of a markdown table in specs/iglue_reference_results.md under the heading that starts so."""
    text = shared_path("specs", "iglue_reference_results.md").read_text(encoding="utf-8")
    block = text.split(heading, 1)[1].split("\n\n", 1)[0]
    lines = [l for l in block.splitlines() if l.startswith("|")]
    header = [c.strip() for c in lines[0].strip("|").split("|")]
    return [dict(zip(header, (c.strip() for c in l.strip("|").split("|")))) for l in lines[2:]]


def write_iglue_zero_shot_logs(root: Path, task: str, name: str, rows, models) -> None:
    """`experiments/zero_shot/<model>/<task>/test.<lang>[_mt].err` as eval_task writes them."""
    for row in rows:
        if row["model"] not in models:
            continue
        for col, value in row.items():
            if col == "model" or not re.match(r"^\d", value):
                continue
            log = root / row["model"] / task / f"test.{col}.err"
            log.parent.mkdir(parents=True, exist_ok=True)
            log.write_text(f"11/29/2026 10:00:00 - INFO - volta_ml -   Eval task TASK12 on iteration 0\n"
                           f"11/29/2026 10:00:01 - INFO - volta_ml -   Validation [{name}]: loss 0.783 score "
                           f"{float(value):.3f} \nConsistency: 33.36688475088073\n")


def test_iglue_csvs_regenerated_from_the_logged_per_language_scores(tmp_path):
    """Logs carrying the reference per-language scores give IGLUE's CSVs, `avg` included, character for
    character (the mean over the target languages, English excluded)."""
    multilingual = ["ctrl_muniter", "ctrl_xuniter", "uc2", "m3p"]
    xvnli = spec_table("### 1.1 XVNLI")
    marvl = spec_table("### 1.3 MaRVL")
    exp = tmp_path / "experiments" / "zero_shot"
    write_iglue_zero_shot_logs(exp, "xvnli", "XVNLI", xvnli, multilingual)
    # MaRVL: non-MT logs exist only for the multilingual models (English-only models have "no log")
    write_iglue_zero_shot_logs(exp, "marvl", "NLVR2", marvl, [r["model"] for r in marvl])
    few = tmp_path / "experiments" / "few_shot" / "ctrl_muniter" / "xvnli"
    for lang, value in zip(["ar", "es", "fr", "ru"], ["46.993", "56.787", "59.45", "51.718"]):
        (few / lang / "1").mkdir(parents=True)
        # XVNLI few-shot tables take the FIRST Validation line of test.err
        (few / lang / "1" / "test.err").write_text(f"Validation [XVNLI]: loss 0.5 score {value} \n"
                                                   f"Validation [XVNLI]: loss 0.5 score 99.999 \n")
    assert protocols_cli(["report", str(tmp_path / "experiments"), "--out", str(tmp_path / "report"),
                          "--no_plots"]) == 0
    out = tmp_path / "report"
    assert (out / "XVNLI_0.csv").read_text() == IGLUE_CSV["XVNLI_0"]
    assert (out / "MaRVL_0.mt.csv").read_text() == IGLUE_CSV["MaRVL_0.mt"]
    assert (out / "XVNLI_1.csv").read_text() == IGLUE_CSV["XVNLI_1"]
    # the non-MT MaRVL table has the English-only models too (their English test exists): missing target
    # languages are -1.0 and still averaged, as IGLUE's scrapers record them
    marvl_csv = (out / "MaRVL_0.csv").read_text().splitlines()
    assert marvl_csv[:5] == IGLUE_CSV["MaRVL_0"].splitlines()
    assert marvl_csv[5] == "ctrl_lxmert,68.954,-1.0,-1.0,-1.0,-1.0,-1.0,-1.0"
    md = (out / "MaRVL_0.md").read_text()
    assert "| ctrl_lxmert | 68.95 | – | – | – | – | – | – |" in md
    assert "| uc2 | 70.56 | 56.74 | 52.62 | 60.47 | 56.70 | 59.88 | 57.28 |" in md
    tex = (out / "XVNLI_0.tex").read_text()
    assert r"\begin{tabular}{lrrrrrr}" in tex and r"ctrl\_xuniter & 75.77 & 51.98 & 58.94 & 63.32 & 59.71 & 58.48 \\" in tex


def test_auc_by_the_trapezoidal_rule():
    # shots 1, 5, 10 -> area 4*(50+54)/2 + 5*(54+55)/2 = 208 + 272.5 = 480.5 over a range of 9
    assert auc([(5, 54.0), (1, 50.0), (10, 55.0)]) == pytest.approx(480.5 / 9)
    assert auc([(1, 10.0), (3, 10.0)]) == pytest.approx(10.0)       # a flat curve: its value
    assert auc([(5, 1.0)]) is None


def record(protocol, model, task, lang, metrics, shot=None, seed=0):
    return {"protocol": protocol, "model": model, "task": task, "lang": lang, "shot": shot, "seed": seed,
            "metrics": metrics}


def test_report_side_by_side_auc_seeds_and_plots(tmp_path):
    recs = []
    for model, base in (("uc2", 50.0), ("m3p", 40.0)):
        recs.append(record("zero_shot", model, "xvnli", "en", {"score": base + 30}))
        for i, lang in enumerate(["ar", "fr"]):
            recs.append(record("zero_shot", model, "xvnli", lang, {"score": base + i}))
            recs.append(record("translate_test", model, "xvnli", lang, {"score": base + 20 + i}))
            for shot, gain in (("1", 1.0), ("5", 3.0), ("10", 4.0)):
                recs.append(record("few_shot", model, "xvnli", lang, {"score": base + i + gain}, shot=shot, seed=0))
                recs.append(record("few_shot", model, "xvnli", lang, {"score": base + i + gain + 2}, shot=shot, seed=1))
    recs.append(record("zero_shot", "uc2", "xflickrco", "de", {"ir_r1": 28.6, "tr_r1": 23.9}))
    files = write_report(recs, tmp_path / "report")
    names = {p.name for p in files}
    assert {"XVNLI_0.csv", "XVNLI_0.mt.csv", "XVNLI_1.csv", "XVNLI_10.csv", "XVNLI_summary.md",
            "XVNLI_fewshot_auc.csv", "xFlickrCO_ir_0.csv", "xFlickrCO_tr_0.csv"} <= names
    # two seeds are averaged: uc2 ar 1-shot = mean(51, 53)
    assert "uc2,52.0,53.0,52.5" in (tmp_path / "report/XVNLI_1.csv").read_text()
    # the .mt table takes its English column from the English test
    assert (tmp_path / "report/XVNLI_0.mt.csv").read_text().splitlines()[1] == "uc2,80.0,70.0,71.0,70.5"
    summary = (tmp_path / "report/XVNLI_summary.csv").read_text().splitlines()
    assert summary[0] == "model,en,zero-shot,translate-test,1-shot,5-shot,10-shot,few-shot AUC"
    # AUC per language over shots 1,5,10 of (base+i+{2,4,5}): (4*3 + 5*4.5)/9 + base + i, averaged over ar, fr
    expected_auc = (4 * 3 + 5 * 4.5) / 9 + 50 + 0.5
    uc2 = summary[1].split(",")
    assert uc2[:7] == ["uc2", "80.0", "50.5", "70.5", "52.5", "54.5", "55.5"]
    assert float(uc2[7]) == pytest.approx(expected_auc)
    assert "| uc2 | 80.00 | 50.50 | 70.50 | 52.50 | 54.50 | 55.50 | 54.33 |" in (tmp_path / "report/XVNLI_summary.md").read_text()
    from volta_ml.protocols.plots import write_plots
    pngs = write_plots(recs, tmp_path / "plots")
    assert {p.name for p in pngs} >= {"XVNLI_fewshot_ar.png", "XVNLI_fewshot_fr.png", "XVNLI_languages.png",
                                      "XVNLI_mt_gap.png", "xFlickrCO_ir_languages.png"}
    for p in pngs:
        assert p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and p.stat().st_size > 5000


def test_reading_gqa_and_retrieval_logs(tmp_path):
    exp = tmp_path / "zero_shot"
    gqa = exp / "uc2" / "xgqa" / "test.de_mt.out"
    gqa.parent.mkdir(parents=True)
    gqa.write_text("***** Running evaluation *****\n  Num Iters:  25\n52.607\n")
    ret = exp / "uc2" / "xflickrco" / "test.de.out"
    ret.parent.mkdir(parents=True)
    ret.write_text("1999 Final r1:28.600, r5:57.700, r10:69.400, mder:4.000, meanr:26.019\n"
                   "***************\nImage Retrieval\n"
                   "Final r1:28.600, r5:57.700, r10:69.400, mder:4.000, meanr:26.019\n"
                   "***************\nText Retrieval\n"
                   "Final r1:23.900, r5:53.550, r10:67.200, mder:5.000, meanr:22.904\n")
    (exp / "uc2" / "xflickrco" / "test.ja.out").write_text("killed before the end\n")   # skipped
    recs = {(r["task"], r["lang"], r["protocol"]): r["metrics"] for r in iglue_log_records(tmp_path)}
    assert recs[("xgqa", "de", "translate_test")] == {"score": 52.607}
    assert recs[("xflickrco", "de", "zero_shot")]["ir_r1"] == 28.6
    assert recs[("xflickrco", "de", "zero_shot")]["tr_meanr"] == 22.904
    assert ("xflickrco", "ja", "zero_shot") not in recs
    assert retrieval_metrics(ret)["ir_r10"] == 69.4


def test_table_avg_and_missing_values():
    t = Table("xvnli", "XVNLI", {"a": {"en": 70.0, "ar": 50.0, "fr": 60.0}, "b": {"ar": 40.0}}, True)
    assert t.columns == ["en", "ar", "fr"] and t.avg("a") == 55.0
    assert t.avg("b") == pytest.approx((40.0 - 1.0) / 2)
    assert t.to_csv().splitlines()[2] == "b,-1.0,40.0,-1.0,19.5"
    assert [r for r in build_tables([]) if r] == []
