"""What the suite's readers produce: items (one question, or one image to caption) of one language, with the
store their images come from, and the helpers they share (finding the released files, reading parquet shards
row by row with the row named in every error).

`--data` is the released file or folder, or a hub dataset id (`ByteDance/MTVQA`) resolved offline in the local
Hugging Face cache (`cvqa.data.resolve_data`: nothing is downloaded)."""
from __future__ import annotations

import ast
import re
from dataclasses import dataclass, field
from pathlib import Path

from volta_ml.data.annotations import AnnotationError


class SuiteDataError(AnnotationError):
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


def parquet_shards(root: Path, split: str | None = None) -> list[Path]:
    """The parquet shards of `root` (a file or a folder), restricted to `split` by the Hugging Face naming
    (`<split>-00000-of-00001.parquet`, `<split>.parquet` or a `<split>/` folder) when given."""
    if root.is_file():
        return [root]
    if not root.is_dir():
        raise FileNotFoundError(f"{root}: no such file or folder")
    shards = sorted(root.rglob("*.parquet"))
    if not shards:
        raise FileNotFoundError(f"{root}: no *.parquet shards below this folder")
    if split is None:
        return shards
    named = [s for s in shards if split_of(s) == split or s.parent.name == split]
    if not named:
        raise SuiteDataError(f"{root}: no parquet shard of split {split!r}; found {sorted({split_of(s) for s in shards})}")
    return named


def split_of(shard: Path) -> str:
    """`test-00000-of-00001.parquet` -> `test`."""
    return re.sub(r"(-\d{5}-of-\d{5})?$", "", shard.stem)


def parquet_rows(shard: Path, columns: list[str] | None = None):
    """(row index, record) of every row of `shard`; a damaged shard is one error naming it."""
    import pyarrow.parquet as pq

    try:
        names = pq.read_schema(shard).names
        if columns is not None:
            missing = [c for c in columns if c not in names]
            if missing:
                raise SuiteDataError(f"{shard}: missing column(s) {missing}; found {names}")
        row = 0
        for batch in pq.ParquetFile(shard).iter_batches(batch_size=64):
            for record in batch.to_pylist():
                yield row, record
                row += 1
    except (OSError, ValueError) as err:
        if isinstance(err, (SuiteDataError, FileNotFoundError)):
            raise
        raise SuiteDataError(f"{shard}: damaged parquet shard ({type(err).__name__}: "
                             f"{(str(err).strip().splitlines() or [''])[0]})") from None


def image_bytes(cell) -> bytes | None:
    """The bytes of a Hugging Face `Image` cell ({bytes, path} or raw bytes); None when it holds none."""
    data = cell.get("bytes") if isinstance(cell, dict) else cell
    return data or None


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
