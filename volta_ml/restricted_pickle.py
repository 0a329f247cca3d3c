"""The one pickle reader of volta-ml: pickles made by other programs never run code here.

`pickle.load` on a file runs whatever callables the file names, so the reader below resolves only an allow-list
of globals, enough to rebuild plain containers, strings, bytes, numbers and numpy arrays/scalars; any other
global is refused *before* anything is called, with `UnsafePickle` naming it. Used by the feature stores
(VOLTA's pickled LMDB values, `_info.npy`, td-LMDB records) and the annotation pickles (GQA targets and answer
vocabularies, retrieval hard negatives). PyTorch files (resume checkpoints) go through torch's own weights-only
unpickler instead (`engine/checkpointing.py`). Imports nothing from the package.
"""
from __future__ import annotations

import _codecs
import collections
import pickle
from typing import BinaryIO

import numpy as np

try:  # numpy >= 2 moved the pickle helpers to numpy._core; old pickles name numpy.core
    from numpy._core import multiarray as _multiarray
    from numpy._core import numeric as _numeric
except ImportError:  # pragma: no cover - numpy 1.x
    from numpy.core import multiarray as _multiarray
    from numpy.core import numeric as _numeric


class UnsafePickle(pickle.UnpicklingError):
    """The pickle names a global outside the allow-list (`.global_name`); nothing was executed."""

    def __init__(self, global_name: str, why: str = "is not allowed"):
        super().__init__(f"global {global_name} {why}")
        self.global_name = global_name


def _reconstruct(subtype, shape, dtype):
    # Only plain ndarrays: a subclass could run its own __array_finalize__/__setstate__.
    if subtype is not np.ndarray:
        raise UnsafePickle(f"{subtype!r}", "(an ndarray subclass) is not allowed")
    return _multiarray._reconstruct(np.ndarray, shape, dtype)


def _latin1_encode(text, encoding="latin1"):
    # Protocol-2 pickles store bytes as _codecs.encode(str, "latin1"); allow only that codec.
    if encoding not in ("latin1", "latin-1"):
        raise UnsafePickle(f"_codecs.encode(..., {encoding!r})", "is not allowed (only latin1)")
    return _codecs.encode(text, "latin1")


ALLOWED = {}
for _mod in ("numpy.core.multiarray", "numpy._core.multiarray"):
    ALLOWED[(_mod, "_reconstruct")] = _reconstruct
    ALLOWED[(_mod, "scalar")] = _multiarray.scalar
for _mod in ("numpy.core.numeric", "numpy._core.numeric"):
    ALLOWED[(_mod, "_frombuffer")] = _numeric._frombuffer
ALLOWED.update({
    ("numpy", "ndarray"): np.ndarray,
    ("numpy", "dtype"): np.dtype,
    ("_codecs", "encode"): _latin1_encode,
    ("builtins", "set"): set,
    ("builtins", "frozenset"): frozenset,
    ("builtins", "complex"): complex,
    ("builtins", "bytearray"): bytearray,
    ("__builtin__", "set"): set,
    ("__builtin__", "frozenset"): frozenset,
    ("collections", "OrderedDict"): collections.OrderedDict,
})


class _Restricted(pickle.Unpickler):
    def find_class(self, module, name):
        try:
            return ALLOWED[(module, name)]
        except KeyError:
            raise UnsafePickle(f"{module}.{name}") from None

    def persistent_load(self, pid):
        raise UnsafePickle("persistent id", "is not allowed")


def restricted_load(stream: BinaryIO, encoding: str = "ASCII"):
    """Unpickle `stream` allowing only containers, str/bytes, numbers and numpy arrays/scalars.

    Raises `UnsafePickle` for any other global (nothing was called), `pickle.UnpicklingError`, `EOFError`,
    `ValueError`, ... for a corrupt stream (callers turn both into one line naming their file)."""
    return _Restricted(stream, encoding=encoding).load()
