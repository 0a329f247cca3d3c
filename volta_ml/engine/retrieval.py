"""The full caption x image score matrix: chunked, resumable, sharded across ranks.

The matrix is cut into chunks of `captions_per_chunk` captions x all images. Rank r of R computes chunks
r, r+R, ...; each finished chunk is written atomically to `<work_dir>/chunk_<k>.npz` (float32 or float16) and
skipped when a restarted run (any number of ranks) finds it, provided the run's fingerprint (the checkpoint's
content, annotation file, features, flags that change scores) matches `<work_dir>/manifest.json`; otherwise the
saved chunks are recomputed (`engine/chunks.ChunkStore`, policy "recompute"). At the end every
rank's chunks are gathered, so all ranks hold the matrix a single process computes, bit for bit: chunks
and the batches inside them do not depend on the number of ranks.

Optional, non-standard fast mode (`shortlist=K`): each caption's images are first scored with the same
cross-encoder on only the first `shortlist_regions` regions of every image (cheap), the K best are re-scored
in full, and in the final matrix every re-scored pair ranks above every pair that was not, which keep their
cheap order. Numbers from this mode are not comparable to IGLUE's and are reported as such.
"""
from __future__ import annotations

import sys

import numpy as np
import torch
from tqdm import tqdm

from volta_ml.atomic import atomic_open
from volta_ml.engine.chunks import ChunkPlan, ChunkStore, chunk_name
from volta_ml.engine.distributed import DistInfo, gather_objects
from volta_ml.engine.retrieval_scorer import IMAGE_KEYS, PairScorer

def save_array(path: str, array: np.ndarray) -> None:
    """`np.save`, atomically: a crash leaves the old file or none, never a truncated one."""
    with atomic_open(path) as handle:
        np.save(handle, array)


def _pair_batches(n_captions: int, n_images: int, pair_batch: int):
    """(caption rows, image rows) of consecutive pairs in caption-major order."""
    total = n_captions * n_images
    for start in range(0, total, pair_batch):
        flat = torch.arange(start, min(start + pair_batch, total))
        yield flat // n_images, flat % n_images


def _score_all_pairs(scorer: PairScorer, n_captions: int, n_images: int, pair_batch: int, bar) -> np.ndarray:
    out = torch.empty(n_captions * n_images)
    done = 0
    for caption_rows, image_rows in _pair_batches(n_captions, n_images, pair_batch):
        out[done:done + len(caption_rows)] = scorer.score(caption_rows, image_rows).cpu()
        done += len(caption_rows)
        bar.update(len(caption_rows))
    return out.view(n_captions, n_images).numpy()


def _score_listed_pairs(scorer: PairScorer, images: np.ndarray, pair_batch: int, bar) -> np.ndarray:
    """Scores of (caption c, image images[c, j]) for every c, j."""
    n_captions, k = images.shape
    flat_images = torch.from_numpy(images.reshape(-1))
    flat_captions = torch.arange(n_captions).repeat_interleave(k)
    out = torch.empty(len(flat_images))
    for start in range(0, len(flat_images), pair_batch):
        stop = start + pair_batch
        out[start:stop] = scorer.score(flat_captions[start:stop], flat_images[start:stop]).cpu()
        bar.update(len(out[start:stop]))
    return out.view(n_captions, k).numpy()


def _chunk_scores(scorer, cheap_scorer, captions: dict, rows: range, n_images: int, shortlist: int | None,
                  pair_batch: int, dtype, bar) -> dict:
    block = {k: v[rows.start:rows.stop] for k, v in captions.items()}
    if not shortlist:
        scorer.set_captions(block)
        return {"scores": _score_all_pairs(scorer, len(rows), n_images, pair_batch, bar).astype(dtype)}
    cheap_scorer.set_captions(block)
    cheap = _score_all_pairs(cheap_scorer, len(rows), n_images, pair_batch, bar)
    k = min(shortlist, n_images)
    picked = np.argsort(-cheap, axis=1, kind="stable")[:, :k]
    scorer.set_captions(block)
    full = _score_listed_pairs(scorer, picked, pair_batch, bar)
    return {"cheap": cheap.astype(dtype), "picked": picked.astype(np.int32), "full": full.astype(dtype)}


def merge_shortlist(parts: list[dict], n_images: int) -> np.ndarray:
    """Fast mode's final matrix: re-scored pairs keep their full score; every other pair keeps its cheap
    score shifted below the lowest full score, so it ranks after all re-scored pairs in rows and columns."""
    cheap = np.concatenate([p["cheap"] for p in parts]).astype(np.float32)
    picked = np.concatenate([p["picked"] for p in parts]).astype(np.int64)
    full = np.concatenate([p["full"] for p in parts]).astype(np.float32)
    shift = float(full.min()) - float(cheap.max()) - 1.0
    scores = cheap + shift
    np.put_along_axis(scores, picked, full, axis=1)
    return scores


def compute_score_matrix(model, captions: dict, gallery: dict, *, task_id: str | None = None,
                         zero_shot: bool = False, info: DistInfo | None = None, work_dir: str | None = None,
                         fingerprint: dict | None = None, captions_per_chunk: int = 64, pair_batch: int = 1024,
                         precision: str = "fp32", score_dtype: str = "float32", shortlist: int | None = None,
                         shortlist_regions: int = 10, reuse_prefix: bool = True, progress: bool = True,
                         after_chunk=None) -> np.ndarray:
    """Scores [n_captions, n_images] (float32) of every caption against every image, on every rank.

    `captions`: input_txt / attention_mask / token_type_ids [C, L]; `gallery`: input_imgs / image_loc /
    image_attention_mask [N, R, ...] (CPU tensors). `work_dir` enables resuming; `after_chunk(chunk)` is
    called after each chunk is saved (tests use it to interrupt a run).
    """
    info = info or DistInfo()
    dtype = np.dtype(score_dtype)
    n_captions, n_images = len(captions["input_txt"]), len(gallery["input_imgs"])
    plan = ChunkPlan(n_captions, n_images, captions_per_chunk)
    store = ChunkStore(work_dir, fingerprint or {}, info) if work_dir else None
    owned = plan.owned(info)
    results = {c: store.load(chunk_name(c), len(plan.rows(c))) for c in owned} if store else {}
    todo = [c for c in owned if results.get(c) is None]
    if store and len(todo) < len(owned):
        label = f"rank {info.rank}: " if info.world_size > 1 else ""
        print(f"{label}resuming: {len(owned) - len(todo)} of {len(owned)} chunks already in {work_dir}",
              file=sys.stderr)

    if todo:
        scorer = PairScorer(model, task_id, zero_shot, precision, reuse_prefix)
        scorer.set_gallery(gallery)
        cheap_scorer = None
        if shortlist:
            cheap_scorer = PairScorer(model, task_id, zero_shot, precision, reuse_prefix)
            cheap_scorer.set_gallery({k: gallery[k][:, :shortlist_regions] for k in IMAGE_KEYS})
        per_pair = 1 + (min(shortlist, n_images) / n_images if shortlist else 0)
        total = int(sum(len(plan.rows(c)) for c in todo) * n_images * per_pair)
        label = f"rank {info.rank}: " if info.world_size > 1 else ""
        with tqdm(total=total, desc=f"{label}scoring pairs", unit="pair", unit_scale=True, dynamic_ncols=True,
                  disable=not progress, file=sys.stderr, mininterval=1.0) as bar:
            for chunk in todo:
                results[chunk] = _chunk_scores(scorer, cheap_scorer, captions, plan.rows(chunk), n_images,
                                               shortlist, pair_batch, dtype, bar)
                if store:
                    store.save(chunk_name(chunk), results[chunk])
                if after_chunk is not None:
                    after_chunk(chunk)

    merged: dict[int, dict] = {}
    for part in gather_objects({c: results[c] for c in owned}, info):
        merged.update(part)
    parts = [merged[c] for c in range(plan.n_chunks)]
    if shortlist:
        return merge_shortlist(parts, n_images)
    return np.concatenate([p["scores"] for p in parts]).astype(np.float32)
