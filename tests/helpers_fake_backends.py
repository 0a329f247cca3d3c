"""The one set of stand-ins for `volta_ml.hf` backends (the contract in volta_ml/hf/base.py), shared by the CVQA
and IGLUE x Hugging Face tests.

Each output depends only on its own example (images, rendered prompt, candidate), like a real model without
batch effects, so a test computes the reference one example at a time with a fresh fake. `install(monkeypatch)`
makes `volta_ml.hf.load_backend` return them (the instances land in `LOADED`);
`python tests/helpers_fake_backends.py <volta-ml args>` runs the CLI with them (for torchrun tests).
"""
from __future__ import annotations

import sys
import zlib

import numpy as np
import torch

from volta_ml.hf.base import ChoiceTokenError, ModelSpec


def _seed(*parts) -> int:
    return zlib.crc32("|".join(map(str, parts)).encode())


def image_key(image) -> str:
    """What a fake sees of a photo: its pixel sum and size (None: the blind control's missing photo)."""
    return "blank" if image is None else str(np.asarray(image, dtype=np.int64).sum()) + f"x{image.size}"


class FakeDual:
    """Embeddings from the pixels / the text (deterministic, per item), L2-normalised. `calls` counts embed calls,
    `image_calls` the number of images of each embed_images call."""

    def __init__(self, spec: ModelSpec | None = None, dim: int = 16):
        self.spec, self.dim = spec or ModelSpec("fake-dual"), dim
        self.calls, self.image_calls = 0, []

    def _vec(self, key: str) -> torch.Tensor:
        g = torch.Generator().manual_seed(_seed(key))
        v = torch.randn(self.dim, generator=g)
        return v / v.norm()

    def embed_images(self, images):
        self.calls += 1
        self.image_calls.append(len(images))
        return torch.stack([self._vec("img" + image_key(im)) for im in images])

    def embed_texts(self, texts):
        self.calls += 1
        return torch.stack([self._vec("txt" + t) for t in texts])


class FakeGenerative:
    """Scores from a hash of (rendered prompt, images, candidate): what a batch gives equals one at a time.
    A choice outside `letters_ok` is not "one token" (ChoiceTokenError, as the real backend)."""

    letters_ok = ("A", "B", "C", "D")

    def __init__(self, spec: ModelSpec | None = None, max_images: int = 1,
                 answers=("yes", "no", "The red car.", "left"), cut=()):
        self.spec, self.max_images, self.answers = spec or ModelSpec("fake-mllm"), max_images, list(answers)
        self.cut = set(cut)          # answers that come back truncated (stopped at max_new_tokens)
        self.prompt_format, self.calls = "chat_template", 0

    def render(self, prompt, num_images):
        return "USER: " + "<image>" * num_images + "\n" + prompt + " ASSISTANT:"

    def _value(self, images, prompt, candidate) -> float:
        key = self.render(prompt, len(images)) + "|".join(image_key(im) for im in images) + "#" + candidate
        return (_seed(key) % 10007) / 1000.0 - 5.0

    def choice_logits(self, images, prompts, choices):
        bad = [c for c in choices if c not in self.letters_ok]
        if bad:
            raise ChoiceTokenError(f"{self.spec.model}: {bad[0]!r} is not one token")
        self.calls += 1
        return torch.tensor([[self._value(ims, p, c) for c in choices] for ims, p in zip(images, prompts)])

    def continuation_logprobs(self, images, prompts, continuations):
        self.calls += 1
        sums = torch.tensor([[-abs(self._value(ims, p, "lp" + c)) for c in conts]
                             for ims, p, conts in zip(images, prompts, continuations)])
        counts = torch.tensor([[len(c.split()) for c in conts] for conts in continuations])
        return sums, counts

    def generate(self, images, prompts, max_new_tokens):
        from volta_ml.hf.base import Answer

        self.calls += 1
        texts = [self.answers[_seed(self.render(p, len(ims)), *map(image_key, ims)) % len(self.answers)]
                 for ims, p in zip(images, prompts)]
        return [Answer(t, truncated=t in self.cut) for t in texts]


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


FAKES = {"clip": FakeDual, "mclip": FakeDual, "mllm": FakeGenerative}
LOADED: list = []


def load_backend(kind, spec):
    if kind not in FAKES:
        raise ValueError(f"unknown backend {kind!r}")
    LOADED.append(FAKES[kind](spec))
    return LOADED[-1]


def install(monkeypatch) -> None:
    import volta_ml.hf

    LOADED.clear()
    monkeypatch.setattr(volta_ml.hf, "load_backend", load_backend, raising=False)


if __name__ == "__main__":
    import volta_ml.hf
    from volta_ml.cli import main

    volta_ml.hf.load_backend = load_backend
    sys.exit(main(sys.argv[1:]))
