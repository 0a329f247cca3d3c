"""What the suite's readers produce: items (one question, or one image to caption) of one language, with the
store their images come from, and the helpers they share (the released files' fields; finding and reading
parquet releases is `iglue_hf/parquet.py`, which IGLUE's hub copies share).

`--data` is the released file or folder, or a hub dataset id (`ByteDance/MTVQA`) resolved offline in the local
Hugging Face cache (`cvqa.data.resolve_data`: nothing is downloaded)."""
from __future__ import annotations

import ast
from dataclasses import dataclass, field
from pathlib import Path

from volta_ml.iglue_hf.parquet import (ReleaseError, card_splits, image_bytes, is_parquet_release,  # noqa: F401
                                       parquet_rows, parquet_shards, split_of)


class SuiteDataError(ReleaseError):
    """A released file that is not in the benchmark's schema; the message names the file, row / item and field."""


@dataclass
class Item:
    id: str
    lang: str
    question: str = ""                      # the question (empty for captioning)
    images: tuple = ()                      # keys of the task's image store, in prompt order (may be empty)
    options: tuple[str, ...] = ()           # multiple choice: option texts (an image option reads "<image k>")
    answer: int | None = None               # multiple choice: the gold option's index
    references: tuple[str, ...] = ()        # open answers / reference captions
    meta: dict = field(default_factory=dict)


@dataclass
class TaskData:
    items: list[Item]
    store: object                           # FileImages | ParquetImages | ZipImages
    files: list[Path]                       # the released files read (their digests key the resume store)
    skipped: dict = field(default_factory=dict)   # reason -> count of rows left out (recorded in the results)
    retrieval: object = None                # xm3600_retrieval: iglue_hf.data.RetrievalData


def resolve(data: str, revision: str | None = None) -> Path:
    """A path as given; a hub dataset id that is no path here: its snapshot in the local Hugging Face cache."""
    from volta_ml.cvqa.data import resolve_data

    return Path(resolve_data(data, revision))


def literal_list(value, where: str, column: str) -> list:
    """A list, or (as several releases store it) its Python literal as a string."""
    if isinstance(value, str):
        text = value.strip()
        for attempt in (text, text.replace("\n", " ")):
            try:
                value = ast.literal_eval(attempt)
                break
            except (ValueError, SyntaxError):
                continue
        else:
            raise SuiteDataError(f"{where}: {column} is a string but not a list literal: {text[:80]!r}")
    if not isinstance(value, (list, tuple)):
        raise SuiteDataError(f"{where}: {column} must be a list, got {type(value).__name__}")
    return list(value)


def text(record: dict, column: str, where: str, allow_empty: bool = False) -> str:
    """A required text field (a number is read as its text)."""
    if column not in record or record[column] is None:
        raise SuiteDataError(f"{where}: missing field {column!r}")
    value = record[column]
    if not isinstance(value, (str, int, float)) or isinstance(value, bool):
        raise SuiteDataError(f"{where}: {column} must be text, got {type(value).__name__}")
    value = str(value)
    if not allow_empty and not value.strip():
        raise SuiteDataError(f"{where}: {column} is empty")
    return value


def texts(record: dict, column: str, where: str) -> tuple[str, ...]:
    """A required non-empty list of texts."""
    value = record.get(column)
    if not isinstance(value, list) or not value or not all(isinstance(v, str) for v in value):
        raise SuiteDataError(f"{where}: {column} must be a non-empty list of strings, got {value!r}"[:200])
    return tuple(value)
