"""A restricted unpickler for feature files downloaded from elsewhere.

VOLTA stores pickled dicts in LMDB values, `_info.npy` files and td-LMDB
records.  `pickle.loads` on such a file runs whatever callables the file names,
so here only the globals needed to rebuild plain containers, strings, numbers
and numpy arrays/scalars are resolved; any other global is refused *before*
anything is called, with an error naming the store and key.
"""
from __future__ import annotations

import _codecs
import collections
import io
import pickle

import numpy as np

from .records import FeatureStoreError

try:  # numpy >= 2 moved the pickle helpers to numpy._core; old pickles name numpy.core
    from numpy._core import multiarray as _multiarray
    from numpy._core import numeric as _numeric
except ImportError:  # pragma: no cover - numpy 1.x
    from numpy.core import multiarray as _multiarray
    from numpy.core import numeric as _numeric


class UnsafePickleError(FeatureStoreError):
    """The pickle names a global outside the allow-list; nothing was executed."""


def _reconstruct(subtype, shape, dtype):
    # Only plain ndarrays: a subclass could run its own __array_finalize__/__setstate__.
    if subtype is not np.ndarray:
        raise pickle.UnpicklingError(f"refusing ndarray subclass {subtype!r}")
    return _multiarray._reconstruct(np.ndarray, shape, dtype)


def _latin1_encode(text, encoding="latin1"):
    # Protocol-2 pickles store bytes as _codecs.encode(str, "latin1"); allow only that codec.
    if encoding not in ("latin1", "latin-1"):
        raise pickle.UnpicklingError(f"refusing _codecs.encode with encoding {encoding!r}")
    return _codecs.encode(text, "latin1")


_ALLOWED = {}
for _mod in ("numpy.core.multiarray", "numpy._core.multiarray"):
    _ALLOWED[(_mod, "_reconstruct")] = _reconstruct
    _ALLOWED[(_mod, "scalar")] = _multiarray.scalar
for _mod in ("numpy.core.numeric", "numpy._core.numeric"):
    _ALLOWED[(_mod, "_frombuffer")] = _numeric._frombuffer
_ALLOWED.update({
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


class _RestrictedUnpickler(pickle.Unpickler):
    def find_class(self, module, name):
        try:
            return _ALLOWED[(module, name)]
        except KeyError:
            raise pickle.UnpicklingError(
                f"global {module}.{name} is not allowed in a feature file") from None

    def persistent_load(self, pid):
        raise pickle.UnpicklingError("persistent ids are not allowed in a feature file")


def safe_loads(data: bytes, store: str, key: str | None = None, encoding: str = "latin1"):
    """Unpickle `data` allowing only containers, str/bytes, numbers and numpy arrays."""
    return safe_load(io.BytesIO(data), store, key, encoding)


def safe_load(stream, store: str, key: str | None = None, encoding: str = "latin1"):
    try:
        return _RestrictedUnpickler(stream, encoding=encoding).load()
    except pickle.UnpicklingError as err:
        if "not allowed" in str(err) or "refusing" in str(err):
            raise UnsafePickleError(store, f"unsafe pickle refused ({err}); nothing was executed",
                                    key) from None
        raise FeatureStoreError(store, f"corrupt pickle: {err}", key) from None
    except (EOFError, ValueError, TypeError, IndexError, AttributeError, OverflowError,
            MemoryError, UnicodeDecodeError) as err:
        raise FeatureStoreError(store, f"corrupt or truncated pickle: {type(err).__name__}: {err}",
                                key) from None
