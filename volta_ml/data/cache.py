"""Tokenised-text cache keyed by content, never written into the data directory.

VOLTA caches by `<task>_<split>_<basename(bert_model)>_<len>.pkl` next to the data and silently reuses stale
files when an annotation file changes. Here the key hashes the annotation file bytes, the exact texts, the
tokenizer fingerprint and the settings, so a stale hit is impossible; writes are atomic so concurrent jobs
cannot read half-written files.
"""
from __future__ import annotations

import hashlib
import os
from pathlib import Path

import numpy as np

from volta_ml.atomic import atomic_open
from volta_ml.data.text import encode_texts
from volta_ml.digest import file_digest

CACHE_FORMAT = 1


def default_cache_dir() -> Path:
    root = os.environ.get("VOLTA_ML_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "volta_ml")
    return Path(root) / "tokens"


class TokenCache:
    """`TokenCache(dir).encode(tokenizer, texts, max_seq_length, source=path)`; `dir=None` disables caching."""

    def __init__(self, cache_dir: str | Path | None):
        self.cache_dir = Path(cache_dir) if cache_dir else None

    def key(self, tokenizer, texts: list[str], max_seq_length: int, source: str | Path | None) -> str:
        digest = hashlib.sha256()
        fingerprint = getattr(tokenizer, "volta_fingerprint", None)
        if fingerprint is None:
            from volta_ml.data.text import tokenizer_fingerprint
            fingerprint = tokenizer_fingerprint(tokenizer)
        digest.update(f"v{CACHE_FORMAT}|{fingerprint}|{max_seq_length}|".encode())
        if source is not None and os.path.isfile(source):  # a store directory: its texts are hashed below
            digest.update(file_digest(source).encode())
        for text in texts:
            digest.update(text.encode("utf-8", "surrogatepass"))
            digest.update(b"\x00")
        return digest.hexdigest()[:32]

    def encode(self, tokenizer, texts: list[str], max_seq_length: int, source=None) -> tuple[np.ndarray, np.ndarray]:
        if self.cache_dir is None:
            return encode_texts(tokenizer, texts, max_seq_length)
        file = self.cache_dir / f"{self.key(tokenizer, texts, max_seq_length, source)}.npz"
        if file.is_file():
            try:
                with np.load(file) as stored:
                    return stored["ids"], stored["lengths"]
            except (OSError, ValueError, KeyError):
                pass  # unreadable (e.g. a crashed writer on another filesystem): rebuild it
        ids, lengths = encode_texts(tokenizer, texts, max_seq_length)
        with atomic_open(file, "wb") as handle:
            np.savez(handle, ids=ids, lengths=lengths)
        return ids, lengths
