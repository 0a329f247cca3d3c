"""Visual Genome 1600-object / 400-attribute vocabularies of bottom-up-attention.

The lists ship as package data (`volta_ml/resources/vg_vocab/`, see its NOTICE). A line
may hold comma-separated synonyms; like VOLTA, the first one is kept, lower-cased and
stripped. Object id k is line k (background excluded), attribute id k is line k.
"""
from __future__ import annotations

from functools import lru_cache
from pathlib import Path

VOCAB_DIR = Path(__file__).resolve().parents[1] / "resources" / "vg_vocab"


def _read(path: Path, expected: int) -> list[str]:
    lines = path.read_text(encoding="utf-8").splitlines()
    names = [line.split(",")[0].lower().strip() for line in lines]
    if len(names) != expected:
        raise ValueError(f"{path}: {len(names)} lines, expected {expected}")
    return names


@lru_cache(maxsize=4)
def load_vg_vocab(directory: str | None = None) -> tuple[list[str], list[str]]:
    """(object names [1600], attribute names [400])."""
    d = Path(directory) if directory else VOCAB_DIR
    return _read(d / "objects_vocab.txt", 1600), _read(d / "attributes_vocab.txt", 400)
