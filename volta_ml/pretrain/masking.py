"""VOLTA's pretraining corruption rules, vectorised over a batch, with one random stream per sample.

The rules (VOLTA's `BertPreprocessBatch` and `WikipediasDataset`, written again from their behaviour):

- **Tokens** (`mask_token_batch`): each content token is picked with probability 0.15 (`u < 0.15`); a picked
  token becomes `[MASK]` when `u / 0.15 < 0.8`, a uniformly random id of the whole vocabulary
  (`len(tokenizer)`, special tokens included) when `u / 0.15 < 0.9`, and stays itself otherwise. Its label is
  the original id; every other label is -1.
- **Regions** (`mask_region_batch`): each real region is picked with probability 0.15; a picked region's
  features are zeroed when `u / 0.15 < 0.9` (the other 10% keep theirs). Its `image_label` is 1, every other
  one -1 (padding included). `masked_label` marks every real region whose IoU with a picked region is above 0.4
  (a picked region marks itself); it only decides which regions the global image feature averages over
  (VOLTA zeroes the picked regions alone, not their overlaps).
- **IoU** (`box_iou`): VOLTA's pixel convention, `(x2 - x1 + 1) * (y2 - y1 + 1)` areas, computed in the
  boxes' float32 with VOLTA's operations in VOLTA's order (the same values).
- **Negatives**: with objective 0 or 1 the caption is replaced, with probability 0.5 (`u > 0.5`), by a
  caption drawn uniformly from the captions file (`is_next` = 1); objective 2 never replaces it.
  `ignore_mismatched_labels` is objective 1's rule in VOLTA's training loop: no masked-token or
  masked-region target on a replaced caption.

Randomness: VOLTA draws from the process-global `random` / `np.random` states of its DataLoader workers, so a
run cannot be repeated. Here every sample draws one block of uniforms from its own Philox stream, keyed by
(seed, purpose) and placed by (index, epoch, rank) in the counter (`sample_uniforms`): the same (seed, epoch,
rank, index) always gives the same sample, in any worker, in any batch, after any resume; other epochs, ranks
or indices give independent streams. A uniform `u` picks an integer in [0, n) as `floor(u * n)` (the random
token id, the negative caption, the Wikipedia line), and a language as the first whose cumulative probability
exceeds `u` (`np.random.choice`'s rule).
"""
from __future__ import annotations

import threading

import numpy as np

MASK_PROB = 0.15           # a token / region is picked for prediction
MASK_TOKEN_SHARE = 0.8     # of the picked tokens: [MASK]
RANDOM_TOKEN_SHARE = 0.9   # cumulative: the next 10% get a random id, the last 10% stay
ZERO_REGION_SHARE = 0.9    # of the picked regions: features zeroed
OVERLAP_IOU = 0.4          # regions overlapping a picked one above this IoU leave the global average
NEGATIVE_PROB = 0.5        # caption replaced (objectives 0 and 1)
OBJECTIVES = {0: "masking + image-text matching",
              1: "image-text matching; no masking targets on a mismatched pair",
              2: "masking only; no negative captions"}

CONCAP_STREAM = 0x436F6E436170     # the Philox key's second word: which kind of sample the stream serves
WIKI_STREAM = 0x57696B69

_LOCAL = threading.local()
_MASK64 = (1 << 64) - 1


def sample_uniforms(seed: int, purpose: int, index: int, size: int, epoch: int = 0,
                    rank: int | None = None) -> np.ndarray:
    """`size` uniforms in [0, 1) from the stream of one sample: Philox-4x64 with key (seed, purpose) and counter
    (0, index, epoch, rank + 1); the counter's first word is the position inside the stream, so streams never
    overlap. (One bit generator per thread, its state set per call: ~4x cheaper than building one.)"""
    holder = getattr(_LOCAL, "rng", None)
    if holder is None:
        bit_generator = np.random.Philox(key=0)
        holder = _LOCAL.rng = (bit_generator, np.random.Generator(bit_generator))
    holder[0].state = {
        "bit_generator": "Philox",
        "state": {"counter": np.array([0, index & _MASK64, epoch & _MASK64,
                                       (0 if rank is None else rank + 1) & _MASK64], dtype=np.uint64),
                  "key": np.array([seed & _MASK64, purpose & _MASK64], dtype=np.uint64)},
        "buffer": np.zeros(4, dtype=np.uint64), "buffer_pos": 4, "has_uint32": 0, "uinteger": 0,
    }
    return holder[1].random(size)


def pick_below(u: np.ndarray, n) -> np.ndarray:
    """floor(u * n) as int64, in [0, n) (n a count or an array of counts)."""
    return np.minimum((u * n).astype(np.int64), np.asarray(n, dtype=np.int64) - 1)


def mask_token_batch(content: np.ndarray, lengths: np.ndarray, u: np.ndarray, u_random: np.ndarray,
                     mask_id: int, vocab_size: int):
    """VOLTA's `random_word` on each row's first `lengths[b]` content ids of `content` `[B, C]`:
    -> (ids, labels) int64 `[B, C]`; positions past a row's length keep their id and get label -1.
    `u` picks and splits (80/10/10), `u_random` gives the random ids."""
    real = np.arange(content.shape[1]) < lengths[:, None]
    picked = (u < MASK_PROB) & real
    share = u / MASK_PROB
    ids = content.copy()
    ids[picked & (share < MASK_TOKEN_SHARE)] = mask_id
    randomised = picked & (share >= MASK_TOKEN_SHARE) & (share < RANDOM_TOKEN_SHARE)
    ids[randomised] = pick_below(u_random[randomised], vocab_size)
    labels = np.where(picked, content, -1)
    return ids, labels


def box_iou(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """IoU of pixel boxes `a` and `b` (x1, y1, x2, y2 in the last axis; the other axes broadcast), VOLTA's +1
    convention, computed in the boxes' dtype with VOLTA's operations in VOLTA's order (the same values)."""
    area_a = (a[..., 2] - a[..., 0] + 1) * (a[..., 3] - a[..., 1] + 1)
    area_b = (b[..., 2] - b[..., 0] + 1) * (b[..., 3] - b[..., 1] + 1)
    iw = np.minimum(a[..., 2], b[..., 2]) - np.maximum(a[..., 0], b[..., 0]) + 1
    ih = np.minimum(a[..., 3], b[..., 3]) - np.maximum(a[..., 1], b[..., 1]) + 1
    np.maximum(iw, 0, out=iw)
    np.maximum(ih, 0, out=ih)
    inter = iw * ih
    return inter / (area_a + area_b - inter)


def mask_region_batch(boxes: np.ndarray, real: np.ndarray, u: np.ndarray):
    """VOLTA's `random_region` on padded pixel boxes `[B, R, 4]` whose real regions are `real` (bool
    `[B, R]`): -> (zeroed bool `[B, R]`: features set to 0, image_label int64 `[B, R]`: 1 picked / -1
    otherwise, masked_label bool `[B, R]`: a real region overlapping a picked one with IoU > 0.4)."""
    picked = (u < MASK_PROB) & real
    zeroed = picked & (u / MASK_PROB < ZERO_REGION_SHARE)
    image_label = np.where(picked, 1, -1).astype(np.int64)
    masked_label = np.zeros(real.shape, dtype=bool)
    rows, cols = np.nonzero(picked)            # row-major: the picked regions of a sample are consecutive
    if len(rows):
        overlaps = box_iou(boxes[rows, cols][:, None, :], boxes[rows]) > OVERLAP_IOU    # [picked, R]
        starts = np.flatnonzero(np.r_[True, rows[1:] != rows[:-1]])
        masked_label[rows[starts]] = np.logical_or.reduceat(overlaps, starts, axis=0)
        masked_label &= real
    return zeroed, image_label, masked_label


def ignore_mismatched_labels(lm_label_ids, image_label, is_next):
    """Objective 1 (VOLTA's training loop): on pairs whose caption was replaced (`is_next` = 1) every
    masked-token and masked-region label becomes -1. Literally VOLTA's `x * (is_next == 0)` then `x[x == 0] = -1`
    (so a label equal to 0 also becomes -1 on a matched pair). Torch tensors in, new tensors out."""
    keep = (is_next == 0).long().unsqueeze(1)
    out = []
    for labels in (lm_label_ids, image_label):
        labels = labels * keep
        labels[labels == 0] = -1
        out.append(labels)
    return tuple(out)
