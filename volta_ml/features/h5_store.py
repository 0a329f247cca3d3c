"""boxes36 H5 files: one group per image, named by the image id.

Each group holds `features` (N, D) float32, `boxes` (N, 4), `img_w`/`img_h`
int64 scalars and optional `obj_id`, `obj_conf`, `attr_id`, `attr_conf`,
`num_objects`, `captions`.  h5py handles are not fork-safe, so the file is
opened lazily in each process (see base.py).
"""
from __future__ import annotations

import os

import h5py
import numpy as np

from .base import FeatureStore, StoreWriter
from .records import FeatureDimError, FeatureStoreError, IncompleteStoreError, make_record, whole_pixels

_REQUIRED = ("features", "boxes", "img_w", "img_h")


def _plain(value):
    if isinstance(value, bytes):
        return value.decode("utf-8")
    if isinstance(value, np.ndarray) and value.dtype.kind == "O":
        return [v.decode("utf-8") if isinstance(v, bytes) else v for v in value.tolist()]
    return value


class H5Store(FeatureStore):
    format_name = "h5"

    def __init__(self, path: str, expected_dim: int | None = None):
        super().__init__(path, expected_dim)
        try:
            with h5py.File(self.path, "r") as f:
                count = len(f.keys())
        except OSError as err:
            raise FeatureStoreError(self.path, f"cannot open HDF5 file: {err}") from None
        if count == 0:
            raise IncompleteStoreError(self.path, "H5 file holds no image groups")
        self._keys = None

    def _open_handle(self):
        return h5py.File(self.path, "r")

    def keys_list(self) -> list[str]:
        if self._keys is None:
            self._keys = list(self.handle.keys())
        return self._keys

    def __contains__(self, image_id) -> bool:
        image_id = str(image_id)
        return "/" not in image_id and image_id in self.handle

    def read(self, image_id: str):
        if image_id not in self:
            return None
        group = self.handle[image_id]
        if not isinstance(group, h5py.Group):
            raise FeatureStoreError(self.path, "is a dataset, not an image group", image_id)
        missing = [name for name in _REQUIRED if name not in group]
        if missing:
            raise FeatureStoreError(self.path, f"image group lacks dataset(s) {missing}", image_id)
        try:
            fields = {name: group[name][()] for name in group.keys()}
        except (OSError, ValueError, KeyError) as err:
            raise FeatureStoreError(self.path, f"corrupt image group: {err}", image_id) from None
        features = fields.pop("features")
        if self.expected_dim is not None and features.shape[-1] != self.expected_dim:
            raise FeatureDimError(self.path, f"feature dimension {features.shape[-1]} but "
                                  f"{self.expected_dim} expected", image_id)
        boxes = fields.pop("boxes")
        image_w, image_h = fields.pop("img_w"), fields.pop("img_h")
        extra = {k: _plain(v) for k, v in fields.items()}
        return make_record(self.path, image_id, features, boxes, image_w, image_h, extra)


class H5Writer(StoreWriter):
    """Writes `<path>.partial` and renames it to `path` in close(); reopening resumes."""

    def __init__(self, path: str, overwrite: bool = False, **meta):
        self.path = str(path)
        self.partial = self.path + ".partial"
        if os.path.exists(self.path):
            if not overwrite:
                raise FileExistsError(f"{self.path} already exists; pass overwrite=True")
            os.remove(self.path)
        self._file = h5py.File(self.partial, "a")
        self._closed = False

    def put(self, image_id, features, boxes, image_w, image_h, **extra) -> None:
        key = str(image_id)
        if "/" in key:
            raise ValueError(f"image id {key!r}: '/' would create nested H5 groups")
        record = make_record(self.path, key, features, boxes, image_w, image_h)
        if key in self._file:
            del self._file[key]
        group = self._file.create_group(key)
        group["features"] = record.features
        group["boxes"] = record.boxes
        w, h = whole_pixels(self.path, key, record.image_w, record.image_h)
        group["img_w"] = np.int64(w)
        group["img_h"] = np.int64(h)
        for name, value in extra.items():
            if isinstance(value, (list, tuple)) and value and isinstance(value[0], str):
                group.create_dataset(name, data=value, dtype=h5py.string_dtype("utf-8"))
            else:
                group[name] = value

    def __contains__(self, image_id) -> bool:
        return str(image_id) in self._file

    def close(self) -> None:
        if self._closed:
            return
        self._file.close()
        os.replace(self.partial, self.path)
        self._closed = True

    def abort(self) -> None:
        if not self._closed:
            self._file.close()  # leave <path>.partial for a resumed run
            self._closed = True

