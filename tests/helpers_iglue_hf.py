"""Fixtures for the IGLUE x Hugging Face tests: subsets of the real IGLUE annotation files laid out as IGLUE's
datasets/ folder, generated images for every image they name, and small deterministic backends that keep the
`volta_ml.hf.base` contract (the tiny real models of tests/helpers_hf.py are exercised where available)."""
from __future__ import annotations

import json
import zlib
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from volta_ml.hf.base import ModelSpec
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


def image_key(image) -> str:
    return "blank" if image is None else str(np.asarray(image, dtype=np.int64).sum()) + f"x{image.size}"


class FakeDual:
    """Embeddings from the pixels / the text (deterministic, per item), L2-normalised."""

    def __init__(self, dim: int = 16):
        self.spec, self.dim, self.calls = ModelSpec("fake-dual"), dim, 0

    def _vec(self, key: str) -> torch.Tensor:
        g = torch.Generator().manual_seed(_seed(key))
        v = torch.randn(self.dim, generator=g)
        return v / v.norm()

    def embed_images(self, images):
        self.calls += 1
        return torch.stack([self._vec("img" + image_key(im)) for im in images])

    def embed_texts(self, texts):
        self.calls += 1
        return torch.stack([self._vec("txt" + t) for t in texts])


class FakeGenerative:
    """Scores from a hash of (rendered prompt, images, candidate): what a batch gives equals one at a time."""

    def __init__(self, max_images: int = 1, answers=("yes", "no", "The red car.", "left")):
        self.spec, self.max_images, self.answers = ModelSpec("fake-mllm"), max_images, list(answers)
        self.prompt_format, self.calls = "chat_template", 0

    def render(self, prompt, num_images):
        return "USER: " + "<image>" * num_images + "\n" + prompt + " ASSISTANT:"

    def _value(self, images, prompt, candidate) -> float:
        key = self.render(prompt, len(images)) + "|".join(image_key(im) for im in images) + "#" + candidate
        return (_seed(key) % 10007) / 1000.0 - 5.0

    def choice_logits(self, images, prompts, choices):
        self.calls += 1
        return torch.tensor([[self._value(ims, p, c) for c in choices] for ims, p in zip(images, prompts)])

    def continuation_logprobs(self, images, prompts, continuations):
        self.calls += 1
        sums = torch.tensor([[-abs(self._value(ims, p, "lp" + c)) for c in conts]
                             for ims, p, conts in zip(images, prompts, continuations)])
        counts = torch.tensor([[len(c.split()) for c in conts] for conts in continuations])
        return sums, counts

    def generate(self, images, prompts, max_new_tokens):
        self.calls += 1
        return [self.answers[_seed(self.render(p, len(ims)), *map(image_key, ims)) % len(self.answers)]
                for ims, p in zip(images, prompts)]


class FailingAfter:
    """Wraps a backend and raises after `n` calls (an interrupted run)."""

    def __init__(self, backend, n: int):
        self.backend, self.left = backend, n
        self.spec = backend.spec
        for name in ("max_images", "prompt_format"):
            if hasattr(backend, name):
                setattr(self, name, getattr(backend, name))

    def __getattr__(self, name):
        method = getattr(self.backend, name)

        def call(*args, **kwargs):
            if self.left <= 0:
                raise RuntimeError("interrupted")
            self.left -= 1
            return method(*args, **kwargs)
        return call
