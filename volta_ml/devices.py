"""`pick_device`: what `--device` means in every command (training, evaluation, retrieval, CVQA, extraction).

Imports nothing from the package, so every layer can use it.
"""
from __future__ import annotations

import torch


class DeviceError(ValueError):
    """`--device` names a device that does not exist or that torch cannot see (a usage error, exit code 2)."""


def pick_device(requested: str | None = None, local_rank: int = -1) -> torch.device:
    """None, "" or "auto" -> CUDA when available, else CPU; "cuda" -> cuda:<local rank> (cuda:0 outside a
    multi-process launch); "cuda:N", "cpu", ... as given. Asking for CUDA where torch sees none is an error."""
    if requested in (None, "", "auto"):
        requested = "cuda" if torch.cuda.is_available() else "cpu"
    try:
        device = torch.device(requested)
    except RuntimeError as error:
        raise DeviceError(f"--device {requested}: {error}") from None
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise DeviceError(f"--device {requested} was requested but torch sees no CUDA device")
        if device.index is None:
            device = torch.device("cuda", max(local_rank, 0) % torch.cuda.device_count())
    return device
