"""Wikipedia text-only masked-language batches, as VOLTA's `WikipediasDataset` builds them for
train_concap_wiki.py (mUNITER / xUNITER-style pretraining).

`WikiData(dataroot, langs, lg_sampling_factor, tokenizer, batch_size=512, max_seq_length=36, seed=0, rank=None,
num_locs=5, add_global_imgfeat=None, max_region_num=36, feature_dim=2048)`; `sample(step)` -> VOLTA's batch
    (input_ids, input_mask, segment_ids, lm_label_ids, image_feat, image_loc, image_mask)
    input_ids / input_mask / segment_ids / lm_label_ids  int64 [batch_size, max_seq_length]
    image_feat  float32 zeros [batch_size, R', feature_dim]   image_loc float32 zeros [batch_size, R', num_locs]
    image_mask  int64 zeros [batch_size, R']                  R' = max_region_num + 2 with a global feature
(VOLTA adds the global row to the region count twice, in `__init__` and again in `__getitem__`; the rows are
all masked out, so only the shape shows it). `sample(step)` depends only on (seed, rank, step).

VOLTA's rules, kept:
- corpora: `<dataroot>/<lg>.20180201.txt`, one example per non-empty line (`langs` = ["ALL"]: every such file
  in `dataroot`, here in sorted order); `langs` may be VOLTA's "en-de-fr" string.
- language sampling (`set_sampling_probs`, `shuf_order`): each row of a batch draws its language, with
  replacement, uniformly when `lg_sampling_factor` is -1, else with p(lg) proportional to
  (lines(lg) / lines(all)) ** lg_sampling_factor (a factor must then be > 0);
- each row reads a uniformly drawn line, encoded WITH the tokenizer's special tokens ([CLS] line [SEP]), and while
  it has fewer than `max_seq_length - 2` tokens appends the following lines (wrapping around the corpus), each
  encoded with its special tokens too; it keeps the first `max_seq_length - 2` tokens, masks them as every
  VOLTA token is masked (special tokens included), and wraps the result in the special tokens once more: so
  a batch row reads [CLS] [CLS] line ... [SEP] [CLS] next line ... [SEP], always `max_seq_length` long
  (input_mask all 1, no padding).
Lines are split at "\\n" (a "\\r\\n" ending counts as one) and decoded as UTF-8 with invalid bytes replaced;
VOLTA's Hugging Face `datasets` text loader also splits at the rarer Unicode line separators. The line index
is built once per file (byte offsets, 12 bytes a line) and lines are read through a shared memory map.
"""
from __future__ import annotations

import glob
import mmap
import os

import numpy as np
import torch

from .masking import WIKI_STREAM, mask_token_batch, pick_below, sample_uniforms
from .text import PretrainDataError, TextEncoder

WIKI_SUFFIX = ".20180201.txt"
GLOBAL_MODES = (None, "first", "last")


def wiki_languages(dataroot, langs) -> list[str]:
    """VOLTA's `--lgs`: "en-de" or ["en", "de"]; ["ALL"] (or "ALL"): every `<lg>.20180201.txt` in dataroot."""
    langs = langs.split("-") if isinstance(langs, str) else list(langs)
    if langs == ["ALL"]:
        files = sorted(glob.glob(os.path.join(str(dataroot), "*" + WIKI_SUFFIX)))
        if not files:
            raise PretrainDataError(f"{dataroot}: --lgs ALL but no *{WIKI_SUFFIX} file there")
        return [os.path.basename(f).split(".")[0] for f in files]
    if not langs or any(not lang for lang in langs):
        raise PretrainDataError(f"--lgs {'-'.join(langs)!r}: expected languages separated by '-', e.g. en-de-fr")
    return langs


def sampling_probs(sizes, lg_sampling_factor) -> np.ndarray | None:
    """VOLTA's `set_sampling_probs`: None (uniform) for -1, else p ~ (size / total) ** factor, normalised."""
    if lg_sampling_factor == -1:
        return None
    if not lg_sampling_factor > 0:
        raise PretrainDataError(f"--lg_sampling_factor {lg_sampling_factor}: -1 (uniform) or a positive exponent")
    probs = np.asarray(sizes, dtype=np.float64)
    probs = probs / probs.sum()
    probs = probs ** float(lg_sampling_factor)
    return probs / probs.sum()


class LineIndex:
    """The non-empty lines of a UTF-8 text file: `len()`, `line(i)`; byte offsets found with numpy, lines read
    through a memory map opened lazily in each process."""

    def __init__(self, path: str, chunk: int = 1 << 26):
        self.path = str(path)
        self._map, self._pid = None, None
        size = os.path.getsize(self.path)
        starts, ends = [np.zeros(1, dtype=np.int64)], []
        if size:
            data = np.frombuffer(self._mapping(), dtype=np.uint8)
            for at in range(0, size, chunk):
                newlines = np.flatnonzero(data[at:at + chunk] == 10) + at
                ends.append(newlines)
                starts.append(newlines + 1)
        ends.append(np.array([size], dtype=np.int64))
        starts, ends = np.concatenate(starts), np.concatenate(ends)
        if size:
            carriage = ends > starts
            carriage[carriage] = data[ends[carriage] - 1] == 13
            ends = ends - carriage
        keep = ends > starts
        self.starts = starts[keep]
        self.lengths = (ends - starts)[keep].astype(np.int32)

    def _mapping(self):
        if self._map is None or self._pid != os.getpid():
            with open(self.path, "rb") as handle:
                self._map = mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ)
            self._pid = os.getpid()
        return self._map

    def __getstate__(self):
        return {**self.__dict__, "_map": None, "_pid": None}

    def __len__(self) -> int:
        return len(self.starts)

    def line(self, i: int) -> str:
        start = int(self.starts[i])
        return self._mapping()[start:start + int(self.lengths[i])].decode("utf-8", errors="replace")


class WikiData:
    """VOLTA's Wikipedia text-only MLM batches (see the module docstring)."""

    def __init__(self, dataroot, langs, lg_sampling_factor, tokenizer, batch_size: int = 512,
                 max_seq_length: int = 36, seed: int = 0, rank: int | None = None, num_locs: int = 5,
                 add_global_imgfeat=None, max_region_num: int = 36, feature_dim: int = 2048):
        if add_global_imgfeat not in GLOBAL_MODES:
            raise PretrainDataError(f"add_global_imgfeat {add_global_imgfeat!r}: choose first, last or none")
        self.lgs = wiki_languages(dataroot, langs)
        self.corpus = {}
        for lang in self.lgs:
            path = os.path.join(str(dataroot), lang + WIKI_SUFFIX)
            if not os.path.isfile(path):
                raise PretrainDataError(f"{path}: no Wikipedia text for language {lang!r} (VOLTA's layout: "
                                        f"<dataroot>/<lg>{WIKI_SUFFIX}, one paragraph a line)")
            self.corpus[lang] = LineIndex(path)
            if not len(self.corpus[lang]):
                raise PretrainDataError(f"{path}: no non-empty line")
        self.lg2lens = {lang: len(index) for lang, index in self.corpus.items()}
        self.lg_sampling_factor = lg_sampling_factor
        probs = sampling_probs([self.lg2lens[lang] for lang in self.lgs], lg_sampling_factor)
        self.lg2prob = None if probs is None else dict(zip(self.lgs, probs))
        weights = np.full(len(self.lgs), 1.0 / len(self.lgs)) if probs is None else probs
        self._cdf = np.cumsum(weights)
        self._cdf /= self._cdf[-1]
        self.text = TextEncoder(tokenizer)
        self.batch_size, self.max_seq_length = int(batch_size), int(max_seq_length)
        self.content_len = self.max_seq_length - self.text.num_special
        if self.content_len < 1:
            raise PretrainDataError(f"max_seq_length {max_seq_length} leaves no room for text between the "
                                    "tokenizer's special tokens")
        self.seed, self.rank = int(seed), rank
        self.num_locs, self.feature_dim = int(num_locs), int(feature_dim)
        self.num_regions = max_region_num + 2 * int(add_global_imgfeat is not None)   # VOLTA counts it twice

    def _fill(self, langs: list[str], lines: np.ndarray) -> np.ndarray:
        """Token ids `[B, content_len]`: each row's line and the lines after it, with special tokens."""
        C = self.content_len
        rows = [list(ids) for ids in self.text.encode_many([self.corpus[lang].line(int(i))
                                                             for lang, i in zip(langs, lines)], special=True)]
        cursor = lines.astype(np.int64).copy()
        idle = np.zeros(len(rows), dtype=np.int64)   # lines read since a row last grew (a pass of nothing: stop)
        while short := [r for r in range(len(rows)) if len(rows[r]) < C]:
            for r in short:
                if idle[r] >= self.lg2lens[langs[r]]:
                    raise PretrainDataError(f"{self.corpus[langs[r]].path}: no line encodes to any token; a "
                                            f"Wikipedia row needs {C} of them")
                cursor[r] = (cursor[r] + 1) % self.lg2lens[langs[r]]
            more = self.text.encode_many([self.corpus[langs[r]].line(int(cursor[r])) for r in short], special=True)
            for r, ids in zip(short, more):
                rows[r] += ids
                idle[r] = 0 if ids else idle[r] + 1
        return np.array([ids[:C] for ids in rows], dtype=np.int64)

    def _draw(self, step: int):
        B, C = self.batch_size, self.content_len
        u = sample_uniforms(self.seed, WIKI_STREAM, int(step), B * (2 + 2 * C), rank=self.rank).reshape(B, -1)
        # draw layout per row: [language, line, C token picks, C random ids]
        lang_index = np.minimum(np.searchsorted(self._cdf, u[:, 0], side="right"), len(self.lgs) - 1)
        langs = [self.lgs[k] for k in lang_index]
        lines = pick_below(u[:, 1], np.array([self.lg2lens[lang] for lang in langs]))
        return langs, lines, u

    def rows(self, step: int) -> tuple[list[str], np.ndarray]:
        """The language and first line (index among the non-empty lines) of each row of `sample(step)`."""
        langs, lines, _ = self._draw(step)
        return langs, lines

    def sample(self, step: int) -> tuple:
        """The batch of `step` (VOLTA's `WikipediasDataset.sample()`), the same for the same (seed, rank, step)."""
        B, L, C = self.batch_size, self.max_seq_length, self.content_len
        langs, lines, u = self._draw(step)
        content = self._fill(langs, lines)
        ids, labels = mask_token_batch(content, np.full(B, C), u[:, 2:2 + C], u[:, 2 + C:],
                                       self.text.mask_id, self.text.vocab_size)
        P, S = len(self.text.prefix), len(self.text.suffix)
        input_ids = np.empty((B, L), dtype=np.int64)
        input_ids[:, :P] = self.text.prefix
        input_ids[:, P:P + C] = ids
        input_ids[:, P + C:] = self.text.suffix[:S]
        lm_label_ids = np.full((B, L), -1, dtype=np.int64)
        lm_label_ids[:, P:P + C] = labels
        R = self.num_regions
        return (torch.from_numpy(input_ids), torch.ones((B, L), dtype=torch.long), torch.zeros((B, L), dtype=torch.long),
                torch.from_numpy(lm_label_ids), torch.zeros((B, R, self.feature_dim), dtype=torch.float32),
                torch.zeros((B, R, self.num_locs), dtype=torch.float32), torch.zeros((B, R), dtype=torch.long))
