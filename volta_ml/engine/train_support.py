"""Pieces the training loop uses: pre-emption signals, mixed precision, loaders (validation itself is
`volta_ml.engine.evaluate.evaluate`, the loop eval_task.py runs)."""
from __future__ import annotations

import atexit
import logging
import signal
from dataclasses import dataclass

import torch
from torch.utils.data import DataLoader, Dataset, Subset

from volta_ml.engine.distributed import DistInfo, ResumableDistributedSampler, ShardSampler
from volta_ml.engine.evaluate import autocast
from volta_ml.engine.failures import die_with_parent, stop_workers

logger = logging.getLogger("volta_ml.train")

PREEMPTION_SIGNALS = (signal.SIGTERM, signal.SIGUSR1)


class Preempted(Exception):
    """Raised after the resume file was written because SIGTERM/SIGUSR1 arrived."""

    def __init__(self, signum: int, path):
        super().__init__(f"stopped by {signal.Signals(signum).name}; resume with --resume_file {path}")
        self.signum = signum
        self.exit_code = 128 + signum  # what a shell reports for a signal death: the job is not "done"


class NonFiniteLoss(Exception):
    pass


class PreemptionFlag:
    """Records SIGTERM / SIGUSR1 instead of dying; the loop saves at the next optimizer step."""

    def __init__(self):
        self.signum = 0
        self._previous = {}

    def __enter__(self):
        for sig in PREEMPTION_SIGNALS:
            try:
                self._previous[sig] = signal.signal(sig, self._handle)
            except ValueError:  # not the main thread (e.g. embedded use): signals stay as they were
                pass
        return self

    def _handle(self, signum, frame):
        self.signum = signum

    def __exit__(self, *exc):
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        return False


def _ignore_preemption_in_worker(worker_id: int) -> None:
    # Slurm signals every process of the step; workers must outlive the main process's save,
    # but not the main process itself.
    die_with_parent(worker_id)
    for sig in PREEMPTION_SIGNALS:
        signal.signal(sig, signal.SIG_IGN)


# At exit after an error that escaped `failures.fail` (embedded use), DataLoader workers may still be
# alive (a traceback holds their iterator); multiprocessing would SIGTERM them, which they ignore,
# and wait forever. This runs before multiprocessing's own exit hook (LIFO).
atexit.register(stop_workers, at_exit=True)


@dataclass
class Precision:
    """`--amp none|bf16|fp16`: autocast dtype plus a GradScaler that is only active for fp16."""
    mode: str
    device: torch.device

    def __post_init__(self):
        if self.mode not in ("none", "bf16", "fp16"):
            raise ValueError(f"--amp must be none, bf16 or fp16, got {self.mode!r}")
        self.scaler = torch.amp.GradScaler(self.device.type, enabled=self.mode == "fp16")

    def autocast(self):
        return autocast(self.mode, self.device)


def train_loader(dataset: Dataset, batch_size: int, info: DistInfo, args, collate_fn, shard: bool = True
                 ) -> DataLoader:
    """`shard=False`: the dataset already is this rank's own part (VOLTA's training_feat_part_<rank>.lmdb): every
    index of it is this rank's."""
    sampler = ResumableDistributedSampler(dataset, info if shard else DistInfo(device=info.device), shuffle=True,
                                          seed=args.seed)
    workers = args.num_workers // info.world_size
    return DataLoader(dataset, batch_size=batch_size, sampler=sampler, num_workers=workers,
                      collate_fn=collate_fn, pin_memory=info.device.type == "cuda", drop_last=args.drop_last,
                      worker_init_fn=_ignore_preemption_in_worker if workers else None,
                      # a private generator: creating an epoch's iterator must not draw from the
                      # global torch RNG, or a resumed run would see different dropout masks
                      generator=torch.Generator(),
                      # a dataset with set_epoch (retrieval negatives) must be re-sent to the workers each epoch
                      persistent_workers=workers > 0 and not hasattr(dataset, "set_epoch"))


def val_loader(dataset: Dataset, batch_size: int, info: DistInfo, args, collate_fn,
               max_batches: int | None = None) -> DataLoader:
    """Validation shard of this rank; `max_batches` keeps the first max_batches*batch_size
    examples of the whole set, so the result does not depend on the number of ranks."""
    if max_batches is not None:
        dataset = Subset(dataset, range(min(len(dataset), max_batches * batch_size)))
    workers = args.num_val_workers
    return DataLoader(dataset, batch_size=batch_size, sampler=ShardSampler(len(dataset), info),
                      num_workers=workers, collate_fn=collate_fn, pin_memory=info.device.type == "cuda",
                      worker_init_fn=_ignore_preemption_in_worker if workers else None,
                      persistent_workers=workers > 0)  # built once per run: no fork per evaluation
