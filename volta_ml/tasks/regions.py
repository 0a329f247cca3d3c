"""Open the region view a task reads, with the model config's feature settings."""
from __future__ import annotations

from pathlib import Path


def open_region_view(features_path: str, model_config, task_entry: dict):
    """`RegionView` over the store at `features_path`, shaped by the model config (num_locs, global feature,
    M3P's L2 normalisation) and the task's `max_region_num`."""
    from volta_ml.features import RegionView, open_store

    if not features_path:
        raise FileNotFoundError(f"task {task_entry.get('name')}: no feature store path (features_h5path1 in the "
                                f"task config, or --val_features_lmdbpath)")
    if not Path(features_path).exists():
        raise FileNotFoundError(f"feature store not found: {features_path}")
    store = open_store(features_path)
    add_global = getattr(model_config, "add_global_imgfeat", None)
    return RegionView(store, num_locs=int(getattr(model_config, "num_locs", 5)),
                      add_global_imgfeat=add_global if add_global in ("first", "last") else None,
                      max_region_num=int(task_entry.get("max_region_num", 36)),
                      norm_embeddings=bool(getattr(model_config, "norm_embeddings", False)))


def features_path(task_entry: dict, role: str, override: str | None = None) -> str | None:
    """The store a split reads, as VOLTA picks it: the CLI override (`--val_features_lmdbpath`,
    `--train_features_lmdbpath`), else `features_h5path1`, except that serialized configs keep the
    validation store in `features_h5path2`."""
    from volta_ml.tasks.config import entry_path

    if override:
        return override
    serialized = task_entry.get("format") == "serialized_lmdb"
    return entry_path(task_entry, "features_h5path2" if serialized and role == "val" else "features_h5path1")
