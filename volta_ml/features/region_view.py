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
        features, locations, rows = self._padded(record)
        mask = np.zeros(self.num_rows, dtype=np.int64)
        mask[:rows] = 1
        import torch  # lazy: `volta-ml features inspect` should not pay for importing torch
        return RegionSample(torch.from_numpy(features), torch.from_numpy(locations),
                            torch.from_numpy(mask), rows)

    def _padded(self, record: FeatureRecord):
        """Steps 1-4 of the module docstring, writing each feature value once (no concatenation
        then copy into the padding): one pass over the record's features per sample."""
        regions = np.asarray(record.features, dtype=np.float32)
        locations = box_locations(np.asarray(record.boxes, dtype=np.float32), record.image_w,
                                  record.image_h, self.num_locs)
        if self.norm_embeddings:
            regions = _l2_normalise_rows(regions)
            locations = _l2_normalise_rows(locations)
        n, width = regions.shape
        features = np.empty((self.num_rows, width), dtype=np.float32)
        padded_loc = np.zeros((self.num_rows, self.num_locs), dtype=np.float32)
        global_at = self.add_global_imgfeat if n > 0 else None
        start = 1 if global_at == "first" else 0
        kept = min(n, self.num_rows - start)  # region rows that fit the budget
        features[start:start + kept] = regions[:kept]
        padded_loc[start:start + kept] = locations[:kept]
        rows = start + kept
        # VOLTA truncates [global; regions] or [regions; global] to the budget: a "last"
        # global row is dropped when the regions alone fill it.
        if global_at == "first":
            g_row = 0
        elif global_at == "last" and rows < self.num_rows:
            g_row = rows
        else:
            g_row = None
        if g_row is not None:
            features[g_row] = regions.sum(axis=0, dtype=np.float32) / np.float32(n)
            padded_loc[g_row] = 1.0
            padded_loc[g_row, :2] = 0.0
            rows = max(rows, g_row + 1)
        features[rows:] = 0.0
        return features, padded_loc, rows
