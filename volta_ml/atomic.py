"""Atomic file writes: write to a temporary file beside the target, fsync, then rename over it.

A crash or kill mid-write leaves the previous file (or none) under the final name, never a truncated one.
`replace_folder` does the same for a whole folder (a training run's `hf_best/` export). A write that fails
because of the disk (full, read-only, quota) raises `WriteError`, naming the file, whatever library wrote it
(`disk_error`: torch's zip writer and safetensors wrap the OSError in errors of their own).
Used by every stage that writes results, caches or checkpoints; it imports nothing from the package.
"""
from __future__ import annotations

import ctypes
import errno
import json
import os
import re
import shutil
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Callable, Iterator


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


# Rust's std::io::Error as safetensors and tokenizers print it: "... No space left on device (os error 28)"
_RUST_OS_ERROR = re.compile(r"\(os error (\d+)\)")


def disk_error(error: BaseException) -> OSError | None:
    """The disk error (errno in DISK_ERRNOS) behind `error`: `error` itself, an OSError in its chain (torch's
    zip writer raises a RuntimeError while handling the OSError of its write), one that a text names the way Rust's
    I/O errors do (safetensors' `SafetensorError: ... (os error 28)`), or one a failed rank reported
    (torch.distributed.checkpoint's CheckpointException keeps each rank's (exception, traceback) in `failures`);
    None otherwise."""
    todo, seen = [error], set()
    while todo:
        current = todo.pop()
        if not isinstance(current, BaseException) or id(current) in seen:
            continue
        seen.add(id(current))
        if isinstance(current, OSError):
            if current.errno in DISK_ERRNOS:
                return current
        else:
            found = _RUST_OS_ERROR.search(str(current))
            if found and int(found.group(1)) in DISK_ERRNOS:
                code = int(found.group(1))
                cause = OSError(code, os.strerror(code))
                cause.in_text_of = current     # the library names no file (safetensors removes its own)
                return cause
        failures = getattr(current, "failures", None)
        todo += [current.__cause__, current.__context__]
        todo += [pair[0] for pair in failures.values()] if isinstance(failures, dict) else []
    return None


class WriteError(OSError):
    """A file could not be written (disk full, read-only, quota): names the file, keeps the errno.
    `kept` names what is unchanged when it is not the file itself (a folder swapped in whole)."""

    def __init__(self, path: Path, cause: OSError, unchanged: bool = True, kept: Path | None = None):
        free = ""
        try:
            free = f", {shutil.disk_usage(_existing(path)).free / 2**20:.1f} MiB free there"
        except OSError:
            pass
        kept_text = f"; the previous {(kept or path).name} (if any) is unchanged" if unchanged else ""
        super().__init__(cause.errno, f"cannot write {path}: {cause.strerror or cause}{free}{kept_text}")
        self.path = path

    def __str__(self) -> str:
        return self.strerror


def _existing(path: Path) -> Path:
    """`path`'s nearest folder that exists (where the free space is measured)."""
    for folder in path.parents:
        if folder.is_dir():
            return folder
    return Path(".")


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
        cause = disk_error(error) if isinstance(error, Exception) and not isinstance(error, OSError) else None
        if cause is not None:       # torch.save's RuntimeError from a full disk
            raise WriteError(path, cause) from error
        raise
    if durable:
        _fsync_dir(path.parent)


def atomic_write_json(path: str | os.PathLike, data, **dump_kwargs) -> None:
    with atomic_open(path, "w", encoding="utf-8") as f:
        json.dump(data, f, **dump_kwargs)


# --- a whole folder --------------------------------------------------------------------------------------------
def replace_folder(path: str | os.PathLike, write: Callable[[Path], None]) -> None:
    """Make `path` the folder that `write(folder)` fills, so that after the first call a complete folder is on
    disk at every instant, whatever fails or is killed:

    1. finish a replacement a kill interrupted (`finish_replace`), then `write` into `.<name>.partial`;
    2. rename it to `.<name>.new`: complete from here on;
    3. swap it in: one atomic exchange of the two folders (Linux `renameat2(RENAME_EXCHANGE)`), or, on a file
       system without it (NFS, ...), `path` -> `.<name>.old` and `.<name>.new` -> `path`; then the previous
       folder is removed.

    A kill between the two renames of 3 leaves both complete folders beside each other; the next call (or
    `finish_replace`) puts the newer one under `path`. A folder is only ever deleted when a complete one is
    under `path`. A disk error while writing raises `WriteError` naming the file, with `path` unchanged.
    """
    path = Path(path)
    partial, new, _ = _siblings(path)
    finish_replace(path)
    shutil.rmtree(partial, ignore_errors=True)
    try:
        write(partial)
        _fsync_tree(partial)
    except Exception as error:  # noqa: BLE001 - a disk error is named, anything else keeps its traceback
        cause = disk_error(error)
        if cause is None or isinstance(error, WriteError):
            raise
        raise WriteError(_file_written(partial, cause), cause, kept=path) from error
    os.rename(partial, new)
    _fsync_dir(path.parent)
    finish_replace(path)


def finish_replace(path: str | os.PathLike) -> None:
    """Complete what `replace_folder` was doing when it was killed: a complete `.<name>.new` goes under `path`,
    a lone `.<name>.old` back under `path`; leftovers are removed only when `path` is complete."""
    path = Path(path)
    partial, new, old = _siblings(path)
    if new.is_dir():
        if path.is_dir():
            shutil.rmtree(old, ignore_errors=True)   # `path` is complete: an older copy is not needed
            if _exchange(new, path):
                os.rename(new, old)                  # the previous folder, marked as such before it is deleted
            else:
                os.rename(path, old)
                os.rename(new, path)
        else:
            os.rename(new, path)
        _fsync_dir(path.parent)
    elif not path.is_dir() and old.is_dir():
        os.rename(old, path)
        _fsync_dir(path.parent)
    if path.is_dir():
        shutil.rmtree(old, ignore_errors=True)


def _siblings(path: Path) -> tuple[Path, Path, Path]:
    return tuple(path.with_name(f".{path.name}.{state}") for state in ("partial", "new", "old"))


def _exchange(a: Path, b: Path) -> bool:
    """Swap two paths atomically (Linux renameat2 RENAME_EXCHANGE); False where the system or file system
    cannot."""
    try:
        renameat2 = ctypes.CDLL(None, use_errno=True).renameat2
    except (OSError, AttributeError):
        return False
    at_fdcwd, rename_exchange = -100, 2
    if renameat2(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), rename_exchange) == 0:
        return True
    code = ctypes.get_errno()
    if code in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP, errno.ENOTSUP):
        return False
    raise OSError(code, os.strerror(code), str(a), None, str(b))


def _fsync_tree(folder: Path) -> None:
    for file in sorted(p for p in folder.rglob("*") if p.is_file()):
        fd = os.open(file, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    for sub in [folder, *(p for p in folder.rglob("*") if p.is_dir())]:
        _fsync_dir(sub)


def _file_written(folder: Path, cause: OSError) -> Path:
    """The file a disk error was about: the one it names, else the file written last under `folder` (Python's
    `write()` of an open file names none), else `folder` (a library's own I/O error, `disk_error`)."""
    if cause.filename:
        return Path(os.fsdecode(cause.filename))
    if getattr(cause, "in_text_of", None) is not None:
        return folder
    files = [p for p in folder.rglob("*") if p.is_file()] if folder.is_dir() else []
    return max(files, key=lambda p: p.stat().st_mtime_ns) if files else folder
