"""Atomic file writes: write to a temporary file beside the target, fsync, then rename over it.

A crash or kill mid-write leaves the previous file (or none) under the final name, never a truncated one.
Used by every stage that writes results, caches or checkpoints; it imports nothing from the package.
"""
from __future__ import annotations

import errno
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


# errors of the disk, not of the program (also raised while a block is still writing)
DISK_ERRNOS = {errno.ENOSPC, errno.EROFS, errno.EDQUOT, errno.EFBIG}


class WriteError(OSError):
    """A file could not be written (disk full, read-only, quota): names the file, keeps the errno."""

    def __init__(self, path: Path, cause: OSError, unchanged: bool = True):
        free = ""
        try:
            import shutil
            free = f", {shutil.disk_usage(path.parent).free / 2**20:.1f} MiB free there"
        except OSError:
            pass
        kept = f"; the previous {path.name} (if any) is unchanged" if unchanged else ""
        super().__init__(cause.errno, f"cannot write {path}: {cause.strerror or cause}{free}{kept}")
        self.path = path

    def __str__(self) -> str:
        return self.strerror


@contextmanager
def atomic_open(path: str | os.PathLike, mode: str = "wb", encoding: str | None = None,
                newline: str | None = None, durable: bool = True) -> Iterator[IO]:
    """`with atomic_open(path, "w") as f: ...` — `path` appears only once the block has succeeded.

    `durable=False` skips the fsyncs: still never a truncated file after a crash of the process, but not
    safe against power loss (for many small files inside a staging folder that is itself renamed at the end).
    """
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    except OSError as error:
        raise WriteError(path, error) from error
    written = False  # past the caller's block: any OSError now is a failure to write `path`
    try:
        text = "b" not in mode
        with os.fdopen(fd, mode, encoding=encoding if text else None, newline=newline if text else None) as handle:
            yield handle
            written = True
            handle.flush()
            if durable:
                os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException as error:
        Path(tmp).unlink(missing_ok=True)
        # inside the block only a disk error is about `path` (reading a missing input there is not)
        if (isinstance(error, OSError) and not isinstance(error, WriteError) and error.errno is not None
                and (written or error.errno in DISK_ERRNOS)):
            raise WriteError(path, error) from error
        raise
    if durable:
        _fsync_dir(path.parent)


def atomic_write_json(path: str | os.PathLike, data, **dump_kwargs) -> None:
    with atomic_open(path, "w", encoding="utf-8") as f:
        json.dump(data, f, **dump_kwargs)
