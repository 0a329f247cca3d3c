"""Sharded, resumable map over a list of items, in fixed chunks (the unit eval_retrieval resumes and shards by).

Chunk k holds items [k*size, (k+1)*size). Rank r of R computes chunks r, r+R, ...; each finished chunk is saved
atomically under `work_dir` (engine.retrieval.ChunkStore, valid only for the run's fingerprint) and skipped by a
restarted run with any number of ranks. Every rank then holds all chunks, concatenated in item order, so the
result does not depend on the number of ranks or on interruptions (batches never cross chunk borders).
"""
from __future__ import annotations

import sys
from typing import Callable

import numpy as np
from tqdm import tqdm

from volta_ml.engine.distributed import DistInfo, gather_objects
from volta_ml.engine.retrieval import ChunkPlan, ChunkStore


def map_chunks(n_items: int, chunk_size: int, compute: Callable[[range], dict], *, work_dir: str,
               fingerprint: dict, info: DistInfo, desc: str, progress: bool = True) -> dict[str, np.ndarray]:
    """`compute(rows) -> {name: array with len(rows) rows}` over all items; arrays concatenated in item order."""
    if n_items == 0:
        raise ValueError(f"{desc}: nothing to compute")
    plan = ChunkPlan(n_items, 0, chunk_size)
    store = ChunkStore(work_dir, dict(fingerprint, n_items=n_items, chunk_size=chunk_size), info)
    mine, reused = {}, 0
    for chunk in tqdm(plan.owned(info), desc=desc, unit="chunk", file=sys.stderr,
                      disable=not (progress and info.is_main), mininterval=1.0):
        arrays = store.load(chunk)
        if arrays is None:
            arrays = {k: np.asarray(v) for k, v in compute(plan.rows(chunk)).items()}
            store.save(chunk, arrays)
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
