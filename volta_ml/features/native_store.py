"""The native volta-ml store: an LMDB keyed by image id, raw arrays, a metadata record.

Why not VOLTA's layout: no pickle (nothing to execute), O(1) lookup by id (no
`keys` list search), raw little-endian arrays (optional float16 features), a
compact `data.mdb` (no `writemap`, so no sparse 1 TiB file), and a metadata
record that says whether the writer finished.  Writes are committed in batches
so a crash loses nothing already written; the metadata flips to complete only
in `close()`, and readers refuse a store that is not complete.
"""
from __future__ import annotations

import json
import os
import shutil

import lmdb
import numpy as np

from .base import (FeatureStore, LmdbStoreMixin, StoreWriter, release_shared_env,
                   shared_readonly_env)
from .native_codec import decode_header, decode_record, encode_record
from .records import (FeatureDimError, FeatureRecord, FeatureStoreError, IncompleteStoreError,
                      RecordParts, make_record, whole_pixels)

META_KEY = b"__volta_ml_meta__"
FORMAT_NAME = "volta-ml-features"
FORMAT_VERSION = 1
_MAP_SIZE = 1 << 40  # address space only: without writemap the file grows with the data
_BATCH_BYTES = 64 << 20
_BATCH_RECORDS = 256


def read_meta(env: lmdb.Environment) -> dict | None:
    with env.begin() as txn:
        raw = txn.get(META_KEY)
    return None if raw is None else json.loads(raw)


class NativeStore(LmdbStoreMixin, FeatureStore):
    format_name = "native"

    def __init__(self, path: str, expected_dim: int | None = None):
        super().__init__(path, expected_dim)
        meta = read_meta(shared_readonly_env(self.path))
        if meta is None or meta.get("format") != FORMAT_NAME:
            raise FeatureStoreError(self.path, "not a volta-ml native store (no metadata record)")
        if meta.get("version", 0) > FORMAT_VERSION:
            raise FeatureStoreError(self.path, f"store format version {meta['version']} is newer "
                                    f"than this volta-ml reads ({FORMAT_VERSION}); upgrade volta-ml")
        if not meta.get("complete"):
            raise IncompleteStoreError(
                self.path, "half-written store: its writer never called close() (crashed or still "
                "running); rerun the writer/converter to resume, then close it")
        if meta.get("num_images", 0) == 0:
            raise IncompleteStoreError(self.path, "empty store (0 images)")
        self.meta = meta
        dim = meta.get("feature_dim")
        if expected_dim is not None and dim is not None and dim != expected_dim:
            raise FeatureDimError(self.path, f"store holds {dim}-d features but {expected_dim} expected")
        self._keys = None

    def keys_list(self) -> list[str]:
        if self._keys is None:
            with self.handle.begin() as txn:
                keys = [k.decode() for k in txn.cursor().keys()]
            self._keys = [k for k in keys if k.encode() != META_KEY]
        return self._keys

    def __len__(self) -> int:
        return int(self.meta["num_images"])

    def __contains__(self, image_id) -> bool:
        return self.get_value(str(image_id).encode()) is not None

    def read(self, image_id: str):
        # Zero-copy: the record's arrays are read-only views of the store file (lmdb_values).
        value = self.get_value(image_id.encode())
        if value is None:
            return None
        try:
            n, w, h, features, boxes, extra = decode_record(value)
        except (ValueError, KeyError, TypeError, json.JSONDecodeError, UnicodeDecodeError) as err:
            raise FeatureStoreError(self.path, f"corrupt record: {err}", image_id) from None
        if features.dtype != np.float32:
            features = features.astype(np.float32)
        # Shapes and sizes were validated when the record was written: no second check here.
        return FeatureRecord(features, boxes, w, h, n, extra)

    def region_parts(self, image_id: str) -> RecordParts | None:
        """The record's arrays (zero-copy views) without decoding its extras or casting float16."""
        value = self.get_value(image_id.encode())
        if value is None:
            return None
        try:
            n, d, w, h, dtype, start, box_start, _ = decode_header(value)
        except ValueError as err:
            raise FeatureStoreError(self.path, f"corrupt record: {err}", image_id) from None
        if self.expected_dim is not None and d != self.expected_dim:
            raise FeatureDimError(self.path, f"feature dimension {d} but {self.expected_dim} expected",
                                  image_id)
        return RecordParts(n, w, h, np.ndarray((n, d), dtype, value, start),
                           np.ndarray((n, 4), np.float32, value, box_start))

    def describe(self) -> dict:
        info = super().describe()
        info.update({k: v for k, v in self.meta.items() if k not in ("format", "complete")})
        return info


class NativeWriter(StoreWriter):
    """Writer for the native store; see `open_writer`."""

    def __init__(self, path: str, feature_dtype: str = "float32", overwrite: bool = False,
                 append: bool = False, feature_dim: int | None = None, **meta):
        if feature_dtype not in ("float32", "float16"):
            raise ValueError(f"feature_dtype must be float32 or float16, not {feature_dtype!r}")
        self.path = str(path)
        existing = self._existing_meta()
        if existing is not None and existing.get("complete") and not (overwrite or append):
            raise FileExistsError(f"{self.path} is a complete feature store; pass overwrite=True "
                                  "to replace it or append=True to add to it")
        if overwrite and os.path.exists(self.path):
            release_shared_env(self.path)
            shutil.rmtree(self.path)
            existing = None
        if existing is not None:  # resume a crashed write, or append
            feature_dtype = existing.get("feature_dtype", feature_dtype)
            feature_dim = feature_dim or existing.get("feature_dim")
            meta = {**existing.get("extra_meta", {}), **meta}
        os.makedirs(self.path, exist_ok=True)
        release_shared_env(self.path)
        self._env = lmdb.open(self.path, map_size=_MAP_SIZE, writemap=False, meminit=False,
                              readahead=False, max_dbs=0)
        self.feature_dtype = feature_dtype
        self.feature_dim = feature_dim
        self.extra_meta = meta
        self._min_boxes = existing.get("min_boxes") if existing else None
        self._max_boxes = existing.get("max_boxes") if existing else None
        self._pending: dict[bytes, bytes] = {}
        self._pending_bytes = 0
        self._closed = False
        self._write_meta(complete=False)

    def _existing_meta(self) -> dict | None:
        if not os.path.exists(os.path.join(self.path, "data.mdb")):
            if os.path.exists(self.path) and os.listdir(self.path):
                raise FileExistsError(f"{self.path} exists and is not a volta-ml native store")
            return None
        env = shared_readonly_env(self.path)
        meta = read_meta(env)
        empty = env.stat()["entries"] == 0
        release_shared_env(self.path)
        if meta is None and not empty:
            raise FileExistsError(f"{self.path} is an LMDB but not a volta-ml native store")
        return meta

    def _meta(self, complete: bool) -> dict:
        count = self._env.stat()["entries"] - (1 if self._has_meta() else 0)
        return {"format": FORMAT_NAME, "version": FORMAT_VERSION, "complete": complete,
                "num_images": count, "feature_dim": self.feature_dim,
                "feature_dtype": self.feature_dtype, "min_boxes": self._min_boxes,
                "max_boxes": self._max_boxes,
                "box_rule": self.extra_meta.get("box_rule") or self._box_rule(),
                "extractor": self.extra_meta.get("extractor"), "extra_meta": self.extra_meta}

    def _box_rule(self) -> str | None:
        if self._min_boxes is None:
            return None
        if self._min_boxes == self._max_boxes:
            return f"fixed {self._min_boxes}"
        return f"{self._min_boxes}-{self._max_boxes}"

    def _has_meta(self) -> bool:
        with self._env.begin() as txn:
            return txn.get(META_KEY) is not None

    def _write_meta(self, complete: bool) -> None:
        meta = json.dumps(self._meta(complete), default=str).encode()
        with self._env.begin(write=True) as txn:
            txn.put(META_KEY, meta)

    def put(self, image_id, features, boxes, image_w, image_h, **extra) -> None:
        if self._closed:
            raise RuntimeError(f"writer for {self.path} is closed")
        key = str(image_id)
        if key.encode() == META_KEY:
            raise ValueError(f"image id {key!r} is reserved")
        record = make_record(self.path, key, features, boxes, image_w, image_h)
        if self.feature_dim is None:
            self.feature_dim = record.feature_dim
        elif record.feature_dim != self.feature_dim:
            raise FeatureDimError(self.path, f"feature dimension {record.feature_dim} but the store "
                                  f"holds {self.feature_dim}-d features", key)
        n = record.num_boxes
        self._min_boxes = n if self._min_boxes is None else min(self._min_boxes, n)
        self._max_boxes = n if self._max_boxes is None else max(self._max_boxes, n)
        dtype = "<f2" if self.feature_dtype == "float16" else "<f4"
        value = encode_record(record.features, record.boxes,
                              *whole_pixels(self.path, key, record.image_w, record.image_h),
                              extra, feature_dtype=dtype)
        self._pending[key.encode()] = value
        self._pending_bytes += len(value)
        if len(self._pending) >= _BATCH_RECORDS or self._pending_bytes >= _BATCH_BYTES:
            self.flush()

    def __contains__(self, image_id) -> bool:
        key = str(image_id).encode()
        if key in self._pending:
            return True
        with self._env.begin() as txn:
            return txn.get(key) is not None

    def flush(self) -> None:
        """Commit pending records (durable; the store stays marked incomplete)."""
        if not self._pending:
            return
        with self._env.begin(write=True) as txn:
            for key, value in self._pending.items():
                txn.put(key, value)
        self._pending.clear()
        self._pending_bytes = 0

    def close(self) -> None:
        if self._closed:
            return
        self.flush()
        self._write_meta(complete=True)
        self._env.sync(True)
        self._env.close()
        self._closed = True

    def abort(self) -> None:
        """Keep what was committed, leave the store marked incomplete (resumable)."""
        if self._closed:
            return
        self.flush()
        self._write_meta(complete=False)
        self._env.close()
        self._closed = True

