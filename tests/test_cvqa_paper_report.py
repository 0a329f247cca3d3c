"""`volta-ml cvqa report`: result folders whose predictions give known accuracies -> every cell of the paper's
tables, the paper column and the differences."""
from __future__ import annotations

import csv
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import helpers_report_cells as report_cells
from helpers_stats import plain_holm
from volta_ml import stats
from volta_ml.cvqa import paper
from volta_ml.cvqa.collect import question_type
from volta_ml.cvqa.data import CVQAQuestion
from volta_ml.cvqa.report import accuracy_summary, write_predictions

REPO = Path(__file__).resolve().parents[1]

# (pair, category, image type, English question): 3 pairs on 3 continents, 2 categories, 2 sources, 7 types
SPEC = [("Brazil-Portuguese", "Cooking and Food", "Self", "What dish is this?"),
        ("Brazil-Portuguese", "Cooking and food", "External", "Which city is this?"),
        ("Brazil-Portuguese", "Brands and Products", "Self", "Who made this?"),
        ("Brazil-Portuguese", "Brands and Products", "External", "How is it cooked?"),
        ("India-Telugu", "Cooking and Food", "Self", "Why is it eaten?"),
        ("India-Telugu", "Cooking and Food", "Self", "Where is this temple?"),
        ("India-Telugu", "Brands and Products", "External", "WHAT brand is this?"),
        ("Kenya-Swahili", "Cooking and Food", "Self", "Name this dish."),
        ("Kenya-Swahili", "Brands and Products", "External", "Tell me: what is the name of this?"),
        ("Kenya-Swahili", "Cooking and Food", "Self", "Somewhat odd: which one?")]
TYPES = ["what", "which", "who", "how", "why", "where", "what", "other", "what", "which"]
QUESTIONS = [CVQAQuestion(id=f"{i}_0", image_id=str(i), language=pair.split("-")[1], country=pair.split("-")[0],
                          question="q", question_en=text, options=("a", "b", "c", "d"),
                          options_en=("a", "b", "c", "d"), label=i % 4, category=cat, image_type=kind, shard="s",
                          row=i) for i, (pair, cat, kind, text) in enumerate(SPEC)]
LLAVA = "llava-hf/llava-1.5-7b-hf"
CLIP = "openai/clip-vit-large-patch14-336"
# run folder -> (backend, model, rule, {condition: indices of the questions answered right}, text-only?)
FOLDERS = {
    "llava_letter": ("mllm", LLAVA, "letter", {"en-aware": {0, 1, 2, 4, 6, 7, 8}, "loc-aware": {0, 4},
                                               "en-agnostic": {0, 1, 2, 3, 4, 5}, "loc-agnostic": {0}}, False),
    "sweep/clip/en-aware": ("clip", CLIP, None, {"en-aware": {0, 1, 2, 3, 4}}, False),
    "sweep/clip/loc-aware": ("clip", CLIP, None, {"loc-aware": {9}}, False),
    "llava_open": ("mllm", LLAVA, "open", {"en-aware": {0, 1, 2}}, False),
    "zoo": (None, "ctrl_xuniter.bin", None, {"en-aware": {0}, "loc-aware": set()}, True),
    "mblip": ("mllm", "/models/my-mblip", "letter", {"en-aware": set(), "loc-aware": set(range(10))}, False),
}


def predictions(right: set[int]) -> np.ndarray:
    return np.array([q.label if i in right else (q.label + 1) % 4 for i, q in enumerate(QUESTIONS)])


def write_folder(folder: Path, backend, model, rule, conditions, blind, legacy: bool = False) -> None:
    """A result folder as `cvqa score` writes it: the text-only control's and the open rule's length-normalised
    scores per question and option in the predictions files (`text_only_<k>`, `length_normalised_<k>`) and their
    summaries in cvqa_results.json; `legacy`: the summaries only (a folder written before issue 23)."""
    folder.mkdir(parents=True)
    results = {"model": model, "model_revision": "0123abc", "revision": "datarev", "rule": rule, "runs": {},
               "text_only": {}, "variants": {}}
    if backend:
        results["backend"] = backend
    for condition, right in conditions.items():
        preds = predictions(right)
        extra = {}
        if rule == "open":      # the open rule's length-normalised variant
            extra["length_normalised"] = np.eye(4)[predictions({3, 4, 5, 6})]
            results["variants"].setdefault("length_normalised", {})[condition] = accuracy_summary(
                QUESTIONS, predictions({3, 4, 5, 6}))
        if blind:
            extra["text_only"] = np.eye(4)[predictions({1, 2})]
            results["text_only"][condition] = accuracy_summary(QUESTIONS, predictions({1, 2}))
        write_predictions(folder / f"predictions_{condition}.csv", QUESTIONS, preds, np.zeros((10, 4)), condition,
                          "datarev", None if legacy else extra)
        results["runs"][condition] = accuracy_summary(QUESTIONS, preds)
    (folder / "cvqa_results.json").write_text(json.dumps(results))


NO_ITEMS = ("EN paper", "EN diff", "LOC paper", "LOC diff", "p", "p (Holm)")   # the paper's numbers, diffs, p


def bare_cells(folder: Path) -> list[tuple]:
    """Every accuracy of the report shown without its interval (the random row is the expected 25%)."""
    return report_cells.bare_cells(folder, NO_ITEMS, ("random",))


def report(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "volta_ml.cli", "cvqa", "report", *args], cwd=REPO,
                          capture_output=True, text=True, timeout=120, env={**os.environ, "PYTHONPATH": str(REPO)})


def rows(path: Path) -> list[dict]:
    with open(path, newline="", encoding="utf-8") as f:
        return list(csv.DictReader(f))


def number(cell: str):
    return None if cell == "" else float(cell)


@pytest.fixture(scope="module")
def out(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("paper_report")
    for name, spec in FOLDERS.items():
        write_folder(tmp / "runs" / name, *spec)
    proc = report(str(tmp / "runs"), "--out", str(tmp / "report"), "--paper-row", "/models/my-mblip=mBLIP-mT0")
    assert proc.returncode == 0, proc.stderr
    return tmp / "report"


def expected_cells(right: set[int], group: int, key: str, kind=None) -> tuple[int, float]:
    """(n, accuracy) of the questions whose SPEC field `group` (or TYPES when kind) is `key`, counted here."""
    members = [i for i in range(10) if (TYPES[i] if kind else
                                        {0: SPEC[i][0], 1: paper.paper_category(SPEC[i][1]),
                                         2: {"Self": "Self-made", "External": "Web"}[SPEC[i][2]]}[group]) == key]
    return len(members), 100.0 * len(right & set(members)) / len(members)


LABELS = {"llava_letter": "LLaVA-1.5-7B (letter)", "sweep/clip/en-aware": "CLIP", "llava_open": "LLaVA-1.5-7B (open)",
          "zoo": "ctrl_xuniter.bin", "mblip": "mBLIP-mT0 (letter)"}


def test_table3_every_cell_paper_column_and_difference(out):
    table = {r["model"]: r for r in rows(out / "table3_overall.csv")}
    assert list(table) == ["LLaVA-1.5-7B (letter)", "LLaVA-1.5-7B (open)", "LLaVA-1.5-7B (open) length_normalised",
                           "mBLIP-mT0 (letter)", "CLIP",
                           "ctrl_xuniter.bin", "ctrl_xuniter.bin text-only", "random"]    # folder order
    want = {  # EN, EN paper, LOC, LOC paper, EN macro, LOC macro
        "LLaVA-1.5-7B (letter)": (70.0, 48.9, 20.0, 36.5, (75 + 200 / 3 + 200 / 3) / 3, (25 + 100 / 3 + 0) / 3),
        "CLIP": (50.0, 42.3, 10.0, 31.5, (100 + 100 / 3 + 0) / 3, (0 + 0 + 100 / 3) / 3),
        "LLaVA-1.5-7B (open)": (30.0, 30.0, None, None, (75 + 0 + 0) / 3, None),
        "LLaVA-1.5-7B (open) length_normalised": (40.0, None, None, None, (25 + 100 + 0) / 3, None),
        "ctrl_xuniter.bin": (10.0, None, 0.0, None, 25 / 3, 0.0),
        "ctrl_xuniter.bin text-only": (20.0, None, 20.0, None, 50 / 3, 50 / 3),
        "mBLIP-mT0 (letter)": (0.0, 31.5, 100.0, 31.2, 0.0, 100.0),
        "random": (25.0, None, 25.0, None, 25.0, 25.0)}
    for model, (en, p_en, loc, p_loc, en_macro, loc_macro) in want.items():
        row = table[model]
        assert number(row["EN"]) == pytest.approx(en) and number(row["EN paper"]) == p_en
        assert number(row["LOC"]) == (None if loc is None else pytest.approx(loc)) and number(row["LOC paper"]) == p_loc
        assert number(row["EN diff"]) == (None if p_en is None else pytest.approx(en - p_en, abs=5e-5))
        assert number(row["LOC diff"]) == (None if p_loc is None else pytest.approx(loc - p_loc, abs=5e-5))
        assert number(row["EN-LOC gap"]) == (None if loc is None else pytest.approx(en - loc))
        assert number(row["EN macro"]) == pytest.approx(round(en_macro, 4), abs=1e-9)   # 4 decimals of the exact value
        assert number(row["LOC macro"]) == (None if loc_macro is None else pytest.approx(round(loc_macro, 4), abs=1e-9))
    assert table["LLaVA-1.5-7B (letter)"]["EN diff"] == "21.1" and table["LLaVA-1.5-7B (letter)"]["LOC diff"] == "-16.5"
    assert table["LLaVA-1.5-7B (letter)"]["EN macro"] == "69.4444" and table["CLIP"]["rule"] == "-"
    assert table["ctrl_xuniter.bin"]["backend"] == "zoo" and table["ctrl_xuniter.bin"]["paper model"] == "-"
    md = (out / "table3_overall.md").read_text()
    # our accuracies with their intervals (± half the width), the paper's numbers and the differences without
    assert re.search(r"\| LLaVA-1\.5-7B \(letter\) \| mllm \| letter \| LLaVA-1\.5-7B \| 70\.00 ± \d+\.\d\d \| 48\.90 \| "
                     r"21\.10 \| 20\.00 ± \d+\.\d\d \| 36\.50 \| -16\.50 \|", md)
    tex = (out / "table3_overall.tex").read_text()
    assert r"\begin{tabular}{llllrrrrrrrrrr}" in tex and r"LLaVA-1.5-7B (letter) & mllm & letter" in tex
    # the text-only control and the length-normalised variant: intervals from their per-question scores, the gap
    # paired over the same questions
    pairs = [q.country + "-" + q.language for q in QUESTIONS]
    blind = np.array([100.0 * (i in {1, 2}) for i in range(10)])
    for model, right in (("ctrl_xuniter.bin text-only", {1, 2}), ("LLaVA-1.5-7B (open) length_normalised", {3, 4, 5, 6})):
        values = np.array([100.0 * (i in right) for i in range(10)])
        iv, macro = stats.interval(values, pairs), stats.interval(values, pairs, average="macro")
        row = table[model]
        assert (number(row["EN ci_low"]), number(row["EN ci_high"])) == (round(iv.low, 4), round(iv.high, 4))
        assert (number(row["EN macro ci_low"]), number(row["EN macro ci_high"])) == \
            (round(macro.low, 4), round(macro.high, 4))
    paired = stats.compare_items(dict(enumerate(blind)), dict(enumerate(blind)), dict(enumerate(pairs)))
    assert number(table["ctrl_xuniter.bin text-only"]["EN-LOC gap ci_high"]) == round(paired.high, 4) == 0.0


def test_every_accuracy_cell_has_its_interval(out, tmp_path):
    """No accuracy without its interval in any table of the report (the paper's numbers, the differences from
    them and the random row have no per-question data); a folder written before the per-question control scores
    existed still shows its summaries, without one."""
    from volta_ml.cli import main

    assert bare_cells(out) == []
    write_folder(tmp_path / "runs" / "old", *FOLDERS["zoo"], legacy=True)
    assert main(["cvqa", "report", str(tmp_path / "runs"), "--out", str(tmp_path / "report"), "--no-plots",
                 "--resamples", "50"]) == 0
    bare = bare_cells(tmp_path / "report")
    assert {cell[0] for cell in bare} == {"table3_overall.md", "cvqa_paper_report.md"}
    assert sorted({cell[1:] for cell in bare}) == sorted(
        ("ctrl_xuniter.bin text-only", column, value) for column, value in
        (("EN", "20.00"), ("LOC", "20.00"), ("EN-LOC gap", "0.00"), ("EN macro", "16.67"), ("LOC macro", "16.67")))


def test_table7_aware_and_agnostic(out):
    table = {(r["prompt"], r["model"]): r for r in rows(out / "table7_prompt.csv")}
    assert [k for k in table if k[0] == "agnostic"] == [("agnostic", "LLaVA-1.5-7B (letter)")]
    agnostic = table[("agnostic", "LLaVA-1.5-7B (letter)")]
    assert [agnostic[c] for c in ("EN", "EN paper", "EN diff", "LOC", "LOC paper", "LOC diff", "EN-LOC gap")] == \
        ["60.0", "47.7", "12.3", "10.0", "35.4", "-25.4", "50.0"]
    aware = table[("aware", "CLIP")]
    assert [aware[c] for c in ("EN", "EN paper", "EN diff", "LOC", "LOC paper", "LOC diff")] == \
        ["50.0", "42.3", "7.7", "10.0", "31.5", "-21.5"]
    assert table[("aware", "LLaVA-1.5-7B (open)")]["EN paper"] == ""      # Table 7 is the letter rule only


# The paper's numbers for the groups and models of these runs, written out from the paper (specs/cvqa.md §0b:
# Table 5 columns Food / Brands, Table 6, Figure 3's text), not read from volta_ml.cvqa.paper: (EN, LOC)
PAPER_TABLE5 = {("Food", "LLaVA-1.5-7B"): (45.9, 32.5), ("Brands", "LLaVA-1.5-7B"): (47.7, 36.5),
                ("Food", "CLIP"): (40.8, 30.9), ("Brands", "CLIP"): (40.1, 31.3),
                ("Food", "mBLIP-mT0"): (27.8, 26.9), ("Brands", "mBLIP-mT0"): (33.5, 31.3)}
PAPER_TABLE6 = {("Self-made", "LLaVA-1.5-7B"): (47.0, 34.0), ("Web", "LLaVA-1.5-7B"): (48.0, 37.0),
                ("Self-made", "CLIP"): (41.5, 30.4), ("Web", "CLIP"): (44.1, 33.1),
                ("Self-made", "mBLIP-mT0"): (34.4, 31.9), ("Web", "mBLIP-mT0"): (34.0, 32.8)}
PAPER_FIGURE3 = {("Brazil-Portuguese", "LLaVA-1.5-7B"): (60.73, 51.16)}   # the other pairs: not in the text


@pytest.mark.parametrize("name,column,group,reference", [
    ("table5_category", "category", 1, PAPER_TABLE5), ("table6_image_source", "image source", 2, PAPER_TABLE6),
    ("figure3_pairs", "pair", 0, PAPER_FIGURE3)])
def test_breakdown_tables_every_cell(out, name, column, group, reference):
    table = rows(out / f"{name}.csv")
    seen = set()
    for row in table:
        folder = next(f for f, label in LABELS.items() if label == row["model"])
        backend, model, rule, conditions, _ = FOLDERS[folder]
        if folder.startswith("sweep/"):
            conditions = {**FOLDERS["sweep/clip/en-aware"][3], **FOLDERS["sweep/clip/loc-aware"][3]}
        p_row = paper.paper_row(backend, model, {"/models/my-mblip": "mBLIP-mT0"})
        theirs = reference.get((row[column], p_row)) if rule != "open" else None
        for lang, condition in (("EN", "en-aware"), ("LOC", "loc-aware")):
            if condition not in conditions:
                assert row[lang] == ""
                continue
            n, acc = expected_cells(conditions[condition], group, row[column])
            assert int(row["n"]) == n and number(row[lang]) == pytest.approx(round(acc, 4), abs=1e-9)
            assert number(row[f"{lang} paper"]) == (theirs[lang == "LOC"] if theirs else None)
            assert number(row[f"{lang} diff"]) == (pytest.approx(acc - theirs[lang == "LOC"], abs=5e-5) if theirs
                                                   else None)
        seen.add((row[column], row["model"]))
    keys = {expected for expected in ({0: s[0], 1: paper.paper_category(s[1]), 2: None}[group] for s in SPEC)} - {None}
    assert len(seen) == len(table) == len(keys or {"Self-made", "Web"}) * len(LABELS)


@pytest.mark.parametrize("table, key, numbers", [   # rows the report test above does not reach
    (paper.TABLE3, "M-CLIP", (36.9, 33.4)), (paper.TABLE3, "InstructBLIP", (47.8, 32.7)),
    (paper.TABLE3, "mBLIP-BLOOMZ", (39.4, 33.0)), (paper.TABLE3, "GPT-4o", (79.1, 79.4)),
    (paper.TABLE5, ("People", "LLaVA-1.5-7B"), (58.6, 38.7)), (paper.TABLE5, ("Vehicles", "M-CLIP"), (38.4, 39.4)),
    (paper.TABLE5, ("Objects", "CLIP"), (39.0, 24.2)), (paper.TABLE5, ("Pop Culture", "InstructBLIP"), (45.0, 35.5)),
    (paper.TABLE5, ("Plants & Animals", "mBLIP-BLOOMZ"), (46.4, 38.2)),
    (paper.TABLE6, ("Self-made", "InstructBLIP"), (49.1, 31.1)), (paper.TABLE6, ("Web", "M-CLIP"), (36.8, 33.6)),
    (paper.TABLE7, ("agnostic", "mBLIP-BLOOMZ"), (39.8, 33.6)), (paper.TABLE7, ("agnostic", "CLIP"), (43.1, 31.5)),
    (paper.TABLE7, ("aware", "InstructBLIP"), (47.8, 32.7)),
    (paper.FIGURE3, ("Mongolia-Mongolian", "LLaVA-1.5-7B"), (40.0, 27.62)),
])
def test_the_paper_numbers_are_the_papers(table, key, numbers):
    """A dozen and more of the paper's numbers across Tables 3, 5, 6, 7 and Figure 3, written out here from the
    paper (specs/cvqa.md §0b), against the constants the report reads."""
    assert table[key] == numbers


def test_figure3_groups_pairs_by_continent_and_quotes_the_paper(out):
    table = rows(out / "figure3_pairs.csv")
    assert list(dict.fromkeys((r["continent"], r["pair"]) for r in table)) == [
        ("Asia", "India-Telugu"), ("Latin America", "Brazil-Portuguese"), ("Africa", "Kenya-Swahili")]
    brazil = next(r for r in table if r["pair"] == "Brazil-Portuguese" and r["model"] == "LLaVA-1.5-7B (letter)")
    assert (brazil["EN"], brazil["EN paper"], brazil["EN diff"]) == ("75.0", "60.73", "14.27")
    assert (brazil["LOC"], brazil["LOC paper"], brazil["LOC diff"]) == ("25.0", "51.16", "-26.16")


def test_question_types(out):
    assert [question_type(s[3]) for s in SPEC] == TYPES           # whole words, any case, first one wins
    table = {(r["question type"], r["model"]): r for r in rows(out / "question_types.csv")}
    assert list(dict.fromkeys(k[0] for k in table)) == ["what", "how", "why", "where", "who", "which", "other"]
    for (kind, model), row in table.items():
        folder = next(f for f, label in LABELS.items() if label == model)
        conditions = FOLDERS[folder][3]
        if folder.startswith("sweep/"):
            conditions = {**conditions, **FOLDERS["sweep/clip/loc-aware"][3]}
        for lang, condition in (("EN", "en-aware"), ("LOC", "loc-aware")):
            n, acc = expected_cells(conditions[condition], 0, kind, kind=True) if condition in conditions else (0, None)
            assert number(row[lang]) == (None if acc is None else pytest.approx(round(acc, 4), abs=1e-9))
            assert int(row["n"]) == TYPES.count(kind)
    assert table[("what", "LLaVA-1.5-7B (letter)")]["EN"] == "100.0"       # questions 0, 6, 8 all right


def test_report_files_and_figures(out):
    for name in ("table3_overall", "table5_category", "table6_image_source", "table7_prompt", "figure3_pairs",
                 "question_types"):
        for ext in ("csv", "md", "tex"):
            assert (out / f"{name}.{ext}").stat().st_size > 0
        assert (out / f"{name}.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    summary = (out / "cvqa_paper_report.md").read_text()
    assert "Data revision(s): `datarev`." in summary and "en-aware, loc-aware" in summary   # the CLIP folders merged


def test_bad_inputs_are_one_line_errors(tmp_path, capsys):
    from volta_ml.cli import main

    write_folder(tmp_path / "a", *FOLDERS["sweep/clip/en-aware"])
    write_folder(tmp_path / "b", *FOLDERS["sweep/clip/en-aware"])
    (tmp_path / "empty").mkdir()
    write_folder(tmp_path / "c", *FOLDERS["sweep/clip/en-aware"])
    (tmp_path / "c" / "predictions_en-aware.csv").rename(tmp_path / "c" / "predictions_english.csv")
    write_folder(tmp_path / "d", *FOLDERS["sweep/clip/en-aware"])
    broken = tmp_path / "d" / "predictions_en-aware.csv"
    lines = broken.read_text().splitlines()
    lines[3] = ",".join(["2_0", "B"] + lines[3].split(",")[2:])      # line 4: question 2 predicts "B"
    broken.write_text("\n".join(lines) + "\n")
    for args, message in (([tmp_path / "d"], f"{broken} line 4: Prediction and Label must be integers"),
            ([tmp_path / "a", tmp_path / "b"], f"{tmp_path / 'b' / 'predictions_en-aware.csv'}: en-aware of "
                                               f"{CLIP} (clip) is also in {tmp_path / 'a'}"),
            ([tmp_path / "nothing"], "nothing: no such file or folder"),
            ([tmp_path / "empty"], "empty: no cvqa_results.json at or below this folder"),
            ([tmp_path / "c"], "predictions_english.csv: the file name names no condition"),
            ([tmp_path / "a", "--paper-row", "x=GPT-5"], "--paper-row 'x=GPT-5': expected MODEL=ROW")):
        assert main(["cvqa", "report", *map(str, args), "--out", str(tmp_path / "r")]) == 2
        stderr = capsys.readouterr().err
        assert len(stderr.strip().splitlines()) == 1 and message in stderr, stderr


def test_intervals_format_errors_and_a_baseline_equal_to_compare(tmp_path, capsys):
    """Every accuracy with its interval (questions resampled within their pair), the generate rule's unparsed
    answers per prompt, and `--baseline`'s table with the numbers `volta-ml compare` prints."""
    from volta_ml.cli import main

    write_folder(tmp_path / "runs" / "letter", *FOLDERS["llava_letter"])
    generate = tmp_path / "runs" / "generate"
    write_folder(generate, "mllm", "/models/other-llava", "generate", {"en-aware": {0, 1, 2, 3, 4, 5},
                                                                       "loc-aware": {0, 1}}, False)
    path = generate / "predictions_en-aware.csv"
    lines = path.read_text().splitlines()
    for row in (9, 10):                                  # questions 8 and 9: answers that named no option
        lines[row] = ",".join([lines[row].split(",")[0], "-1"] + lines[row].split(",")[2:])
    path.write_text("\n".join(lines) + "\n")
    out = tmp_path / "report"
    assert main(["cvqa", "report", str(tmp_path / "runs"), "--out", str(out), "--no-plots",
                 "--baseline", "LLaVA-1.5-7B (letter)"]) == 0
    table3 = {r["model"]: r for r in rows(out / "table3_overall.csv")}
    pairs = [q.country + "-" + q.language for q in QUESTIONS]
    right = np.array([100.0 * (i in FOLDERS["llava_letter"][3]["en-aware"]) for i in range(10)])
    iv = stats.interval(right, pairs)
    row = table3["LLaVA-1.5-7B (letter)"]
    assert (number(row["EN ci_low"]), number(row["EN ci_high"])) == (round(iv.low, 4), round(iv.high, 4))
    macro = stats.interval(right, pairs, average="macro")
    assert number(row["EN macro ci_high"]) == round(macro.high, 4) and row["EN paper"] == "48.9"
    assert "EN paper ci_low" not in row                   # the paper's numbers and differences have none
    errors = {r["prompt"]: r for r in rows(out / "format_errors.csv")}
    assert set(errors) == {"en-aware", "loc-aware"} and errors["en-aware"]["model"] == "other-llava (generate)"
    assert number(errors["en-aware"]["format errors"]) == 20.0 and number(errors["loc-aware"]["format errors"]) == 0.0
    baseline = {(r["prompt"], r["average"]): r for r in rows(out / "baseline_comparison.csv")}
    assert bare_cells(out) == []          # the baseline table's A and B values too
    capsys.readouterr()
    assert main(["compare", str(generate), str(tmp_path / "runs" / "letter"), "--out", str(tmp_path / "c")]) == 0
    assert "| cvqa | en-aware micro | other-llava (generate) | LLaVA-1.5-7B (letter) |" in capsys.readouterr().out
    compared = rows(tmp_path / "c" / "cvqa_compare.csv")
    assert [r["column"] for r in compared] == ["en-aware micro", "en-aware macro", "loc-aware micro", "loc-aware macro"]
    for r in compared:
        mine = baseline[tuple(r["column"].split())]
        assert mine["A"] == r["A"] and mine["B"] == r["B"] and mine["paired questions"] == r["paired_items"]
        for ours, theirs in (("A − B", "difference"), ("A − B ci_low", "ci_low"), ("A − B ci_high", "ci_high")):
            assert number(mine[ours]) == round(float(r[theirs]), 4)
        assert mine["p"] == f"{float(r['p_value']):.4f}" and mine["p (Holm)"] == f"{float(r['p_holm']):.4f}"
    assert [float(r["p_holm"]) for r in compared] == pytest.approx(plain_holm([float(r["p_value"]) for r in compared]),
                                                                  abs=1e-15)
