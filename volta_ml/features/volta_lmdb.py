"""VOLTA's keyed LMDB ("format: lmdb"): one pickled dict per image plus a b"keys" list.

Two producers, told apart by the *type* of each array field:
- `h5_to_lmdb.py` stores raw numpy arrays (`features`, `boxes`, ...), numpy
  int64 `img_w`/`img_h`, and `img_id`;
- `npy_to_lmdb.py` stores base64 bytes for `features`/`boxes`, Python ints for
  `img_w`/`img_h`/`num_boxes`, raw `objects`/`cls_prob`, and `feature_path`.
VOLTA guesses "base64 first, raw on any exception", which can silently decode a
raw buffer as garbage; here bytes/str means base64 (decoded strictly) and an
ndarray means raw, nothing else is accepted.  Lookups are a direct LMDB get
(O(1)), never a search of the keys list; values go through the restricted
unpickler.
"""
from __future__ import annotations

import base64
import binascii

try:  # SIMD base64 (20x faster on 300 KB feature buffers); same strict semantics
    from pybase64 import b64decode as _b64decode
except ImportError:  # pragma: no cover - optional speed-up
    from base64 import b64decode as _b64decode
import pickle

import numpy as np

from .base import (FeatureStore, LmdbStoreMixin, StoreWriter, create_fresh_lmdb,
                   shared_readonly_env)
from .records import (FeatureDimError, FeatureStoreError, IncompleteStoreError, make_record, whole_pixels)
from .safe_pickle import safe_loads

KEYS_KEY = b"keys"
_IMAGE_FIELDS = ("features", "boxes", "img_w", "img_h")


def decode_array_field(store: str, key: str, name: str, value, dtype=np.float32) -> np.ndarray:
    """Raw ndarray -> itself; bytes/str -> strict base64 of a little-endian buffer."""
    if isinstance(value, np.ndarray):
        return value
    if isinstance(value, (bytes, bytearray, str)):
        try:
            raw = _b64decode(value, validate=True)
        except (binascii.Error, ValueError) as err:
            raise FeatureStoreError(store, f"field {name!r} is not valid base64 ({err})", key) from None
        itemsize = np.dtype(dtype).itemsize
        if len(raw) % itemsize:
            raise FeatureStoreError(store, f"field {name!r}: {len(raw)} decoded bytes is not a "
                                    f"multiple of {itemsize} ({np.dtype(dtype).name})", key)
        return np.frombuffer(raw, dtype=np.dtype(dtype).newbyteorder("<"))
    raise FeatureStoreError(store, f"field {name!r} has unsupported type {type(value).__name__}", key)


def record_from_volta_dict(store: str, key: str, item, expected_dim: int | None = None):
    """Turn one VOLTA record dict (keyed LMDB or td-LMDB) into a FeatureRecord."""
    if not isinstance(item, dict):
        raise FeatureStoreError(store, f"record is a {type(item).__name__}, expected a dict", key)
    item = {k.decode() if isinstance(k, bytes) else k: v for k, v in item.items()}
    missing = [f for f in _IMAGE_FIELDS if f not in item]
    if missing:
        raise FeatureStoreError(store, f"record lacks field(s) {missing}", key)
    boxes = decode_array_field(store, key, "boxes", item["boxes"])
    features = decode_array_field(store, key, "features", item["features"])
    if features.ndim == 1 or boxes.ndim == 1:  # base64 buffers are flat: recover the shapes
        if boxes.ndim == 1:
            if boxes.size % 4:
                raise FeatureStoreError(store, f"{boxes.size} box values is not a multiple of 4", key)
            boxes = boxes.reshape(-1, 4)
        n = boxes.shape[0]
        if features.ndim == 1:
            if n == 0 or features.size % n:
                raise FeatureStoreError(
                    store, f"{features.size} feature values do not split into {n} boxes", key)
            features = features.reshape(n, -1)
    if expected_dim is not None and features.shape[-1] != expected_dim:
        raise FeatureDimError(store, f"feature dimension {features.shape[-1]} but "
                              f"{expected_dim} expected", key)
    extra = {k: v for k, v in item.items() if k not in _IMAGE_FIELDS}
    return make_record(store, key, features, boxes, item["img_w"], item["img_h"], extra)


class VoltaLmdbStore(LmdbStoreMixin, FeatureStore):
    format_name = "volta-lmdb"

    def __init__(self, path: str, expected_dim: int | None = None):
        super().__init__(path, expected_dim)
        env = shared_readonly_env(self.path)
        entries = env.stat()["entries"]
        with env.begin() as txn:
            has_keys = txn.get(KEYS_KEY) is not None
        if entries == 0:
            raise IncompleteStoreError(self.path, "empty LMDB (no records)")
        if not has_keys:
            raise IncompleteStoreError(
                self.path, "no b'keys' record: a half-written VOLTA LMDB (the converters write "
                "it last) or not a VOLTA feature LMDB")
        self._keys = None
        self.encoding = None  # "raw" or "base64", learnt from the first record read

    def keys_list(self) -> list[str]:
        if self._keys is None:
            with self.handle.begin() as txn:
                raw = txn.get(KEYS_KEY)
            keys = safe_loads(raw, self.path, "keys")
            if not isinstance(keys, (list, tuple)):
                raise FeatureStoreError(self.path, "b'keys' does not hold a list", "keys")
            self._keys = [k.decode() if isinstance(k, bytes) else str(k) for k in keys]
        return self._keys

    def __contains__(self, image_id) -> bool:
        key = str(image_id).encode()
        if key == KEYS_KEY:
            return False
        with self.handle.begin() as txn:
            return txn.get(key) is not None

    def read(self, image_id: str):
        key = image_id.encode()
        value = None if key == KEYS_KEY else self.get_value(key)
        if value is None:
            return None
        item = safe_loads(value, self.path, image_id)
        record = record_from_volta_dict(self.path, image_id, item, self.expected_dim)
        if self.encoding is None:
            self.encoding = "raw" if isinstance(item.get("features"), np.ndarray) else "base64"
        return record

    def describe(self) -> dict:
        info = super().describe()
        if self.encoding is None and len(self):
            self.read(self.keys_list()[0])
        info["encoding"] = {"raw": "raw arrays (h5_to_lmdb)", "base64": "base64 (npy_to_lmdb)"}.get(
            self.encoding, self.encoding)
        return info


def _b64(array: np.ndarray, dtype) -> bytes:
    return base64.b64encode(np.ascontiguousarray(array, dtype=np.dtype(dtype).newbyteorder("<")))


class VoltaLmdbWriter(StoreWriter):
    """Writes VOLTA's keyed layout so VOLTA itself can read the result.

    encoding="raw" mirrors `h5_to_lmdb.py` (raw arrays, numpy int64 sizes, `img_id`);
    encoding="base64" mirrors `npy_to_lmdb.py` (base64 features/boxes, int sizes,
    `num_boxes`).  `b"keys"` is written last, in `close()`: until then VOLTA's
    reader and ours both see the store as incomplete.
    """

    def __init__(self, path: str, encoding: str = "raw", overwrite: bool = False, **meta):
        if encoding not in ("raw", "base64"):
            raise ValueError(f"encoding must be 'raw' or 'base64', not {encoding!r}")
        self.path = str(path)
        self.encoding = encoding
        self._env = create_fresh_lmdb(self.path, overwrite)
        self._txn = self._env.begin(write=True)
        self._keys: list[bytes] = []
        self._seen: set[bytes] = set()
        self._feature_dim = None
        self._pending = 0
        self._closed = False

    def put(self, image_id, features, boxes, image_w, image_h, **extra) -> None:
        key = str(image_id).encode()
        if key == KEYS_KEY:
            raise ValueError("image id 'keys' is reserved by VOLTA's layout")
        record = make_record(self.path, str(image_id), features, boxes, image_w, image_h)
        if self._feature_dim is None:
            self._feature_dim = record.feature_dim
        elif record.feature_dim != self._feature_dim:
            raise FeatureDimError(self.path, f"feature dimension {record.feature_dim} but the store "
                                  f"holds {self._feature_dim}-d features", str(image_id))
        if self.encoding == "raw":
            w, h = whole_pixels(self.path, str(image_id), record.image_w, record.image_h)
            item = {"features": record.features, "boxes": record.boxes, **extra,
                    "img_w": np.int64(w), "img_h": np.int64(h),
                    "img_id": str(image_id)}
        else:
            item = {"feature_path": extra.pop("feature_path", str(image_id)),
                    "features": _b64(record.features, np.float32),
                    "boxes": _b64(record.boxes, np.float32),
                    "img_h": record.image_h, "img_w": record.image_w,
                    "num_boxes": record.num_boxes, **extra}
        self._txn.put(key, pickle.dumps(item, protocol=4))
        if key not in self._seen:
            self._seen.add(key)
            self._keys.append(key)
        self._pending += 1
        if self._pending >= 256:  # bound the size of one write transaction
            self._txn.commit()
            self._txn = self._env.begin(write=True)
            self._pending = 0

    def __contains__(self, image_id) -> bool:
        return str(image_id).encode() in self._seen

    def close(self) -> None:
        if self._closed:
            return
        self._txn.put(KEYS_KEY, pickle.dumps(self._keys, protocol=4))
        self._txn.commit()
        self._env.sync(True)
        self._env.close()
        self._closed = True

    def abort(self) -> None:
        if self._closed:
            return
        self._txn.commit()  # keep the records; without b"keys" the store reads as incomplete
        self._env.close()
        self._closed = True

