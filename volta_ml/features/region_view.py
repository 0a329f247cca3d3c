"""The per-sample region inputs VOLTA's datasets feed the model.

Reproduces VOLTA's default feature-reader path followed by the dataset padding
(spec features.md §4.6, models.md §3.6, pipeline.md "Padding of regions"):

1. locations from pixel boxes: [x1, y1, x2, y2] (+ area fraction in the last
   column for num_locs >= 5, computed on pixel coordinates), x divided by W and
   y by H, then for num_locs > 5 columns 4/5 = normalised width/height;
2. norm_embeddings (M3P): L2-normalise each feature row and each location row;
3. global feature: mean of the region rows, location [0, 0, 1, 1, 1...], first or last;
4. zero-pad to R = max_region_num (+1 with a global feature), copy the first
   min(num_boxes, R) rows, image_mask 1 on them.

Kept from VOLTA: float32 location arithmetic in the same order, the global row's
geometry, truncation to R rows.  Fixed (documented in docs/features.md): a
zero-norm row under norm_embeddings stays zero instead of becoming NaN; VOLTA's
float64 detour when a global row is added (values cast back to float32 anyway).
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np

from .records import FeatureDimError, FeatureRecord

_GLOBAL_MODES = (None, "first", "last")


class RegionSample(NamedTuple):
    features: "torch.Tensor"  # float32 [R, F]
    image_loc: "torch.Tensor"  # float32 [R, num_locs]
    image_mask: "torch.Tensor"  # int64 [R]
    num_boxes: int  # rows holding data (incl. the global row), = image_mask.sum()


def box_locations(boxes: np.ndarray, image_w: float, image_h: float, num_locs: int) -> np.ndarray:
    """VOLTA's `image_location` for pixel boxes [N, 4]; float32 [N, num_locs]."""
    if num_locs < 4:
        raise ValueError(f"num_locs must be >= 4, got {num_locs}")
    loc = np.zeros((boxes.shape[0], num_locs), dtype=np.float32)
    loc[:, :4] = boxes
    w, h = float(image_w), float(image_h)
    if num_locs >= 5:
        loc[:, -1] = (loc[:, 3] - loc[:, 1]) * (loc[:, 2] - loc[:, 0]) / (w * h)
    loc[:, 0] = loc[:, 0] / w
    loc[:, 1] = loc[:, 1] / h
    loc[:, 2] = loc[:, 2] / w
    loc[:, 3] = loc[:, 3] / h
    if num_locs > 5:
        loc[:, 4] = loc[:, 2] - loc[:, 0]
        loc[:, 5] = loc[:, 3] - loc[:, 1]
    return loc


def _l2_normalise_rows(x: np.ndarray) -> np.ndarray:
    norm = np.linalg.norm(x, 2, axis=1, keepdims=True)
    return np.divide(x, norm, out=np.zeros_like(x), where=norm > 0)


def region_arrays(record: FeatureRecord, num_locs: int = 5, add_global_imgfeat=None,
                  norm_embeddings: bool = False):
    """Unpadded (features, locations, num_boxes) as VOLTA's feature reader returns them."""
    features = np.asarray(record.features, dtype=np.float32)
    locations = box_locations(np.asarray(record.boxes, dtype=np.float32), record.image_w,
                              record.image_h, num_locs)
    num_boxes = features.shape[0]
    if norm_embeddings:
        features = _l2_normalise_rows(features)
        locations = _l2_normalise_rows(locations)
    if add_global_imgfeat is not None and num_boxes > 0:
        g_feat = (features.sum(axis=0, dtype=np.float32) / np.float32(num_boxes))[None, :]
        g_loc = np.ones((1, num_locs), dtype=np.float32)
        g_loc[0, :2] = 0.0
        if add_global_imgfeat == "first":
            features = np.concatenate([g_feat, features], axis=0)
            locations = np.concatenate([g_loc, locations], axis=0)
        else:
            features = np.concatenate([features, g_feat], axis=0)
            locations = np.concatenate([locations, g_loc], axis=0)
        num_boxes += 1
    return features, locations, num_boxes


class RegionView:
    """`view[image_id] -> RegionSample`, padded to a fixed region budget.

    R = max_region_num, plus one row when a global feature is added.  A dataset
    that (like VOLTA's VE/XVNLI loader) does not add that row passes
    `max_region_num - 1`, which keeps the same rows VOLTA keeps.
    """

    def __init__(self, store, num_locs: int = 5, add_global_imgfeat=None, max_region_num: int = 36,
                 norm_embeddings: bool = False, feature_dim: int | None = None):
        if add_global_imgfeat not in _GLOBAL_MODES:
            raise ValueError(f"add_global_imgfeat must be one of {_GLOBAL_MODES}, "
                             f"got {add_global_imgfeat!r}")
        if num_locs not in (4, 5, 7):
            raise ValueError(f"num_locs must be 4, 5 or 7 (VOLTA configs), got {num_locs}")
        if max_region_num < 1:
            raise ValueError(f"max_region_num must be >= 1, got {max_region_num}")
        if isinstance(store, (str, bytes)) or hasattr(store, "__fspath__"):
            from . import open_store
            store = open_store(store)
        self.store = store
        self.num_locs = num_locs
        self.add_global_imgfeat = add_global_imgfeat
        self.max_region_num = max_region_num
        self.norm_embeddings = norm_embeddings
        self.feature_dim = feature_dim
        self.num_rows = max_region_num + (1 if add_global_imgfeat else 0)

    def __len__(self) -> int:
        return len(self.store)

    def __contains__(self, image_id) -> bool:
        return image_id in self.store

    def keys(self):
        return self.store.keys()

    def __getitem__(self, image_id) -> RegionSample:
        record = self.store[str(image_id)]
        if self.feature_dim is not None and record.feature_dim != self.feature_dim:
            raise FeatureDimError(getattr(self.store, "path", repr(self.store)),
                                  f"feature dimension {record.feature_dim} but the model expects "
                                  f"{self.feature_dim} (v_feature_size)", str(image_id))
        features, locations, num_boxes = region_arrays(
            record, self.num_locs, self.add_global_imgfeat, self.norm_embeddings)
        rows = min(num_boxes, self.num_rows)
        padded_feat = np.zeros((self.num_rows, features.shape[1]), dtype=np.float32)
        padded_loc = np.zeros((self.num_rows, self.num_locs), dtype=np.float32)
        mask = np.zeros(self.num_rows, dtype=np.int64)
        padded_feat[:rows] = features[:rows]
        padded_loc[:rows] = locations[:rows]
        mask[:rows] = 1
        import torch  # lazy: `volta-ml features inspect` should not pay for importing torch
        return RegionSample(torch.from_numpy(padded_feat), torch.from_numpy(padded_loc),
                            torch.from_numpy(mask), rows)
