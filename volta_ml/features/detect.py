"""Which reader a path needs, decided from what is on disk (never from try/except decoding, never from a name), and
`open_store`. An LMDB is recognised by its data file's header in both of LMDB's layouts: a directory holding
`data.mdb`, or one file (`subdir=False`, as tensorpack's `LMDBSerializer.save` and VOLTA's h5_to_td-lmdb.py write
it, whatever its name)."""
from __future__ import annotations

import os

from .base import is_lmdb_file, lmdb_file_kind, shared_readonly_env
from .formats import lmdb_markers, reader_class
from .records import FeatureStoreError, IncompleteStoreError

_HDF5_SIGNATURE = b"\x89HDF\r\n\x1a\n"


def _lmdb_kind(path: str) -> str:
    env = shared_readonly_env(path)  # kept open: the reader opened next reuses it
    if env.stat()["entries"] == 0:
        raise IncompleteStoreError(path, "empty LMDB (no records)")
    with env.begin() as txn:
        for fmt, marker in lmdb_markers():
            if txn.get(marker) is not None:
                return fmt
        cursor = txn.cursor()
        first = cursor.key() if cursor.first() else b""
    if first.isdigit() and len(first) == 8:
        raise IncompleteStoreError(path, "td-LMDB without its b'__keys__' record: half-written "
                                   "(tensorpack writes it last)")
    raise IncompleteStoreError(path, "LMDB without b'keys' or a volta-ml metadata record: a "
                               "half-written VOLTA LMDB, or not a feature store")


def detect_format(path: str) -> str:
    """'native' | 'volta-lmdb' | 'td-lmdb' | 'h5' | 'npy' | 'tsv'."""
    path = str(path)
    if not os.path.exists(path):
        for suffix in (".partial", ".partial.h5"):
            if os.path.exists(path + suffix):
                raise IncompleteStoreError(path, f"store not found, but {path + suffix} exists: its "
                                           "writer never finished (rerun it to resume)")
        raise FileNotFoundError(f"feature store {path} does not exist")
    if os.path.isdir(path):
        data_file = os.path.join(path, "data.mdb")
        if os.path.exists(data_file):
            if not is_lmdb_file(data_file):
                raise FeatureStoreError(path, "data.mdb is not an LMDB data file (no LMDB header): corrupt, "
                                              "or not an LMDB")
            return _lmdb_kind(path)
        names = os.listdir(path)
        if any(n.endswith(".npy") for n in names):
            return "npy"
        if not names:
            raise IncompleteStoreError(path, "empty directory")
        raise FeatureStoreError(path, "directory holds neither an LMDB (data.mdb) nor .npy files")
    with open(path, "rb") as f:
        head = f.read(8)
    if head == _HDF5_SIGNATURE:
        return "h5"
    kind = lmdb_file_kind(path)
    if kind == "data":   # LMDB's one-file layout
        return _lmdb_kind(path)
    if kind == "lock":
        raise FeatureStoreError(path, "an LMDB lock file, not the LMDB: pass the LMDB itself (the file or "
                                      "directory it sits beside)")
    if os.path.getsize(path) == 0:
        raise IncompleteStoreError(path, "empty file")
    if path.endswith(".mdb"):
        raise FeatureStoreError(path, "not an LMDB data file (no LMDB header): corrupt, or not an LMDB")
    if path.endswith((".tsv", ".tsv.txt")) or b"\t" in _first_line(path):
        return "tsv"
    raise FeatureStoreError(path, "unknown feature file format: neither H5 nor LMDB (no header of either), "
                                  "nor TSV (no tab in its first line)")


def _first_line(path: str, limit: int = 1 << 16) -> bytes:
    with open(path, "rb") as f:
        return f.readline(limit)


def open_store(path, fmt: str | None = None, feature_dim: int | None = None):
    """Open a feature store read-only; `fmt` overrides detection, `feature_dim` is enforced."""
    path = str(path)
    fmt = fmt or detect_format(path)
    return reader_class(fmt)(path, expected_dim=feature_dim)
