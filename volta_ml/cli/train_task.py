"""`train_task.py` / `volta-ml train`: start-up, the run, and the exit status.

Exit status: 0 when training finished (the last output line is then
`Best Validation score: X `), 128+signal after SIGTERM/SIGUSR1 saved the resume file
(143 / 138: schedulers treat it as "killed", so a requeued job resumes with the same
command when it passes --resume_file <run dir>/pytorch_ckpt_latest.tar), 3 when the
loss became NaN/inf, 2 for usage errors (argparse).
"""
from __future__ import annotations

import logging
import random
import sys
from typing import Callable

import numpy as np
import torch

from volta_ml.engine.distributed import DistInfo, finish_process, init_distributed, shutdown
from volta_ml.engine.train import TrainJob, train
from volta_ml.cli.flags import VoltaArgumentParser
from volta_ml.cli.train_flags import add_train_flags, parse_train_args
from volta_ml.engine.train_support import NonFiniteLoss, Preempted

logger = logging.getLogger("volta_ml.train")
EXIT_NON_FINITE = 3


def setup_logging(info: DistInfo) -> None:
    # VOLTA's logger format; only rank 0 reports progress.
    logging.basicConfig(format="%(asctime)s - %(levelname)s - %(name)s -   %(message)s",
                        datefmt="%m/%d/%Y %H:%M:%S", level=logging.INFO if info.is_main else logging.WARNING,
                        stream=sys.stderr, force=True)


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def run(args, build_job: Callable[[object, DistInfo], TrainJob]) -> int:
    return finish_process(_run(args, build_job))


def _run(args, build_job: Callable[[object, DistInfo], TrainJob]) -> int:
    info = init_distributed(args.local_rank, args.device)
    setup_logging(info)
    seed_everything(args.seed)
    try:
        job = build_job(args, info)
        best = train(job, args, info)
    except Preempted as stop:
        logger.warning("%s", stop)
        return stop.exit_code
    except NonFiniteLoss as error:
        logger.error("%s", error)
        return EXIT_NON_FINITE
    finally:
        shutdown(info)
    if info.is_main:
        sys.stderr.flush()
        # the few-shot scripts read field 4 of the last log line
        print(f"Best Validation score: {best * 100:.3f} ", flush=True)
    return 0


def build_task_job(args, info: DistInfo) -> TrainJob:
    from volta_ml.engine.task_job import build_task_job as build
    return build(args, info)


def main(argv: list[str] | None = None) -> int:
    return run(parse_train_args(argv), build_task_job)


def register(subparsers) -> None:
    parser = subparsers.add_parser("train", help="fine-tune on one task (train_task.py flags)",
                                   description="Fine-tune a VOLTA model on one task; same flags as train_task.py.")
    parser.__class__ = VoltaArgumentParser  # nearest-flag suggestions and the trailing 'deactivate' rule
    add_train_flags(parser)
    parser.set_defaults(func=lambda args: run(args, build_task_job))


if __name__ == "__main__":
    sys.exit(main())
