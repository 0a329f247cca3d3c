"""Small deterministic stand-ins for `volta_ml.hf` backends (the contract in volta_ml/hf/base.py).

Each output depends only on its own example (image pixels, text), like a real model without batch effects, so
a test can compute the reference one example at a time. `install(monkeypatch)` makes `volta_ml.hf.load_backend`
return them; `python tests/helpers_cvqa_backends.py <volta-ml args>` runs the CLI with them (for torchrun tests).
"""
from __future__ import annotations

import hashlib
import sys

import numpy as np
import torch

DIM = 12


def _text_vector(text: str) -> np.ndarray:
    rng = np.random.default_rng(int(hashlib.sha1(text.encode()).hexdigest()[:8], 16))
    return rng.standard_normal(DIM)


def _image_vector(image) -> np.ndarray:
    if image is None:
        return np.ones(DIM)
    pixels = np.asarray(image, dtype=np.float64)
    stats = np.concatenate([pixels.mean(axis=(0, 1)), pixels.std(axis=(0, 1)), [pixels.shape[0], pixels.shape[1]]])
    return np.resize(stats / 100.0, DIM) * np.arange(1, DIM + 1)


def _unit(rows: list[np.ndarray]) -> torch.Tensor:
    x = torch.tensor(np.stack(rows), dtype=torch.float32)
    return x / x.norm(dim=-1, keepdim=True)


class FakeDualEncoder:
    def __init__(self, spec):
        self.spec = spec
        self.image_calls: list[int] = []

    def embed_images(self, images):
        self.image_calls.append(len(images))
        return _unit([_image_vector(i) for i in images])

    def embed_texts(self, texts):
        return _unit([_text_vector(t) for t in texts])


class FakeGenerative:
    max_images = 1
    letters_ok = ("A", "B", "C", "D")

    def __init__(self, spec):
        self.spec = spec
        self.calls = 0

    def render(self, prompt, num_images):
        return "USER: " + "<image>" * num_images + f"\n{prompt} ASSISTANT:"

    def _base(self, images, prompt) -> float:
        return float(_image_vector(images[0]).sum() + _text_vector(prompt)[0])

    def choice_logits(self, images, prompts, choices):
        from volta_ml.hf.base import ChoiceTokenError

        bad = [c for c in choices if c not in self.letters_ok]
        if bad:
            raise ChoiceTokenError(f"{self.spec.model}: {bad[0]!r} is not one token")
        self.calls += 1
        return torch.tensor([[self._base(i, p) * _text_vector(c)[1] for c in choices]
                             for i, p in zip(images, prompts)], dtype=torch.float32)

    def continuation_logprobs(self, images, prompts, continuations):
        self.calls += 1
        sums = [[-abs(self._base(i, p) * _text_vector(c)[2]) for c in conts]
                for i, p, conts in zip(images, prompts, continuations)]
        counts = [[len(c.split()) for c in conts] for conts in continuations]
        return torch.tensor(sums, dtype=torch.float32), torch.tensor(counts)

    def generate(self, images, prompts, max_new_tokens):
        return ["A" for _ in prompts]


FAKES = {"clip": FakeDualEncoder, "mclip": FakeDualEncoder, "mllm": FakeGenerative}
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
