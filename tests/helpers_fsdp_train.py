"""Several `volta-ml train` runs in one multi-process launch (tests/test_hf_train_fsdp.py): the processes start, import
torch / transformers and join the process group once, then train each run in turn, exactly as `train_task.py` would
(seeds, job builder, engine), so one `torchrun` costs one start-up instead of one per run.

    python -m torch.distributed.run --nproc_per_node 2 tests/helpers_fsdp_train.py RUNS.json

RUNS.json: a list of runs, each an argv list (train_task.py flags) or {"argv": [...], "after": FILE}: started once
FILE exists (another process's work it needs, e.g. a killed run to resume; at most 10 minutes). A run that fails
fails the launch (its traceback on stderr).
"""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def main(path: str) -> int:
    sys.path.insert(0, str(REPO))
    from volta_ml.cli.train_flags import parse_train_args
    from volta_ml.cli.train_task import build_task_job, seed_everything, setup_logging
    from volta_ml.engine.distributed import finish_process, init_distributed, shutdown
    from volta_ml.engine.train import train
    info = init_distributed()
    setup_logging(info)
    for run in json.loads(Path(path).read_text()):
        argv = run["argv"] if isinstance(run, dict) else run
        deadline = time.time() + 600
        while isinstance(run, dict) and not Path(run["after"]).exists() and time.time() < deadline:
            time.sleep(0.2)
        args = parse_train_args(argv)
        seed_everything(args.seed)
        best = train(build_task_job(args, info), args, info)
        if info.is_main:
            print(f"{args.output_dir}: Best Validation score: {best * 100:.3f}", flush=True)
    shutdown(info)
    return finish_process(0)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
