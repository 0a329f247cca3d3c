"""Resumable CVQA scoring: the questions are cut into fixed chunks, each chunk's scores saved as soon as they exist.

`<output_dir>/chunks/meta.json` records what the chunks were scored with (backend, model, its revision, rule,
dtype, prompts, data revision, the question list, chunk size, photo settings). A rerun into the same folder
loads the chunks already there and scores only the rest; a rerun with a different model, revision, rule, ... is
refused, so one result never mixes two models. Chunk `k` of every pass (`<condition>` or `<condition>.blind`)
is `chunks/<pass>/<first question index>.npz`, written atomically; chunk boundaries do not depend on the number
of processes, so a resumed or re-sharded run gives the same numbers. Photos that failed to decode in a chunk
are kept beside it (`chunks/photos/<first question index>.json`).
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from volta_ml.atomic import atomic_open, atomic_write_json

# Keys of meta.json a resumed run must match (anything else, e.g. batch size or device, may change).
RESUME_KEYS = ("backend", "model", "model_revision", "rule", "dtype", "template", "prompts_version",
               "data_revision", "questions_sha1", "chunk_size", "max_side", "max_pixels")


class ResumeMismatch(ValueError):
    """The chunks in the output folder were scored with another model, revision, rule, ..."""


class ChunkStore:
    def __init__(self, folder: str | Path, meta: dict, write: bool = True):
        self.folder = Path(folder)
        path = self.folder / "meta.json"
        if path.is_file():
            old = json.loads(path.read_text(encoding="utf-8"))
            for key in RESUME_KEYS:
                if old.get(key) != meta.get(key):
                    raise ResumeMismatch(
                        f"{path}: the chunks there were scored with {key} {old.get(key)!r} but this run has "
                        f"{meta.get(key)!r}; refusing to mix them (use another --output_dir, or delete "
                        f"{self.folder} to start over)")
        elif write:
            atomic_write_json(path, {k: meta.get(k) for k in RESUME_KEYS}, indent=2)

    def _path(self, name: str, start: int, suffix: str = ".npz") -> Path:
        return self.folder / name / f"{start:08d}{suffix}"

    def load(self, name: str, start: int, count: int) -> dict | None:
        """The saved arrays of one chunk of one pass, or None when not (completely) scored yet."""
        path = self._path(name, start)
        if not path.is_file():
            return None
        try:
            with np.load(path) as saved:
                arrays = {k: saved[k] for k in saved.files}
        except (OSError, ValueError, EOFError):   # an unreadable file is scored again
            return None
        return arrays if arrays.get("score") is not None and arrays["score"].shape == (count, 4) else None

    def save(self, name: str, start: int, arrays: dict) -> None:
        with atomic_open(self._path(name, start), "wb") as f:
            np.savez(f, **arrays)

    def load_failures(self, start: int) -> dict | None:
        path = self._path("photos", start, ".json")
        return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else None

    def save_failures(self, start: int, failures: dict) -> None:
        atomic_write_json(self._path("photos", start, ".json"), failures)
