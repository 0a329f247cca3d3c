"""Checkpoint files that never lose work.

Every file is written to a temporary name in the same directory, flushed to disk and
renamed over the target, so a crash or SIGKILL during a save leaves the previous file
intact. Two kinds of files, as VOLTA names them:
- `pytorch_model_<N>.bin` / `pytorch_model_best.bin`: the unwrapped model's state_dict
  (VOLTA key names: `bert.*`, `clfs_dict.TASK<n>.*`), loadable by VOLTA itself;
- `pytorch_ckpt_latest.tar`: everything a resumed run needs (model, optimizer, scheduler,
  grad scaler, data position, RNG states of every rank, best score) and what the model was
  (`saved_from`: model, LoRA rank and targets, ...; files written before it was recorded lack it),
  made only of tensors and plain containers so it loads with `torch.load(weights_only=True)`.
  A file that does not fit the model being trained (another model, LoRA rank or target set) is
  refused in one line naming the first tensors that differ and what the file was saved from
  (`check_fits`); a truncated or damaged file in one line naming the file.

Every resume file is read with torch's weights-only unpickler, never with full unpickling. VOLTA's own
resume files also pickle its TensorBoard logger (`tbLogger`) and, in multi-task runs, the task stop
controllers (`MultiTaskStopOnPlateau`); those classes are read as inert `VoltaObject` stand-ins (their
fields only: nothing of VOLTA's is imported or run). Any other class is refused with one line.
"""
from __future__ import annotations

import io
import logging
import os
import pickle
import pickletools
import random
import re
import zipfile
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
                rng_states: list[dict], pending_grads: dict | None = None, saved_from: dict | None = None,
                sharded: dict | None = None) -> None:
    """Write `pytorch_ckpt_latest.tar`.

    `epoch_id` is the last finished epoch (VOLTA's meaning, -1 before the first);
    (`resume_epoch`, `resume_micro_step`) is where the data loader continues.
    `rng_states` holds one entry per rank. `pending_grads` are gradients accumulated by
    micro-batches that did not reach an optimizer step yet (VOLTA carries them over). `saved_from`
    describes the model (`TrainJob.origin`: plain strings), named when the file does not fit another.
    `sharded` (an FSDP run, `engine/sharding.py`): the model, optimizer and pending gradients are in the folder it
    names (`model` and `optimizer` are then None), with what is needed to rebuild them (plain values).
    """
    state = {
        "format": FORMAT,
        "model_state_dict": ({k: v.detach().cpu() for k, v in unwrap(model).state_dict().items()}
                             if model is not None else {}),
        "optimizer_state_dict": optimizer.state_dict() if optimizer is not None else None,
        "scheduler_state_dict": scheduler.state_dict(),
        "scaler_state_dict": scaler.state_dict() if scaler is not None and scaler.is_enabled() else None,
        "global_step": int(global_step),
        "epoch_id": int(epoch_id),
        "resume_epoch": int(resume_epoch),
        "resume_micro_step": int(resume_micro_step),
        "score": float(best_score),
        "rng_states": rng_states,
        "pending_grads": {k: v.detach().cpu() for k, v in (pending_grads or {}).items()},
        "saved_from": {str(k): str(v) for k, v in (saved_from or {}).items()},
    }
    if sharded is not None:
        state["sharded"] = sharded
    atomic_torch_save(state, path)


def _origin(described: dict | None) -> str:
    return ", ".join(f"{key} {value}" for key, value in described.items()) if described else ""


def check_fits(path, state: dict, model: nn.Module, origin: dict | None = None) -> None:
    """Refuse, in one line, a resume file whose model tensors are not this model's (another model, LoRA rank
    or target set, projector): the first tensors that differ, and what the file and this run were saved from
    (`saved_from`, `origin`). A sharded state (`engine/sharding.py`) is checked by the shapes it records; a 0-d
    tensor and its 1-element form (how FSDP holds it) are the same shape here."""
    if "sharded" in state:
        saved = {k: tuple(v) for k, v in state["sharded"].get("shapes", {}).items()}
    else:
        saved = {k: tuple(v.shape) for k, v in state["model_state_dict"].items()}
    own = {k: tuple(v.shape) for k, v in unwrap(model).state_dict().items()}

    def same(a: tuple, b: tuple) -> bool:
        return a == b or {a, b} == {(), (1,)}
    differences = shape_differences(saved, own, same)
    if not differences:
        return
    recorded = _origin(state.get("saved_from"))
    source = (f"saved from {recorded}" if recorded else
              "saved by VOLTA" if state.get("format") == "volta" else
              "saved by an older volta-ml that did not record its model" if "saved_from" not in state else
              "saved by a job that describes no model")
    this = f"; this run: {_origin(origin)}" if origin else ""
    raise UsageError(f"--resume_file {path}: another model's resume file ({source}{this}): "
                     f"{differences}")


def shape_differences(saved: dict, own: dict, same=lambda a, b: a == b) -> str:
    """What differs between the tensor shapes a file holds (`saved`) and a model's (`own`), both {name: shape}:
    "<n> of another shape (first <name>: file [..], model [..]); <n> of this model missing (first <name>); <n> not
    in this model (first <name>)", the parts that apply; "" when they are the same."""
    shaped = [k for k in own if k in saved and not same(saved[k], own[k])]
    missing = [k for k in own if k not in saved]
    extra = [k for k in saved if k not in own]
    differences = []
    if shaped:
        differences.append(f"{len(shaped)} of another shape (first {shaped[0]}: file "
                           f"{list(saved[shaped[0]])}, model {list(own[shaped[0]])})")
    if missing:
        differences.append(f"{len(missing)} of this model missing (first {missing[0]})")
    if extra:
        differences.append(f"{len(extra)} not in this model (first {extra[0]})")
    return "; ".join(differences)


class VoltaObject:
    """An inert stand-in for an object of one of VOLTA's classes in its resume file: `volta_class` names the
    class, `fields` holds the pickled state (plain values). No method of VOLTA's runs (tbLogger's own
    `__setstate__` would reopen its log files)."""
    volta_class = ""

    def __setstate__(self, state) -> None:
        self.fields = dict(state) if isinstance(state, dict) else {"state": state}

    def __repr__(self) -> str:
        return f"<stand-in for {self.volta_class}: {sorted(getattr(self, 'fields', {}))}>"


# VOLTA's classes that its train_task.py / train_tasks.py pickle beside the tensors, by class name; the
# module is checked to be VOLTA's (or vilbert-multi-task's, which VOLTA grew from) when the file names it.
VOLTA_CLASSES = ("tbLogger", "MultiTaskStopOnPlateau")
VOLTA_MODULES = ("volta", "vilbert")


def _numpy_safe_globals() -> list:
    """numpy scalars (a score kept as numpy.float64) and their dtypes: values, no code."""
    try:
        from numpy._core import multiarray
    except ImportError:  # pragma: no cover - numpy 1.x
        from numpy.core import multiarray
    found = [(multiarray.scalar, f"{mod}.scalar") for mod in ("numpy.core.multiarray", "numpy._core.multiarray")]
    found.append(np.dtype)
    found += [getattr(np.dtypes, n) for n in dir(np.dtypes) if n.endswith("DType")]
    return found


def _stand_ins(names: set[str]) -> list[tuple[type, str]]:
    """A stand-in class for each VOLTA class the file names, registered under the file's own name for it."""
    found = []
    for full in names:
        module, _, cls = full.rpartition(".")
        if cls in VOLTA_CLASSES and module.split(".")[0] in VOLTA_MODULES:
            found.append((type(cls, (VoltaObject,), {"volta_class": full}), full))
    return found


def pickle_globals(path: str | os.PathLike) -> set[str]:
    """The globals ("module.name") the main pickle of a `torch.save` file names, read without unpickling:
    zip files (torch >= 1.6) and the legacy format (torch < 1.6: three small header pickles, then the main
    one). Only for naming what a file holds; torch's weights-only unpickler is what refuses."""
    with open(path, "rb") as handle:
        if zipfile.is_zipfile(handle):
            with zipfile.ZipFile(handle) as archive:
                data = next((n for n in archive.namelist() if n.endswith("data.pkl")), None)
                if data is None:
                    raise ValueError("a zip file without data.pkl")
                return _globals_in(io.BytesIO(archive.read(data)))
        handle.seek(0)
        for _ in range(3):  # magic number, protocol version, system info
            for _op in pickletools.genops(handle):
                pass
        return _globals_in(handle)


def _globals_in(stream) -> set[str]:
    found, strings = set(), []
    for opcode, arg, _ in pickletools.genops(stream):
        if opcode.name in ("GLOBAL", "INST"):
            found.add(".".join(arg.split(" ", 1)))
        elif opcode.name == "STACK_GLOBAL" and len(strings) >= 2:
            found.add(f"{strings[-2]}.{strings[-1]}")
        elif isinstance(arg, str) and "UNICODE" in opcode.name:
            strings.append(arg)
    return found


ZIP_MAGIC = b"PK\x03\x04"                       # torch.save since torch 1.6: a zip archive
LEGACY_MAGIC = b"\x80\x02\x8a\x0a\x6c\xfc\x9c\x46\xf9\x20\x6a\xa8\x50\x19"   # before: pickled magic number


def _unreadable(path, error: BaseException) -> str:
    """Why the pickle of a resume file cannot be read, in words: a truncated or damaged torch.save file (a
    copy or a save that did not finish), an empty one, or not a torch.save file at all."""
    try:
        size = os.path.getsize(path)
        with open(path, "rb") as handle:
            head = handle.read(len(LEGACY_MAGIC))
    except OSError as unopened:
        return f"cannot be read ({unopened.strerror or unopened})"
    if size == 0:
        return "an empty file (0 bytes): truncated"
    first = (str(error).strip().splitlines() or [""])[0]
    if head.startswith(ZIP_MAGIC) and zipfile.is_zipfile(path):
        return f"not a training checkpoint (a zip archive, but not torch.save's: {first})"
    if head.startswith(ZIP_MAGIC):
        return (f"truncated or corrupt: a torch.save zip archive whose end is missing or damaged ({size:,} bytes; "
                f"a copy or save that did not finish?)")
    if head.startswith(LEGACY_MAGIC):
        return f"truncated or corrupt: a torch.save file (torch < 1.6 format) that ends too early ({size:,} bytes)"
    return f"not a training checkpoint (not a torch.save file: {type(error).__name__}: {first})"


TORCH_MODULES = ("torch", "numpy", "collections", "builtins", "__builtin__", "copyreg", "copy_reg", "_codecs")


def _refused(path, names: list[str]) -> UsageError:
    more = f" (+{len(names) - 3} more)" if len(names) > 3 else ""
    return UsageError(f"--resume_file {path}: refused: the file names {', '.join(names[:3])}{more}, which a "
                      f"training checkpoint never holds (tensors, plain containers and VOLTA's "
                      f"{'/'.join(VOLTA_CLASSES)} only); nothing in it was run")


def load_latest(path: str | os.PathLike) -> dict:
    """Read a resume file with torch's weights-only unpickler (never full unpickling).

    Our own files hold only tensors and plain containers. A file written by VOLTA itself also pickles its
    TensorBoard logger and task stop controllers: those become `VoltaObject` stand-ins; any other class in
    the file is refused with a `UsageError` naming the file and the class, before anything is built. Of a
    VOLTA file, the model weights, step, epoch and best score are used.
    """
    try:
        named = pickle_globals(path)
    except Exception as unreadable:  # noqa: BLE001 - any reader error means: not a checkpoint
        raise UsageError(f"--resume_file {path}: {_unreadable(path, unreadable)}") from None
    stand_ins = _stand_ins(named)
    # what torch itself may allow (tensors, storages, containers, numpy values) is judged by its unpickler;
    # anything from another module is refused here, by name, before loading starts
    refused = sorted(n for n in named - {name for _, name in stand_ins} if n.split(".")[0] not in TORCH_MODULES)
    if refused:
        raise _refused(path, refused)
    try:
        with torch.serialization.safe_globals(_numpy_safe_globals() + stand_ins):
            state = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as unsafe:  # torch's refusal names the global: "... GLOBAL a.b.C was not ..."
        found = re.search(r"GLOBAL ([\w.]+)", str(unsafe))
        if found:
            raise _refused(path, [found.group(1)]) from None
        raise UsageError(f"--resume_file {path}: not a readable training checkpoint "
                         f"(UnpicklingError: {(str(unsafe).strip().splitlines() or [''])[0]})") from None
    except Exception as unreadable:  # noqa: BLE001 - any reader error means: not a checkpoint
        first = (str(unreadable).strip().splitlines() or [""])[0]
        raise UsageError(f"--resume_file {path}: not a readable training checkpoint, truncated or corrupt "
                         f"({type(unreadable).__name__}: {first})") from None
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
