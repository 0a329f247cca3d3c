"""Reading the CVQA release (Hugging Face parquet shards, image bytes embedded) from a local folder, or from the
local Hugging Face cache given the dataset's hub id (`afaji/cvqa`, offline: nothing is downloaded).

The release changed shape over its revisions (see `docs/cvqa.md`): `Options` is a list in recent revisions and a
stringified list in early ones, `Image Type` / `License` are missing in the pilot, and `Label` is -1 where the
labels are hidden. `Subset` is the string form of a Python tuple `(Language, Country)`; it is parsed with
`ast.literal_eval`, never `eval`. The image column is read lazily so the ~5 GB of photos never sit in memory.
"""
from __future__ import annotations

import ast
import hashlib
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

import numpy as np

REQUIRED_COLUMNS = ("ID", "Subset", "Question", "Translated Question", "Options", "Translated Options", "Label",
                    "Category", "image")
HIDDEN_LABEL = -1
_REVISION_DIR = re.compile(r"^[0-9a-f]{7,40}$")
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")    # owner/name, as afaji/cvqa


class CVQAFormatError(ValueError):
    """A CVQA row or shard that cannot be read; the message names the file, row and field."""


# What pyarrow raises on a damaged shard: ArrowInvalid (a ValueError; bad magic bytes or footer metadata) and
# OSError (page headers or compressed pages that do not deserialize, a file cut short while being read).
_ARROW_READ_ERRORS = (OSError, ValueError)


def _corrupt(shard: Path, err: Exception) -> CVQAFormatError:
    first_line = (str(err).strip().splitlines() or [type(err).__name__])[0]
    return CVQAFormatError(f"{shard}: damaged parquet shard ({type(err).__name__}: {first_line}); download "
                           "this shard of afaji/cvqa again")


def _batches(shard: Path, **kwargs) -> Iterator:
    """`ParquetFile(shard).iter_batches(**kwargs)`, with a damaged shard reported as one error naming it."""
    import pyarrow.parquet as pq

    try:
        yield from pq.ParquetFile(shard).iter_batches(**kwargs)
    except CVQAFormatError:
        raise
    except _ARROW_READ_ERRORS as err:
        if isinstance(err, FileNotFoundError):
            raise
        raise _corrupt(shard, err) from None


def _row_group_starts(shard: Path) -> np.ndarray:
    """The first row of each row group of `shard` (and the row count at the end)."""
    import pyarrow.parquet as pq

    try:
        meta = pq.ParquetFile(shard).metadata
    except _ARROW_READ_ERRORS as err:
        if isinstance(err, FileNotFoundError):
            raise
        raise _corrupt(shard, err) from None
    return np.cumsum([0] + [meta.row_group(g).num_rows for g in range(meta.num_row_groups)])


@dataclass(frozen=True)
class CVQAQuestion:
    id: str                      # the submission key, e.g. "5920942824275514756_0"
    image_id: str                # feature-store key shared by the questions on one photo
    language: str
    country: str
    question: str                # local language (LOC)
    question_en: str             # `Translated Question` (EN)
    options: tuple[str, ...]     # 4 local-language options
    options_en: tuple[str, ...]  # 4 English options, index-aligned with `options`
    label: int                   # 0-3, or -1 when hidden
    category: str
    image_type: str
    shard: str
    row: int

    @property
    def pair(self) -> str:
        """The per-pair reporting key, `Country-Language`."""
        return f"{self.country}-{self.language}"


@dataclass
class CVQADataset:
    root: Path
    revision: str
    shards: list[Path]
    questions: list[CVQAQuestion]
    _image_rows: dict[str, tuple[int, int]] = field(default_factory=dict, repr=False)  # image_id -> (shard, row)

    @property
    def hidden_labels(self) -> bool:
        """True when every label is -1 (the hidden-label release): submission mode, no accuracy."""
        return all(q.label == HIDDEN_LABEL for q in self.questions)

    @property
    def image_ids(self) -> list[str]:
        return list(self._image_rows)

    def iter_images(self, image_ids=None) -> Iterator[tuple[str, bytes]]:
        """(image_id, encoded image bytes) once per image, streaming the shards one record batch at a time."""
        wanted = set(self._image_rows if image_ids is None else image_ids)
        by_shard: dict[int, dict[int, str]] = {}
        for image_id in wanted:
            shard, row = self._image_rows[image_id]
            by_shard.setdefault(shard, {})[row] = image_id
        for shard_index, rows in sorted(by_shard.items()):
            shard = self.shards[shard_index]
            starts = _row_group_starts(shard)
            groups = sorted({int(np.searchsorted(starts, r, side="right")) - 1 for r in rows})   # only those read
            for group in groups:
                offset = int(starts[group])
                for batch in _batches(shard, batch_size=64, columns=["image"], row_groups=[group]):
                    column = batch.column(0)
                    for i in range(batch.num_rows):
                        if offset + i in rows:
                            yield rows[offset + i], _image_bytes(column[i].as_py(), shard, offset + i)
                    offset += batch.num_rows


def parse_subset(value, where: str) -> tuple[str, str]:
    """`"('Telugu', 'India')"` -> ("Telugu", "India"), by literal parsing only."""
    try:
        parsed = ast.literal_eval(value) if isinstance(value, str) else value
    except (ValueError, SyntaxError) as err:
        raise CVQAFormatError(f"{where}: Subset {value!r} is not a tuple literal ({err})") from None
    if not (isinstance(parsed, (tuple, list)) and len(parsed) == 2 and all(isinstance(x, str) for x in parsed)):
        raise CVQAFormatError(f"{where}: Subset {value!r} is not a (Language, Country) pair of strings")
    return parsed[0].strip(), parsed[1].strip()


def parse_options(value, where: str, column: str) -> tuple[str, ...]:
    """A list of 4 strings, or (early revisions) its string rendering; stray outer spaces are removed."""
    if isinstance(value, str):
        try:
            value = ast.literal_eval(value)
        except (ValueError, SyntaxError) as err:
            raise CVQAFormatError(f"{where}: {column} is a string but not a list literal ({err}): "
                                  f"{value[:80]!r}") from None
    if not isinstance(value, (list, tuple)) or len(value) != 4 or not all(isinstance(x, str) for x in value):
        raise CVQAFormatError(f"{where}: {column} must hold 4 strings, got {value!r}")
    return tuple(x.strip() for x in value)


def image_key(question_id: str) -> str:
    """`<image-id>_<question-index>` -> `<image-id>`; an id without that shape is its own image key."""
    head, sep, tail = question_id.rpartition("_")
    return head if sep and head and tail.isdigit() else question_id


def revision_from_path(root: Path) -> str | None:
    """The commit of a Hugging Face cache snapshot (`.../snapshots/<commit>/...`), if `root` is one."""
    parts = root.resolve().parts
    for i, part in enumerate(parts[:-1]):
        if part == "snapshots" and _REVISION_DIR.match(parts[i + 1]):
            return parts[i + 1]
    return None


def _image_bytes(cell, shard: Path, row: int) -> bytes:
    """The `datasets` Image struct {bytes, path} (or raw bytes) -> encoded bytes."""
    data = cell.get("bytes") if isinstance(cell, dict) else cell
    if data is not None and not isinstance(data, bytes):
        raise CVQAFormatError(f"{shard} row {row}: column image holds {type(data).__name__} {_short(data)}, not "
                              "the encoded photo (the `datasets` Image struct {bytes, path}, or bytes)")
    if not data:
        raise CVQAFormatError(f"{shard} row {row}: the image has no embedded bytes "
                              f"(path {cell.get('path') if isinstance(cell, dict) else None!r})")
    return data


def _short(value, width: int = 40) -> str:
    text = repr(value)
    return text if len(text) <= width else text[:width - 3] + "..."


def parse_label(value, where: str) -> int:
    """`Label` as the int64 of the release: an option index 0-3, or -1 when hidden. An integral float (a column
    that passed through pandas) is that integer; anything else (2.5, "2", a missing value) names the row."""
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or value not in (HIDDEN_LABEL, 0, 1, 2, 3):
        raise CVQAFormatError(f"{where}: Label must be an integer 0-3 or -1 (hidden), got "
                              f"{type(value).__name__} {_short(value)}")
    return value


def _text(record: dict, column: str, where: str, default: str | None = None) -> str:
    value = record.get(column, default)
    if value is None:
        if default is not None:
            return default
        raise CVQAFormatError(f"{where}: {column} is empty")
    return str(value)


def _question(record: dict, shard: Path, row: int) -> CVQAQuestion:
    where = f"{shard} row {row} (ID {record.get('ID')!r})"
    language, country = parse_subset(record["Subset"], where)
    label = parse_label(record["Label"], where)
    qid = _text(record, "ID", where)
    return CVQAQuestion(
        id=qid, image_id=image_key(qid), language=language, country=country,
        question=_text(record, "Question", where).strip(),
        question_en=_text(record, "Translated Question", where).strip(),
        options=parse_options(record["Options"], where, "Options"),
        options_en=parse_options(record["Translated Options"], where, "Translated Options"),
        label=label, category=" ".join(_text(record, "Category", where).split()),
        image_type=_text(record, "Image Type", where, default="unknown").strip() or "unknown",
        shard=shard.name, row=row)


def find_shards(root: Path) -> list[Path]:
    if root.is_file() and root.suffix == ".parquet":
        return [root]
    if not root.is_dir():
        raise FileNotFoundError(f"CVQA data not found: {root} (a folder of parquet shards, e.g. a local copy of "
                                "the Hugging Face dataset afaji/cvqa, or its hub id when it is in the local Hugging "
                                "Face cache; nothing is downloaded)")
    shards = sorted(root.rglob("*.parquet"))
    if not shards:
        raise FileNotFoundError(f"{root}: no *.parquet shards below this folder")
    return shards


def resolve_data(data: str | Path, revision: str | None = None) -> Path:
    """`--data` as a path: a folder or parquet file as given; a hub dataset id (`afaji/cvqa`) that is not a path
    here is the snapshot of `revision` (default: the cached `main`) in the local Hugging Face cache
    (`HF_HUB_CACHE`), found offline through `huggingface_hub`; not cached is a one-line FileNotFoundError."""
    path = Path(data).expanduser()
    if path.exists() or not _HUB_ID.match(str(data)):
        return path
    from huggingface_hub import constants, snapshot_download
    from huggingface_hub.errors import HFValidationError, LocalEntryNotFoundError

    try:
        return Path(snapshot_download(str(data), repo_type="dataset", revision=revision, local_files_only=True))
    except (LocalEntryNotFoundError, HFValidationError):
        at = f" --revision {revision}" if revision else ""
        raise FileNotFoundError(
            f"CVQA data {data}: no such folder, and no snapshot{' of revision ' + revision if revision else ''} of "
            f"the hub dataset {data} in the local Hugging Face cache ({constants.HF_HUB_CACHE}); nothing is "
            f"downloaded: fetch it first (hf download {data} --repo-type dataset{at}) or give the folder of its "
            "parquet shards") from None


def load_cvqa(root: str | Path, revision: str | None = None, limit: int | None = None) -> CVQADataset:
    """Every question of the shards under `root` (a folder, a parquet file or a cached hub id, `resolve_data`;
    without image pixels). `revision` (the HF commit) is recorded in results; it defaults to the snapshot commit
    in the path, else "unknown"."""
    import pyarrow.parquet as pq

    if limit is not None and limit < 1:
        raise ValueError(f"load_cvqa: limit must be at least 1 (or None: every question), got {limit}")
    root = resolve_data(root, revision)
    shards = find_shards(root)
    questions: list[CVQAQuestion] = []
    image_rows: dict[str, tuple[int, int]] = {}
    image_digest: dict[str, str] = {}
    seen_ids: dict[str, str] = {}
    for shard_index, shard in enumerate(shards):
        try:
            names = set(pq.read_schema(shard).names)
        except FileNotFoundError:
            raise
        except _ARROW_READ_ERRORS as err:
            raise _corrupt(shard, err) from None
        missing = [c for c in REQUIRED_COLUMNS if c not in names]
        if missing:
            raise CVQAFormatError(f"{shard}: missing column(s) {missing}; found {sorted(names)}")
        row = 0
        for batch in _batches(shard, batch_size=32):
            if limit is not None and len(questions) >= limit:
                break
            for record in batch.to_pylist()[:None if limit is None else limit - len(questions)]:
                q = _question(record, shard, row)
                if q.id in seen_ids:
                    raise CVQAFormatError(f"{shard} row {row}: ID {q.id!r} already seen in {seen_ids[q.id]}")
                seen_ids[q.id] = f"{shard.name} row {row}"
                digest = hashlib.sha1(_image_bytes(record["image"], shard, row)).hexdigest()
                image_id = q.image_id
                if image_id in image_digest and image_digest[image_id] != digest:
                    image_id = q.id   # the id does not name one photo here: key this question's image alone
                    q = CVQAQuestion(**{**q.__dict__, "image_id": image_id})
                if image_id not in image_rows:
                    image_rows[image_id] = (shard_index, row)
                    image_digest[image_id] = digest
                questions.append(q)
                row += 1
        if limit is not None and len(questions) >= limit:
            break
    if not questions:
        raise CVQAFormatError(f"{root}: the shards hold no questions")
    return CVQADataset(root=root, revision=revision or revision_from_path(root) or "unknown", shards=shards,
                       questions=questions, _image_rows=image_rows)
