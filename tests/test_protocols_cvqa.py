"""CVQA cells in sweep grids: expansion (model x rule x condition), the example grid of the paper's rows, a local
run with the stand-in entry point (tests/helpers_fake_entry.py) followed by `volta-ml cvqa report` on the
sweep's output, Slurm arrays, and grid errors."""
from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from conftest import REPO
from helpers_fake_entry import cvqa_right
from volta_ml.protocols.grid import GridError, load_grid
from volta_ml.protocols.runners import cells_by_stage, plan_cells
from volta_ml.protocols.slurm import write_slurm

FAKE = str(Path(__file__).resolve().parent / "helpers_fake_entry.py")


def grid_file(tmp: Path, **overrides) -> Path:
    grid = {"name": "cv", "output_dir": str(tmp / "runs"),
            "cvqa": {"data": "cvqa_shards", "conditions": ["en-aware", "loc-aware"], "flags": ["--batch_size", "4"],
                     "models": {"llava": {"backend": "mllm", "model": "llava-hf/llava-1.5-7b-hf", "revision": "abc123",
                                          "rules": ["letter", "open"], "flags": ["--dtype", "fp32"]},
                                "clip": {"backend": "clip", "model": "openai/clip-vit-large-patch14-336"}}},
            "commands": {"cvqa_score": [sys.executable, FAKE, "cvqa-score"]}}
    grid.update(overrides)
    path = tmp / "grid.yml"
    path.write_text(yaml.safe_dump(grid, sort_keys=False))      # cells follow the grid's model order
    return path


def test_cells_are_model_x_rule_x_condition_with_the_score_flags(tmp_path):
    grid = load_grid(grid_file(tmp_path, extra_flags={"cvqa_score": ["--no-progress"]}))
    cells = {c.id: c for c in plan_cells(grid)}
    assert list(cells) == ["cvqa/llava/letter/en-aware", "cvqa/llava/letter/loc-aware", "cvqa/llava/open/en-aware",
                           "cvqa/llava/open/loc-aware", "cvqa/clip/en-aware", "cvqa/clip/loc-aware"]
    cell = cells["cvqa/llava/open/loc-aware"]
    assert (cell.stage, cell.protocol, cell.model, cell.lang, cell.scorer) == ("cvqa", "cvqa", "llava", "loc-aware", "cvqa")
    assert cell.commands[0].argv == [sys.executable, FAKE, "cvqa-score", "--backend", "mllm", "--model",
                                     "llava-hf/llava-1.5-7b-hf", "--model-revision", "abc123", "--rule", "open", "--data",
                                     str(tmp_path / "cvqa_shards"), "--conditions", "loc-aware", "--output_dir",
                                     str(tmp_path / "runs/cvqa/llava/open/loc-aware"), "--dtype", "fp32",
                                     "--batch_size", "4", "--no-progress"]
    assert cell.commands[1].argv[-2:] == ["record", str(tmp_path / "runs/cvqa/llava/open/loc-aware")]
    clip = cells["cvqa/clip/en-aware"].commands[0].argv
    assert "--rule" not in clip and "--model-revision" not in clip and clip[3:7] == ["--backend", "clip", "--model",
                                                                              "openai/clip-vit-large-patch14-336"]


def test_default_entry_is_volta_ml_cvqa_score_and_example_grid_has_the_paper_rows():
    grid = load_grid(REPO / "examples/grids/cvqa_paper.yml")
    cells = plan_cells(grid)
    assert cells[0].commands[0].argv[:5] == [grid.python, "-m", "volta_ml.cli", "cvqa", "score"]
    models = {c.commands[0].argv[c.commands[0].argv.index("--model") + 1] for c in cells}
    assert models == {"openai/clip-vit-large-patch14-336", "M-CLIP/XLM-Roberta-Large-Vit-B-32",
                      "llava-hf/llava-1.5-7b-hf", "Salesforce/instructblip-flan-t5-xl", "Gregor/mblip-mt0-xl",
                      "Gregor/mblip-bloomz-7b"}
    # 6 models x 4 conditions, LLaVA twice (letter and open)
    assert {s: len(c) for s, c in cells_by_stage(cells).items()} == {"cvqa": 7 * 4}


def sweep(grid: Path, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "volta_ml.protocols.cli", "sweep", str(grid), *extra], cwd=REPO,
                          capture_output=True, text=True, timeout=300, env={**os.environ, "PYTHONPATH": str(REPO)})


def test_local_sweep_runs_the_cells_records_them_and_feeds_the_report(tmp_path):
    grid = grid_file(tmp_path)
    proc = sweep(grid, "--local")
    assert proc.returncode == 0 and "6 ran, 0 already finished, 0 failed" in proc.stdout, proc.stdout + proc.stderr
    runs = tmp_path / "runs"
    for rule, model, hub in (("letter", "llava", "llava-hf/llava-1.5-7b-hf"), ("open", "llava", "llava-hf/llava-1.5-7b-hf"),
                             (None, "clip", "openai/clip-vit-large-patch14-336")):
        for condition in ("en-aware", "loc-aware"):
            d = runs / "/".join(p for p in ("cvqa", model, rule, condition) if p)
            result = json.loads((d / "result.json").read_text())
            assert result["metrics"] == {"score": 25.0 * cvqa_right(hub, rule or "", condition), "macro":
                                         25.0 * cvqa_right(hub, rule or "", condition), "condition": condition}
            assert json.loads((d / "argv.json").read_text())[:2] == ["--backend", "mllm" if rule else "clip"]
    assert "0 ran, 6 already finished" in sweep(grid, "--local").stdout          # finished cells are skipped

    report = subprocess.run([sys.executable, "-m", "volta_ml.cli", "cvqa", "report", str(runs), "--out",
                             str(tmp_path / "report"), "--no-plots"], cwd=REPO, capture_output=True, text=True,
                            timeout=120, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert report.returncode == 0, report.stderr
    with open(tmp_path / "report" / "table3_overall.csv", newline="") as f:
        table = {r["model"]: r for r in csv.DictReader(f)}
    llava = table["LLaVA-1.5-7B (letter)"]          # the two condition cells merged into one row
    en, loc = (25.0 * cvqa_right("llava-hf/llava-1.5-7b-hf", "letter", c) for c in ("en-aware", "loc-aware"))
    assert (float(llava["EN"]), float(llava["LOC"]), llava["EN paper"], float(llava["EN diff"])) == \
        (en, loc, "48.9", pytest.approx(en - 48.9, abs=5e-5))
    assert table["CLIP"]["LOC paper"] == "31.5" and table["LLaVA-1.5-7B (open)"]["EN paper"] == "30.0"


def test_slurm_array_holds_the_cvqa_cells(tmp_path):
    grid = load_grid(grid_file(tmp_path, slurm={"stages": {"cvqa": {"time": "08:00:00"}}}))
    cells = plan_cells(grid)
    submit = write_slurm(grid.name, cells, tmp_path / "slurm", grid.slurm, grid.env, grid.step())
    script = (tmp_path / "slurm" / "cvqa.sbatch").read_text()
    assert "#SBATCH --array=0-5" in script and "#SBATCH --time=08:00:00" in script
    assert "cvqa.sbatch" in submit.read_text()
    dry = subprocess.run(["/bin/bash", str(tmp_path / "slurm" / "cvqa.sbatch")], capture_output=True, text=True,
                         timeout=60, env={**os.environ, "SLURM_ARRAY_TASK_ID": "3", "VOLTA_ML_DRY_RUN": "1"})
    assert dry.returncode == 0, dry.stderr
    assert "cell 3: cvqa/llava/open/loc-aware" in dry.stdout and "--rule open" in dry.stdout


@pytest.mark.parametrize("change,message", [
    ({"cvqa": {"models": {}}}, "cvqa: missing required key 'data'"),
    ({"cvqa": {"data": "d", "models": {"m": {"model": "x"}}}}, "cvqa.models.m: expected a mapping with at least 'backend'"),
    ({"cvqa": {"data": "d", "models": {"m": {"backend": "clip", "rule": "letter"}}}},
     "cvqa.models.m: unknown key(s) ['rule']"),
    ({"cvqa": {"data": "d", "conditions": ["en"], "models": {"m": {"backend": "clip"}}}},
     "cvqa.conditions: unknown condition(s) ['en']"),
    ({"cvqa": {"data": "d", "model": {}}}, "cvqa: unknown key(s) ['model']"),
])
def test_grid_errors_name_the_cvqa_key(tmp_path, change, message):
    with pytest.raises(GridError) as error:
        load_grid(grid_file(tmp_path, **change))
    assert message in str(error.value) and "grid.yml" in str(error.value)
