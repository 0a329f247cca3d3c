"""Report numbers on a hand-made case."""
from __future__ import annotations

import csv

import numpy as np
import pytest

from volta_ml.cvqa.data import CVQAQuestion
from volta_ml.cvqa.report import accuracy_summary, en_loc_gap, write_predictions, write_submission, write_tables


def q(qid, country, language, label, category="Cooking and Food", image_type="Self"):
    return CVQAQuestion(id=qid, image_id=qid.split("_")[0], language=language, country=country, question="q",
                        question_en="q", options=("a", "b", "c", "d"), options_en=("a", "b", "c", "d"),
                        label=label, category=category, image_type=image_type, shard="s", row=0)


# Pair A (India-Telugu): 4 questions, pair B (Egypt-Arabic): 2 questions.
QUESTIONS = [q("1_0", "India", "Telugu", 0), q("1_1", "India", "Telugu", 1, "cooking and food"),
             q("2_0", "India", "Telugu", 2, "Brands and Products", "External"), q("3_0", "India", "Telugu", 3),
             q("4_0", "Egypt", "Arabic", 0, "Brands and Products", "External"), q("5_0", "Egypt", "Arabic", 1)]
EN = np.array([0, 1, 2, 0, 0, 0])    # A: 3/4 right, B: 1/2 right
LOC = np.array([0, 0, 0, 0, 3, 3])   # A: 1/4 right, B: 0/2 right


def test_micro_macro_and_breakdowns():
    en = accuracy_summary(QUESTIONS, EN)
    assert en["micro"] == pytest.approx(100 * 4 / 6, abs=1e-3)
    assert en["macro"] == pytest.approx((75.0 + 50.0) / 2)          # unweighted over the two pairs
    assert en["pair"] == {"Egypt-Arabic": {"n": 2, "labelled": 2, "accuracy": 50.0},
                          "India-Telugu": {"n": 4, "labelled": 4, "accuracy": 75.0}}
    # "Cooking and Food" and "cooking and food" are one category, shown with the first spelling.
    assert en["category"] == {"Brands and Products": {"n": 2, "labelled": 2, "accuracy": 100.0},
                              "Cooking and Food": {"n": 4, "labelled": 4, "accuracy": 50.0}}
    assert en["image_type"]["External"]["accuracy"] == 100.0 and en["image_type"]["Self"]["accuracy"] == 50.0
    loc = accuracy_summary(QUESTIONS, LOC)
    assert loc["micro"] == pytest.approx(100 / 6, abs=1e-3) and loc["macro"] == pytest.approx(12.5)
    gap = en_loc_gap({"en-agnostic": en, "loc-agnostic": loc, "en-aware": en})
    assert gap == {"agnostic": {"micro": pytest.approx(50.0, abs=1e-3), "macro": pytest.approx(50.0)}}


def test_partly_hidden_labels_count_only_labelled_questions():
    mixed = QUESTIONS[:4] + [q("4_0", "Egypt", "Arabic", -1), q("5_0", "Egypt", "Arabic", -1)]
    summary = accuracy_summary(mixed, EN)
    assert summary["labelled"] == 4 and summary["micro"] == 75.0
    assert summary["pair"]["Egypt-Arabic"] == {"n": 2, "labelled": 0, "accuracy": None}
    assert summary["macro"] == 75.0      # a pair without labels has no accuracy to average


def test_tables_and_submission(tmp_path):
    results = {"model": "m.bin", "revision": "abc1234", "prompts_version": "v", "template": "paper",
               "questions": 6, "score_convention": "c", "hidden_labels": False,
               "runs": {"en-agnostic": accuracy_summary(QUESTIONS, EN),
                        "loc-agnostic": accuracy_summary(QUESTIONS, LOC)},
               "text_only": {"en-agnostic": accuracy_summary(QUESTIONS, np.zeros(6, dtype=int))}}
    results["en_loc_gap"] = en_loc_gap(results["runs"])
    write_tables(results, tmp_path)
    with open(tmp_path / "cvqa_pair.csv", newline="") as f:
        rows = list(csv.reader(f))
    assert rows[0] == ["pair", "n", "en-agnostic", "loc-agnostic", "text-only en-agnostic", "random", "revision"]
    assert rows[1] == ["Egypt-Arabic", "2", "50.0", "0.0", "50.0", "25.0", "abc1234"]
    assert rows[2] == ["India-Telugu", "4", "75.0", "25.0", "25.0", "25.0", "abc1234"]
    assert rows[3][:5] == ["micro", "6", str(round(400 / 6, 4)), str(round(100 / 6, 4)), str(round(200 / 6, 4))]
    assert rows[4][:5] == ["macro (pairs)", "", "62.5", "12.5", "37.5"]
    md = (tmp_path / "cvqa_report.md").read_text()
    assert "| India-Telugu | 4 | 75.00 | 25.00 | 25.00 | 25.00 |" in md and "| agnostic | 50.00 | 50.00 |" in md
    write_submission(tmp_path / "sub.csv", QUESTIONS, EN)
    assert (tmp_path / "sub.csv").read_text().splitlines() == ["ID,Prediction", "1_0,0", "1_1,1", "2_0,2", "3_0,0",
                                                               "4_0,0", "5_0,0"]


def test_averages_and_gap_come_from_unrounded_accuracies():
    # 11/21 right in EN and 1/21 in LOC: 52.3810 - 4.7619 = 47.6191 when rounded first, 47.6190 exactly
    qs = [q(f"{i}_0", "India", "Telugu", 0) for i in range(21)]
    en = accuracy_summary(qs, np.array([0] * 11 + [1] * 10))
    loc = accuracy_summary(qs, np.array([0] * 1 + [1] * 20))
    assert en["pair"]["India-Telugu"]["accuracy"] == 100 * 11 / 21 and loc["micro"] == 100 / 21
    gap = en_loc_gap({"en-aware": en, "loc-aware": loc})["aware"]
    assert gap["micro"] == 100 * 11 / 21 - 100 / 21 and round(gap["macro"], 4) == 47.619
    # macro over pairs from unrounded pair accuracies: 7/45 and 0/1
    qs2 = [q(f"{i}_0", "India", "Telugu", 0) for i in range(45)] + [q("99_0", "Egypt", "Arabic", 0)]
    summary = accuracy_summary(qs2, np.array([0] * 7 + [1] * 39))
    assert summary["macro"] == (100 * 7 / 45 + 0.0) / 2


def test_predictions_keep_scores_at_full_precision(tmp_path):
    scores = np.array([[0.123456789012, 0.123456789013, -np.inf, 1e-300]] * len(QUESTIONS))
    write_predictions(tmp_path / "p.csv", QUESTIONS, EN, scores, "en-aware", "rev")
    with open(tmp_path / "p.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert [float(rows[0][f"score_{i}"]) for i in range(4)] == scores[0].tolist()   # no apparent tie at 6 digits
    assert rows[2] == {"ID": "2_0", "Prediction": "2", "Label": "2", "pair": "India-Telugu",
                       "category": "Brands and Products", "image_type": "External", "score_0": "0.123456789012",
                       "score_1": "0.123456789013", "score_2": "-inf", "score_3": "1e-300", "condition": "en-aware",
                       "revision": "rev", "question_en": "q", "image": "2"}
    write_predictions(tmp_path / "imported.csv", QUESTIONS, EN, None, "en-aware", "rev")
    assert open(tmp_path / "imported.csv").read().splitlines()[1] == \
        "1_0,0,0,India-Telugu,Cooking and Food,Self,,,,,en-aware,rev,q,1"


def test_report_command_errors_user_one_line_bug_traceback(tmp_path, capsys, monkeypatch):
    """`volta-ml cvqa`: a bad input is one line in the house form (exit 2); a programming error, here a KeyError
    from inside the report code, is not mistaken for one: traceback and exit 1."""
    from volta_ml.cli import main
    from volta_ml.cvqa import collect

    assert main(["cvqa", "report", str(tmp_path / "missing"), "--out", str(tmp_path / "r")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"volta-ml cvqa: error: {tmp_path / 'missing'}: no such file or folder"]
    assert main(["cvqa", "report", str(tmp_path), "--out", str(tmp_path / "r"), "--paper-row", "nope"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("volta-ml cvqa: error: --paper-row 'nope': expected MODEL=ROW")

    def broken(*args, **kwargs):
        return {}["run"]
    monkeypatch.setattr(collect, "load_runs", broken)
    assert main(["cvqa", "report", str(tmp_path), "--out", str(tmp_path / "r")]) == 1
    err = capsys.readouterr().err
    assert "Traceback (most recent call last)" in err and "in broken" in err
    assert err.strip().splitlines()[-1] == "volta-ml cvqa: error: KeyError: 'run'"
