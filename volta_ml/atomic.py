"""Atomic file writes: write to a temporary file beside the target, fsync, then rename over it.

A crash or kill mid-write leaves the previous file (or none) under the final name, never a truncated one.
Used by every stage that writes results, caches or checkpoints; it imports nothing from the package.
"""
from __future__ import annotations

import json
import os
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Iterator


def _fsync_dir(directory: Path) -> None:
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


@contextmanager
def atomic_open(path: str | os.PathLike, mode: str = "wb", encoding: str | None = None,
                newline: str | None = None, durable: bool = True) -> Iterator[IO]:
    """`with atomic_open(path, "w") as f: ...` — `path` appears only once the block has succeeded.

    `durable=False` skips the fsyncs: still never a truncated file after a crash of the process, but not
    safe against power loss (for many small files inside a staging folder that is itself renamed at the end).
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        text = "b" not in mode
        with os.fdopen(fd, mode, encoding=encoding if text else None, newline=newline if text else None) as handle:
            yield handle
            handle.flush()
            if durable:
                os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    if durable:
        _fsync_dir(path.parent)


def atomic_write_json(path: str | os.PathLike, data, **dump_kwargs) -> None:
    with atomic_open(path, "w", encoding="utf-8") as f:
        json.dump(data, f, **dump_kwargs)
