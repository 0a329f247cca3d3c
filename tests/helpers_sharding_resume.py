"""Damaged and foreign FSDP resume states (tests/test_sharding_resume.py): a tiny FSDP2 model saves its sharded state
(`engine/sharding.save_sharded_state`), the state is damaged (or a model of other shapes loads it), and
`load_sharded_state` is asked to load it. In the test's process (a process group of one) or on 2 ranks:

    python -m torch.distributed.run --nproc_per_node 2 tests/helpers_sharding_resume.py OUT.json

OUT.json: per rank, per case, the error's class and text (or "loaded" and whether the weights came back) and the
log records the load let through to the root logger (what `volta-ml train` prints on stderr).
"""
from __future__ import annotations

import contextlib
import json
import logging
import sys
from pathlib import Path
from unittest import mock

import torch
from torch import nn

REPO = Path(__file__).resolve().parents[1]
# "unchecked": the damaged .metadata of "metadata" reaching dcp.load itself (as a file changed after
# `check_shard_folder` read it would): its error is still one line, its logged tracebacks still held back
CASES = ("whole", "metadata", "cut", "other", "unchecked")


class Records(logging.Handler):
    """Every record that reaches the root logger's handlers."""

    def __init__(self):
        super().__init__(logging.DEBUG)
        self.seen: list[dict] = []

    def emit(self, record):
        self.seen.append({"logger": record.name, "file": record.pathname, "level": record.levelname,
                          "traceback": record.exc_info is not None, "message": record.getMessage()[:200]})


def _model(width: int) -> nn.Module:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    import torch.distributed as dist
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.Linear(8, width), nn.Linear(width, 2))
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    for unit in model:
        fully_shard(unit, mesh=mesh)
    return fully_shard(model, mesh=mesh)


def _trained(width: int):
    model = _model(width)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model(torch.randn(3, 4)).sum().backward()
    optimizer.step()
    return model, optimizer


def _damage(folder: Path, case: str) -> None:
    if case in ("metadata", "unchecked"):   # its first bytes overwritten
        data = (folder / ".metadata").read_bytes()
        (folder / ".metadata").write_bytes(b"garbage!" + data[8:])
    elif case == "cut":      # every data file cut in half (a copy that did not finish)
        for part in folder.glob("*.distcp"):
            part.write_bytes(part.read_bytes()[: part.stat().st_size // 2])


def run_cases(root: Path, info) -> dict:
    """Each case on every rank of `info`: save, damage (rank 0), load; what the load said and logged."""
    from volta_ml.engine import checkpointing as ckpt
    from volta_ml.engine import sharding
    from volta_ml.engine.distributed import barrier, broadcast_object
    records = Records()
    logging.getLogger().addHandler(records)
    logging.getLogger().setLevel(logging.INFO)
    results = {}
    try:
        for case in CASES:
            run = Path(broadcast_object(str(root / case), info))
            run.mkdir(parents=True, exist_ok=True)
            path = run / ckpt.LATEST_NAME
            model, optimizer = _trained(8)
            saved = sharding.gather_full_state(model)
            sharding.save_sharded_state(path, model, optimizer, True, info, **_fields(optimizer))
            state = ckpt.load_latest(path)
            if info.is_main:
                _damage(sharding.shard_folder(path, state), case)
            barrier(info)
            model, optimizer = _trained(16 if case == "other" else 8)
            records.seen.clear()
            unchecked = mock.patch.object(sharding, "check_shard_folder", return_value=None)
            try:
                with unchecked if case == "unchecked" else contextlib.nullcontext():
                    sharding.load_sharded_state(path, state, model, optimizer)
                loaded = sharding.gather_full_state(model)
                outcome = {"loaded": True, "same": loaded is None or all(torch.equal(saved[k], loaded[k])
                                                                         for k in saved)}
            except Exception as error:  # noqa: BLE001 - what the caller would report
                outcome = {"error": type(error).__name__, "message": str(error)}
            results[case] = dict(outcome, records=list(records.seen))
            barrier(info)
    finally:
        logging.getLogger().removeHandler(records)
    return results


def _fields(optimizer) -> dict:
    return dict(scheduler=torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0), scaler=None,
                global_step=1, epoch_id=0, resume_epoch=1, resume_micro_step=0, best_score=0.0)


def main(out: str) -> int:
    sys.path.insert(0, str(REPO))
    from volta_ml.engine.distributed import finish_process, gather_objects, init_distributed, shutdown
    info = init_distributed(device="cpu")
    results = gather_objects(run_cases(Path(out).parent / "states", info), info)
    if info.is_main:
        Path(out).write_text(json.dumps(results))
    shutdown(info)
    return finish_process(0)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
