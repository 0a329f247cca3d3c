"""What the suite's readers produce: items (one question, or one image to caption) of one language, with the
store their images come from, and the helpers they share (finding the released files, reading parquet shards
row by row with the row named in every error).

`--data` is the released file or folder, or a hub dataset id (`ByteDance/MTVQA`) resolved offline in the local
Hugging Face cache (`cvqa.data.resolve_data`: nothing is downloaded)."""
from __future__ import annotations

import ast
import base64
import binascii
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


def card_splits(root: Path) -> dict[str, list[str]] | None:
    """split -> the file patterns the dataset card gives it: the `configs:` section of the YAML front matter of
    `root/README.md` (each config's `data_files`, a list of {split, path} with path a pattern or a list of them,
    or a bare pattern / list: split `train`), as the Hugging Face hub and `datasets` read it. None when the folder
    has no card, or a card without `configs`. A split named by two configs with other files is ambiguous: one
    error naming both."""
    import yaml

    card = root / "README.md"
    if not card.is_file():
        return None
    text = card.read_text(encoding="utf-8", errors="replace")
    match = re.match(r"\A---[ \t]*\r?\n(.*?)\r?\n---[ \t]*(\r?\n|\Z)", text, re.S)
    if not match:
        return None
    try:
        front = yaml.safe_load(match.group(1))
    except yaml.YAMLError as err:
        raise SuiteDataError(f"{card}: the front matter is not YAML ({(str(err).splitlines() or [''])[0]})") from None
    configs = front.get("configs") if isinstance(front, dict) else None
    if configs is None:
        return None
    if not isinstance(configs, list):
        raise SuiteDataError(f"{card}: configs must be a list of {{config_name, data_files}}, got {type(configs).__name__}")
    splits: dict[str, list[str]] = {}
    named_by: dict[str, str] = {}
    for c, config in enumerate(configs):
        name = str(config.get("config_name", "default")) if isinstance(config, dict) else f"#{c}"
        files = config.get("data_files") if isinstance(config, dict) else None
        if isinstance(files, (str, dict)):
            files = [files]
        if not isinstance(files, list) or not files:
            raise SuiteDataError(f"{card}: configs[{c}] ({name}): data_files must be a pattern or a list of "
                                 f"{{split, path}}, got {files!r}"[:200])
        for entry in files:
            split, paths = ("train", entry) if isinstance(entry, str) else \
                (entry.get("split", "train"), entry.get("path")) if isinstance(entry, dict) else (None, None)
            paths = [paths] if isinstance(paths, str) else paths
            if not isinstance(paths, list) or not paths or not all(isinstance(p, str) for p in paths):
                raise SuiteDataError(f"{card}: configs[{c}] ({name}): data_files entry {entry!r} has no path "
                                     "(a pattern or a list of them)"[:200])
            split = str(split)
            if split in splits and splits[split] != paths:
                raise SuiteDataError(f"{card}: split {split!r} is given other files by configs {named_by[split]!r} "
                                     f"and {name!r}")
            splits[split], named_by[split] = paths, name
    return splits


def parquet_shards(root: Path, split: str | None = None) -> list[Path]:
    """The parquet shards of `root` (a file or a folder), restricted to `split` when given: by the dataset card's
    `configs` (`card_splits`) where the folder has one, else by the Hugging Face naming
    (`<split>-00000-of-00001.parquet`, `<split>.parquet` or a `<split>/` folder)."""
    if root.is_file():
        return [root]
    if not root.is_dir():
        raise FileNotFoundError(f"{root}: no such file or folder")
    shards = sorted(root.rglob("*.parquet"))
    if not shards:
        raise FileNotFoundError(f"{root}: no *.parquet shards below this folder")
    if split is None:
        return shards
    configured = card_splits(root)
    if configured is not None:
        if split not in configured:
            raise SuiteDataError(f"{root / 'README.md'}: the dataset card's configs have no split {split!r}; its "
                                 f"splits: {', '.join(configured)}")
        named = sorted({p for pattern in configured[split] for p in root.glob(pattern) if p.suffix == ".parquet"})
        if not named:
            raise SuiteDataError(f"{root}: no parquet file matches the data_files {configured[split]} the dataset "
                                 f"card (README.md) gives split {split!r}")
        return named
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
    """The bytes of an image cell: a Hugging Face `Image` cell or a struct of the same fields ({bytes, path}),
    raw bytes, or a base64 string (PangeaBench-m3exam's `image_<k>`); None when it holds none (null, empty, the
    literal "None", a string that is not base64)."""
    data = cell.get("bytes") if isinstance(cell, dict) else cell
    if isinstance(data, str):
        text = data.strip()
        if text in ("", "None"):
            return None
        if text.startswith("data:") and "," in text:          # a data URL: data:image/png;base64,....
            text = text.split(",", 1)[1]
        try:
            return base64.b64decode(text, validate=True) or None
        except (binascii.Error, ValueError):
            return None
    return data or None


def is_parquet_release(root: Path, marker: str) -> bool:
    """Whether `root` is a parquet copy of a release (a parquet file, or a folder with parquet files and no
    file named `marker`, the original release's file)."""
    if root.is_file():
        return root.suffix == ".parquet"
    return root.is_dir() and not any(root.rglob(marker)) and any(root.rglob("*.parquet"))


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
