"""`open_writer(path, fmt)`: one entry point for every writable format (the writers of `formats.FORMATS`)."""
from __future__ import annotations

from .formats import writer_class


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
    return writer_class(fmt)(str(path), **meta)
