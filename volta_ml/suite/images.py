"""Where a suite task's images come from: files under a folder, cells of the release's parquet shards, members
of a zip archive. Every store checks its keys before any scoring (`check`: one `MissingImagesError` line naming
how many are missing and the first few) and loads one as an RGB `PIL.Image` (`load`). A question with more
images than the model takes gets them stacked into one canvas (`stack`)."""
from __future__ import annotations

import io
import zipfile
from collections import OrderedDict
from pathlib import Path

from PIL import Image

from volta_ml.digest import file_digest, stat_digest
from volta_ml.iglue_hf.images import SHOWN_MISSING, ImageRef, ImageSource, MissingImagesError


def _rgb(data: bytes, where: str) -> Image.Image:
    from volta_ml.hf.loading import photo_rgb   # here: the command line imports this module without torch

    try:
        with Image.open(io.BytesIO(data)) as image:
            return photo_rgb(image)
    except (OSError, ValueError) as err:
        raise MissingImagesError(f"{where}: not a readable image ({err})") from None


def _missing(missing: list[str], total: int, what: str, where: str) -> None:
    if missing:
        raise MissingImagesError(f"{len(missing)} of the {total} images {what} show are not {where}; first missing: "
                                 f"{', '.join(missing[:SHOWN_MISSING])}")


class FileImages:
    """Images as files: a key is a path relative to `root` (`{file}` of the template) or an id the template
    turns into one (`{id}.jpg`)."""

    def __init__(self, root: str | Path, template: str = "{file}"):
        self.source = ImageSource(root, template)
        self.root = Path(root)

    @staticmethod
    def ref(key: str) -> ImageRef:
        return ImageRef(id=key, file=key)

    def path(self, key: str) -> Path:
        return self.source.path(self.ref(key))

    def check(self, keys, what: str) -> None:
        keys = list(dict.fromkeys(keys))
        _missing([str(self.path(k)) for k in keys if not self.path(k).is_file()], len(keys), what,
                 f"under {self.root} (template {self.source.template!r})")

    def load(self, key: str) -> Image.Image:
        return self.source.load(self.ref(key))

    def digest(self, keys) -> dict:
        return {"images": str(self.root.resolve()), "template": self.source.template,
                "images_stat": stat_digest([self.path(k) for k in dict.fromkeys(keys)], str(self.root))}


class ParquetImages:
    """Images embedded in parquet shards (the Hugging Face `Image` feature: a struct {bytes, path}); a key is
    (shard index, row, column). A row group is read when one of its images is loaded (the last two are kept)."""

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

    def check(self, keys, what: str) -> None:
        """The readers only make keys of cells that hold image bytes; nothing is left to check here."""

    def load(self, key) -> Image.Image:
        import pyarrow.parquet as pq

        shard, row, column = key
        group, start = self._row_group(shard, row)
        cache_key = (shard, group, column)
        if cache_key not in self._groups:
            self._groups[cache_key] = pq.ParquetFile(self.shards[shard]).read_row_group(group, columns=[column])
            while len(self._groups) > 2:
                self._groups.popitem(last=False)
        cell = self._groups[cache_key].column(0)[row - start].as_py()
        data = cell.get("bytes") if isinstance(cell, dict) else cell
        return _rgb(data, f"{self.shards[shard]} row {row} column {column}")

    def digest(self, keys) -> dict:
        return {"image_shards": [file_digest(str(s)) for s in self.shards]}


class ZipImages:
    """Images inside a zip archive (Kaleidoscope's `data.zip`): a key is a path relative to `prefix` in it."""

    def __init__(self, archive: str | Path, prefix: str = ""):
        self.archive, self.prefix = Path(archive), prefix
        self._zip: zipfile.ZipFile | None = None

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

    def load(self, key: str) -> Image.Image:
        return _rgb(self._open().read(self.prefix + key), f"{self.archive}:{self.prefix}{key}")

    def digest(self, keys) -> dict:
        return {"image_archive": file_digest(str(self.archive)), "prefix": self.prefix}


def stack(images: list[Image.Image]) -> Image.Image:
    """One canvas with the images one below the other, each keeping its size, left-aligned on white: how a
    model that takes one image per prompt sees a question with several."""
    width, height = max(im.width for im in images), sum(im.height for im in images)
    canvas = Image.new("RGB", (width, height), "white")
    top = 0
    for im in images:
        canvas.paste(im, (0, top))
        top += im.height
    return canvas
