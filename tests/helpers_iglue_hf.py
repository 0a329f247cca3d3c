"""Fixtures for the IGLUE x Hugging Face tests: subsets of the real IGLUE annotation files laid out as IGLUE's
datasets/ folder and generated images for every image they name. The stand-in backends are in
tests/helpers_fake_backends.py (shared with the CVQA tests); the tiny real models in tests/helpers_hf.py."""
from __future__ import annotations

import json
import zlib
from pathlib import Path

import numpy as np
from PIL import Image

from volta_ml.iglue_hf.data import image_refs, read_task
from volta_ml.iglue_hf.images import DEFAULT_TEMPLATES, ImageSource

# (task, real file under ../shared/iglue/datasets, rows kept, the same file's place under a data_root)
SUBSETS = {
    "xvnli": [("XVNLI/annotations/ar/test.jsonl", 24), ("XVNLI/annotations_machine-translate/ar/test.jsonl", 24),
              ("XVNLI/annotations/en/test.jsonl", 24)],
    "xflickrco": [("xFlickrCO/annotations/de/test.jsonl", 30),
                  ("xFlickrCO/annotations_machine-translate/de/test_gmt.jsonl", 30)],
    "wit": [("wit/annotations/test_ar.jsonl", 30)],
    "marvl": [("marvl/zero_shot/annotations/marvl-id.jsonl", 16),
              ("marvl/zero_shot/annotations_machine-translate/marvl-id_gmt.jsonl", 16)],
    "xgqa": [("xGQA/annotations/few_shot/de/train_5.json", 20)],
}


def _seed(*parts) -> int:
    return zlib.crc32("|".join(map(str, parts)).encode())


def build_data_root(shared: Path, root: Path, cap: int | None = None) -> Path:
    """The first rows (at most `cap`) of each real file, at the same relative path under `root`."""
    for files in SUBSETS.values():
        for rel, rows in files:
            rows = min(rows, cap or rows)
            src, dst = shared / rel, root / rel
            dst.parent.mkdir(parents=True, exist_ok=True)
            if rel.endswith(".json"):
                data = json.loads(src.read_text(encoding="utf-8"))
                dst.write_text(json.dumps(dict(list(data.items())[:rows])), encoding="utf-8")
            else:
                lines = src.read_text(encoding="utf-8").splitlines()[:rows]
                dst.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return root


def make_images(task: str, annotation: Path, lang: str, image_root: Path) -> None:
    """A small distinct picture (size and colours from the id) for every image the file names."""
    source = ImageSource(image_root, DEFAULT_TEMPLATES[task])
    for ref in dict.fromkeys(image_refs(read_task(task, str(annotation), lang))):
        path = source.path(ref)
        path.parent.mkdir(parents=True, exist_ok=True)
        rng = np.random.default_rng(_seed(ref.id))
        h, w = int(rng.integers(12, 24)), int(rng.integers(12, 24))
        Image.fromarray(rng.integers(0, 255, (h, w, 3), dtype=np.uint8)).save(path)
