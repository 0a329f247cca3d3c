"""The local sweep runner and the in-cell steps, with a fast stand-in for the train/eval entry points
(tests/helpers_fake_entry.py) over the real IGLUE annotation files: skipping finished cells, learning-rate
selection, failures, and resuming an interrupted sweep. The real entry points run in test_protocols_e2e.py."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from conftest import REPO

FAKE = str(Path(__file__).resolve().parent / "helpers_fake_entry.py")


def annotations(tmp: Path) -> Path:
    """The real IGLUE annotation files when ../shared is there; otherwise a few generated lines at the same
    paths (the stand-in entry points only count lines), so the runner is tested in a fresh clone too."""
    from conftest import SHARED
    real = SHARED / "iglue" / "datasets"
    if real.is_dir():
        return real
    root = tmp / "datasets"
    for i, rel in enumerate(["XVNLI/annotations/ar/test.jsonl", "XVNLI/annotations/fr/test.jsonl",
                             "XVNLI/annotations/en/test.jsonl", "XVNLI/annotations_machine-translate/ar/test.jsonl",
                             "XVNLI/annotations_machine-translate/fr/test.jsonl", "XVNLI/annotations/ar/train_1.jsonl",
                             "XVNLI/annotations/ar/train_5.jsonl"]):
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text('{"gold_label": "neutral"}\n' * (10 + i), encoding="utf-8")
    return root


def write_grid(tmp: Path, data_root: Path, **overrides) -> Path:
    ckpt = tmp / "english" / "pytorch_model_best.bin"
    ckpt.parent.mkdir(parents=True, exist_ok=True)
    ckpt.write_text("{}")
    grid = {
        "name": "fake", "data_root": str(data_root), "output_dir": str(tmp / "runs"),
        "tasks": ["xvnli"], "protocols": ["zero_shot", "translate_test", "few_shot"],
        "languages": {"xvnli": ["ar", "fr"]}, "few_shot_languages": {"xvnli": ["ar"]},
        "shots": {"xvnli": ["1", "5"]}, "learning_rates": ["1e-4", "5e-5", "1e-5"],
        "models": {"tiny": {"config": "ctrl_xuniter_base", "finetuned": str(ckpt)}},
        "commands": {kind: [sys.executable, FAKE, name] for kind, name in
                     (("train", "train"), ("eval", "eval"), ("eval_retrieval", "eval-retrieval"),
                      ("gqa_score", "gqa-score"))},
        "env": {"FAKE_DEV": json.dumps({"1e-4": 50.0, "5e-5": 61.0, "1e-5": 61.0})},
    }
    grid.update(overrides)
    path = tmp / "grid.yml"
    path.write_text(yaml.safe_dump(grid))
    return path


def sweep(grid: Path, *extra: str, env=None, check=True) -> subprocess.CompletedProcess:
    # volta_ml.protocols.cli: the `volta-ml sweep` command without loading torch for the other subcommands
    proc = subprocess.run([sys.executable, "-m", "volta_ml.protocols.cli", "sweep", str(grid), *extra], cwd=REPO,
                          capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(REPO), **(env or {})},
                          timeout=300)
    if check:
        assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc


def results(runs: Path) -> dict[str, dict]:
    return {str(p.parent.relative_to(runs)): json.loads(p.read_text()) for p in runs.rglob("result.json")}


@pytest.mark.reads_shared
def test_local_sweep_runs_all_cells_selects_lr_and_skips_finished(tmp_path):
    iglue = annotations(tmp_path)
    grid = write_grid(tmp_path, iglue)
    out = sweep(grid, "--local")
    assert "13 ran, 0 already finished, 0 failed" in out.stdout
    res = results(tmp_path / "runs")
    # zero-shot en/ar/fr + translate-test ar/fr + 2 shots x (3 trainings + 1 test)
    assert len(res) == 5 + 2 * 4
    lines = lambda p: sum(1 for l in open(iglue / p, encoding="utf-8") if l.strip())  # noqa: E731
    assert res["zero_shot/tiny/xvnli/ar"]["metrics"]["score"] == 40 + lines("XVNLI/annotations/ar/test.jsonl") % 7
    mt = "XVNLI/annotations_machine-translate/ar/test.jsonl"
    assert res["translate_test/tiny/xvnli/ar"]["metrics"]["score"] == 40 + lines(mt) % 7
    # dev scores 50 / 61 / 61: the strictly greater wins, the tie goes to the earlier rate (5e-5)
    test = res["few_shot_test/tiny/xvnli/ar/5/seed0"]
    assert test["selected_lr"] == "5e-5"
    assert test["metrics"]["score"] == pytest.approx(40 + 10 * 5e-5 * 1e4 + lines("XVNLI/annotations/ar/test.jsonl") % 7)
    sel = tmp_path / "runs/few_shot_test/tiny/xvnli/ar/5/seed0"
    assert "Best lr:  5e-5" in (sel / "select.log").read_text()
    assert (sel / "selected/pytorch_model_best.bin").resolve() == \
        (tmp_path / "runs/few_shot_train/tiny/xvnli/ar/5/seed0/lr5e-5/ckpt/Task19_tiny/pytorch_model_best.bin").resolve()
    # eval_task's output layout and IGLUE's log names
    assert (sel / "eval/pytorch_model_best.bin-/test_result.json").exists()
    assert "Validation [Task19]" in (sel / "test.err").read_text()

    stamps = {k: (tmp_path / "runs" / k / "result.json").stat().st_mtime_ns for k in res}
    again = sweep(grid, "--local")
    assert "0 ran, 13 already finished" in again.stdout
    assert stamps == {k: (tmp_path / "runs" / k / "result.json").stat().st_mtime_ns for k in res}
    listing = sweep(grid, "--list").stdout
    assert "13/13 cells finished" in listing


@pytest.mark.reads_shared
def test_failed_cell_is_reported_and_blocks_its_dependants(tmp_path):
    grid = write_grid(tmp_path, annotations(tmp_path), protocols=["few_shot"],
                      shots={"xvnli": ["1"]}, learning_rates=["1e-4"])
    proc = sweep(grid, "--local", env={"FAKE_FAIL": "train_1.jsonl"}, check=False)
    assert proc.returncode == 1
    assert "FAILED few_shot_train/tiny/xvnli/ar/1/seed0/lr1e-4 (exit 1)" in proc.stderr
    assert "simulated failure" in proc.stderr           # the tail of the failing command's log
    assert "blocked: few_shot_test/tiny/xvnli/ar/1/seed0" in proc.stdout
    assert not list((tmp_path / "runs").rglob("result.json"))
    # once the cause is gone, the same command finishes the sweep
    sweep(grid, "--local")
    assert len(results(tmp_path / "runs")) == 2


@pytest.mark.reads_shared
def test_interrupted_sweep_resumes(tmp_path):
    grid = write_grid(tmp_path, annotations(tmp_path), protocols=["zero_shot", "translate_test"])
    env = {**os.environ, "PYTHONPATH": str(REPO), "FAKE_SLEEP": "0.4"}
    proc = subprocess.Popen([sys.executable, "-m", "volta_ml.protocols.cli", "sweep", str(grid), "--local"], cwd=REPO,
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    runs = tmp_path / "runs"
    deadline = time.time() + 60
    while time.time() < deadline and len(list(runs.rglob("result.json"))) < 2:
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 128 + signal.SIGTERM, out + err
    assert "run the same command again to resume" in err
    first = results(runs)
    assert 2 <= len(first) < 5
    stamps = {k: (runs / k / "result.json").stat().st_mtime_ns for k in first}

    resumed = sweep(grid, "--local")
    assert f"{5 - len(first)} ran, {len(first)} already finished, 0 failed" in resumed.stdout
    final = results(runs)
    assert len(final) == 5
    assert stamps == {k: (runs / k / "result.json").stat().st_mtime_ns for k in first}   # not rerun


def test_record_refuses_incomplete_logs(tmp_path):
    from volta_ml.protocols.cell import Cell, write_json_atomic
    from volta_ml.protocols.steps import main as steps_main

    cell = Cell(id="zero_shot/m/xvnli/ar", stage="zero_shot", protocol="zero_shot", model="m", task="xvnli",
                lang="ar", scorer="eval_task", dir=str(tmp_path))
    write_json_atomic(tmp_path / "cell.json", cell.to_json())
    (tmp_path / "test.err").write_text("Eval task TASK19 on iteration 0\n")     # crashed before its score
    assert steps_main(["record", str(tmp_path)]) == 1
    assert steps_main(["is-done", str(tmp_path)]) == 1
    (tmp_path / "test.err").write_text("x - INFO - Validation [XVNLI]: loss 0.921 score 51.976 \n")
    assert steps_main(["record", str(tmp_path)]) == 0
    assert steps_main(["is-done", str(tmp_path)]) == 0
    assert json.loads((tmp_path / "result.json").read_text())["metrics"]["score"] == 51.976
