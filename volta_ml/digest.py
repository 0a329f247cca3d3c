"""Content hashes for cache keys, resume fingerprints and detector-weight checks (sha256, hex).

Imports nothing from the package, so every layer can use it.
"""
from __future__ import annotations

import hashlib
import os


def file_digest(path: str | os.PathLike, limit: int | None = None) -> str:
    """sha256 of a file's bytes, read in 1 MiB blocks. With `limit`, only the first `limit` bytes are read and
    the file's size and modification time are hashed with them (a cheap fingerprint of a big checkpoint)."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        remaining = limit
        while remaining is None or remaining > 0:
            block = handle.read(1 << 20 if remaining is None else min(1 << 20, remaining))
            if not block:
                break
            digest.update(block)
            if remaining is not None:
                remaining -= len(block)
    if limit:
        stat = os.stat(path)
        digest.update(f"{stat.st_size}:{stat.st_mtime_ns}".encode())
    return digest.hexdigest()


def text_digest(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()
