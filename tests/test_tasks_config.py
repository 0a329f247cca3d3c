"""Task YAML loading: the shipped portable configs, VOLTA's absolute-path files, path resolution, errors."""
from __future__ import annotations

import pytest
import yaml

from helpers_tasks import REPO, VOLTA_TASK_CONFIGS
from volta_ml.tasks.config import (
    PathResolver, TaskConfigError, entry_path, get_task_entry, load_task_config,
)

SHIPPED = sorted((REPO / "config_tasks").glob("iglue_*.yml"))


def test_every_iglue_config_is_shipped():
    assert {p.name for p in SHIPPED} == {f"iglue_{kind}_tasks_{feat}.yml" for kind in ("trainval", "test", "fewshot")
                                         for feat in ("boxes36", "X101")}


@pytest.mark.parametrize("shipped", SHIPPED, ids=lambda p: p.name)
def test_shipped_config_equals_iglue_with_data_root(shipped):
    original = VOLTA_TASK_CONFIGS / shipped.name.replace(".yml", ".dtu.yml")
    if not original.is_file():
        pytest.skip(f"{original} not found (../shared is absent)")
    ours, theirs = load_task_config(shipped), yaml.safe_load(original.read_text())
    resolve = PathResolver(data_root="/home/projects/ku_00062/data")
    assert list(ours) == list(theirs)
    for task, entry in theirs.items():
        for key, value in entry.items():
            mine = ours[task][key]
            if isinstance(mine, str) and "{data_root}" in mine:
                mine = resolve(mine)
            assert mine == value, (task, key)


def test_dtu_name_falls_back_to_the_shipped_twin(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    config = load_task_config("config_tasks/iglue_test_tasks_boxes36.dtu.yml")
    assert config["TASK19"]["_source"].endswith("config_tasks/iglue_test_tasks_boxes36.yml")


def test_data_root_from_flag_or_environment(monkeypatch):
    config = load_task_config(REPO / "config_tasks/iglue_test_tasks_boxes36.yml")
    _, entry = get_task_entry(config, "19")
    monkeypatch.delenv("VOLTA_ML_DATA_ROOT", raising=False)
    with pytest.raises(TaskConfigError, match="--data_root"):
        entry_path(PathResolver().resolve_entry(entry), "features_h5path1")
    resolved = PathResolver(data_root="/data").resolve_entry(entry)
    assert entry_path(resolved, "features_h5path1") == "/data/flickr30k/features/flickr30k_boxes36.lmdb"
    assert entry_path(resolved, "features_h5path1", "/x/marvl.lmdb") == "/x/marvl.lmdb"  # CLI override wins
    import os
    assert os.path.join(resolved["dataroot"], "test.jsonl") == "/data/XVNLI/annotations/en/test.jsonl"
    monkeypatch.setenv("VOLTA_ML_DATA_ROOT", "/env")
    assert entry_path(PathResolver().resolve_entry(entry), "dataroot") == "/env/XVNLI/annotations/en"


def test_volta_absolute_paths_load_and_can_be_mapped():
    original = VOLTA_TASK_CONFIGS / "iglue_test_tasks_boxes36.dtu.yml"
    if not original.is_file():
        pytest.skip(f"{original} not found (../shared is absent)")
    _, entry = get_task_entry(load_task_config(original), 12)
    assert entry_path(PathResolver().resolve_entry(entry), "dataroot") == "/home/projects/ku_00062/data/nlvr2/annotations"
    mapped = PathResolver(path_map="/home/projects/ku_00062/data=/mnt/iglue").resolve_entry(entry)
    assert entry_path(mapped, "dataroot") == "/mnt/iglue/nlvr2/annotations"


def test_unknown_task_lists_available(tmp_path):
    config = load_task_config(REPO / "config_tasks/iglue_test_tasks_boxes36.yml")
    with pytest.raises(TaskConfigError, match=r"TASK7 is not in .*available: TASK8, TASK12, TASK15, TASK19, TASK20"):
        get_task_entry(config, "7")
    bad = tmp_path / "bad.yml"
    bad.write_text("TASK1:\n  name: X\n  type: VL-nonsense\n")
    with pytest.raises(TaskConfigError, match="TASK1.type 'VL-nonsense'"):
        load_task_config(bad)
