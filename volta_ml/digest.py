"""Content hashes for cache keys, resume fingerprints and detector-weight checks (sha256, hex), and the content
fingerprint of a model or data set (`content_fingerprint`) that keys every resumable chunk store.

Imports nothing from the package, so every layer can use it.
"""
from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path


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


# --- content fingerprints of models and data (resume keys), hashed once per file version ---------------------
CACHE_ENV = "VOLTA_ML_DIGEST_CACHE"


def digest_cache_path() -> Path:
    """The JSON file of known digests: $VOLTA_ML_DIGEST_CACHE, else <XDG cache dir>/volta_ml/file_digests.json."""
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV])
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "volta_ml" / "file_digests.json"


def _read_cache(path: Path) -> dict:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}


def _write_cache(path: Path, cache: dict) -> None:
    """Best effort, atomic (temp file + rename); a cache that cannot be written only costs a re-hash."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(cache, sort_keys=True), encoding="utf-8")
        os.replace(tmp, path)
    except OSError:
        pass


def cached_file_digests(paths) -> dict[str, str]:
    """{path: sha256} of whole files; a file whose (absolute path, size, mtime) is in the digest cache is not
    read again, so a 15 GB checkpoint is hashed once per version of the file."""
    cache_path = digest_cache_path()
    cache = _read_cache(cache_path)
    out, changed = {}, False
    for path in paths:
        stat = os.stat(path)
        key = os.path.abspath(path)
        stamp = f"{stat.st_size}:{stat.st_mtime_ns}"
        entry = cache.get(key)
        if not entry or entry.get("stamp") != stamp:
            entry = cache[key] = {"stamp": stamp, "sha256": file_digest(path)}
            changed = True
        out[str(path)] = entry["sha256"]
    if changed:
        _write_cache(cache_path, cache)
    return out


def content_fingerprint(name: str, revision: str | None = None) -> dict:
    """What a model or data set holds, for resume keys. A local file: {".": "<size>:<sha256>"}; a local folder:
    the same per file ({relative path: "<size>:<sha256>"}, hidden files skipped: config, weights, tokenizer,
    every file from_pretrained may read); a hub id: {"commit": the commit `revision` resolves to in the local
    Hugging Face cache}, or "unresolved" when it is not there (then the id and revision are the only key)."""
    path = Path(name).expanduser()
    if path.is_file():
        return {".": f"{path.stat().st_size}:{cached_file_digests([path])[str(path)]}"}
    if path.is_dir():
        files = sorted(p for p in path.rglob("*") if p.is_file()
                       and not any(part.startswith(".") for part in p.relative_to(path).parts))
        digests = cached_file_digests(files)
        return {p.relative_to(path).as_posix(): f"{p.stat().st_size}:{digests[str(p)]}" for p in files}
    return {"commit": hub_commit(name, revision) or "unresolved"}


def hub_commit(repo_id: str, revision: str | None = None) -> str | None:
    """The commit of `repo_id` at `revision` (default main) in the local Hugging Face cache, or None. Offline."""
    try:
        from huggingface_hub import try_to_load_from_cache
        found = try_to_load_from_cache(repo_id, "config.json", revision=revision)
    except Exception:   # not a valid repo id, no huggingface_hub: nothing to resolve
        return None
    return Path(found).parent.name if isinstance(found, str) else None


def stat_digest(paths, root: str | os.PathLike | None = None) -> str:
    """sha256 of each file's (path relative to `root`, size, mtime): a cheap key for many files (a folder of
    images, a feature store) that changes when any of them is replaced, without reading them. A folder in
    `paths` stands for every file below it, except LMDB's lock files (`lock.mdb`, `*-lock`: every reader writes
    them)."""
    lines = []
    for path in map(Path, paths):
        files = sorted(p for p in path.rglob("*") if p.is_file() and not _is_lmdb_lock(p)) if path.is_dir() \
            else [path]
        for file in files:
            stat = file.stat()
            name = os.path.relpath(file, root) if root is not None else str(file)
            lines.append(f"{name}\t{stat.st_size}\t{stat.st_mtime_ns}")
    return text_digest("\n".join(lines))


def _is_lmdb_lock(path: Path) -> bool:
    return path.name == "lock.mdb" or path.name.endswith("-lock")
