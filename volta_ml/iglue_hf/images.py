"""Images for the Hugging Face backends, read from files (no region features).

An annotation row names its image(s); `ImageRef` keeps the fields a path template can use:
`{id}` (the image id the task's loader derives: Flickr30k number, GQA imageId, WIT `wit_ix`, MaRVL file stem),
`{file}` (the file name the row gives, or `{id}.jpg`), `{concept}` (MaRVL) and `{lang}` (the row's or the
run's language). The path of an image is `<image root>/<template>`; `DEFAULT_TEMPLATES` holds one per task,
matching how the datasets are usually unpacked, and `--image_template` overrides it.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path

from PIL import Image

from volta_ml.engine.failures import UsageError

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


class ImageSource:
    """`<root>/<template>` for each `ImageRef`; images come back as RGB `PIL.Image`s."""

    def __init__(self, root: str | Path, template: str):
        self.root, self.template = Path(root), template
        try:
            template.format(**ImageRef("x").fields())
        except (KeyError, IndexError) as err:
            raise UsageError(f"image template {template!r}: unknown field {err}; known: "
                             f"{', '.join('{' + k + '}' for k in ImageRef('x').fields())}") from None

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

    def load(self, ref: ImageRef) -> Image.Image:
        """The photo in RGB, transparency composited on white (`hf.loading.photo_rgb`, as HF processors do)."""
        from volta_ml.hf.loading import photo_rgb   # here: the command line imports this module without torch

        with Image.open(self.path(ref)) as image:
            return photo_rgb(image)


def side_by_side(left: Image.Image, right: Image.Image, gap: int = 0) -> Image.Image:
    """One canvas with `left` and `right` scaled to the same height (the smaller of the two) and placed
    next to each other on white: how a single-image model sees a MaRVL pair."""
    height = min(left.height, right.height)
    scaled = [im if im.height == height else im.resize((max(1, round(im.width * height / im.height)), height),
                                                       Image.BICUBIC) for im in (left, right)]
    canvas = Image.new("RGB", (scaled[0].width + gap + scaled[1].width, height), "white")
    canvas.paste(scaled[0], (0, 0))
    canvas.paste(scaled[1], (scaled[0].width + gap, 0))
    return canvas
