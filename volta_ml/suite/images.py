"""Where a suite task's images come from: files under a folder, cells of the release's parquet shards, members
of a zip archive, base64 cells of a TSV (VLMEvalKit's). Every store checks its keys before any scoring (`check`:
one `MissingImagesError` line naming how many are missing and the first few; a parquet or TSV cell without an
image is refused by the reader) and loads one as an RGB `PIL.Image` (`load`). A question with more images than
the model takes gets them stacked into one canvas (`stack`).

An image that is there but cannot be decoded (empty, truncated, corrupt) is handled as `cvqa score` and `iglue-hf`
handle it (`volta_ml.hf.photos`): `load` returns None, `failed` maps the image's `name` (its path, `<shard> row
<r> column <c>`, `<archive>:<member>`, `<tsv> index <i> image <k>`) to the reason, the question is scored without
that image, and the run lists it in `suite_results.json` (`failed_images`; `failures` / `failed_in` keep them
with each chunk's scores so that a resumed or sharded run lists them too)."""
from __future__ import annotations

import io
import zipfile
from pathlib import Path

from PIL import Image

from volta_ml.digest import file_digest, stat_digest
from volta_ml.iglue_hf.images import SHOWN_MISSING, ImageRef, ImageSource, MissingImagesError, ParquetSource

from volta_ml.iglue_hf.parquet import ParquetCells, image_bytes


class _Decoding:
    """What the three stores share: the decode failures of the images loaded so far, and their chunk rows."""

    failed: dict[str, str]

    def name(self, key) -> str:
        raise NotImplementedError

    def _decode(self, open_image, key) -> Image.Image | None:
        from volta_ml.hf.photos import decode_photo   # here: the command line imports this module without torch

        return decode_photo(open_image, self.name(key), failed=self.failed)

    def failures(self, keys_per_row, width: int):
        """[rows, width] of the decode failures of the rows just loaded (`hf.photos.failure_rows`)."""
        from volta_ml.hf.photos import failure_rows

        return failure_rows(self.failed, [[self.name(k) for k in keys] for keys in keys_per_row], width)

    def failed_in(self, reasons, keys_per_row) -> dict[str, str]:
        """{name: reason} of every image `failures` marked: the run's `failed_images`."""
        from volta_ml.hf.photos import failed_in

        return failed_in(reasons, [[self.name(k) for k in keys] for keys in keys_per_row])


def _missing(missing: list[str], total: int, what: str, where: str) -> None:
    if missing:
        raise MissingImagesError(f"{len(missing)} of the {total} images {what} show are not {where}; first missing: "
                                 f"{', '.join(missing[:SHOWN_MISSING])}")


class FileImages(_Decoding):
    """Images as files: a key is a path relative to `root` (`{file}` of the template) or an id the template
    turns into one (`{id}.jpg`)."""

    def __init__(self, root: str | Path, template: str = "{file}"):
        self.source = ImageSource(root, template, scoring=True)
        self.root = Path(root)
        self.failed = self.source.failed

    def name(self, key: str) -> str:
        return str(self.path(key))

    @staticmethod
    def ref(key: str) -> ImageRef:
        return ImageRef(id=key, file=key)

    def path(self, key: str) -> Path:
        return self.source.path(self.ref(key))

    def check(self, keys, what: str) -> None:
        keys = list(dict.fromkeys(keys))
        _missing([str(self.path(k)) for k in keys if not self.path(k).is_file()], len(keys), what,
                 f"under {self.root} (template {self.source.template!r})")

    def load(self, key: str) -> Image.Image | None:
        return self.source.load(self.ref(key))

    def digest(self, keys) -> dict:
        return {"images": str(self.root.resolve()), "template": self.source.template,
                "images_stat": stat_digest([self.path(k) for k in dict.fromkeys(keys)], str(self.root))}


class ParquetImages(_Decoding):
    """Images embedded in parquet shards (the Hugging Face `Image` feature or a plain struct {bytes, path}, or a
    base64 string: `image_bytes`); a key is (shard index, row, column), read through `iglue_hf.parquet.ParquetCells`
    (a row group at a time)."""

    def __init__(self, shards: list[Path]):
        self.shards = list(shards)
        self.cells = ParquetCells(self.shards)
        self.failed: dict[str, str] = {}
        self.refs: dict = {}          # ImageRef -> key, for the retrieval loop (`source`)

    @property
    def source(self) -> ParquetSource:
        """The images as `iglue_hf.images.ParquetSource` (`ImageSource`'s interface, by `ImageRef`)."""
        return ParquetSource(self.cells, self.refs)

    def check(self, keys, what: str) -> None:
        """The readers only make keys of cells that hold image bytes; nothing is left to check here."""

    def name(self, key) -> str:
        return self.cells.name(*key)

    def load(self, key) -> Image.Image | None:
        data = image_bytes(self.cells.cell(*key))
        return self._decode(lambda: Image.open(io.BytesIO(data or b"")), key)

    def digest(self, keys) -> dict:
        return {"image_shards": [file_digest(str(s)) for s in self.shards]}


class ZipImages(_Decoding):
    """Images inside a zip archive (Kaleidoscope's `data.zip`): a key is a path relative to `prefix` in it. A
    member whose bytes fail the archive's check (CRC) is an image that cannot be decoded."""

    def __init__(self, archive: str | Path, prefix: str = ""):
        self.archive, self.prefix = Path(archive), prefix
        self._zip: zipfile.ZipFile | None = None
        self.failed: dict[str, str] = {}

    def _open(self) -> zipfile.ZipFile:
        if self._zip is None:
            try:
                self._zip = zipfile.ZipFile(self.archive)
            except zipfile.BadZipFile as err:
                raise MissingImagesError(f"{self.archive}: not a readable zip archive ({err})") from None
        return self._zip

    def check(self, keys, what: str) -> None:
        names = set(self._open().namelist())
        keys = list(dict.fromkeys(keys))
        _missing([f"{self.archive}:{self.prefix}{k}" for k in keys if self.prefix + k not in names], len(keys), what,
                 f"in {self.archive}")

    def name(self, key: str) -> str:
        return f"{self.archive}:{self.prefix}{key}"

    def load(self, key: str) -> Image.Image | None:
        archive = self._open()
        return self._decode(lambda: Image.open(io.BytesIO(archive.read(self.prefix + key))), key)

    def digest(self, keys) -> dict:
        return {"image_archive": file_digest(str(self.archive)), "prefix": self.prefix}


class Base64Images(_Decoding):
    """Images as base64 text in the cells of a TSV (VLMEvalKit's `image` column), held as read: a key is (the
    index of the row holding the text, the image's position in that row's list)."""

    def __init__(self, tsv: str | Path, cells: dict):
        self.tsv, self.cells = Path(tsv), cells
        self.failed: dict[str, str] = {}

    def check(self, keys, what: str) -> None:
        """The reader only makes keys of cells that hold text; nothing is left to check here."""

    def name(self, key) -> str:
        index, position = key
        return f"{self.tsv} index {index} image {position}"

    def load(self, key) -> Image.Image | None:
        import base64

        return self._decode(lambda: Image.open(io.BytesIO(base64.b64decode(self.cells[key]))), key)

    def digest(self, keys) -> dict:
        return {"images": "base64 cells of the TSV (its digest is the data's)"}


def stack(images: list[Image.Image | None]) -> Image.Image:
    """One canvas with the images one below the other, each keeping its size, left-aligned on white: how a
    model that takes one image per prompt sees a question with several. An image that failed to decode (None) is
    the blind control's blank image (`hf.loading.blank_image`), so the others keep their places."""
    if any(im is None for im in images):
        from volta_ml.hf.loading import blank_image
        images = [blank_image() if im is None else im for im in images]
    width, height = max(im.width for im in images), sum(im.height for im in images)
    canvas = Image.new("RGB", (width, height), "white")
    top = 0
    for im in images:
        canvas.paste(im, (0, top))
        top += im.height
    return canvas
