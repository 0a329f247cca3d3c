"""npy-per-image directories (X101 features).

`<stem>.npy`: float32 (N, D) features; `<stem>_info.npy`: a 0-d object array
holding a dict with `bbox`, `num_boxes`, `objects`, `cls_prob`, `image_width`,
`image_height`.  The info file is a pickle: it is parsed here with numpy's
header reader and the restricted unpickler, never with `allow_pickle=True`.
"""
from __future__ import annotations

import os
import shutil

import numpy as np

from volta_ml.atomic import atomic_open

from .base import FeatureStore, StoreWriter
from .records import FeatureStoreError, IncompleteStoreError, make_record
from .safe_pickle import safe_load

INFO_SUFFIX = "_info.npy"
_SIDE_SUFFIXES = (INFO_SUFFIX, "_full.npy")


def load_npy_safely(path: str, store: str, key: str):
    """np.load without allow_pickle: object arrays go through the restricted unpickler."""
    try:
        with open(path, "rb") as f:
            version = np.lib.format.read_magic(f)
            read_header = (np.lib.format.read_array_header_1_0 if version == (1, 0)
                           else np.lib.format.read_array_header_2_0)
            shape, fortran, dtype = read_header(f)
            if dtype.hasobject:
                return safe_load(f, store, key)
            count = int(np.prod(shape)) if shape else 1
            data = f.read(count * dtype.itemsize)
    except FeatureStoreError:
        raise
    except (ValueError, OSError) as err:
        raise FeatureStoreError(store, f"unreadable {os.path.basename(path)}: {err}", key) from None
    if len(data) != count * dtype.itemsize:
        raise FeatureStoreError(store, f"{os.path.basename(path)} is truncated "
                                f"({len(data)} of {count * dtype.itemsize} bytes)", key)
    array = np.frombuffer(data, dtype=dtype)
    return array.reshape(shape[::-1]).T if fortran else array.reshape(shape)


class NpyStore(FeatureStore):
    format_name = "npy"

    def __init__(self, path: str, expected_dim: int | None = None):
        super().__init__(path, expected_dim)
        self._keys = None
        if not self.keys_list():
            raise IncompleteStoreError(self.path, "no <stem>.npy feature files")

    def _open_handle(self):
        return None  # one file pair per read, nothing to keep open

    def keys_list(self) -> list[str]:
        if self._keys is None:
            names = sorted(os.listdir(self.path))
            self._keys = [n[:-4] for n in names
                          if n.endswith(".npy") and not n.endswith(_SIDE_SUFFIXES)]
        return self._keys

    def __contains__(self, image_id) -> bool:
        image_id = str(image_id)
        return "/" not in image_id and os.path.isfile(os.path.join(self.path, image_id + ".npy"))

    def read(self, image_id: str):
        if image_id not in self:
            return None
        base = os.path.join(self.path, image_id)
        if not os.path.isfile(base + INFO_SUFFIX):
            raise FeatureStoreError(self.path, f"{image_id}{INFO_SUFFIX} is missing", image_id)
        features = load_npy_safely(base + ".npy", self.path, image_id)
        info = load_npy_safely(base + INFO_SUFFIX, self.path, image_id)
        if isinstance(info, np.ndarray) and info.dtype.hasobject and info.shape == ():
            info = info.item()
        if not isinstance(info, dict):
            raise FeatureStoreError(self.path, f"{image_id}{INFO_SUFFIX} does not hold a dict",
                                    image_id)
        missing = [k for k in ("bbox", "image_width", "image_height") if k not in info]
        if missing:
            raise FeatureStoreError(self.path, f"{image_id}{INFO_SUFFIX} lacks {missing}", image_id)
        extra = {k: v for k, v in info.items() if k not in ("bbox", "image_width", "image_height")}
        return make_record(self.path, image_id, features, info["bbox"], info["image_width"],
                           info["image_height"], extra, self.expected_dim)


class NpyWriter(StoreWriter):
    """Writes into `<path>.partial/` and renames it to `path` in close(); reopening resumes."""

    def __init__(self, path: str, overwrite: bool = False, **meta):
        self.path = str(path).rstrip("/")
        self.partial = self.path + ".partial"
        if os.path.exists(self.path):
            if not overwrite:
                raise FileExistsError(f"{self.path} already exists; pass overwrite=True")
            shutil.rmtree(self.path)
        os.makedirs(self.partial, exist_ok=True)
        self._closed = False

    def _save(self, path: str, array, allow_pickle=False) -> None:
        with atomic_open(path, durable=False) as f:   # the folder is renamed into place at close
            np.save(f, array, allow_pickle=allow_pickle)

    def put(self, image_id, features, boxes, image_w, image_h, **extra) -> None:
        key = str(image_id)
        if "/" in key or key.endswith(_SIDE_SUFFIXES[0][:-4]):
            raise ValueError(f"image id {key!r} cannot name an npy file pair")
        record = make_record(self.path, key, features, boxes, image_w, image_h)
        info = {"bbox": record.boxes, "num_boxes": extra.pop("num_boxes", record.num_boxes),
                **extra, "image_width": record.image_w, "image_height": record.image_h}
        base = os.path.join(self.partial, key)
        self._save(base + ".npy", record.features)
        self._save(base + INFO_SUFFIX, np.array(info, dtype=object), allow_pickle=True)

    def __contains__(self, image_id) -> bool:
        return os.path.isfile(os.path.join(self.partial, str(image_id) + INFO_SUFFIX))

    def close(self) -> None:
        if not self._closed:
            os.replace(self.partial, self.path)
            self._closed = True

    def abort(self) -> None:
        self._closed = True  # keep <path>.partial for a resumed run

