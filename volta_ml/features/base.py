"""What all stores share: a read-only Mapping, opened lazily once per process.

DataLoader workers (fork or spawn) and `multiprocessing` copy the store object;
file handles must not cross that boundary (an LMDB environment or an HDF5 file
opened before fork is unsafe in the child).  Each store therefore keeps only
paths and small metadata in its picklable state and (re)opens its handle the
first time it is used in a process.
"""
from __future__ import annotations

import os
import struct
from collections.abc import Mapping
from typing import Iterator

import lmdb

from .lmdb_values import PROCESS, LmdbValues, ReadOnlyLmdb
from .records import FeatureRecord, FeatureDimError, FeatureStoreError, MissingImageError


class FeatureStore(Mapping):
    """Read-only mapping image id (str) -> FeatureRecord."""

    format_name = "abstract"

    def __init__(self, path: str, expected_dim: int | None = None):
        self.path = str(path)
        self.expected_dim = expected_dim
        self._handle = None
        self._handle_pid = None

    # -- per-process handle -------------------------------------------------
    def _open_handle(self):  # pragma: no cover - every subclass overrides
        raise NotImplementedError

    def _close_handle(self, handle) -> None:
        close = getattr(handle, "close", None)
        if close is not None:
            close()

    @property
    def handle(self):
        pid = os.getpid()
        if self._handle is None or self._handle_pid != pid:
            # A handle inherited through fork belongs to the parent: drop it, never close it here.
            self._handle = self._open_handle()
            self._handle_pid = pid
        return self._handle

    def close(self) -> None:
        if self._handle is not None and self._handle_pid == os.getpid():
            self._close_handle(self._handle)
        self._handle = None
        self._handle_pid = None

    def __getstate__(self):
        state = dict(self.__dict__)
        state["_handle"] = None
        state["_handle_pid"] = None
        state.pop("_values", None)  # a process-local LMDB reader (lmdb_values)
        return state

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # -- mapping --------------------------------------------------------------
    def keys_list(self) -> list[str]:
        """All image ids, in store order."""
        raise NotImplementedError

    def read(self, image_id: str) -> FeatureRecord | None:
        """The record, or None when the id is absent."""
        raise NotImplementedError

    def __getitem__(self, image_id) -> FeatureRecord:
        record = self.read(str(image_id))
        if record is None:
            raise MissingImageError(str(image_id), self.path, self._near_match_pool())
        if self.expected_dim is not None and record.feature_dim != self.expected_dim:
            raise FeatureDimError(self.path, f"feature dimension {record.feature_dim} but "
                                  f"{self.expected_dim} expected", str(image_id))
        return record

    def get(self, image_id, default=None):
        # Mapping.get would build the near-match message of a KeyError just to discard it.
        return self[image_id] if image_id in self else default

    def _near_match_pool(self):
        try:
            return self.keys_list()
        except Exception:  # a broken key index must not hide the real KeyError
            return None

    def __iter__(self) -> Iterator[str]:
        return iter(self.keys_list())

    def __len__(self) -> int:
        return len(self.keys_list())

    def __contains__(self, image_id) -> bool:
        return self.read(str(image_id)) is not None

    def describe(self) -> dict:
        """Format-level facts for `volta-ml features inspect`."""
        return {"format": self.format_name, "path": self.path, "images": len(self)}

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.path!r})"


# An LMDB data file starts with its first meta page: a 16-byte page header (64-bit builds) whose flags hold
# P_META, then the meta record, which opens with LMDB's magic number (a lock file holds it at byte 0 instead).
_LMDB_MAGIC = 0xBEEFC0DE
_LMDB_MAGIC_AT = 16
_LMDB_MAGICS = (struct.pack("<I", _LMDB_MAGIC), struct.pack(">I", _LMDB_MAGIC))


def lmdb_file_kind(path: str) -> str | None:
    """"data" for an LMDB data file, "lock" for an LMDB lock file, None for anything else: by the file's header,
    never by its name."""
    try:
        with open(path, "rb") as f:
            head = f.read(_LMDB_MAGIC_AT + 4)
    except OSError:
        return None
    if head[_LMDB_MAGIC_AT:] in _LMDB_MAGICS:
        return "data"
    return "lock" if head[:4] in _LMDB_MAGICS else None


def is_lmdb_file(path: str) -> bool:
    """Whether the file at `path` is an LMDB data file, by its header (never by its name)."""
    return lmdb_file_kind(path) == "data"


def lmdb_data_file(path: str) -> str:
    """The data file of the LMDB at `path`: `<path>/data.mdb` for LMDB's directory layout, `path` itself for its
    one-file layout (`subdir=False`: what tensorpack's `LMDBSerializer.save` and VOLTA's h5_to_td-lmdb.py write)."""
    return os.path.join(path, "data.mdb") if os.path.isdir(path) else path


def open_lmdb_readonly(path: str) -> lmdb.Environment:
    """A read-only environment of the LMDB at `path` (either layout). A file that is not an LMDB, or whose data
    file is shorter than the pages its last commit uses (a copy or download cut short: reading the missing pages
    would kill the process with SIGBUS), is refused here, before anything is read."""
    subdir = os.path.isdir(path)
    try:
        # lock=False: many readers, no writer; readahead=False: random access is the common case.
        env = lmdb.open(path, subdir=subdir, readonly=True, lock=False, readahead=False,
                        meminit=False, max_readers=4096, max_dbs=0)
    except lmdb.Error as err:   # py-lmdb's message starts with the path: said once
        detail = str(err).removeprefix(f"{path}: ").removeprefix(f"{lmdb_data_file(path)}: ")
        raise FeatureStoreError(path, f"not a readable LMDB: {detail}") from None
    data_file = lmdb_data_file(path)
    used = (env.info()["last_pgno"] + 1) * env.stat()["psize"]   # both read from the meta page alone
    size = os.path.getsize(data_file)
    if size < used:
        env.close()
        where = "data.mdb" if subdir else "the file"
        raise FeatureStoreError(path, f"truncated LMDB: {where} holds {size} bytes but its records use {used} "
                                      "(an interrupted copy, download or write); copy it again")
    return env


# py-lmdb refuses to open one environment twice in a process, and a forked child
# inherits the parent's registration.  So read-only environments are shared per
# process: every store on the same path uses one, and a child closes the copy it
# inherited (safe with lock=False: it only unmaps the child's own mapping) before
# opening its own. What is handed out is a `ReadOnlyLmdb`: an LMDB error met while
# reading through it is the store's one-line error naming the key (lmdb_values).
_SHARED_ENVS: dict[str, tuple[int, ReadOnlyLmdb]] = {}


def shared_readonly_env(path: str) -> ReadOnlyLmdb:
    pid = os.getpid()
    entry = _SHARED_ENVS.get(path)  # fast path: callers on the hot path pass the real path
    if entry is not None and entry[0] == pid:
        return entry[1]
    key = os.path.realpath(path)
    entry = _SHARED_ENVS.get(key)
    if entry is not None:
        if entry[0] == pid:
            return entry[1]
        try:
            entry[1].close()
        except lmdb.Error:
            pass
    env = ReadOnlyLmdb(open_lmdb_readonly(key), path, lmdb_data_file(key))
    _SHARED_ENVS[key] = (pid, env)
    return env


_SHARED_VALUES: dict[str, LmdbValues] = {}


def shared_lmdb_values(path: str) -> LmdbValues:
    """Zero-copy `get` on this process's shared environment of `path` (see lmdb_values)."""
    env = shared_readonly_env(path)
    values = _SHARED_VALUES.get(path)
    if values is None or values.env is not env:  # first use, a new process or a reopened store
        values = _SHARED_VALUES[path] = LmdbValues(env, lmdb_data_file(path))
    return values


def release_shared_env(path: str) -> None:
    """Close this process's shared reader of `path` (before writing to it, or on close())."""
    real = os.path.realpath(path)
    values = _SHARED_VALUES.pop(real, None)
    if values is not None:
        values.close()
    entry = _SHARED_ENVS.pop(real, None)
    if entry is not None and entry[0] == os.getpid():
        entry[1].close()


class LmdbStoreMixin:
    """Handle = this process's shared read-only environment of `self.path`."""

    def _real(self) -> str:
        # The real path fixed at first use, so a later chdir cannot change it.
        real = self.__dict__.get("_real_path")
        if real is None:
            real = self._real_path = os.path.realpath(self.path)
        return real

    @property
    def handle(self):
        # Looked up on every use (a dict hit): a writer in this process may have closed it.
        return shared_readonly_env(self._real())

    def get_value(self, key: bytes):
        """The value under `key` (a zero-copy read-only buffer where possible), or None."""
        values = self.__dict__.get("_values")
        if values is None or values.closed or values.pid != PROCESS["pid"]:
            values = self._values = shared_lmdb_values(self._real())
        return values.get(key)

    def close(self) -> None:
        release_shared_env(self.path)


class StoreWriter:
    """Context-manager protocol shared by every writer: commit on success, keep a resumable partial
    store (never a store that passes for complete) when the block raises."""

    def close(self) -> None:
        raise NotImplementedError

    def abort(self) -> None:
        raise NotImplementedError

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        if exc_type is None:
            self.close()
        else:
            self.abort()


def create_fresh_lmdb(path: str, overwrite: bool) -> lmdb.Environment:
    """An empty LMDB directory at `path` for a legacy-layout writer (refuses to clobber without overwrite).

    No writemap: VOLTA's writemap=True is what made data.mdb a sparse 1 TiB file."""
    release_shared_env(path)
    if os.path.exists(os.path.join(path, "data.mdb")):
        if not overwrite:
            raise FileExistsError(f"{path} already exists; pass overwrite=True")
        import shutil
        shutil.rmtree(path)
    os.makedirs(path, exist_ok=True)
    return lmdb.open(path, map_size=1 << 40, writemap=False, meminit=False)
