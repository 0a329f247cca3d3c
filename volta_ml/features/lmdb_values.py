"""Zero-copy LMDB values that stay valid after their transaction ends.

py-lmdb can return a value without copying it (`buffers=True`), but that buffer
points into LMDB's own map of `data.mdb` and dangles once the transaction ends
or the environment closes.  Here the same file is mapped a second time with
Python's `mmap`, and each value's buffer is translated into a slice of that map:
arrays built on the slice keep the map alive by ordinary reference counting, so
a record stays valid after its store is closed, and a read copies nothing.  Both
maps share the page cache, so the second one costs address space, not memory.

The translation needs the address of LMDB's map, which only `/proc/self/maps`
tells (Linux).  Where it cannot be established, or a value lies beyond the pages
in use when the map was made, `get` returns a copy (`bytes`) instead.

Every read of a store's LMDB goes through this module (`ReadOnlyLmdb`, the environment
`base.shared_readonly_env` hands out, and `LmdbValues`), so an error LMDB raises while
reading (`lmdb.CorruptedError` for damaged data pages behind a valid header,
`lmdb.PageNotFoundError`, ...) becomes here the store's one-line `FeatureStoreError`
naming the store and the key (`read_failed`), in DataLoader workers too.
"""
from __future__ import annotations

import ctypes
import mmap
import os
import struct
import threading

import lmdb

from .records import FeatureStoreError


class _PyBuffer(ctypes.Structure):  # CPython's Py_buffer, to read a buffer's address
    _fields_ = [("buf", ctypes.c_void_p), ("obj", ctypes.py_object), ("len", ctypes.c_ssize_t),
                ("itemsize", ctypes.c_ssize_t), ("readonly", ctypes.c_int), ("ndim", ctypes.c_int),
                ("format", ctypes.c_char_p), ("shape", ctypes.c_void_p),
                ("strides", ctypes.c_void_p), ("suboffsets", ctypes.c_void_p),
                ("internal", ctypes.c_void_p)]


_get_buffer = ctypes.pythonapi.PyObject_GetBuffer
_get_buffer.argtypes = [ctypes.py_object, ctypes.POINTER(_PyBuffer), ctypes.c_int]
_release_buffer = ctypes.pythonapi.PyBuffer_Release
_release_buffer.argtypes = [ctypes.POINTER(_PyBuffer)]


def buffer_address(buf) -> int:
    view = _PyBuffer()
    ref = ctypes.byref(view)
    _get_buffer(buf, ref, 0)
    address = view.buf
    _release_buffer(ref)
    return address


# The pid of this process, refreshed in every forked child: a cheap "is this handle ours?" test.
PROCESS = {"pid": os.getpid()}
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=lambda: PROCESS.update(pid=os.getpid()))


def _mapping_base(address: int, data_file: str) -> int | None:
    """Address where byte 0 of `data_file` sits in the mapping that contains `address`."""
    try:
        with open("/proc/self/maps") as maps:
            for line in maps:
                fields = line.split(maxsplit=5)
                if len(fields) < 6 or fields[5].rstrip("\n") != data_file:
                    continue
                start, end = (int(x, 16) for x in fields[0].split("-"))
                if start <= address < end:
                    return start - int(fields[2], 16)
    except OSError:
        return None
    return None


def read_failed(store: str, err: lmdb.Error, key: bytes | None = None, after: bytes | None = None) -> FeatureStoreError:
    """The store's error for an LMDB error met while reading `key` (or while listing the records, `after` the last
    one read)."""
    detail = str(err).strip().splitlines()[0] if str(err).strip() else ""
    where = ""
    if key is None and after is not None:
        where = " while listing its records" + (f" (after {_text(after)!r})" if after else "")
    damage = DAMAGED if isinstance(err, (lmdb.CorruptedError, lmdb.PageNotFoundError, lmdb.InvalidError)) else ""
    return FeatureStoreError(store, f"cannot read the LMDB{where} ({type(err).__name__}: {detail}){damage}",
                             None if key is None else _text(key))


DAMAGED = ": its data pages are damaged (an interrupted copy or a failing disk): copy or rebuild the store"


def _text(key: bytes) -> str:
    return bytes(key).decode("utf-8", errors="replace")


class ReadOnlyLmdb:
    """A read-only environment whose reads (`begin()` -> `get`, `cursor`) raise `read_failed`'s error naming the
    store; everything else (`stat`, `info`, `close`) is the environment's. `env` is the lmdb environment,
    `data_file` its data file."""

    __slots__ = ("env", "store", "data_file")

    def __init__(self, env: lmdb.Environment, store: str, data_file: str):
        self.env, self.store, self.data_file = env, store, data_file

    def begin(self, **options) -> "_Reading":
        return _Reading(self.env.begin(**options), self)

    def __getattr__(self, name):
        return getattr(self.env, name)


class _Reading:
    """A read transaction of a `ReadOnlyLmdb` (a context manager, as lmdb's)."""

    __slots__ = ("txn", "owner")

    def __init__(self, txn, owner: ReadOnlyLmdb):
        self.txn, self.owner = txn, owner

    def __enter__(self):
        self.txn.__enter__()
        return self

    def __exit__(self, *exc):
        return self.txn.__exit__(*exc)

    def get(self, key: bytes, default=None):
        try:
            return self.txn.get(key, default)
        except lmdb.Error as err:
            raise read_failed(self.owner.store, err, key) from None

    def cursor(self) -> "_Cursor":
        return _Cursor(self.txn.cursor(), self.owner)


class _Cursor:
    """A cursor of a `_Reading`: `first`, `key`, `value`, and `keys` (all of them, in order). LMDB checks the pages
    a search from the root reaches (MDB_CORRUPTED), not the page a cursor steps onto from its neighbour: a damaged
    one there aborts the process (an assertion in mdb_cursor_next / mdb_cursor_set). So `keys` checks the tree's
    pages first (`damaged_page`) and steps only through a tree it found whole."""

    __slots__ = ("cursor", "owner")

    def __init__(self, cursor, owner: ReadOnlyLmdb):
        self.cursor, self.owner = cursor, owner

    def first(self) -> bool:
        try:
            return self.cursor.first()
        except lmdb.Error as err:
            raise read_failed(self.owner.store, err, after=b"") from None

    def key(self) -> bytes:
        return self.cursor.key()

    def value(self):
        try:
            return self.cursor.value()
        except lmdb.Error as err:
            raise read_failed(self.owner.store, err, self.cursor.key()) from None

    def keys(self):
        damage = damaged_page(self.owner.data_file, self.owner.env.stat()["psize"])
        if damage is not None:
            raise FeatureStoreError(self.owner.store, f"cannot read the LMDB while listing its records ({damage})"
                                    f"{DAMAGED}")
        last = b""
        try:
            for last in self.cursor.iternext(keys=True, values=False):
                yield last
        except lmdb.Error as err:
            raise read_failed(self.owner.store, err, after=last) from None


# LMDB's file layout (mdb.c, 64-bit builds): a page opens with its number (8 bytes), 2 bytes of padding, its
# flags, and the lower / upper bounds of its free space; pages 0 and 1 are meta pages, whose MDB_meta (after the
# page header) holds magic, version, address and map size, then the FREE and MAIN databases (48 bytes each: the
# root page number last), then the last page number and the transaction id.
_PAGE = struct.Struct("<QHHHH")
_P_BRANCH, _P_LEAF = 0x01, 0x02
_MAIN_ROOT_AT = 16 + 24 + 48 + 40
_TXNID_AT = 16 + 24 + 96 + 8
_NO_ROOT = (1 << 64) - 1


def damaged_page(data_file: str, psize: int) -> str | None:
    """What is wrong with the first page of the main tree (from the newest meta page's root, through every branch
    page) that is not the branch or leaf page its parent points to; None when every one is."""
    with open(data_file, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as pages:
        meta = max((0, 1), key=lambda m: struct.unpack_from("<Q", pages, m * psize + _TXNID_AT)[0])
        root = struct.unpack_from("<Q", pages, meta * psize + _MAIN_ROOT_AT)[0]
        pending = [] if root == _NO_ROOT else [root]
        while pending:
            pgno = pending.pop()
            if (pgno + 1) * psize > len(pages):
                return f"page {pgno} lies beyond the end of the file"
            number, _, flags, lower, _ = _PAGE.unpack_from(pages, pgno * psize)
            if number != pgno or not flags & (_P_BRANCH | _P_LEAF):
                return f"page {pgno} is not the tree page it should be: it reads as page {number}, flags {flags:#x}"
            if flags & _P_BRANCH:
                base = pgno * psize
                if not 16 <= lower <= psize:
                    return f"page {pgno} is damaged: its node table ends at {lower}, outside the page"
                for i in range((lower - 16) // 2):
                    offset = struct.unpack_from("<H", pages, base + 16 + 2 * i)[0]
                    if not lower <= offset <= psize - 8:      # a node (8-byte header) lies past the node table
                        return f"page {pgno} is damaged: its node {i} lies at {offset}, outside the page"
                    lo, hi, high = struct.unpack_from("<HHH", pages, base + offset)
                    pending.append(lo | hi << 16 | high << 32)
    return None


class LmdbValues:
    """`get(key)` for one read-only environment: a slice of a private map of the data file
    (zero-copy, never dangling), or a `bytes` copy where that map is unavailable."""

    def __init__(self, env: ReadOnlyLmdb, data_file: str):
        self.env = env
        self.pid = PROCESS["pid"]
        self.closed = False
        self._local = threading.local()  # LMDB transactions must not be shared across threads
        self._view, self._base, self._size = None, 0, 0
        data_file = os.path.realpath(data_file)
        with env.begin(buffers=True) as txn:
            cursor = txn.cursor()
            probe = cursor.value() if cursor.first() else b""
            if len(probe) == 0:
                return  # nothing to read anyway
            address = buffer_address(probe)
            base = _mapping_base(address, data_file)
            if base is None:
                return
            # Map only the pages in use: VOLTA's writers (writemap=True) leave a sparse 1 TiB file. A data file
            # shorter than that was refused when the environment was opened (base.open_lmdb_readonly).
            used = (env.info()["last_pgno"] + 1) * env.stat()["psize"]
            with open(data_file, "rb") as f:
                size = min(os.fstat(f.fileno()).st_size, used)
                view = memoryview(mmap.mmap(f.fileno(), size, access=mmap.ACCESS_READ))
            offset = address - base
            sample = min(len(probe), 4096)
            if 0 <= offset and offset + sample <= size and view[offset:offset + sample] == probe[:sample]:
                self._view, self._base, self._size = view, base, size

    @property
    def zero_copy(self) -> bool:
        return self._view is not None

    def close(self) -> None:
        """Forget the environment (the caller closes it); values already returned stay valid."""
        self.closed = True
        self._view = None
        self._local = threading.local()

    def _begin(self):
        # One long read transaction per thread: stores are immutable once complete, and
        # beginning a transaction per read would cost more than the read itself.
        local = self._local
        local.txn = self.env.env.begin(buffers=True)   # lmdb's own: the hot path maps its errors in `get`
        local.pybuf = _PyBuffer()
        local.pybuf_ref = ctypes.byref(local.pybuf)
        return local

    def get(self, key: bytes):
        local = self._local
        try:
            txn = local.txn
        except AttributeError:
            txn = self._begin().txn
        try:
            value = txn.get(key)
        except lmdb.Error as err:
            del local.txn          # LMDB may have invalidated it: the next read begins a new one
            txn.abort()
            raise read_failed(self.env.store, err, key) from None
        if value is None:
            return None
        if self._view is not None and value:
            _get_buffer(value, local.pybuf_ref, 0)  # buffer_address(), inlined: the hot path
            start = local.pybuf.buf - self._base
            _release_buffer(local.pybuf_ref)
            end = start + len(value)
            if 0 <= start and end <= self._size:
                return self._view[start:end]
        return bytes(value)
