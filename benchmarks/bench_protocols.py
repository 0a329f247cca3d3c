"""How long the sweep machinery takes at IGLUE's full size (no training or evaluation is run).

The grid: the 9 IGLUE models x 5 tasks, zero-shot and translate-test, plus few-shot for the 4 multilingual
models (IGLUE's shots, languages and 3 learning rates). Prints cells per stage, then the time to plan the
cells, write the Slurm job arrays, dry-run one index per array, and build every table and plot from a
synthetic score for every test cell.

    python benchmarks/bench_protocols.py
"""
from __future__ import annotations

import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from volta_ml.protocols.grid import load_grid  # noqa: E402
from volta_ml.protocols.iglue import ENGLISH_ONLY_MODELS  # noqa: E402
from volta_ml.protocols.plots import write_plots  # noqa: E402
from volta_ml.protocols.report import write_report  # noqa: E402
from volta_ml.protocols.runners import cells_by_stage, plan_cells  # noqa: E402
from volta_ml.protocols.slurm import write_slurm  # noqa: E402

MULTILINGUAL = ["ctrl_muniter", "ctrl_xuniter", "uc2", "m3p"]


def grid_file(tmp: Path, models: list[str], protocols: list[str], tasks: list[str], name: str) -> Path:
    spec = {"name": name, "data_root": "/data/iglue", "output_dir": str(tmp / "runs"), "tasks": tasks,
            "protocols": protocols,
            "models": {m: {"config": f"{m}_base", "finetuned": "/ckpt/{task}/{model}/best.bin"} for m in models}}
    path = tmp / f"{name}.yml"
    path.write_text(yaml.safe_dump(spec))
    return path


def timed(fn):
    start = time.perf_counter()
    value = fn()
    return value, time.perf_counter() - start


def main() -> None:
    tmp = Path(tempfile.mkdtemp(prefix="bench_protocols_"))
    all_tasks = ["xvnli", "xgqa", "marvl", "xflickrco", "wit"]
    grids = [grid_file(tmp, MULTILINGUAL + sorted(ENGLISH_ONLY_MODELS), ["zero_shot", "translate_test"], all_tasks,
                       "transfer"),
             grid_file(tmp, MULTILINGUAL, ["few_shot"], ["xvnli", "xgqa", "marvl", "xflickrco"], "fewshot")]
    cells, t_plan = timed(lambda: [c for g in grids for c in plan_cells(load_grid(g))])
    stages = cells_by_stage(cells)
    print(f"{'stage':16s} cells")
    for stage, group in stages.items():
        print(f"{stage:16s} {len(group):6d}")
    print(f"{'total':16s} {len(cells):6d}   (IGLUE: 2,726 hand-written job scripts)\n")

    _, t_slurm = timed(lambda: write_slurm("iglue", cells, tmp / "slurm", {}, {}, [sys.executable, "-m",
                                                                                   "volta_ml.protocols.steps"]))
    sizes = {p.name: p.stat().st_size for p in (tmp / "slurm").glob("*.sbatch")}

    def dry_runs():
        for stage, group in stages.items():
            subprocess.run(["bash", str(tmp / "slurm" / f"{stage}.sbatch")], check=True, capture_output=True,
                           env={**os.environ, "SLURM_ARRAY_TASK_ID": str(len(group) - 1), "VOLTA_ML_DRY_RUN": "1"})
    _, t_dry = timed(dry_runs)

    rng = random.Random(0)
    records = []
    for c in cells:
        if c.stage in ("zero_shot", "translate_test", "few_shot_test"):
            metrics = {"ir_r1": rng.uniform(5, 40), "tr_r1": rng.uniform(5, 40)} if c.scorer == "retrieval" \
                else {"score": rng.uniform(30, 70)}
            records.append({"protocol": c.protocol, "model": c.model, "task": c.task, "lang": c.lang,
                            "shot": c.shot, "seed": c.seed, "metrics": metrics})
    tables, t_tables = timed(lambda: write_report(records, tmp / "report"))
    plots, t_plots = timed(lambda: write_plots(records, tmp / "report" / "plots"))

    print(f"{'step':44s} {'seconds':>8s}")
    print(f"{'plan ' + str(len(cells)) + ' cells':44s} {t_plan:8.2f}")
    print(f"{'write ' + str(len(sizes)) + ' job arrays (' + str(sum(sizes.values()) // 1024) + ' KiB)':44s} {t_slurm:8.2f}")
    print(f"{'dry-run the last index of each array':44s} {t_dry:8.2f}")
    print(f"{'tables from ' + str(len(records)) + ' scores (' + str(len(tables)) + ' files)':44s} {t_tables:8.2f}")
    print(f"{str(len(plots)) + ' plots':44s} {t_plots:8.2f}")
    print(f"\n(output in {tmp})")


if __name__ == "__main__":
    main()
