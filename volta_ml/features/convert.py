"""Converting, inspecting and verifying stores (the work behind `volta-ml features ...`)."""
from __future__ import annotations

import os
from typing import Any

import numpy as np
from tqdm import tqdm

from . import open_store
from .records import FeatureStoreError
from .writers import open_writer

# Field names differ between H5 (obj_id...), npy (objects...) and TSV (objects_id...);
# records keep the source's names so that writing back to the same family is lossless.


def convert_store(src: str, dst: str, to: str = "native", num_imgs: int | None = None,
                  progress: bool = True, feature_dim: int | None = None,
                  extra_fn=None, **writer_options) -> int:
    """Copy every record of `src` into a new store `dst` of format `to`; returns the count.

    `extra_fn(image_id, record) -> dict` may add or replace per-record extra fields
    (the legacy wrappers use it for VOLTA's `feature_path`).  A native destination
    left unfinished by an earlier run is resumed: records already there are skipped.
    """
    store = open_store(src, feature_dim=feature_dim)
    keys = store.keys_list()
    if num_imgs is not None:
        keys = keys[:num_imgs]
    written = 0
    with open_writer(dst, to, **writer_options) as writer:
        for image_id in tqdm(keys, desc=f"{os.path.basename(str(src))} -> {to}",
                             disable=not progress, unit="img"):
            if image_id in writer:
                continue
            record = store[image_id]
            extra = dict(record.extra)
            if extra_fn is not None:
                extra.update(extra_fn(image_id, record))
            writer.put(image_id, record.features, record.boxes, record.image_w, record.image_h,
                       **extra)
            written += 1
    store.close()
    return written


def _summary(value: Any):
    if isinstance(value, np.ndarray):
        return f"array {value.dtype} {list(value.shape)}"
    if isinstance(value, (bytes, str)) and len(value) > 60:
        return f"{type(value).__name__} of length {len(value)}"
    return value


def inspect_store(path: str) -> dict:
    """Format, count, dims and one decoded sample."""
    store = open_store(path)
    info = store.describe()
    first = store.keys_list()[0]
    record = store[first]
    info["feature_dim"] = info.get("feature_dim") or record.feature_dim
    info["sample"] = {"image_id": first, "num_boxes": record.num_boxes,
                      "features": _summary(record.features), "boxes[0]": record.boxes[0].tolist(),
                      "image_w": record.image_w, "image_h": record.image_h,
                      **{k: _summary(v) for k, v in record.extra.items()}}
    store.close()
    return info


def verify_store(path: str, feature_dim: int | None = None, progress: bool = True,
                 max_errors: int = 20) -> dict:
    """Decode every record; count them; check dims, NaN/inf and box sanity."""
    store = open_store(path)
    report = {"path": str(path), "format": store.format_name, "records": 0, "errors": [],
              "nonfinite": [], "bad_boxes": [], "feature_dims": set(), "min_boxes": None,
              "max_boxes": None}
    keys = store.keys_list()
    for image_id in tqdm(keys, desc=f"verify {os.path.basename(str(path))}", disable=not progress,
                         unit="img"):
        try:
            record = store[image_id]
        except (FeatureStoreError, KeyError) as err:
            report["errors"].append(str(err))
            if len(report["errors"]) >= max_errors:
                report["errors"].append("(stopped after too many errors)")
                break
            continue
        report["records"] += 1
        report["feature_dims"].add(record.feature_dim)
        n = record.num_boxes
        report["min_boxes"] = n if report["min_boxes"] is None else min(report["min_boxes"], n)
        report["max_boxes"] = n if report["max_boxes"] is None else max(report["max_boxes"], n)
        if not (np.isfinite(record.features).all() and np.isfinite(record.boxes).all()):
            report["nonfinite"].append(image_id)
        b = record.boxes
        if n and ((b[:, 2] < b[:, 0]).any() or (b[:, 3] < b[:, 1]).any()):
            report["bad_boxes"].append(image_id)
    if feature_dim is not None and report["feature_dims"] - {feature_dim}:
        report["errors"].append(f"feature dimension(s) {sorted(report['feature_dims'])} but "
                                f"{feature_dim} expected")
    if len(report["feature_dims"]) > 1:
        report["errors"].append(f"mixed feature dimensions {sorted(report['feature_dims'])}")
    report["expected_records"] = len(keys)
    if report["records"] != len(keys) and not report["errors"]:
        report["errors"].append(f"{report['records']} records decoded, {len(keys)} listed")
    report["feature_dims"] = sorted(report["feature_dims"])
    report["ok"] = not (report["errors"] or report["nonfinite"])
    store.close()
    return report
