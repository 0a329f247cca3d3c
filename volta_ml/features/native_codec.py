"""Binary layout of one record in the native volta-ml store (no pickle anywhere).

    fixed header (28 bytes, little-endian): b"VMF1", num_boxes, feature_dim, image_w, image_h,
        feature dtype code (0 = float32, 1 = float16), 3 pad bytes, extra-header length E
    E bytes of JSON describing extra fields (absent when E = 0)
    zero padding to a 16-byte boundary, then the blobs, each 16-byte aligned:
        features [N, D], boxes float32 [N, 4], then extra arrays at the offsets the JSON gives

The fixed header makes the common read (features + boxes) two `np.frombuffer`
views with no parsing; extras (object classes, scores, captions) cost a JSON
parse only when present.  Non-array extras (ints, floats, strings, lists) live
in the JSON under "meta".
"""
from __future__ import annotations

import json
import struct

import numpy as np

MAGIC = b"VMF1"
_FIXED = struct.Struct("<4sIIIIB3xI")
_ALIGN = 16
_FEATURE_DTYPES = (np.dtype("<f4"), np.dtype("<f2"))
_BOX_DTYPE = np.dtype("<f4")


def _aligned(n: int) -> int:
    return -(-n // _ALIGN) * _ALIGN


def _json_safe(name: str, value):
    if isinstance(value, (np.integer, np.floating, np.bool_)):
        return value.item()
    if isinstance(value, bytes):
        return value.decode("utf-8")
    if isinstance(value, (list, tuple)):
        return [_json_safe(name, v) for v in value]
    if isinstance(value, dict):
        return {str(k): _json_safe(name, v) for k, v in value.items()}
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    raise TypeError(f"extra field {name!r}: cannot store a {type(value).__name__}")


def encode_record(features: np.ndarray, boxes: np.ndarray, image_w: int, image_h: int,
                  extra: dict, feature_dtype: str = "<f4") -> bytes:
    feat_dtype = np.dtype(feature_dtype)
    code = _FEATURE_DTYPES.index(feat_dtype)
    n, d = features.shape
    blobs = [np.ascontiguousarray(features, dtype=feat_dtype).tobytes(),
             np.ascontiguousarray(boxes, dtype=_BOX_DTYPE).tobytes()]
    offset = _aligned(len(blobs[0])) + _aligned(len(blobs[1]))
    arrays, meta = [], {}
    for name, value in extra.items():
        if isinstance(value, np.ndarray) and value.dtype.kind in "biuf":
            arr = np.ascontiguousarray(value, dtype=value.dtype.newbyteorder("<"))
            arrays.append([name, arr.dtype.str, list(arr.shape), offset])
            blobs.append(arr.tobytes())
            offset += _aligned(arr.nbytes)
        elif isinstance(value, np.ndarray):
            meta[name] = _json_safe(name, value.tolist())
        else:
            meta[name] = _json_safe(name, value)
    extra_header = (json.dumps({"arrays": arrays, "meta": meta}, separators=(",", ":")).encode()
                    if arrays or meta else b"")
    start = _aligned(_FIXED.size + len(extra_header))
    out = bytearray(start + offset)
    _FIXED.pack_into(out, 0, MAGIC, n, d, int(image_w), int(image_h), code, len(extra_header))
    out[_FIXED.size:_FIXED.size + len(extra_header)] = extra_header
    pos = start
    for blob in blobs:
        out[pos:pos + len(blob)] = blob
        pos += _aligned(len(blob))
    return bytes(out)


def decode_header(value) -> tuple:
    """-> (n, d, image_w, image_h, feature dtype, features offset, boxes offset, extra-header length)
    of a record (bytes or a buffer); ValueError on any inconsistency.  No array is built."""
    if len(value) < _FIXED.size:
        raise ValueError(f"record is {len(value)} bytes, shorter than its header")
    magic, n, d, w, h, code, extra_len = _FIXED.unpack_from(value, 0)
    if magic != MAGIC:
        raise ValueError(f"bad record magic {magic!r}")
    if code >= len(_FEATURE_DTYPES):
        raise ValueError(f"unknown feature dtype code {code}")
    feat_dtype = _FEATURE_DTYPES[code]
    start = _aligned(_FIXED.size + extra_len)
    box_start = start + _aligned(n * d * feat_dtype.itemsize)
    if box_start + n * 16 > len(value):
        raise ValueError(f"record truncated: {len(value)} bytes for {n} boxes of {d} features")
    return n, d, w, h, feat_dtype, start, box_start, extra_len


def decode_record(value: bytes):
    """-> (n, image_w, image_h, features, boxes, extra); ValueError on any inconsistency."""
    n, d, w, h, feat_dtype, start, box_start, extra_len = decode_header(value)
    features = np.ndarray((n, d), feat_dtype, value, start)  # views of `value`: no copy
    boxes = np.ndarray((n, 4), _BOX_DTYPE, value, box_start)
    extra = {}
    if extra_len:
        header = json.loads(bytes(value[_FIXED.size:_FIXED.size + extra_len]))
        for name, dtype, shape, off in header["arrays"]:
            dt = np.dtype(dtype)
            count = int(np.prod(shape)) if shape else 1
            if start + off + count * dt.itemsize > len(value):
                raise ValueError(f"record truncated inside array {name!r}")
            extra[name] = np.frombuffer(value, dt, count, start + off).reshape(shape)
        extra.update(header["meta"])
    return n, w, h, features, boxes, extra
