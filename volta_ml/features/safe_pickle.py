"""VOLTA's pickled feature records (LMDB values, `_info.npy` files, td-LMDB records) through the package's one
restricted pickle reader (`volta_ml/restricted_pickle.py`): only plain containers, strings, numbers and numpy
arrays are rebuilt; any other global is refused before anything is called, with an error naming store and key.
"""
from __future__ import annotations

import io
import pickle

from volta_ml.restricted_pickle import UnsafePickle, restricted_load

from .records import FeatureStoreError


class UnsafePickleError(FeatureStoreError):
    """The pickle names a global outside the allow-list; nothing was executed."""


def safe_loads(data: bytes, store: str, key: str | None = None, encoding: str = "latin1"):
    """Unpickle `data` allowing only containers, str/bytes, numbers and numpy arrays."""
    return safe_load(io.BytesIO(data), store, key, encoding)


def safe_load(stream, store: str, key: str | None = None, encoding: str = "latin1"):
    try:
        return restricted_load(stream, encoding=encoding)
    except UnsafePickle as err:
        raise UnsafePickleError(store, f"unsafe pickle refused ({err}); nothing was executed", key) from None
    except pickle.UnpicklingError as err:
        raise FeatureStoreError(store, f"corrupt pickle: {err}", key) from None
    except (EOFError, ValueError, TypeError, IndexError, AttributeError, OverflowError,
            MemoryError, UnicodeDecodeError) as err:
        raise FeatureStoreError(store, f"corrupt or truncated pickle: {type(err).__name__}: {err}",
                                key) from None
