"""The one resumable chunk store: finished pieces of a long computation saved as they exist, valid for one run.

A store is a folder that holds `manifest.json` (the run's fingerprint: everything that changes the numbers, the
model's and the data's contents included, see `digest.content_fingerprint`) and the saved chunks, each an
`.npz` written atomically under a name the caller chooses (`chunk_000003`, `en-aware/00000256`, ...), plus
small `.json` side files. A rerun into the same folder reuses a chunk only when its manifest equals the run's
fingerprint; otherwise, by `on_mismatch`:

- `"recompute"` (eval-retrieval, iglue-hf): one stderr line names what changed, the saved chunks are deleted
  and everything is scored again;
- `"refuse"` (cvqa score): `ResumeMismatch`, one line naming what changed, nothing is touched.

Either way one result never mixes two models or two data sets. The store owns the `.npz` / `.json` files of its
folder: `recompute` deletes them (recursively), nothing else.

`ChunkPlan` cuts N items into fixed chunks (rank r of R computes chunks r, r+R, ...) and `map_chunks` runs a
function over them through a store; chunk borders do not depend on the number of ranks, so a resumed or
re-sharded run gives the same numbers.
"""
from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np
from tqdm import tqdm

from volta_ml.atomic import atomic_open, atomic_write_json
from volta_ml.engine.distributed import DistInfo, barrier, gather_objects

MANIFEST = "manifest.json"
POLICIES = ("recompute", "refuse")


class ResumeMismatch(ValueError):
    """The chunks in the folder were computed by another run (model, weights, data, rule, ...)."""


@dataclass
class ChunkPlan:
    n_items: int
    n_images: int = 0          # retrieval: the width of a chunk's score rows (unused elsewhere)
    chunk_size: int = 64

    @property
    def n_chunks(self) -> int:
        return -(-self.n_items // self.chunk_size)

    def rows(self, chunk: int) -> range:
        start = chunk * self.chunk_size
        return range(start, min(start + self.chunk_size, self.n_items))

    def owned(self, info: DistInfo) -> list[int]:
        return list(range(info.rank, self.n_chunks, info.world_size))


class ChunkStore:
    """Saved chunks in `folder`, reused only by a run with the same `fingerprint` (a JSON-able dict)."""

    def __init__(self, folder: str | Path, fingerprint: dict, info: DistInfo | None = None,
                 on_mismatch: str = "recompute"):
        if on_mismatch not in POLICIES:
            raise ValueError(f"on_mismatch {on_mismatch!r}: expected one of {', '.join(POLICIES)}")
        info = info or DistInfo()
        self.folder = Path(folder)
        self.fingerprint = json.loads(json.dumps(fingerprint, default=str))   # as it reads back from disk
        manifest = self.folder / MANIFEST
        old = _read_json(manifest)           # every rank reads before anyone writes
        if old is not None and old != self.fingerprint and on_mismatch == "refuse":
            raise ResumeMismatch(f"{manifest}: the chunks there were scored with {describe_change(old, self.fingerprint)}; "
                                 f"refusing to mix them (use another output folder, or delete {self.folder} to "
                                 "start over)")
        barrier(info)
        if info.is_main and old != self.fingerprint:
            self.folder.mkdir(parents=True, exist_ok=True)
            if old is not None:
                print(f"{self.folder}: saved chunks belong to another run ({describe_change(old, self.fingerprint)}); "
                      "recomputing", file=sys.stderr)
                self._clear()
            atomic_write_json(manifest, self.fingerprint, indent=1)
        barrier(info)
        # A rank on a node that does not share rank 0's filesystem sees no (or another) manifest: it never
        # reuses what it finds there, but still saves its chunks.
        self.folder.mkdir(parents=True, exist_ok=True)
        self.reusable = _read_json(manifest) == self.fingerprint

    def _clear(self) -> None:
        for path in sorted(self.folder.rglob("*")):
            if path.is_file() and path.name != MANIFEST and path.suffix in (".npz", ".json"):
                path.unlink()

    def path(self, name: str, suffix: str = ".npz") -> Path:
        return self.folder / f"{name}{suffix}"

    def load(self, name: str, rows: int | None = None) -> dict | None:
        """The saved arrays of chunk `name`, or None when absent, unreadable, or (with `rows`) of another length."""
        path = self.path(name)
        if not self.reusable or not path.is_file():
            return None
        try:
            with np.load(path) as saved:
                arrays = {k: saved[k] for k in saved.files}
        except (OSError, ValueError, EOFError):   # an unreadable file is computed again
            return None
        if rows is not None and (not arrays or any(len(a) != rows for a in arrays.values())):
            return None
        return arrays

    def save(self, name: str, arrays: dict) -> None:
        path = self.path(name)
        path.parent.mkdir(parents=True, exist_ok=True)
        with atomic_open(path, "wb") as handle:
            np.savez(handle, **arrays)

    def load_json(self, name: str):
        return _read_json(self.path(name, ".json")) if self.reusable else None

    def save_json(self, name: str, payload) -> None:
        path = self.path(name, ".json")
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_json(path, payload)


def map_chunks(n_items: int, chunk_size: int, compute: Callable[[range], dict], *, work_dir: str,
               fingerprint: dict, info: DistInfo, desc: str, progress: bool = True,
               on_mismatch: str = "recompute") -> dict[str, np.ndarray]:
    """`compute(rows) -> {name: array with len(rows) rows}` over all items, sharded over ranks and resumable;
    every rank gets the arrays concatenated in item order."""
    if n_items == 0:
        raise ValueError(f"{desc}: nothing to compute")
    plan = ChunkPlan(n_items, 0, chunk_size)
    store = ChunkStore(work_dir, dict(fingerprint, n_items=n_items, chunk_size=chunk_size), info, on_mismatch)
    mine, reused = {}, 0
    for chunk in tqdm(plan.owned(info), desc=desc, unit="chunk", file=sys.stderr,
                      disable=not (progress and info.is_main), mininterval=1.0):
        arrays = store.load(chunk_name(chunk), len(plan.rows(chunk)))
        if arrays is None:
            arrays = {k: np.asarray(v) for k, v in compute(plan.rows(chunk)).items()}
            store.save(chunk_name(chunk), arrays)
        else:
            reused += 1
        mine[chunk] = arrays
    if reused and info.is_main:
        print(f"{desc}: reused {reused} saved chunk(s) from {work_dir}", file=sys.stderr)
    merged: dict[int, dict] = {}
    for part in gather_objects(mine, info):
        merged.update(part)
    names = merged[0].keys()
    return {name: np.concatenate([merged[k][name] for k in range(plan.n_chunks)]) for name in names}


def chunk_name(chunk: int) -> str:
    return f"chunk_{chunk:06d}"


def describe_change(old: dict, new: dict, limit: int = 3) -> str:
    """What differs between two fingerprints, in a few words: `rule 'letter' but this run has 'likelihood'`,
    `model_content (model.safetensors changed)`."""
    keys = [k for k in list(new) + [k for k in old if k not in new] if old.get(k) != new.get(k)]
    parts = []
    for key in keys[:limit]:
        was, now = old.get(key), new.get(key)
        if isinstance(was, dict) and isinstance(now, dict):
            changed = sorted(k for k in set(was) | set(now) if was.get(k) != now.get(k))
            more = f" and {len(changed) - limit} more" if len(changed) > limit else ""
            parts.append(f"{key} ({', '.join(map(str, changed[:limit]))}{more} changed)")
        else:
            parts.append(f"{key} {_short(was)} but this run has {_short(now)}")
    if len(keys) > limit:
        parts.append(f"{len(keys) - limit} more key(s): {', '.join(keys[limit:])}")
    return ", ".join(parts)


def _short(value, width: int = 80) -> str:
    text = repr(value)
    return text if len(text) <= width else text[:width - 3] + "..."


def _read_json(path: Path):
    try:
        return json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
