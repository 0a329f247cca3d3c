"""Binary layout of one record in the native volta-ml store.

    b"VMF1" | uint32 LE header length | JSON header | zero padding to 16 | array blobs

The JSON header holds the image size, the box count and, for every array, its
little-endian dtype, shape and byte offset (blobs start 16-byte aligned, so
`np.frombuffer` views them without copying).  Non-array extras (ints, floats,
strings, lists of them) live in the header under "meta".  No pickle anywhere.
"""
from __future__ import annotations

import json
import struct

import numpy as np

MAGIC = b"VMF1"
_PREFIX = struct.Struct("<4sI")
_ALIGN = 16


def _json_safe(name: str, value):
    if isinstance(value, (np.integer, np.floating, np.bool_)):
        return value.item()
    if isinstance(value, bytes):
        return value.decode("utf-8")
    if isinstance(value, (list, tuple)):
        return [_json_safe(name, v) for v in value]
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    raise TypeError(f"extra field {name!r}: cannot store a {type(value).__name__}")


def encode_record(features: np.ndarray, boxes: np.ndarray, image_w: int, image_h: int,
                  extra: dict, feature_dtype: str = "<f4") -> bytes:
    arrays = [("features", np.ascontiguousarray(features, dtype=feature_dtype)),
              ("boxes", np.ascontiguousarray(boxes, dtype="<f4"))]
    meta = {}
    for name, value in extra.items():
        if isinstance(value, np.ndarray) and value.dtype.kind in "biuf":
            arrays.append((name, np.ascontiguousarray(value, dtype=value.dtype.newbyteorder("<"))))
        elif isinstance(value, np.ndarray) and value.dtype.kind in "USO":
            meta[name] = _json_safe(name, value.tolist())
        else:
            meta[name] = _json_safe(name, value)
    layout, offset = [], 0
    for name, arr in arrays:
        layout.append([name, arr.dtype.str, list(arr.shape), offset])
        offset += -(-arr.nbytes // _ALIGN) * _ALIGN
    header = json.dumps({"n": int(features.shape[0]), "w": int(image_w), "h": int(image_h),
                         "arrays": layout, "meta": meta}, separators=(",", ":")).encode()
    start = -(-(_PREFIX.size + len(header)) // _ALIGN) * _ALIGN
    out = bytearray(start + offset)
    _PREFIX.pack_into(out, 0, MAGIC, len(header))
    out[_PREFIX.size:_PREFIX.size + len(header)] = header
    for (name, arr), (_, _, _, off) in zip(arrays, layout):
        out[start + off:start + off + arr.nbytes] = arr.tobytes()
    return bytes(out)


def decode_record(value: bytes):
    """-> (header dict, {name: ndarray}); raises ValueError on any inconsistency."""
    if len(value) < _PREFIX.size:
        raise ValueError(f"record is {len(value)} bytes, shorter than its prefix")
    magic, header_len = _PREFIX.unpack_from(value, 0)
    if magic != MAGIC:
        raise ValueError(f"bad record magic {magic!r}")
    end = _PREFIX.size + header_len
    if end > len(value):
        raise ValueError("record truncated inside its header")
    header = json.loads(bytes(value[_PREFIX.size:end]))
    start = -(-end // _ALIGN) * _ALIGN
    arrays = {}
    for name, dtype, shape, off in header["arrays"]:
        dt = np.dtype(dtype)
        count = int(np.prod(shape)) if shape else 1
        if start + off + count * dt.itemsize > len(value):
            raise ValueError(f"record truncated inside array {name!r}")
        arrays[name] = np.frombuffer(value, dtype=dt, count=count, offset=start + off).reshape(shape)
    return header, arrays
