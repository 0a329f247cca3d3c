"""Readers for the annotation files of IGLUE tasks, with errors that name file and line.

Files are always read as UTF-8 (a BOM is tolerated): IGLUE scripts set `LANG=<language>`, which breaks
locale-dependent decoding, so nothing here depends on the locale. A file that is not UTF-8 is one error naming
the file and the byte offset of the first bad byte (`read_text`, also used for the prediction files of CVQA);
an annotation file with no record at all (empty, or blank lines only) is one error naming the file.
"""
from __future__ import annotations

import io
import json
import pickle
from pathlib import Path

from volta_ml.restricted_pickle import UnsafePickle, restricted_load


class AnnotationError(ValueError):
    """A malformed or unexpected annotation file; the message names the file and, where known, the line."""


def _check_exists(path: Path, what: str) -> None:
    if not path.is_file():
        raise FileNotFoundError(f"{what} not found: {path}")


def read_text(path: str | Path, what: str = "annotation file") -> str:
    """The file's text, decoded as UTF-8 (a leading BOM dropped); not UTF-8 is an `AnnotationError` naming the
    file, the byte offset of the first bad byte and its line."""
    path = Path(path)
    _check_exists(path, what)
    data = path.read_bytes()
    bom = len(b"\xef\xbb\xbf") if data.startswith(b"\xef\xbb\xbf") else 0
    try:
        return data[bom:].decode("utf-8")
    except UnicodeDecodeError as err:
        offset = bom + err.start
        line = data.count(b"\n", 0, offset) + 1
        raise AnnotationError(f"{path}: the {what} is not UTF-8 text (byte offset {offset}, line {line}: "
                              f"{err.reason} 0x{data[offset]:02x}); save it as UTF-8") from None


def read_jsonl(path: str | Path, what: str = "annotation file") -> list[tuple[int, dict]]:
    """Return `(line_number, record)` pairs (1-based line numbers; blank lines skipped); a file without any
    record is an error."""
    path = Path(path)
    records = []
    for line_no, line in enumerate(io.StringIO(read_text(path, what), newline=None), start=1):  # \n, \r\n, \r
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as err:
            raise AnnotationError(f"{path}:{line_no}: not valid JSON ({err.msg} at column {err.colno})") from None
        if not isinstance(record, dict):
            raise AnnotationError(f"{path}:{line_no}: expected a JSON object, got {type(record).__name__}")
        records.append((line_no, record))
    if not records:
        raise AnnotationError(f"{path}: the {what} is empty (no JSON line)")
    return records


def read_json(path: str | Path, what: str = "annotation file"):
    path = Path(path)
    text = read_text(path, what)
    if not text.strip():
        raise AnnotationError(f"{path}: the {what} is empty")
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
