"""The record every feature store returns, and the errors stores raise.

All readers normalise their on-disk layout to `FeatureRecord`: float32 features
`[N, D]`, float32 pixel boxes `[N, 4]` (x1, y1, x2, y2), the raw image size and
the box count.  Fields a format carries beyond those (object classes, scores,
captions...) are kept in `extra` under the name the file used.
"""
from __future__ import annotations

import difflib
import math
from dataclasses import dataclass, field
from typing import Any, Iterable, NamedTuple

import numpy as np


@dataclass
class FeatureRecord:
    features: np.ndarray  # float32 [N, D]
    boxes: np.ndarray  # float32 [N, 4], raw-image pixels, x1 y1 x2 y2
    image_w: int  # a float only where the file holds a fractional size (read as VOLTA reads it: float())
    image_h: int
    num_boxes: int
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def feature_dim(self) -> int:
        return int(self.features.shape[1])


class RecordParts(NamedTuple):
    """What a padded-input builder (RegionView) needs of a record, without building one: the arrays
    as stored (read-only views; features may be float16)."""
    num_boxes: int
    image_w: int
    image_h: int
    features: np.ndarray  # [N, D]
    boxes: np.ndarray  # float32 [N, 4]

    @classmethod
    def of(cls, record: FeatureRecord) -> "RecordParts":
        return cls(record.num_boxes, record.image_w, record.image_h, record.features, record.boxes)


class FeatureStoreError(ValueError):
    """A store (or one of its records) cannot be read; the message names both."""

    def __init__(self, store: str, message: str, key: str | None = None):
        where = f"{store}" if key is None else f"{store} [key {key!r}]"
        super().__init__(f"{where}: {message}")
        self.store = store
        self.key = key


class IncompleteStoreError(FeatureStoreError):
    """The store was never committed (writer crashed or is still running) or is empty."""


class FeatureDimError(FeatureStoreError):
    """A record's feature width differs from the one the caller or the store expects."""


class MissingImageError(KeyError):
    """Image ids that are not in a feature store: one looked up (the message lists near matches), or the
    ones an annotation file names (`in_annotations`, the message lists them with their lines)."""

    def __init__(self, image_id: str, store: str, known_ids: Iterable[str] | None = None,
                 message: str | None = None):
        near: list[str] = []
        if known_ids is not None:
            pool = list(known_ids)
            if len(pool) > 5000:  # keep the error path fast on big stores: similar lengths only
                size = len(str(image_id))
                pool = [k for k in pool if abs(len(k) - size) <= 2]
            near = difflib.get_close_matches(str(image_id), pool, n=3, cutoff=0.6)
        hint = f"; near matches: {', '.join(repr(n) for n in near)}" if near else ""
        self.message = message or f"image id {image_id!r} not in feature store {store}{hint}"
        super().__init__(self.message)
        self.image_id = image_id
        self.store = store
        self.near_matches = near

    @classmethod
    def in_annotations(cls, missing: list[tuple[str, int]], annotation_path, store: str) -> "MissingImageError":
        """`missing`: (image id, annotation line) pairs; the first five are named."""
        shown = "; ".join(f"image id {i!r} (annotation line {line})" for i, line in missing[:5])
        more = f" and {len(missing) - 5} more" if len(missing) > 5 else ""
        return cls(missing[0][0], store, message=f"{len(missing)} image(s) of {annotation_path} are not in the "
                                                 f"feature store {store}: {shown}{more}")

    def __str__(self) -> str:  # KeyError would repr() the message otherwise
        return self.message


def make_record(store: str, key: str, features, boxes, image_w, image_h,
                extra: dict[str, Any] | None = None, expected_dim: int | None = None) -> FeatureRecord:
    """Validate shapes and dtypes once, so every reader fails the same clear way."""
    features = np.asarray(features)
    boxes = np.asarray(boxes)
    if features.ndim != 2:
        raise FeatureStoreError(store, f"features must be 2-D [N, D], got shape {features.shape}", key)
    if boxes.ndim != 2 or boxes.shape[1] != 4:
        raise FeatureStoreError(store, f"boxes must be [N, 4], got shape {boxes.shape}", key)
    if boxes.shape[0] != features.shape[0]:
        raise FeatureStoreError(
            store, f"{features.shape[0]} feature rows but {boxes.shape[0]} boxes", key)
    if expected_dim is not None and features.shape[1] != expected_dim:
        raise FeatureDimError(
            store, f"feature dimension {features.shape[1]} but {expected_dim} expected", key)
    if features.dtype != np.float32:
        features = features.astype(np.float32)
    if boxes.dtype != np.float32:
        boxes = boxes.astype(np.float32)
    try:
        w, h = image_size(image_w), image_size(image_h)
    except (TypeError, ValueError) as err:
        raise FeatureStoreError(store, f"bad image size {image_w!r} x {image_h!r}", key) from err
    if not (w > 0 and h > 0):
        raise FeatureStoreError(store, f"non-positive image size {w} x {h}", key)
    return FeatureRecord(features, boxes, w, h, int(features.shape[0]), dict(extra or {}))


def image_size(value):
    """An image width or height as VOLTA's readers take it, `float(value)` (numbers, numpy scalars, "877" and
    "877.0" strings or bytes alike): an int when whole, else the float; ValueError when not a finite number."""
    size = float(value.decode() if isinstance(value, bytes) else value)
    if not math.isfinite(size):
        raise ValueError(f"image size {value!r}")
    return int(size) if size.is_integer() else size


def whole_pixels(store: str, key: str, image_w, image_h) -> tuple[int, int]:
    """(w, h) for a writer whose format holds whole-pixel sizes; a fractional size is refused, never truncated."""
    if not (float(image_w).is_integer() and float(image_h).is_integer()):
        raise FeatureStoreError(store, f"image size {image_w} x {image_h} is not whole pixels, which this "
                                       "format stores", key)
    return int(image_w), int(image_h)
