"""What VOLTA's pretraining datasets ask of their tokenizer, resolved once, and captions encoded once.

VOLTA calls `tokenizer.encode(caption, add_special_tokens=False)` per sample (Conceptual Captions),
`tokenizer.encode(line)` with the special tokens (Wikipedia), `build_inputs_with_special_tokens(ids)`,
`convert_tokens_to_ids(mask_token)` and `len(tokenizer)`. `TextEncoder` answers the same: a fast tokenizer
encodes through its Rust backend (the same ids, without the Python wrapper), and the special tokens around a
sequence come from `build_inputs_with_special_tokens` where the tokenizer still has it (transformers < 5),
else from comparing `encode(text)` with and without them. `CaptionTokens` holds every caption of a captions
file encoded once, in batches (flat int32 ids + offsets: no per-caption Python objects, so DataLoader workers
share the pages after fork); with a token cache folder (`volta_ml.data.cache.TokenCache`, the one train_task.py
uses) they are kept there, keyed by the tokenizer's fingerprint and the captions file's sha256, so the next run
(and every other rank) loads them instead of encoding them again (Conceptual Captions' 3.3M captions take
minutes on one core).
"""
from __future__ import annotations

import hashlib
import itertools
from pathlib import Path

import numpy as np

from volta_ml.atomic import atomic_open
from volta_ml.data.text import tokenizer_fingerprint
from volta_ml.digest import file_digest
from volta_ml.engine.failures import UsageError

CAPTIONS_CACHE_FORMAT = 1


class PretrainDataError(UsageError):
    """Pretraining data or settings that cannot serve the requested run (one line, exit code 2)."""


class TextEncoder:
    """`encode(text)` (no special tokens), `encode_many(texts)`, `prefix` / `suffix` (the special tokens around
    one sequence), `mask_id`, `vocab_size` (= `len(tokenizer)`)."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.backend = getattr(tokenizer, "backend_tokenizer", None) if getattr(tokenizer, "is_fast", False) \
            else None
        mask_token = getattr(tokenizer, "mask_token", None)
        if mask_token is None:
            raise PretrainDataError(f"tokenizer {type(tokenizer).__name__} has no mask token: masked language "
                                    "modelling needs one")
        self.mask_id = int(tokenizer.convert_tokens_to_ids(mask_token))
        self.vocab_size = len(tokenizer)
        self.prefix, self.suffix = self._special_layout()

    def _special_layout(self) -> tuple[list[int], list[int]]:
        build = getattr(self.tokenizer, "build_inputs_with_special_tokens", None)
        if build is not None:
            probe = -7
            wrapped = list(build([probe]))
            at = wrapped.index(probe)
            return wrapped[:at], wrapped[at + 1:]
        inner = list(self.tokenizer.encode("a", add_special_tokens=False))
        outer = list(self.tokenizer.encode("a"))
        for at in range(len(outer) - len(inner) + 1):
            if outer[at:at + len(inner)] == inner:
                return outer[:at], outer[at + len(inner):]
        raise PretrainDataError(f"cannot tell which special tokens tokenizer {type(self.tokenizer).__name__} "
                                "adds around a sequence")

    @property
    def num_special(self) -> int:
        return len(self.prefix) + len(self.suffix)

    def encode(self, text: str, special: bool = False) -> list[int]:
        """`tokenizer.encode(text, add_special_tokens=special)`."""
        if self.backend is not None:
            return self.backend.encode(text, add_special_tokens=special).ids
        return list(self.tokenizer.encode(text, add_special_tokens=special))

    def encode_many(self, texts: list[str], special: bool = False) -> list[list[int]]:
        if self.backend is not None:
            return [e.ids for e in self.backend.encode_batch(list(texts), add_special_tokens=special)]
        return [list(ids) for ids in self.tokenizer(list(texts), add_special_tokens=special)["input_ids"]]


class CaptionTokens:
    """The captions of a file encoded once without special tokens: `tokens[j]` -> int32 ids of caption j."""

    def __init__(self, ids: np.ndarray, offsets: np.ndarray):
        self.ids, self.offsets = ids, offsets

    @classmethod
    def encode(cls, text: TextEncoder, captions: list[str], chunk: int = 8192) -> "CaptionTokens":
        ids, lengths = [], []
        for start in range(0, len(captions), chunk):
            encoded = text.encode_many(captions[start:start + chunk])
            lengths.append(np.fromiter(map(len, encoded), dtype=np.int64, count=len(encoded)))
            ids.append(np.fromiter(itertools.chain.from_iterable(encoded), dtype=np.int32))
        offsets = np.zeros(len(captions) + 1, dtype=np.int64)
        if lengths:
            np.cumsum(np.concatenate(lengths), out=offsets[1:])
        return cls(np.concatenate(ids) if ids else np.zeros(0, dtype=np.int32), offsets)

    @classmethod
    def load_or_encode(cls, text: TextEncoder, captions: list[str], source, cache_dir=None) -> "CaptionTokens":
        """`encode`, through `<cache_dir>/captions-<key>.npz` when a cache folder is given (written atomically)."""
        if cache_dir is None:
            return cls.encode(text, captions)
        tokenizer = text.tokenizer
        fingerprint = getattr(tokenizer, "volta_fingerprint", None) or tokenizer_fingerprint(tokenizer)
        key = hashlib.sha256(f"pretrain-captions v{CAPTIONS_CACHE_FORMAT}|{fingerprint}|"
                             f"{file_digest(source)}".encode()).hexdigest()[:32]
        file = Path(cache_dir) / f"captions-{key}.npz"
        if file.is_file():
            try:
                with np.load(file) as stored:
                    ids, offsets = stored["ids"], stored["offsets"]
                if len(offsets) == len(captions) + 1:
                    return cls(ids, offsets)
            except (OSError, ValueError, KeyError):
                pass   # unreadable (a crashed writer on another filesystem): encode again
        tokens = cls.encode(text, captions)
        with atomic_open(file, "wb") as handle:
            np.savez(handle, ids=tokens.ids, offsets=tokens.offsets)
        return tokens

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def __getitem__(self, j: int) -> np.ndarray:
        return self.ids[self.offsets[j]:self.offsets[j + 1]]
