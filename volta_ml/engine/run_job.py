"""Running a training job to its exit status: distributed start-up, VOLTA's log format, the seed, the engine's
`train`, and what each way of ending means (the exit codes of `cli/train_task.py`'s docstring). Every training
command line runs its job through `run`: `train_task.py` / `volta-ml train`, pretraining (`pretrain/cli.py`)
and the demo; it sits in the engine so that the pipelines' command lines need not import `volta_ml/cli`."""
from __future__ import annotations

import logging
import random
import sys
from typing import Callable

import numpy as np
import torch

from .distributed import DistInfo, finish_process, init_distributed, shutdown
from .failures import EXIT_NON_FINITE, fail, report
from .logs import attach_stderr_handler
from .train import TrainJob, train
from .train_support import NonFiniteLoss, Preempted

logger = logging.getLogger("volta_ml.train")


def setup_logging(info: DistInfo) -> None:
    # VOLTA's logger format on the root logger (every library's lines); only rank 0 reports progress.
    attach_stderr_handler(logging.getLogger(), logging.INFO if info.is_main else logging.WARNING)


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def run(args, build_job: Callable[[object, DistInfo], TrainJob], prog: str = "train_task.py") -> int:
    return finish_process(_run(args, build_job, prog))


def _run(args, build_job: Callable[[object, DistInfo], TrainJob], prog: str) -> int:
    try:
        info = init_distributed(args.local_rank, args.device)
        setup_logging(info)
        seed_everything(args.seed)
        job = build_job(args, info)
        best = train(job, args, info)
    except Preempted as stop:  # every rank stops at the same step: the group ends normally
        shutdown(info)
        logger.warning("%s", stop)
        return stop.exit_code
    except NonFiniteLoss as error:  # the loss is all-reduced: every rank sees it
        shutdown(info)
        report(prog, str(error))
        return EXIT_NON_FINITE
    except (Exception, KeyboardInterrupt) as error:
        return fail(error, prog)
    shutdown(info)
    if info.is_main and not job.loss_parts:   # pretraining jobs have no score
        sys.stderr.flush()
        # the few-shot scripts read field 4 of the last log line
        print(f"Best Validation score: {best * 100:.3f} ", flush=True)
    return 0
