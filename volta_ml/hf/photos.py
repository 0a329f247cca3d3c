"""Decoding the photos the Hugging Face backends see, and what becomes of a photo that cannot be decoded.

One mechanism for every pipeline that reads photos for an HF model (`cvqa score` from the parquet shards,
`iglue-hf` and `train --hf_model` from image files):

- `decode_photo(open_image, name, ...)`: the RGB photo (`loading.photo_rgb`: transparency on white), optionally
  EXIF-rotated (CVQA, as `datasets` decodes), refused above `max_pixels` (decompression bombs) and shrunk to
  `max_side`; an empty, truncated or corrupt file raises `UnreadablePhoto` naming it and what the decoder said.
- Scoring (`cvqa score`, `iglue-hf`) passes a `failed` dict: the photo is then None, `failed[name]` holds the
  reason, and the example is scored without its image (the backends' meaning of None: the blind control's input);
  the run lists every such photo in its results file (`failed_images`) and says so in one stderr line
  (`failure_line`). A run never stops for one bad photo among thousands. The failures of a chunk are saved with its
  scores (`failure_rows`: one row per example, a column per image, "" where it decoded) so that a resumed or
  sharded run lists them too (`failed_in`); `cvqa score` keeps them in a side file per chunk instead.
- Training passes no `failed` dict: a photo it cannot decode ends the run with one line naming the file (the
  example cannot be trained on as it is, and dropping it silently would change what is trained).
"""
from __future__ import annotations

import re
from typing import Callable, Sequence

import numpy as np
from PIL import Image

from .loading import photo_rgb


IN_MEMORY = re.compile(r" ?<_io\.BytesIO object at 0x[0-9a-fA-F]+>")


class UnreadablePhoto(ValueError):
    """A photo that cannot be decoded (empty, truncated, corrupt, too many pixels); the message names it."""


def decode_photo(open_image: Callable[[], Image.Image], name: str, *, failed: dict | None = None,
                 max_pixels: int | None = None, max_side: int | None = None,
                 exif: bool = False) -> Image.Image | None:
    """The photo `open_image()` opens, in RGB; None with `failed[name] = reason` when it cannot be decoded and
    `failed` is given, else `UnreadablePhoto`."""
    from PIL import ImageOps

    try:
        if max_pixels is not None:
            with open_image() as probe:      # the header only: a bomb is refused before its pixels exist
                width, height = probe.size
            if width * height > max_pixels:
                raise UnreadablePhoto(f"{width}x{height} pixels exceeds --max-pixels {max_pixels} (possible "
                                      "decompression bomb)")
        with open_image() as image:
            photo = photo_rgb(ImageOps.exif_transpose(image) if exif else image)
        if max_side and max(photo.size) > max_side:
            photo.thumbnail((max_side, max_side), Image.Resampling.BICUBIC)
        return photo
    except Exception as err:   # whatever the decoder raises for bad bytes (OSError, SyntaxError, zlib.error, ...)
        # the repr of an in-memory file (its address) would make two runs' results differ: left out
        said = IN_MEMORY.sub("", str(err))
        reason = said if isinstance(err, UnreadablePhoto) else f"{type(err).__name__}: {said}"
        if failed is None:
            raise UnreadablePhoto(f"{name}: cannot decode the image ({reason})") from None
        failed[name] = reason
        return None


def failure_line(failed: dict, results_file) -> str:
    """The one stderr line of a scoring run with photos that failed to decode."""
    first = next(iter(failed.items()))
    return (f"{len(failed)} photo(s) failed to decode (first: {first[0]}: {first[1]}); listed in {results_file} "
            "(failed_images), their examples scored without the image")


def failure_rows(failed: dict | None, names_per_row: Sequence[Sequence[str]], width: int | None = None) -> np.ndarray:
    """[rows, width] of the decode failures (`failed[name]`, "" = decoded) of the photos each row (example)
    showed, padded with "" to `width` columns (default: the most photos of a row; a run whose examples show
    different numbers of photos passes its largest, so that every chunk has the same columns)."""
    rows = [[(failed or {}).get(name, "") for name in names] for names in names_per_row]
    width = max((len(r) for r in rows), default=0) if width is None else width
    return np.array([r + [""] * (width - len(r)) for r in rows], dtype=str).reshape(len(rows), width)


def failed_in(reasons: np.ndarray, names_per_row: Sequence[Sequence[str]]) -> dict[str, str]:
    """{name: reason} of every photo `failure_rows` marked, in row order: the run's `failed_images`."""
    return {name: reason for names, row in zip(names_per_row, reasons.tolist())
            for name, reason in zip(names, row) if reason}
