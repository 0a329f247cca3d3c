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

from .records import FeatureDimError, RecordParts

_GLOBAL_MODES = (None, "first", "last")
_F32, _I64 = np.dtype(np.float32), np.dtype(np.int64)


class RegionSample(NamedTuple):
    features: "torch.Tensor"  # float32 [R, F]
    image_loc: "torch.Tensor"  # float32 [R, num_locs]
    image_mask: "torch.Tensor"  # int64 [R]
    num_boxes: int  # rows holding data (incl. the global row), = image_mask.sum()


class RegionBatch(NamedTuple):
    features: "torch.Tensor"  # float32 [B, R, F]
    image_loc: "torch.Tensor"  # float32 [B, R, num_locs]
    image_mask: "torch.Tensor"  # int64 [B, R]
    num_boxes: "torch.Tensor"  # int64 [B]


def box_locations(boxes: np.ndarray, image_w: float, image_h: float, num_locs: int) -> np.ndarray:
    """VOLTA's `image_location` for pixel boxes [N, 4]; float32 [N, num_locs]."""
    if num_locs < 4:
        raise ValueError(f"num_locs must be >= 4, got {num_locs}")
    loc = np.empty((boxes.shape[0], num_locs), dtype=np.float32)
    _locations_into(loc, boxes, image_w, image_h)
    return loc


def _locations_into(loc: np.ndarray, boxes: np.ndarray, image_w, image_h) -> None:
    """Step 1 written into `loc` [N, num_locs] (float32, VOLTA's operations: the same values)."""
    num_locs = loc.shape[1]
    loc[:, :4] = boxes
    w, h = float(image_w), float(image_h)
    if num_locs >= 5:  # (y2 - y1) * (x2 - x1) / (W * H) on pixel boxes
        area = loc[:, -1]
        np.subtract(loc[:, 3], loc[:, 1], out=area)
        area *= loc[:, 2] - loc[:, 0]
        area /= w * h
    # x / W and y / H as VOLTA's four column divisions compute them (float32 quotients)
    loc[:, :4] /= np.array((w, h, w, h), dtype=np.float32)
    if num_locs > 5:  # normalised width and height
        np.subtract(loc[:, 2:4], loc[:, 0:2], out=loc[:, 4:6])


def _l2_normalise_rows(x: np.ndarray) -> np.ndarray:
    norm = np.linalg.norm(x, 2, axis=1, keepdims=True)
    return np.divide(x, norm, out=np.zeros_like(x), where=norm > 0)


def _l2_normalise_rows_inplace(x: np.ndarray) -> None:
    """`_l2_normalise_rows` in place: the same values, no temporary of the rows' size."""
    norm = np.linalg.norm(x, 2, axis=1, keepdims=True)
    ok = norm > 0
    np.divide(x, norm, out=x, where=ok)
    if not ok.all():
        x[~ok[:, 0]] = 0.0


def _as_array(x) -> np.ndarray:
    return x if isinstance(x, np.ndarray) else x.numpy()


class RegionView:
    """`view[image_id] -> RegionSample`, padded to a fixed region budget.

    R = max_region_num, plus one row when a global feature is added.  A dataset
    that (like VOLTA's VE/XVNLI loader) does not add that row passes
    `max_region_num - 1`, which keeps the same rows VOLTA keeps.

    `read_into` writes the same sample into the caller's arrays (a reused buffer,
    a slot of a batch) and `read_batch` fills a whole batch, pinned for CUDA on
    request: each feature value is copied once, from the store's pages (native
    store: its zero-copy map) into the padded rows, with no per-sample tensors and
    no collate copy.
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
            from .detect import open_store
            store = open_store(store)
        self.store = store
        self.num_locs = num_locs
        self.add_global_imgfeat = add_global_imgfeat
        self.max_region_num = max_region_num
        self.norm_embeddings = norm_embeddings
        self.feature_dim = feature_dim
        self.num_rows = max_region_num + (1 if add_global_imgfeat else 0)
        self._region_parts = getattr(store, "region_parts", None)  # the native store's fast read

    def __len__(self) -> int:
        return len(self.store)

    def __contains__(self, image_id) -> bool:
        return image_id in self.store

    def keys(self):
        return self.store.keys()

    def _parts(self, image_id) -> RecordParts:
        key = str(image_id)
        parts = self._region_parts(key) if self._region_parts is not None else None
        if parts is None:  # another format, or a missing id (store[key] raises the clear error)
            parts = RecordParts.of(self.store[key])
        if self.feature_dim is not None and parts.features.shape[1] != self.feature_dim:
            raise FeatureDimError(getattr(self.store, "path", repr(self.store)),
                                  f"feature dimension {parts.features.shape[1]} but the model "
                                  f"expects {self.feature_dim} (v_feature_size)", key)
        return parts

    def __getitem__(self, image_id) -> RegionSample:
        features, locations, mask, rows = self.arrays(image_id)
        import torch  # lazy: `volta-ml features inspect` should not pay for importing torch
        return RegionSample(torch.from_numpy(features), torch.from_numpy(locations),
                            torch.from_numpy(mask), rows)

    def arrays(self, image_id) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
        """`view[image_id]` as new numpy arrays (features, image_loc, image_mask, num_boxes), for
        callers that stack samples themselves (the task datasets)."""
        parts = self._parts(image_id)
        features = np.empty((self.num_rows, parts.features.shape[1]), dtype=np.float32)
        locations = np.empty((self.num_rows, self.num_locs), dtype=np.float32)
        mask = np.empty(self.num_rows, dtype=np.int64)
        return features, locations, mask, self._fill(parts, features, locations, mask)

    def read_into(self, image_id, features, image_loc, image_mask) -> int:
        """Write the padded sample into `features` float32 [R, F], `image_loc` float32
        [R, num_locs] and `image_mask` int64 [R] (numpy arrays or CPU tensors, C-contiguous,
        e.g. one slot of a reused batch); returns num_boxes.  Every element is written."""
        parts = self._parts(image_id)
        f, l, m = _as_array(features), _as_array(image_loc), _as_array(image_mask)
        rows = self.num_rows
        if not (f.shape == (rows, parts.features.shape[1]) and l.shape == (rows, self.num_locs)
                and m.shape == (rows,) and f.dtype == _F32 and l.dtype == _F32 and m.dtype == _I64
                and f.flags.c_contiguous and l.flags.c_contiguous and m.flags.c_contiguous):
            self._refuse_into(image_id, parts, (f, l, m))
        return self._fill(parts, f, l, m)

    def _refuse_into(self, image_id, parts, arrays) -> None:
        shapes = [(self.num_rows, parts.features.shape[1]), (self.num_rows, self.num_locs),
                  (self.num_rows,)]
        for name, array, shape, dtype in zip(("features", "image_loc", "image_mask"), arrays,
                                             shapes, (_F32, _F32, _I64)):
            if array.shape != shape or array.dtype != dtype or not array.flags.c_contiguous:
                raise ValueError(f"read_into({image_id!r}): {name} must be a C-contiguous "
                                 f"{dtype.name} array of shape {shape}, got "
                                 f"{array.dtype.name} {tuple(array.shape)}")

    def batch_buffer(self, size: int, feature_dim: int | None = None,
                     pin_memory: bool = False) -> RegionBatch:
        """Zeroed tensors for `read_batch`/`read_into` to fill (page-locked with pin_memory)."""
        import torch
        width = feature_dim or self.feature_dim or self._store_width()
        rows = self.num_rows
        return RegionBatch(torch.zeros((size, rows, width), pin_memory=pin_memory),
                           torch.zeros((size, rows, self.num_locs), pin_memory=pin_memory),
                           torch.zeros((size, rows), dtype=torch.int64, pin_memory=pin_memory),
                           torch.zeros(size, dtype=torch.int64, pin_memory=pin_memory))

    def read_batch(self, image_ids, out: RegionBatch | None = None,
                   pin_memory: bool = False) -> RegionBatch:
        """The samples of `image_ids` stacked into one batch, written straight into `out` (a
        previous batch of the same shape, reused) or into new tensors: no per-sample tensors, no
        collate copy.  Pass `pin_memory=True` to copy it to CUDA with non_blocking=True."""
        image_ids = list(image_ids)
        first = self._parts(image_ids[0]) if image_ids else None
        width = first.features.shape[1] if first is not None else None
        want = (len(image_ids), self.num_rows, width)
        if out is None or tuple(out.features.shape) != want:
            out = self.batch_buffer(len(image_ids), width, pin_memory=pin_memory)
        features, locations = out.features.numpy(), out.image_loc.numpy()
        masks, counts = out.image_mask.numpy(), out.num_boxes.numpy()
        for slot, image_id in enumerate(image_ids):
            parts = first if slot == 0 else self._parts(image_id)
            if parts.features.shape[1] != width:
                raise FeatureDimError(getattr(self.store, "path", repr(self.store)),
                                      f"feature dimension {parts.features.shape[1]}, but the "
                                      f"batch's first image has {width}", str(image_id))
            counts[slot] = self._fill(parts, features[slot], locations[slot], masks[slot])
        return out

    def _store_width(self) -> int:
        width = (getattr(self.store, "meta", None) or {}).get("feature_dim")
        if width:
            return int(width)
        return int(self._parts(next(iter(self.store.keys()))).features.shape[1])

    def _fill(self, parts: RecordParts, features: np.ndarray, locations: np.ndarray,
              mask: np.ndarray) -> int:
        """Steps 1-4 of the module docstring written into the given arrays, each feature value
        copied once (the global mean is read back from the warm padded rows)."""
        n, image_w, image_h, regions, boxes = parts
        budget = self.num_rows
        global_at = self.add_global_imgfeat if n > 0 else None
        start = 1 if global_at == "first" else 0
        kept = min(n, budget - start)  # region rows that fit the budget
        rows = start + kept
        dest = features[start:rows]
        if global_at == "first" and kept < n:
            # the global row averages every region, also those beyond the budget
            source = np.asarray(regions, dtype=np.float32)
            if self.norm_embeddings:
                source = _l2_normalise_rows(source)
            dest[...] = source[:kept]
        else:
            dest[...] = regions[:kept]  # float16 stores are cast here
            if self.norm_embeddings:
                _l2_normalise_rows_inplace(dest)
            source = dest  # every region row, read back from the warm buffer
        locations[...] = 0.0
        _locations_into(locations[start:rows], boxes[:kept], image_w, image_h)
        if self.norm_embeddings:
            _l2_normalise_rows_inplace(locations[start:rows])
        # VOLTA truncates [global; regions] or [regions; global] to the budget: a "last"
        # global row is dropped when the regions alone fill it.
        if global_at == "first":
            g_row = 0
        elif global_at == "last" and rows < budget:
            g_row = rows
            rows += 1
        else:
            g_row = None
        if g_row is not None:  # the mean as VOLTA's np.sum(features, axis=0) / num_boxes computes it
            global_row = features[g_row]
            np.add.reduce(source, axis=0, dtype=np.float32, out=global_row)
            global_row /= np.float32(n)
            locations[g_row, 2:] = 1.0
        features[rows:] = 0.0
        mask[:rows] = 1
        mask[rows:] = 0
        return rows
