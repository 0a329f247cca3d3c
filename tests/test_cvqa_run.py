"""End-to-end CVQA runs: labelled (accuracy + CSV), hidden labels (CSV only), the console command."""
from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers_cvqa import REVISION, ROWS, make_cvqa_store, tiny_tokenizer, write_release
from helpers_tiny import tiny_config

from volta_ml.models import build_model, save_checkpoint
from volta_ml.cvqa.data import load_cvqa
from volta_ml.cvqa.run import run_cvqa

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("cvqa_run")
    latest, hidden = write_release(tmp, "latest"), write_release(tmp, "hidden")
    make_cvqa_store(tmp / "feats", load_cvqa(latest))
    tiny_tokenizer(tmp / "tok")
    torch.manual_seed(0)
    config = tiny_config("ctrl_xuniter_base")
    (tmp / "config.json").write_text(json.dumps(config.to_dict()))
    model = build_model(config, kind="pretraining")
    with torch.no_grad():
        model.cls.bi_seq_relationship.weight.normal_(0, 2.0)
    save_checkpoint(model, tmp / "tiny_xuniter.bin")
    return {"tmp": tmp, "latest": latest, "hidden": hidden,
            "args": {"features": str(tmp / "feats"), "config": str(tmp / "config.json"),
                     "checkpoint": str(tmp / "tiny_xuniter.bin"), "bert_model": str(tmp / "tok"),
                     "do_lower_case": True, "max_seq_length": 24, "max_region_num": 8, "device": "cpu",
                     "progress": False}}


def _rows(path):
    with open(path, newline="", encoding="utf-8") as f:
        return list(csv.DictReader(f))


def test_labelled_run_writes_accuracy_tables_plot_and_submissions(files):
    out = files["tmp"] / "labelled"
    path = run_cvqa({**files["args"], "data": str(files["latest"]), "output_dir": str(out)})
    results = json.loads(Path(path).read_text())
    assert results["revision"] == REVISION and not results["hidden_labels"]
    assert results["prompts_version"] == "cvqa-prompts-v1" and list(results["runs"]) == [
        "en-aware", "en-agnostic", "loc-aware", "loc-agnostic"]
    for condition, summary in results["runs"].items():
        preds = _rows(out / f"predictions_{condition}.csv")
        correct = sum(int(r["Prediction"]) == int(r["Label"]) for r in preds)
        assert summary["micro"] == pytest.approx(100 * correct / len(ROWS), abs=1e-3)
        assert {r["revision"] for r in preds} == {REVISION}
        assert [r["question_en"] for r in preds] == [row[3] for row in ROWS]   # for the question-type table
        assert _rows(out / f"submission_{condition}.csv") == [{"ID": r["ID"], "Prediction": r["Prediction"]}
                                                              for r in preds]
        assert set(summary["pair"]) == {"India-Telugu", "Egypt-Egyptian_Arabic", "Mexico-Spanish"}
        assert set(results["text_only"][condition]["pair"]) == set(summary["pair"])
        # the text-only control's option scores, per question, beside the run's own
        blind = np.array([[float(r[f"text_only_{k}"]) for k in range(4)] for r in preds])
        blind_correct = (np.argmax(blind, axis=1) == [int(r["Label"]) for r in preds]).sum()
        assert results["text_only"][condition]["micro"] == pytest.approx(100 * blind_correct / len(ROWS), abs=1e-3)
    assert set(results["en_loc_gap"]) == {"aware", "agnostic"}
    assert set(results["timing"]) == set(results["runs"]) and results["timing"]["en-aware"]["questions_per_second"] > 0
    assert results["en_loc_gap"]["aware"]["micro"] == pytest.approx(
        results["runs"]["en-aware"]["micro"] - results["runs"]["loc-aware"]["micro"], abs=1e-3)
    assert results["text_stats"]["loc-aware"]["unk_rate_per_pair"]["India-Telugu"] > \
        results["text_stats"]["en-aware"]["unk_rate_per_pair"]["India-Telugu"]
    pair_table = _rows(out / "cvqa_pair.csv")
    assert pair_table[-2]["pair"] == "micro" and float(pair_table[-2]["en-aware"]) == pytest.approx(
        results["runs"]["en-aware"]["micro"], abs=5e-5) and pair_table[0]["random"] == "25.0"
    assert {r["revision"] for r in pair_table} == {REVISION}
    assert REVISION in (out / "cvqa_report.md").read_text()
    assert (out / "cvqa_pairs.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    for name in results["files"]:
        assert (out / name).is_file(), name


def test_hidden_labels_give_submission_only(files):
    out = files["tmp"] / "hidden"
    path = run_cvqa({**files["args"], "data": str(files["hidden"]), "output_dir": str(out),
                     "conditions": ["loc-agnostic"], "text_only": False, "revision": "0f90214"})
    results = json.loads(Path(path).read_text())
    assert results["hidden_labels"] and results["revision"] == "0f90214"
    summary = results["runs"]["loc-agnostic"]
    assert summary["micro"] is None and summary["macro"] is None and summary["labelled"] == 0
    assert all(v["accuracy"] is None for v in summary["pair"].values())
    submission = _rows(out / "submission_loc-agnostic.csv")
    assert [r["ID"] for r in submission] == [r[0] for r in ROWS]
    assert all(r["Prediction"] in {"0", "1", "2", "3"} for r in submission)
    assert list(submission[0]) == ["ID", "Prediction"]
    assert not (out / "cvqa_pairs.png").exists() and "Labels are hidden" in (out / "cvqa_report.md").read_text()


def test_bad_arguments_and_a_checkpoint_without_the_matching_head(files):
    with pytest.raises(KeyError, match="unknown argument.*'batchsize'"):
        run_cvqa({**files["args"], "data": "x", "output_dir": "y", "batchsize": 3})
    with pytest.raises(KeyError, match=r"missing required argument\(s\) \['data'"):
        run_cvqa({k: v for k, v in files["args"].items()})
    state = torch.load(files["args"]["checkpoint"], weights_only=True)
    headless = files["tmp"] / "headless.bin"
    torch.save({k: v for k, v in state.items() if not k.startswith("cls.bi_seq")}, headless)
    with pytest.raises(ValueError, match="matching head .* is not in the checkpoint"):
        run_cvqa({**files["args"], "data": str(files["latest"]), "output_dir": str(files["tmp"] / "h"),
                  "checkpoint": str(headless)})


def test_console_command(files):
    out = files["tmp"] / "cli"
    a = files["args"]
    cmd = [sys.executable, "-m", "volta_ml.cli", "cvqa", "score", "--data", str(files["latest"]),
           "--features", a["features"], "--config", a["config"], "--checkpoint", a["checkpoint"],
           "--bert_model", a["bert_model"], "--do_lower_case", "--max_seq_length", "24", "--max_region_num", "8",
           "--conditions", "en-agnostic", "--device", "cpu", "--output_dir", str(out), "--no-progress"]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    results = json.loads((out / "cvqa_results.json").read_text())
    assert f"micro {results['runs']['en-agnostic']['micro']:6.2f}" in done.stdout
    assert "random 25.00" in done.stdout and f"revision {REVISION}" in done.stdout


@pytest.mark.parametrize("step, extra, message", [
    ("score", ["--data", "/nonexistent/cvqa", "--features", "f", "--config", "ctrl_uniter_base", "--checkpoint", "c",
               "--bert_model", "b", "--output_dir", "o"], "CVQA data not found: /nonexistent/cvqa"),
    ("extract", ["--data", "d", "--preset", "volta-butd36", "--weights", "/nonexistent/w.pkl", "--out", "o"],
     "--weights /nonexistent/w.pkl: no such file"),
])
def test_console_errors_are_one_line(tmp_path, step, extra, message):
    done = subprocess.run([sys.executable, "-m", "volta_ml.cli", "cvqa", step, *extra], cwd=tmp_path,
                          env={**os.environ, "PYTHONPATH": str(REPO)}, capture_output=True, text=True, timeout=300)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert f"volta-ml cvqa: error: {message}" in done.stderr


def test_zoo_result_folder_goes_into_the_paper_tables(files, tmp_path):
    """A folder written by today's zoo path is a row of the paper tables (no paper value: not a paper model)."""
    from volta_ml.cvqa.collect import load_runs
    from volta_ml.cvqa.paper_report import write_paper_report

    out = files["tmp"] / "zoo_for_report"
    path = run_cvqa({**files["args"], "data": str(files["latest"]), "output_dir": str(out),
                     "conditions": ["en-aware", "loc-aware"]})
    results = json.loads(Path(path).read_text())
    runs = load_runs([out])
    assert [(r.backend, r.model, r.paper) for r in runs] == [("zoo", "tiny_xuniter.bin", None)]
    write_paper_report(runs, tmp_path, plots=False)
    table = {r["model"]: r for r in _rows(tmp_path / "table3_overall.csv")}
    zoo, blind = table["tiny_xuniter.bin"], table["tiny_xuniter.bin text-only"]
    assert float(zoo["EN"]) == pytest.approx(results["runs"]["en-aware"]["micro"], abs=5e-5)
    assert float(zoo["LOC macro"]) == pytest.approx(results["runs"]["loc-aware"]["macro"], abs=5e-5)
    assert float(blind["EN"]) == pytest.approx(results["text_only"]["en-aware"]["micro"], abs=5e-5)
    assert zoo["EN paper"] == "" and zoo["paper model"] == "-"
    types = {r["question type"] for r in _rows(tmp_path / "question_types.csv")}
    assert types == {"which", "what", "who", "where", "other"}     # from the fixture's English questions
