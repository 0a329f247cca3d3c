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
"""
from __future__ import annotations

import ctypes
import mmap
import os
import threading

import lmdb


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


class LmdbValues:
    """`get(key)` for one read-only environment: a slice of a private map of the data file
    (zero-copy, never dangling), or a `bytes` copy where that map is unavailable."""

    def __init__(self, env: lmdb.Environment, data_file: str):
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
        local.txn = self.env.begin(buffers=True)
        local.pybuf = _PyBuffer()
        local.pybuf_ref = ctypes.byref(local.pybuf)
        return local

    def get(self, key: bytes):
        local = self._local
        try:
            txn = local.txn
        except AttributeError:
            txn = self._begin().txn
        value = txn.get(key)
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
