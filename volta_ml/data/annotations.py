"""Readers for the annotation files of IGLUE tasks, with errors that name file and line.

Files are always read as UTF-8 (a BOM is tolerated): IGLUE scripts set `LANG=<language>`, which breaks
locale-dependent decoding, so nothing here depends on the locale.
"""
from __future__ import annotations

import json
import pickle
from pathlib import Path

from volta_ml.restricted_pickle import UnsafePickle, restricted_load


class AnnotationError(ValueError):
    """A malformed or unexpected annotation file; the message names the file and, where known, the line."""


def _check_exists(path: Path, what: str) -> None:
    if not path.is_file():
        raise FileNotFoundError(f"{what} not found: {path}")


def read_jsonl(path: str | Path, what: str = "annotation file") -> list[tuple[int, dict]]:
    """Return `(line_number, record)` pairs (1-based line numbers; blank lines skipped)."""
    path = Path(path)
    _check_exists(path, what)
    records = []
    with open(path, encoding="utf-8-sig") as handle:
        for line_no, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as err:
                raise AnnotationError(f"{path}:{line_no}: not valid JSON ({err.msg} at column {err.colno})") from None
            if not isinstance(record, dict):
                raise AnnotationError(f"{path}:{line_no}: expected a JSON object, got {type(record).__name__}")
            records.append((line_no, record))
    return records


def read_json(path: str | Path, what: str = "annotation file"):
    path = Path(path)
    _check_exists(path, what)
    with open(path, encoding="utf-8-sig") as handle:
        text = handle.read()
    try:
        return json.loads(text)
    except json.JSONDecodeError as err:
        raise AnnotationError(f"{path}:{err.lineno}: not valid JSON ({err.msg} at column {err.colno})") from None


def read_pickle(path: str | Path, what: str = "annotation pickle"):
    """An annotation pickle (GQA targets and answer vocabularies, hard negatives) through the restricted reader:
    dicts, lists, strings, numbers and numpy arrays only. A file naming anything else is refused, unrun."""
    path = Path(path)
    _check_exists(path, what)
    try:
        with open(path, "rb") as handle:
            return restricted_load(handle)
    except UnsafePickle as err:
        raise AnnotationError(f"{path}: refused: the {what} names {err.global_name}, which an annotation file "
                              f"never holds (only dicts, lists, strings, numbers, numpy arrays); nothing "
                              f"was run") from None
    except (pickle.UnpicklingError, EOFError, ValueError, TypeError, IndexError, UnicodeDecodeError) as err:
        raise AnnotationError(f"{path}: cannot unpickle the {what} ({type(err).__name__}: {err})") from None


def require(record: dict, key: str, path, line_no) -> object:
    """`record[key]`, or an AnnotationError naming file, line and the missing key."""
    try:
        return record[key]
    except KeyError:
        raise AnnotationError(
            f"{path}:{line_no}: missing field {key!r} (fields present: {', '.join(sorted(record))})"
        ) from None
