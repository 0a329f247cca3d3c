"""torch.distributed set-up without flags: torchrun, Slurm `srun`, or a single process.

- torchrun (and the old `torch.distributed.launch`) export RANK / WORLD_SIZE / LOCAL_RANK.
- `srun python train_task.py ...` with several tasks exports SLURM_PROCID / SLURM_NTASKS /
  SLURM_LOCALID; the rendezvous address is the first node of the job and the port is
  derived from the job id, so every task computes the same values.
- otherwise one process; `--local_rank` from old launch scripts only picks the GPU.
Only rank 0 writes files and logs.

A collective waits at most `VOLTA_ML_DIST_TIMEOUT` seconds (default 600, PyTorch's own default is
30 minutes) for the other ranks; a rank that fails leaves the group with `abort()` and exits at once,
which ends the peers' collectives within seconds (docs/training.md, "When things go wrong").
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass
from datetime import timedelta
from typing import Iterator

import torch
import torch.distributed as dist
from torch.utils.data import Dataset, DistributedSampler, Sampler

from volta_ml.devices import pick_device


@dataclass
class DistInfo:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    device: torch.device = torch.device("cpu")
    initialized: bool = False

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def first_slurm_host(nodelist: str) -> str:
    """First host name of a Slurm node list such as `gpu[03-05,7],cpu1` -> `gpu03`."""
    match = re.match(r"([^,\[]+)(?:\[([^\]]+)\])?", nodelist.strip())
    if not match:
        raise ValueError(f"cannot parse SLURM_JOB_NODELIST={nodelist!r}")
    prefix, ranges = match.groups()
    if not ranges:
        return prefix
    return prefix + ranges.split(",")[0].split("-")[0]


def detect_launch(env=os.environ) -> dict | None:
    """Rank/world/local rank plus rendezvous variables, or None for a single process."""
    if "RANK" in env and "WORLD_SIZE" in env:
        return {"rank": int(env["RANK"]), "world_size": int(env["WORLD_SIZE"]),
                "local_rank": int(env.get("LOCAL_RANK", 0)), "env": {}}
    if int(env.get("SLURM_NTASKS", "1")) > 1 and "SLURM_PROCID" in env:
        job_id = int(env.get("SLURM_JOB_ID", "0"))
        nodelist = env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST") or "127.0.0.1"
        rendezvous = {
            "MASTER_ADDR": env.get("MASTER_ADDR") or first_slurm_host(nodelist),
            "MASTER_PORT": env.get("MASTER_PORT") or str(20000 + job_id % 20000),
        }
        return {"rank": int(env["SLURM_PROCID"]), "world_size": int(env["SLURM_NTASKS"]),
                "local_rank": int(env.get("SLURM_LOCALID", 0)), "env": rendezvous}
    return None


DEFAULT_TIMEOUT_S = 600


def collective_timeout(env=os.environ) -> timedelta:
    """`VOLTA_ML_DIST_TIMEOUT` seconds (default 600): how long a rank waits in a collective for the others.
    It bounds the wait for a rank that hangs without dying; a rank that dies is noticed at once."""
    raw = env.get("VOLTA_ML_DIST_TIMEOUT", "")
    from volta_ml.engine.failures import UsageError
    try:
        seconds = float(raw) if raw else DEFAULT_TIMEOUT_S
    except ValueError:
        raise UsageError(f"VOLTA_ML_DIST_TIMEOUT={raw!r}: expected a number of seconds") from None
    if not seconds > 0:
        raise UsageError(f"VOLTA_ML_DIST_TIMEOUT={raw!r}: must be a positive number of seconds")
    return timedelta(seconds=seconds)


def init_distributed(local_rank_flag: int = -1, device: str | None = None) -> DistInfo:
    launch = detect_launch()
    if launch is None:
        return DistInfo(local_rank=max(local_rank_flag, 0), device=pick_device(device, local_rank_flag))
    os.environ.update(launch["env"])
    os.environ.setdefault("RANK", str(launch["rank"]))
    os.environ.setdefault("WORLD_SIZE", str(launch["world_size"]))
    os.environ.setdefault("LOCAL_RANK", str(launch["local_rank"]))
    dev = pick_device(device, launch["local_rank"])
    if dev.type == "cuda":
        torch.cuda.set_device(dev)
    if not dist.is_initialized():
        dist.init_process_group(backend="nccl" if dev.type == "cuda" else "gloo", init_method="env://",
                                rank=launch["rank"], world_size=launch["world_size"],
                                timeout=collective_timeout())
    return DistInfo(rank=launch["rank"], world_size=launch["world_size"], local_rank=launch["local_rank"],
                    device=dev, initialized=True)


_MULTI_PROCESS_RUN_ENDED = False


def shutdown(info: DistInfo) -> None:
    global _MULTI_PROCESS_RUN_ENDED
    if info.initialized and dist.is_initialized():
        # Every rank reaches this point before any tears down: rank 0 hosts the rendezvous store.
        if info.world_size > 1:
            dist.barrier()
        dist.destroy_process_group()
        _MULTI_PROCESS_RUN_ENDED = info.world_size > 1


def abort() -> None:
    """After an error on this rank: leave the process group without a collective (a barrier here would
    wait for ranks that are busy elsewhere), so the process can exit and its peers' collectives fail
    at once instead of waiting for the timeout. `finish_process` then exits without interpreter teardown."""
    global _MULTI_PROCESS_RUN_ENDED
    if not dist.is_initialized():
        return
    multi = dist.get_world_size() > 1
    try:
        if dist.get_backend() == "nccl":
            from torch.distributed.distributed_c10d import _abort_process_group
            _abort_process_group()  # NCCL kernels may be stuck waiting on a peer: abort them
        else:
            dist.destroy_process_group()
    except Exception:  # noqa: BLE001 - the group is broken anyway; the process exits next
        pass
    _MULTI_PROCESS_RUN_ENDED = _MULTI_PROCESS_RUN_ENDED or multi


def finish_process(code: int) -> int:
    """Return `code`; after a multi-process run, exit with it at once instead.

    Interpreter teardown after a gloo run sometimes aborts a rank ("terminate called without
    an active exception", SIGABRT with no Python frame: a C++ destructor at exit; about 1 run
    in 12 on a loaded 2-core machine) and torchrun then fails the whole job.  By then the work
    is saved and the process group destroyed: flush what Python would flush, skip the teardown.
    """
    if not _MULTI_PROCESS_RUN_ENDED:
        return code
    import logging
    import sys
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def all_reduce_sum(tensor: torch.Tensor, info: DistInfo) -> torch.Tensor:
    if info.initialized and info.world_size > 1:
        dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
    return tensor


def all_reduce_max(tensor: torch.Tensor, info: DistInfo | None) -> torch.Tensor:
    if info is not None and info.initialized and info.world_size > 1:
        dist.all_reduce(tensor, op=dist.ReduceOp.MAX)
    return tensor


def gather_objects(obj, info: DistInfo) -> list:
    """Every rank's `obj`, in rank order (a one-element list in a single process)."""
    if not (info.initialized and info.world_size > 1):
        return [obj]
    gathered = [None] * info.world_size
    dist.all_gather_object(gathered, obj)
    return gathered


def broadcast_object(obj, info: DistInfo):
    if not (info.initialized and info.world_size > 1):
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def barrier(info: DistInfo) -> None:
    if info.initialized and info.world_size > 1:
        dist.barrier()


class ResumableDistributedSampler(DistributedSampler):
    """DistributedSampler (shuffle seeded by seed + epoch) that can start mid-epoch.

    `skip_next_epoch(n)` drops the first n indices of this rank for the next `set_epoch`
    epoch only, so a resumed run sees exactly the batches the interrupted one had left.
    With one process it is a plain seeded shuffle; with R processes, rank r takes every
    R-th index, so R ranks with batch b see the same examples per step as one with R*b.
    """

    def __init__(self, dataset: Dataset, info: DistInfo, shuffle: bool = True, seed: int = 0,
                 drop_last: bool = False):
        super().__init__(dataset, num_replicas=info.world_size, rank=info.rank, shuffle=shuffle, seed=seed,
                         drop_last=drop_last)
        self._skip = 0

    def skip_next_epoch(self, count: int) -> None:
        self._skip = count

    def __iter__(self) -> Iterator[int]:
        indices = list(super().__iter__())
        skip, self._skip = self._skip, 0
        return iter(indices[skip:])


class ShardSampler(Sampler[int]):
    """Evaluation shard of rank r: indices r, r+R, ... with no padding, so the gathered sums
    count every example exactly once."""

    def __init__(self, length: int, info: DistInfo):
        self.indices = list(range(info.rank, length, info.world_size))

    def __iter__(self):
        return iter(self.indices)

    def __len__(self):
        return len(self.indices)


class _GatherWithGrad(torch.autograd.Function):
    """all_gather whose backward sends each rank the summed gradient of its own rows (see gather_with_grad)."""

    @staticmethod
    def forward(ctx, tensor: torch.Tensor) -> torch.Tensor:
        ctx.rank, ctx.rows = dist.get_rank(), tensor.shape[0]
        parts = [torch.empty_like(tensor) for _ in range(dist.get_world_size())]
        dist.all_gather(parts, tensor.contiguous())
        return torch.cat(parts)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> torch.Tensor:
        grad = grad.contiguous()
        dist.all_reduce(grad, op=dist.ReduceOp.SUM)  # every rank's loss reads every rank's rows
        return grad[ctx.rank * ctx.rows:(ctx.rank + 1) * ctx.rows]


def gather_with_grad(tensor: torch.Tensor, info: DistInfo) -> torch.Tensor:
    """The rows of every rank, concatenated in rank order, with gradients flowing back to their owners.

    Rank r's rows sit at [r*b, (r+1)*b) of the result. Every rank must pass the same number of rows (the
    training sampler gives every rank the same number of examples). In the backward pass each rank receives
    the sum over all ranks' losses of the gradient of its own rows, so a loss that every rank computes over
    its local rows against the gathered columns, averaged by DDP, has the gradient of one process holding
    the whole batch (the "local loss" of open_clip). In a single process it returns `tensor` itself."""
    if not (info.initialized and info.world_size > 1):
        return tensor
    return _GatherWithGrad.apply(tensor)
