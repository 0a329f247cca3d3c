"""Parquet releases on the Hugging Face hub, as the suite's readers and IGLUE's hub copies read them: which files
are a split (the dataset card's `configs`, else the hub's file naming), their rows one by one with the row named in
every error, the bytes of an image cell, and images read cell by cell (`ParquetCells`, a row group at a time)."""
from __future__ import annotations

import base64
import binascii
import re
from collections import OrderedDict
from pathlib import Path

from volta_ml.data.annotations import AnnotationError


class ReleaseError(AnnotationError):
    """A released file that is not in its schema; the message names the file, row / item and field."""


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
    match = re.match(r"\A---[ \t]*\r?\n(.*?)\r?\n---[ \t]*(\r?\n|\Z)", text, re.DOTALL)
    if not match:
        return None
    try:
        front = yaml.safe_load(match.group(1))
    except yaml.YAMLError as err:
        raise ReleaseError(f"{card}: the front matter is not YAML ({(str(err).splitlines() or [''])[0]})") from None
    configs = front.get("configs") if isinstance(front, dict) else None
    if configs is None:
        return None
    if not isinstance(configs, list):
        raise ReleaseError(f"{card}: configs must be a list of {{config_name, data_files}}, got "
                           f"{type(configs).__name__}")
    splits: dict[str, list[str]] = {}
    named_by: dict[str, str] = {}
    for c, config in enumerate(configs):
        name = str(config.get("config_name", "default")) if isinstance(config, dict) else f"#{c}"
        files = config.get("data_files") if isinstance(config, dict) else None
        if isinstance(files, (str, dict)):
            files = [files]
        if not isinstance(files, list) or not files:
            raise ReleaseError(f"{card}: configs[{c}] ({name}): data_files must be a pattern or a list of "
                                 f"{{split, path}}, got {files!r}"[:200])
        for entry in files:
            split, paths = ("train", entry) if isinstance(entry, str) else \
                (entry.get("split", "train"), entry.get("path")) if isinstance(entry, dict) else (None, None)
            paths = [paths] if isinstance(paths, str) else paths
            if not isinstance(paths, list) or not paths or not all(isinstance(p, str) for p in paths):
                raise ReleaseError(f"{card}: configs[{c}] ({name}): data_files entry {entry!r} has no path "
                                     "(a pattern or a list of them)"[:200])
            split = str(split)
            if split in splits and splits[split] != paths:
                raise ReleaseError(f"{card}: split {split!r} is given other files by configs {named_by[split]!r} "
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
            raise ReleaseError(f"{root / 'README.md'}: the dataset card's configs have no split {split!r}; its "
                                 f"splits: {', '.join(configured)}")
        named = sorted({p for pattern in configured[split] for p in root.glob(pattern) if p.suffix == ".parquet"})
        if not named:
            raise ReleaseError(f"{root}: no parquet file matches the data_files {configured[split]} the dataset "
                                 f"card (README.md) gives split {split!r}")
        return named
    named = [s for s in shards if split_of(s) == split or s.parent.name == split]
    if not named:
        raise ReleaseError(f"{root}: no parquet shard of split {split!r}; found "
                           f"{sorted({split_of(s) for s in shards})}")
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
                raise ReleaseError(f"{shard}: missing column(s) {missing}; found {names}")
        row = 0
        for batch in pq.ParquetFile(shard).iter_batches(batch_size=64):
            for record in batch.to_pylist():
                yield row, record
                row += 1
    except (OSError, ValueError) as err:
        if isinstance(err, (ReleaseError, FileNotFoundError)):
            raise
        raise ReleaseError(f"{shard}: damaged parquet shard ({type(err).__name__}: "
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


class ParquetCells:
    """The cells of parquet shards, read a row group at a time when one of its cells is asked for (the last two
    groups are kept): `cell(shard index, row, column)` -> the cell's Python value."""

    def __init__(self, shards: list[Path]):
        self.shards = list(shards)
        self._groups: OrderedDict = OrderedDict()
        self._starts: dict[int, list[int]] = {}

    def _row_group(self, shard: int, row: int) -> tuple[int, int]:
        import pyarrow.parquet as pq

        if shard not in self._starts:
            meta = pq.ParquetFile(self.shards[shard]).metadata
            starts = [0]
            for g in range(meta.num_row_groups):
                starts.append(starts[-1] + meta.row_group(g).num_rows)
            self._starts[shard] = starts
        starts = self._starts[shard]
        group = max(g for g in range(len(starts) - 1) if starts[g] <= row)
        return group, starts[group]

    def cell(self, shard: int, row: int, column: str):
        import pyarrow.parquet as pq

        group, start = self._row_group(shard, row)
        cache_key = (shard, group, column)
        if cache_key not in self._groups:
            self._groups[cache_key] = pq.ParquetFile(self.shards[shard]).read_row_group(group, columns=[column])
            while len(self._groups) > 2:
                self._groups.popitem(last=False)
        return self._groups[cache_key].column(0)[row - start].as_py()

    def name(self, shard: int, row: int, column: str) -> str:
        return f"{self.shards[shard]} row {row} column {column}"
