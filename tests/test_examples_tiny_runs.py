"""examples/tiny_runs.py, the inputs of the tiny report / compare samples in docs/protocols.md and docs/cvqa.md: the
documented commands are the script's, and the grid it writes plans the sweep the samples show."""
from __future__ import annotations

import importlib.util

from helpers_tasks import REPO, need_iglue

from volta_ml.protocols.grid import load_grid
from volta_ml.protocols.runners import plan_cells


def tiny_runs():
    spec = importlib.util.spec_from_file_location("tiny_runs", REPO / "examples" / "tiny_runs.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_docs_samples_show_the_commands_of_tiny_runs():
    script = tiny_runs()
    for commands, page in ((script.IGLUE_COMMANDS, "protocols.md"), (script.CVQA_COMMANDS, "cvqa.md")):
        text = (REPO / "docs" / page).read_text(encoding="utf-8")
        missing = [line for line in commands.splitlines() if line not in text]
        assert not missing, (page, missing)


def test_tiny_runs_grid_plans_the_documented_sweep(tmp_path):
    need_iglue()
    tiny_runs().iglue_inputs(tmp_path)
    grid = load_grid(tmp_path / "tiny.yml")
    cells = plan_cells(grid)
    # docs/protocols.md: "sweep tiny: 22 ran": 2 models x (3 zero-shot + 2 shots x 2 seeds x (train + test))
    assert len(cells) == 22, [c.id for c in cells]
    assert grid.baseline == "tiny_b"
    assert {c.id for c in cells} >= {"zero_shot/tiny_a/xvnli/fr", "few_shot_test/tiny_b/xvnli/ar/5/seed1"}
