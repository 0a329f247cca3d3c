"""Serialized "td-lmdb" stores (tensorpack LMDBSerializer; "format: serialized_lmdb").

Keys b"00000000", b"00000001", ... plus b"__keys__" (written last).  Values are
msgpack with msgpack-numpy extension maps (tensorpack 0.9.4, which VOLTA pins)
or pickle (tensorpack >= 0.10); the first byte tells them apart (pickle
protocol >= 2 starts with 0x80).  Records are per image (generic converter),
per (image, annotation) pair (GQA), paired NLVR2 dicts (`features_0/1`, ...)
or Conceptual Captions lists.  VOLTA reads these sequentially only; here
`iter_records()` does that, and the Mapping view indexes image ids with one
scan on first keyed access (first record of an image wins).
"""
from __future__ import annotations

import os

import msgpack
import numpy as np
from tqdm import tqdm

from .base import (FeatureStore, LmdbStoreMixin, StoreWriter, create_fresh_lmdb,
                   shared_readonly_env)
from .records import FeatureStoreError, IncompleteStoreError, image_size, whole_pixels
from .safe_pickle import safe_loads
from .volta_lmdb import record_from_volta_dict

TD_KEYS_KEY = b"__keys__"
_CC_FIELDS = ("features", "cls_prob", "objects_id", "objects_conf", "attrs_id", "attrs_conf",
              "attr_scores", "boxes", "num_boxes", "img_h", "img_w", "img_id", "caption")


def _get(d: dict, name: str):
    return d.get(name.encode(), d.get(name))


def _decode_numpy_map(obj: dict):
    nd = _get(obj, "nd")
    if nd is None:
        if _get(obj, "complex") is True:
            return complex(_get(obj, "data").decode() if isinstance(_get(obj, "data"), bytes)
                           else _get(obj, "data"))
        return obj
    dtype_desc = _get(obj, "type")
    if isinstance(dtype_desc, bytes):
        dtype_desc = dtype_desc.decode()
    kind = _get(obj, "kind") or b""
    if isinstance(kind, str):
        kind = kind.encode()
    if kind == b"V":  # structured dtype: msgpack-numpy sends its descr as a list of pairs
        dtype = np.dtype([tuple(f) for f in dtype_desc])
    else:
        dtype = np.dtype(dtype_desc)
    if dtype.hasobject:
        raise ValueError("object arrays are not allowed in a feature record")
    data = _get(obj, "data")
    if nd:
        return np.frombuffer(data, dtype=dtype).reshape(_get(obj, "shape"))
    return np.frombuffer(data, dtype=dtype)[0]


def unpack_value(value: bytes, store: str, key: str):
    """Sniff and decode one td-LMDB value (msgpack-numpy or pickle)."""
    if value[:1] == b"\x80":
        return safe_loads(value, store, key)
    try:
        return msgpack.unpackb(value, raw=False, object_hook=_decode_numpy_map,
                               strict_map_key=False)
    except (ValueError, TypeError, msgpack.exceptions.ExtraData, msgpack.exceptions.FormatError,
            msgpack.exceptions.StackError) as err:
        raise FeatureStoreError(store, f"corrupt or truncated msgpack record: {err}", key) from None


def _encode_numpy(obj):
    if isinstance(obj, np.ndarray):
        if obj.dtype.hasobject:
            raise TypeError("object arrays cannot be serialized")
        return {b"nd": True, b"type": obj.dtype.str, b"kind": b"", b"shape": list(obj.shape),
                b"data": np.ascontiguousarray(obj).tobytes()}
    if isinstance(obj, np.generic):
        return {b"nd": False, b"type": obj.dtype.str, b"data": obj.tobytes()}
    raise TypeError(f"cannot serialize {type(obj).__name__}")


def pack_value(obj) -> bytes:
    """msgpack-numpy exactly as tensorpack 0.9.4 writes it (use_bin_type=True)."""
    return msgpack.packb(obj, use_bin_type=True, default=_encode_numpy)


def _text(v) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


def box_count(value) -> int:
    """A record's num_boxes ("36", "36.0", 36): a whole number, else ValueError."""
    count = float(_text(value))
    if not count.is_integer():
        raise ValueError(f"num_boxes {_text(value)!r}")
    return int(count)


def split_images(store: str, key: str, item):
    """-> [(image_id, dict with VOLTA's per-image fields)] for one td record."""
    if isinstance(item, (list, tuple)):
        if len(item) < 12:
            raise FeatureStoreError(store, f"list record with {len(item)} fields; the CC layout "
                                    f"has {len(_CC_FIELDS)}", key)
        d = dict(zip(_CC_FIELDS, item))
        try:   # TSV strings, "877" or "877.0": VOLTA's reader takes float(image_h), float(image_w)
            d["img_h"], d["img_w"] = image_size(d["img_h"]), image_size(d["img_w"])
            d["num_boxes"] = box_count(d["num_boxes"])
        except ValueError as err:
            raise FeatureStoreError(store, f"Conceptual Captions record with a bad num_boxes / image_h / image_w "
                                           f"({err})", key) from None
        return [(_text(d["img_id"]), d)]
    if not isinstance(item, dict):
        raise FeatureStoreError(store, f"record is a {type(item).__name__}", key)
    item = {_text(k): v for k, v in item.items()}
    if "features_0" in item:  # NLVR2 pairs
        out = []
        for side in ("0", "1"):
            d = {k[:-2]: v for k, v in item.items() if k.endswith("_" + side)}
            out.append((_text(d.get("img_id", f"{key}_{side}")), d))
        return out
    return [(_text(item.get("img_id", key)), item)]


class TdLmdbStore(LmdbStoreMixin, FeatureStore):
    format_name = "td-lmdb"

    def __init__(self, path: str, expected_dim: int | None = None):
        super().__init__(path, expected_dim)
        with shared_readonly_env(self.path).begin() as txn:
            raw_keys = txn.get(TD_KEYS_KEY)
        if raw_keys is None:
            raise IncompleteStoreError(self.path, "no b'__keys__' record: half-written td-LMDB")
        keys = unpack_value(raw_keys, self.path, "__keys__")
        if not isinstance(keys, (list, tuple)):
            raise FeatureStoreError(self.path, "b'__keys__' does not hold a list", "__keys__")
        if not keys:
            raise IncompleteStoreError(self.path, "empty td-LMDB (0 records)")
        self.record_keys = [k if isinstance(k, bytes) else str(k).encode() for k in keys]
        self._index = None  # image id -> (record key, position inside the record)

    @property
    def num_records(self) -> int:
        return len(self.record_keys)

    def raw_record(self, record_key: bytes):
        with self.handle.begin() as txn:
            value = txn.get(record_key)
        if value is None:
            raise FeatureStoreError(self.path, "listed in b'__keys__' but missing", record_key.decode())
        return unpack_value(value, self.path, record_key.decode())

    def iter_records(self):
        """Sequential pass as VOLTA's loaders do: yields (record key, decoded record).

        A complete pass also builds the image-id index, so keyed reads after it cost no second scan.
        """
        index = {} if self._index is None else None
        with self.handle.begin() as txn:
            for key in self.record_keys:
                value = txn.get(key)
                if value is None:
                    raise FeatureStoreError(self.path, "listed in b'__keys__' but missing", key.decode())
                item = unpack_value(value, self.path, key.decode())
                if index is not None:
                    for pos, (image_id, _) in enumerate(split_images(self.path, key.decode(), item)):
                        index.setdefault(image_id, (key, pos))
                yield key.decode(), item
        if index is not None and self._index is None:
            self._index = index

    def _build_index(self):
        records = self.iter_records()
        if self.num_records > 2000:
            records = tqdm(records, total=self.num_records, desc=f"indexing {os.path.basename(self.path)}")
        for _ in records:
            pass
        return self._index

    def keys_list(self) -> list[str]:
        if self._index is None:
            self._index = self._build_index()
        return list(self._index)

    def __len__(self) -> int:
        return len(self.keys_list())

    def read(self, image_id: str):
        if self._index is None:
            self._index = self._build_index()
        where = self._index.get(image_id)
        if where is None:
            return None
        key, pos = where
        _, item = split_images(self.path, key.decode(), self.raw_record(key))[pos]
        return record_from_volta_dict(self.path, image_id, item, self.expected_dim)

    def describe(self) -> dict:
        info = {"format": self.format_name, "path": self.path, "records": self.num_records}
        first = self.raw_record(self.record_keys[0])
        with self.handle.begin() as txn:
            info["serializer"] = "pickle" if txn.get(self.record_keys[0])[:1] == b"\x80" else "msgpack"
        info["record_layout"] = ("list (Conceptual Captions)" if isinstance(first, (list, tuple))
                                 else "dict")
        return info


class TdLmdbWriter(StoreWriter):
    """Tensorpack-compatible writer: one record per `put`, b"__keys__" written in close()."""

    def __init__(self, path: str, serializer: str = "msgpack", overwrite: bool = False, **meta):
        if serializer not in ("msgpack", "pickle"):
            raise ValueError(f"serializer must be msgpack or pickle, not {serializer!r}")
        self.path = str(path)
        self.serializer = serializer
        self._env = create_fresh_lmdb(self.path, overwrite)
        self._txn = self._env.begin(write=True)
        self._keys: list[bytes] = []
        self._ids: set[str] = set()
        self._closed = False

    def _dumps(self, obj) -> bytes:
        if self.serializer == "pickle":
            import pickle
            return pickle.dumps(obj, protocol=4)
        return pack_value(obj)

    def put_record(self, record) -> None:
        """Append any record (dict or list) as-is: GQA/NLVR2/CC layouts."""
        key = f"{len(self._keys):08d}".encode("ascii")
        self._txn.put(key, self._dumps(record))
        self._keys.append(key)
        if len(self._keys) % 256 == 0:
            self._txn.commit()
            self._txn = self._env.begin(write=True)

    def put(self, image_id, features, boxes, image_w, image_h, **extra) -> None:
        w, h = whole_pixels(self.path, str(image_id), image_size(image_w), image_size(image_h))
        item = {"features": np.asarray(features, dtype=np.float32),
                "boxes": np.asarray(boxes, dtype=np.float32), **extra,
                "img_w": np.int64(w), "img_h": np.int64(h), "img_id": str(image_id)}
        self.put_record(item)
        self._ids.add(str(image_id))

    def __contains__(self, image_id) -> bool:
        return str(image_id) in self._ids

    def close(self) -> None:
        if self._closed:
            return
        self._txn.put(TD_KEYS_KEY, self._dumps(self._keys))
        self._txn.commit()
        self._env.sync(True)
        self._env.close()
        self._closed = True

    def abort(self) -> None:
        if not self._closed:
            self._txn.commit()
            self._env.close()
            self._closed = True

