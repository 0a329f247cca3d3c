"""The configs ship inside the package; the top-level folders are the same files for users to read and copy."""
from __future__ import annotations

import filecmp
from pathlib import Path

import pytest

from volta_ml.models.config import SHIPPED_DIR as MODEL_CONFIGS, available_configs
from volta_ml.tasks.config import SHIPPED_DIR as TASK_CONFIGS, load_task_config

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("top, packaged", [(REPO / "config_models", MODEL_CONFIGS),
                                           (REPO / "config_tasks", TASK_CONFIGS)])
def test_top_level_configs_equal_the_packaged_ones(top, packaged):
    assert packaged.is_relative_to(REPO / "volta_ml")
    names = sorted(p.name for p in top.iterdir())
    assert names and names == sorted(p.name for p in packaged.iterdir()), "the two folders list other files"
    match, mismatch, errors = filecmp.cmpfiles(top, packaged, names, shallow=False)
    assert not mismatch and not errors, f"differ: {mismatch + errors} (copy {top.name}/ into {packaged})"


def test_the_package_finds_every_shipped_config_without_the_checkout(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("VOLTA_ML_CONFIG_DIR", raising=False)
    assert available_configs() == sorted(p.stem for p in MODEL_CONFIGS.glob("*.json")
                                         if not p.stem.endswith("_weight_name"))
    for path in TASK_CONFIGS.glob("*.yml"):
        assert load_task_config(f"config_tasks/{path.name}")   # found as the shipped twin from any folder
