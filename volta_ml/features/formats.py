"""The feature-store formats: one row per format, naming its reader, its writer and, for LMDB formats, the
record key only that format holds (how `detect_format` tells LMDBs apart). Adding a format is a module with
a `FeatureStore` reader (and a `StoreWriter`) plus one row here."""
from __future__ import annotations

import importlib
from dataclasses import dataclass


@dataclass(frozen=True)
class StoreFormat:
    module: str                      # volta_ml.features.<module>
    reader: str                      # its FeatureStore class
    writer: str | None = None        # its StoreWriter class (None: read-only)
    lmdb_marker: str | None = None   # its constant holding the key that marks an LMDB of this format

    def load(self, name: str):
        return getattr(importlib.import_module(f"volta_ml.features.{self.module}"), name)


FORMATS: dict[str, StoreFormat] = {   # LMDB markers are tried in this order
    "native": StoreFormat("native_store", "NativeStore", "NativeWriter", "META_KEY"),
    "volta-lmdb": StoreFormat("volta_lmdb", "VoltaLmdbStore", "VoltaLmdbWriter", "KEYS_KEY"),
    "td-lmdb": StoreFormat("td_lmdb", "TdLmdbStore", "TdLmdbWriter", "TD_KEYS_KEY"),
    "h5": StoreFormat("h5_store", "H5Store", "H5Writer"),
    "npy": StoreFormat("npy_store", "NpyStore", "NpyWriter"),
    "tsv": StoreFormat("tsv_store", "TsvStore"),
}

WRITABLE_FORMATS = tuple(name for name, fmt in FORMATS.items() if fmt.writer)


def reader_class(fmt: str):
    if fmt not in FORMATS:
        raise ValueError(f"unknown feature store format {fmt!r}; choose from {', '.join(FORMATS)}")
    return FORMATS[fmt].load(FORMATS[fmt].reader)


def writer_class(fmt: str):
    if fmt not in WRITABLE_FORMATS:
        raise ValueError(f"unknown writer format {fmt!r}; choose from {', '.join(WRITABLE_FORMATS)}")
    return FORMATS[fmt].load(FORMATS[fmt].writer)


def lmdb_markers() -> list[tuple[str, bytes]]:
    """(format, marker key) of every LMDB format, in detection order."""
    return [(name, fmt.load(fmt.lmdb_marker)) for name, fmt in FORMATS.items() if fmt.lmdb_marker]
