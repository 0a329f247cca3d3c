"""Checkpoint files that never lose work.

Every file is written to a temporary name in the same directory, flushed to disk and
renamed over the target, so a crash or SIGKILL during a save leaves the previous file
intact. Two kinds of files, as VOLTA names them:
- `pytorch_model_<N>.bin` / `pytorch_model_best.bin`: the unwrapped model's state_dict
  (VOLTA key names: `bert.*`, `clfs_dict.TASK<n>.*`), loadable by VOLTA itself;
- `pytorch_ckpt_latest.tar`: everything a resumed run needs (model, optimizer, scheduler,
  grad scaler, data position, RNG states of every rank, best score), made only of tensors
  and plain containers so it loads with `torch.load(weights_only=True)`.
"""
from __future__ import annotations

import logging
import os
import random
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from volta_ml.atomic import atomic_open
from volta_ml.engine.failures import UsageError

logger = logging.getLogger(__name__)

LATEST_NAME = "pytorch_ckpt_latest.tar"
FORMAT = "volta-ml-train-state/1"


def unwrap(model: nn.Module) -> nn.Module:
    """The bare model inside DistributedDataParallel / DataParallel / torch.compile wrappers."""
    while True:
        if hasattr(model, "module") and isinstance(model.module, nn.Module):
            model = model.module
        elif hasattr(model, "_orig_mod"):
            model = model._orig_mod
        else:
            return model


def atomic_torch_save(obj: Any, path: str | os.PathLike) -> None:
    """torch.save to a temp file next to `path`, fsync, then rename over `path`."""
    with atomic_open(path, "wb") as handle:
        torch.save(obj, handle)


def remove_stale_temp_files(directory: str | os.PathLike) -> list[Path]:
    """Delete temp files left by saves that were killed mid-write."""
    removed = []
    for tmp in Path(directory).glob(".*.tmp"):
        if tmp.name.startswith((".pytorch_model_", f".{LATEST_NAME}.")):
            tmp.unlink(missing_ok=True)
            removed.append(tmp)
    return removed


def save_model_bin(model: nn.Module, path: str | os.PathLike) -> None:
    """`pytorch_model_*.bin`: the unwrapped model's state_dict, tensors on CPU."""
    state = {key: value.detach().cpu() for key, value in unwrap(model).state_dict().items()}
    atomic_torch_save(state, path)


# ---- RNG states -------------------------------------------------------------------------

def capture_rng_state() -> dict:
    """This process's Python, numpy, torch and CUDA RNG states as tensors and plain values."""
    np_kind, np_keys, np_pos, np_has_gauss, np_gauss = np.random.get_state()
    py_version, py_internal, py_gauss = random.getstate()
    state = {
        "python": [py_version, list(py_internal), py_gauss],
        "numpy": [np_kind, torch.from_numpy(np.asarray(np_keys, dtype=np.int64)), int(np_pos),
                  int(np_has_gauss), float(np_gauss)],
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def restore_rng_state(state: dict) -> None:
    py_version, py_internal, py_gauss = state["python"]
    random.setstate((py_version, tuple(py_internal), py_gauss))
    np_kind, np_keys, np_pos, np_has_gauss, np_gauss = state["numpy"]
    np.random.set_state((np_kind, np.asarray(np_keys, dtype=np.uint32), np_pos, np_has_gauss, np_gauss))
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])


# ---- the resume file --------------------------------------------------------------------

def save_latest(path: str | os.PathLike, *, model, optimizer, scheduler, scaler, global_step: int,
                epoch_id: int, resume_epoch: int, resume_micro_step: int, best_score: float,
                rng_states: list[dict], pending_grads: dict | None = None) -> None:
    """Write `pytorch_ckpt_latest.tar`.

    `epoch_id` is the last finished epoch (VOLTA's meaning, -1 before the first);
    (`resume_epoch`, `resume_micro_step`) is where the data loader continues.
    `rng_states` holds one entry per rank. `pending_grads` are gradients accumulated by
    micro-batches that did not reach an optimizer step yet (VOLTA carries them over).
    """
    state = {
        "format": FORMAT,
        "model_state_dict": {k: v.detach().cpu() for k, v in unwrap(model).state_dict().items()},
        "optimizer_state_dict": optimizer.state_dict(),
        "scheduler_state_dict": scheduler.state_dict(),
        "scaler_state_dict": scaler.state_dict() if scaler is not None and scaler.is_enabled() else None,
        "global_step": int(global_step),
        "epoch_id": int(epoch_id),
        "resume_epoch": int(resume_epoch),
        "resume_micro_step": int(resume_micro_step),
        "score": float(best_score),
        "rng_states": rng_states,
        "pending_grads": {k: v.detach().cpu() for k, v in (pending_grads or {}).items()},
    }
    atomic_torch_save(state, path)


def load_latest(path: str | os.PathLike) -> dict:
    """Read a resume file. Our own files load with weights_only=True.

    A file written by VOLTA itself also pickles its TensorBoard logger object; such a file
    is only loaded with full unpickling, so it must come from a trusted source (the user
    named it with --resume_file). Its model weights, step, epoch and best score are used.
    """
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as error:  # noqa: BLE001 - re-raised below unless it is a VOLTA file
        logger.warning("%s is not a plain-tensor checkpoint (%s); loading it as a VOLTA checkpoint "
                       "with full unpickling, which runs code stored in the file: only resume from "
                       "files you trust", path, type(error).__name__)
        try:
            state = torch.load(path, map_location="cpu", weights_only=False)
        except Exception as unreadable:  # noqa: BLE001 - any reader error means: not a checkpoint
            raise UsageError(f"--resume_file {path}: not a readable training checkpoint "
                             f"({type(unreadable).__name__}: {unreadable})") from None
    if not isinstance(state, dict) or "model_state_dict" not in state:
        raise UsageError(f"--resume_file {path}: not a training checkpoint (no 'model_state_dict' key)")
    if state.get("format") != FORMAT:
        epoch_id = int(state.get("epoch_id", -1))
        state = {
            "format": "volta",
            "model_state_dict": {k.removeprefix("module."): v for k, v in state["model_state_dict"].items()},
            "global_step": int(state.get("global_step", 0)),
            "epoch_id": epoch_id,
            "resume_epoch": epoch_id + 1,
            "resume_micro_step": 0,
            "score": float(state.get("score", -1.0)),
        }
    return state
