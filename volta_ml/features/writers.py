"""`open_writer(path, fmt)`: one entry point for every writable format."""
from __future__ import annotations

WRITABLE_FORMATS = ("native", "volta-lmdb", "td-lmdb", "h5", "npy")


def open_writer(path, fmt: str = "native", **meta):
    """A writer with put(image_id, features, boxes, image_w, image_h, **extra), `in`, close().

    native:     options feature_dtype="float32"|"float16", overwrite, append; other keyword
                arguments (e.g. extractor="butd-r101-c4", box_rule="fixed 36") go to the metadata.
                Reopening an unfinished native store resumes it.
    volta-lmdb: encoding="raw" (like h5_to_lmdb.py) or "base64" (like npy_to_lmdb.py).
    td-lmdb:    tensorpack-compatible serialized LMDB (msgpack-numpy records).
    h5:         boxes36-style group per image.   npy: <stem>.npy + <stem>_info.npy.
    Extra fields (objects, objects_conf, attrs, attrs_conf, cls_prob, ...) are stored when given.
    """
    path = str(path)
    if fmt == "native":
        from .native_store import NativeWriter
        return NativeWriter(path, **meta)
    if fmt == "volta-lmdb":
        from .volta_lmdb import VoltaLmdbWriter
        return VoltaLmdbWriter(path, **meta)
    if fmt == "td-lmdb":
        from .td_lmdb import TdLmdbWriter
        return TdLmdbWriter(path, **meta)
    if fmt == "h5":
        from .h5_store import H5Writer
        return H5Writer(path, **meta)
    if fmt == "npy":
        from .npy_store import NpyWriter
        return NpyWriter(path, **meta)
    raise ValueError(f"unknown writer format {fmt!r}; choose from {', '.join(WRITABLE_FORMATS)}")
