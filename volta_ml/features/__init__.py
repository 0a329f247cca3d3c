"""Region-feature stores: read every VOLTA/IGLUE format, write a better one.

Public API (see docs/architecture.md and docs/features.md):
- `open_store(path)` -> read-only Mapping[str, FeatureRecord], format detected from the path;
- `RegionView(store, ...)` -> per-sample padded model inputs, exactly as VOLTA builds them;
- `open_writer(path, fmt=...)` -> a writer whose store becomes valid only once closed.
"""
from __future__ import annotations

from .detect import detect_format, open_store
from .formats import FORMATS
from .records import (FeatureDimError, FeatureRecord, FeatureStoreError, IncompleteStoreError,
                      MissingImageError)
from .region_view import RegionSample, RegionView, box_locations
from .safe_pickle import UnsafePickleError
from .writers import open_writer

Record = FeatureRecord

__all__ = ["open_store", "open_writer", "detect_format", "FORMATS", "RegionView", "RegionSample",
           "FeatureRecord", "Record", "FeatureStoreError", "IncompleteStoreError",
           "FeatureDimError", "MissingImageError", "UnsafePickleError", "box_locations"]
