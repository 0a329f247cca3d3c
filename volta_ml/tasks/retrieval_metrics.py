"""Retrieval metrics over a caption x image score matrix, with eval_retrieval's rules.

- Image retrieval (IR, text -> image): one query per caption; rank = position of the caption's gold image
  in the descending order of its score row.
- Text retrieval (TR, image -> text): one query per image; rank = the best (smallest) position of any of
  its gold captions in the descending order of its score column.
- R@K = 100 * hits / n, as IGLUE computes it (`100 * mean` would store 57.49999999999999 for 23 of 40 where
  IGLUE has 57.5); medr = floor(median(rank) + 1); meanr = mean(rank) + 1 (ranks are 0-based).
- Ties: VOLTA sorts with numpy's unstable quicksort, so tied scores rank arbitrarily. Here ties are broken
  by index (the lower image / caption index first), i.e. a stable descending sort, so results are
  deterministic and independent of how the matrix was computed or sharded.
"""
from __future__ import annotations

import heapq
import math
import re

import numpy as np

FINAL_FORMAT = "Final r1:%.3f, r5:%.3f, r10:%.3f, mder:%.3f, meanr:%.3f"
FINAL_PATTERN = re.compile(r"Final r1:([-\d.naif]+), r5:([-\d.naif]+), r10:([-\d.naif]+), "
                           r"mder:([-\d.naif]+), meanr:([-\d.naif]+)")
METRIC_KEYS = ("r1", "r5", "r10", "medr", "meanr")
TOP_K_SAVED = 20


def _rank_in(values: np.ndarray, index: int) -> int:
    """0-based position of values[index] in a stable descending sort of `values`."""
    target = values[index]
    return int(np.count_nonzero(values > target) + np.count_nonzero(values[:index] == target))


def image_retrieval_ranks(scores: np.ndarray, caption_image: np.ndarray, block: int = 1024) -> np.ndarray:
    """Rank of each caption's gold image in its row; `caption_image[c]` is the gold image of caption c."""
    scores = np.asarray(scores)
    caption_image = np.asarray(caption_image, dtype=np.int64)
    ranks = np.empty(len(caption_image), dtype=np.int64)
    columns = np.arange(scores.shape[1])
    for start in range(0, len(caption_image), block):
        rows = scores[start:start + block].astype(np.float32, copy=False)
        gold = caption_image[start:start + block]
        target = rows[np.arange(len(rows)), gold][:, None]
        before = columns[None, :] < gold[:, None]
        ranks[start:start + block] = np.count_nonzero(rows > target, axis=1) + \
            np.count_nonzero((rows == target) & before, axis=1)
    return ranks


def text_retrieval_ranks(scores: np.ndarray, caption_image: np.ndarray, num_images: int | None = None) -> np.ndarray:
    """For each image, the best rank among its gold captions in its score column."""
    scores = np.asarray(scores)
    caption_image = np.asarray(caption_image, dtype=np.int64)
    num_images = scores.shape[1] if num_images is None else num_images
    gold_captions = [[] for _ in range(num_images)]
    for caption, image in enumerate(caption_image):
        gold_captions[image].append(caption)
    ranks = np.empty(num_images, dtype=np.int64)
    for image, captions in enumerate(gold_captions):
        if not captions:
            raise ValueError(f"image {image} has no caption, so it has no text-retrieval rank")
        column = np.ascontiguousarray(scores[:, image], dtype=np.float32)
        ranks[image] = min(_rank_in(column, c) for c in captions)
    return ranks


def recall_metrics(ranks: np.ndarray) -> dict[str, float]:
    ranks = np.asarray(ranks)
    n = len(ranks)
    return {
        "r1": 100.0 * int(np.count_nonzero(ranks < 1)) / n,
        "r5": 100.0 * int(np.count_nonzero(ranks < 5)) / n,
        "r10": 100.0 * int(np.count_nonzero(ranks < 10)) / n,
        "medr": float(math.floor(np.median(ranks) + 1)),
        "meanr": float(np.mean(ranks) + 1),
    }


def query_items(ir_ranks: np.ndarray, tr_ranks: np.ndarray) -> list[dict]:
    """Per-query rows of the per-item file (volta_ml/stats.py): `caption:<index>` (file order) with its image
    retrieval hits `ir_r1/ir_r5/ir_r10` (100 or 0) and `image:<index>` (first-seen order) with its text retrieval
    hits `tr_*`; the mean of each column is `recall_metrics`' R@K."""
    rows = []
    for prefix, kind, ranks in (("ir", "caption", ir_ranks), ("tr", "image", tr_ranks)):
        for index, rank in enumerate(np.asarray(ranks).tolist()):
            rows.append({"id": f"{kind}:{index}", **{f"{prefix}_r{k}": 100.0 * (rank < k) for k in (1, 5, 10)}})
    return rows


def final_line(metrics: dict[str, float]) -> str:
    return FINAL_FORMAT % tuple(metrics[k] for k in METRIC_KEYS)


def running_ir_lines(ranks: np.ndarray, num_subiters: int):
    """VOLTA's running line after each caption: `<i> Final ...` over the captions so far, where i is the
    dataset index of the caption's last gallery chunk (caption * num_subiters + num_subiters - 1)."""
    low, high = [], []          # max-heap (negated) of the lower half, min-heap of the upper half
    hits = np.zeros(3)
    total = 0
    for count, rank in enumerate(np.asarray(ranks).tolist(), start=1):
        if low and rank > -low[0]:
            heapq.heappush(high, rank)
        else:
            heapq.heappush(low, -rank)
        if len(low) > len(high) + 1:
            heapq.heappush(high, -heapq.heappop(low))
        elif len(high) > len(low):
            heapq.heappush(low, -heapq.heappop(high))
        median = -low[0] if len(low) > len(high) else (-low[0] + high[0]) / 2
        hits += (rank < 1, rank < 5, rank < 10)
        total += rank
        metrics = {"r1": 100.0 * hits[0] / count, "r5": 100.0 * hits[1] / count, "r10": 100.0 * hits[2] / count,
                   "medr": float(math.floor(median + 1)), "meanr": total / count + 1}
        yield f"{(count - 1) * num_subiters + num_subiters - 1} {final_line(metrics)}"


def top_images(scores: np.ndarray, k: int = TOP_K_SAVED, block: int = 1024) -> list[list[int]]:
    """Per caption, the indices of its k best images by descending score (ties: lower index first)."""
    scores = np.asarray(scores)
    out: list[list[int]] = []
    for start in range(0, scores.shape[0], block):
        rows = -scores[start:start + block].astype(np.float32)
        out.extend(np.argsort(rows, axis=1, kind="stable")[:, :k].tolist())
    return out


def read_final_lines(text: str) -> tuple[dict[str, float], dict[str, float]]:
    """IGLUE's scraping rule: the last two stdout lines starting with `Final` are IR, then TR."""
    finals = [line for line in text.splitlines() if line.startswith("Final")]
    if len(finals) < 2:
        raise ValueError(f"expected two lines starting with 'Final', found {len(finals)}")
    parsed = []
    for line in finals[-2:]:
        match = FINAL_PATTERN.fullmatch(line.strip())
        if not match:
            raise ValueError(f"unparsable Final line: {line!r}")
        parsed.append(dict(zip(METRIC_KEYS, map(float, match.groups()))))
    return parsed[0], parsed[1]
