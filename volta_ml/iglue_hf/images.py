"""Images for the Hugging Face backends, read from files (no region features).

An annotation row names its image(s); `ImageRef` keeps the fields a path template can use:
`{id}` (the image id the task's loader derives: Flickr30k number, GQA imageId, WIT `wit_ix`, MaRVL file stem),
`{file}` (the file name the row gives, or `{id}.jpg`), `{concept}` (MaRVL) and `{lang}` (the row's or the
run's language). The path of an image is `<image root>/<template>`; `DEFAULT_TEMPLATES` holds one per task,
matching how the datasets are usually unpacked, and `--image_template` overrides it.

An image file that exists but cannot be decoded (empty, truncated, corrupt) is handled as `cvqa score` handles a
bad photo (`volta_ml.hf.photos`): when scoring (`ImageSource(..., scoring=True)`, iglue-hf) `load` returns None,
the example is scored without that image and the file is listed in `failed_images`; when training (the default)
it is `UnreadableImageError`, one line naming the file.
"""
from __future__ import annotations

import os
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
from PIL import Image

from volta_ml.engine.failures import UsageError

from .parquet import ParquetCells, image_bytes

DEFAULT_TEMPLATES = {
    "xvnli": "{id}.jpg",                       # Flickr30k images (flickr30k-images/)
    "xflickrco": "{file}",                     # the xFlickr&CO test images (Flickr30k + COCO file names)
    "wit": "{id}.jpg",                         # WIT test images saved under their wit_ix
    "xgqa": "{id}.jpg",                        # GQA images/
    "marvl": "{lang}/images/{concept}/{file}",  # MaRVL's marvl-images/<lang>/images/<concept>/<file>
}
SHOWN_MISSING = 5


@dataclass(frozen=True)
class ImageRef:
    id: str
    file: str = ""
    concept: str = ""
    lang: str = ""

    def fields(self) -> dict:
        out = asdict(self)
        out["file"] = self.file or f"{self.id}.jpg"
        return out


class MissingImagesError(FileNotFoundError):
    """Images named by the annotation file are not under the image root; the message lists the first ones."""


class UnreadableImageError(UsageError):
    """An image file that exists but cannot be decoded, met while training; the message names the file."""


class ImageSource:
    """`<root>/<template>` for each `ImageRef`; images come back as RGB `PIL.Image`s. With `scoring=True` an
    image that cannot be decoded comes back as None and `failed` maps its path to the reason."""

    def __init__(self, root: str | Path, template: str, scoring: bool = False):
        self.root, self.template = Path(root), template
        self.failed: dict[str, str] | None = {} if scoring else None
        known = ", ".join("{" + k + "}" for k in ImageRef("x").fields())
        try:
            template.format(**ImageRef("x").fields())
        except (KeyError, IndexError) as err:
            raise UsageError(f"--image_template {template!r}: unknown field {err}; known: {known}") from None
        except ValueError as err:        # a brace left open or unmatched: str.format's own words
            raise UsageError(f"--image_template {template!r}: not a path template ({err}); fields: {known}, a "
                             "literal brace is written twice ({{ or }})") from None

    def path(self, ref: ImageRef) -> Path:
        return self.root / self.template.format(**ref.fields())

    def check(self, refs, annotation: str) -> None:
        """Raise `MissingImagesError` naming how many of `refs` are missing and the first few paths."""
        missing = []
        for ref in dict.fromkeys(refs):
            if not self.path(ref).is_file():
                missing.append(ref)
        if missing:
            shown = ", ".join(str(self.path(r)) for r in missing[:SHOWN_MISSING])
            raise MissingImagesError(
                f"{len(missing)} of the images {annotation} names are not under {self.root} "
                f"(template {self.template!r}); first missing: {shown}")

    def load(self, ref: ImageRef) -> Image.Image | None:
        """The photo in RGB, transparency composited on white (`hf.loading.photo_rgb`, as HF processors do); an
        undecodable file: None (scoring, recorded in `failed`) or `UnreadableImageError` (training)."""
        from volta_ml.hf.photos import UnreadablePhoto, decode_photo   # here: the CLI imports this without torch

        path = self.path(ref)
        try:
            return decode_photo(lambda: Image.open(path), str(path), failed=self.failed)
        except UnreadablePhoto as err:
            raise UnreadableImageError(f"{err}; training reads every image of the annotation file: replace the "
                                       "file, or remove its rows from the annotations") from None

    def failures(self, refs_per_row) -> np.ndarray:
        """[rows, images per row] of the decode failures of the rows just loaded ("" = read), saved with the
        scores of a chunk so that a resumed or sharded run lists them too (`failed_paths`)."""
        from volta_ml.hf.photos import failure_rows

        return failure_rows(self.failed, [[str(self.path(ref)) for ref in refs] for refs in refs_per_row])

    def failed_paths(self, reasons: np.ndarray, refs_per_row) -> dict[str, str]:
        """{path: reason} of every image `failures` marked, in row order."""
        from volta_ml.hf.photos import failed_in

        return failed_in(reasons, [[str(self.path(ref)) for ref in refs] for refs in refs_per_row])

    def digest(self, refs) -> dict:
        """The resume key of the images: root, template, and every file's size and mtime."""
        from volta_ml.digest import stat_digest

        return {"images": os.path.abspath(self.root), "template": self.template,
                "images_stat": stat_digest([self.path(r) for r in dict.fromkeys(refs)], str(self.root))}


class ParquetSource:
    """`ImageSource`'s interface over images embedded in parquet cells (floschne's IGLUE copies): `index` maps each
    `ImageRef` to its cell (shard index, row, column); an image is named `<shard> row <r> column <c>`. Scoring
    only: an undecodable cell comes back as None and is listed in `failed`."""

    template = "embedded (parquet cells)"

    def __init__(self, cells: ParquetCells, index: dict):
        self.cells, self.index = cells, dict(index)
        self.shards = cells.shards
        self.root = Path(os.path.commonpath([str(s.parent) for s in self.shards]))
        self.failed: dict[str, str] = {}

    def name(self, ref: ImageRef) -> str:
        return self.cells.name(*self.index[ref])

    def check(self, refs, annotation: str) -> None:
        """Every ref was made from a cell that holds bytes (`data.read_copy`): nothing is left to check."""

    def load(self, ref: ImageRef) -> Image.Image | None:
        import io

        from volta_ml.hf.photos import decode_photo

        data = image_bytes(self.cells.cell(*self.index[ref])) or b""
        return decode_photo(lambda: Image.open(io.BytesIO(data)), self.name(ref), failed=self.failed)

    def failures(self, refs_per_row) -> np.ndarray:
        from volta_ml.hf.photos import failure_rows

        return failure_rows(self.failed, [[self.name(ref) for ref in refs] for refs in refs_per_row])

    def failed_paths(self, reasons: np.ndarray, refs_per_row) -> dict[str, str]:
        from volta_ml.hf.photos import failed_in

        return failed_in(reasons, [[self.name(ref) for ref in refs] for refs in refs_per_row])

    def digest(self, refs) -> dict:
        from volta_ml.digest import file_digest

        return {"image_shards": [file_digest(str(s)) for s in self.shards]}


def side_by_side(left: Image.Image | None, right: Image.Image | None, gap: int = 0) -> Image.Image:
    """One canvas with `left` and `right` scaled to the same height (the smaller of the two) and placed
    next to each other on white: how a single-image model sees a MaRVL pair. A photo that failed to decode (None)
    is the blind control's blank image (`hf.loading.blank_image`)."""
    if left is None or right is None:
        from volta_ml.hf.loading import blank_image
        left, right = (blank_image() if im is None else im for im in (left, right))
    height = min(left.height, right.height)
    scaled = [im if im.height == height else im.resize((max(1, round(im.width * height / im.height)), height),
                                                       Image.BICUBIC) for im in (left, right)]
    canvas = Image.new("RGB", (scaled[0].width + gap + scaled[1].width, height), "white")
    canvas.paste(scaled[0], (0, 0))
    canvas.paste(scaled[1], (scaled[0].width + gap, 0))
    return canvas
