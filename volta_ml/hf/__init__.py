"""Hugging Face backends (CLIP-family dual encoders, M-CLIP, generative image-text models); contract in base.py.

`load_backend(kind, spec)` builds the backend `BACKENDS[kind]` for a `ModelSpec`; each loader imports
`transformers` only when called, so importing this package stays cheap. A model or adapter folder that is a
training run's `hf_best/` export older than the run's best checkpoint is said on stderr (`export.check`).
"""
from __future__ import annotations

from .base import BackendInputError, ChoiceTokenError, DualEncoder, EngineError, Generative, ModelSpec
from .loading import ModelLoadError


def _clip(spec: ModelSpec) -> DualEncoder:
    from .dual import ClipBackend
    return ClipBackend(spec)


def _mclip(spec: ModelSpec) -> DualEncoder:
    from .dual import MClipBackend
    return MClipBackend(spec)


def _mllm(spec: ModelSpec) -> Generative:
    from .generative import generative_backend
    return generative_backend(spec)


def _vllm(spec: ModelSpec) -> Generative:
    from .vllm_engine import VllmBackend
    return VllmBackend(spec)
def _openai(spec: ModelSpec) -> Generative:
    from .openai_client import OpenAIBackend
    return OpenAIBackend(spec)


BACKENDS = {
    "clip": _clip,      # transformers CLIP / SigLIP / SigLIP-2 (AutoModel + AutoProcessor)
    "mclip": _mclip,    # M-CLIP text tower (multilingual-clip layout) + OpenAI CLIP image tower
    "mllm": _mllm,      # LLaVA, BLIP-2 / mBLIP, InstructBLIP, the current families of docs/hf_backends.md
    "vllm": _vllm,      # the mllm prompts run by vLLM's offline engine (hf/vllm_engine.py, docs/engines.md)
    "openai": _openai,  # an OpenAI-compatible chat-completions server (--base_url; docs/serving.md)
}
GENERATIVE = ("mllm", "vllm", "openai")   # the generative kinds: the options of a chat template and the letter rule


class UnknownBackendError(ValueError):
    """A backend kind that is not a key of BACKENDS."""


def load_backend(kind: str, spec: ModelSpec) -> DualEncoder | Generative:
    try:
        loader = BACKENDS[kind]
    except KeyError:
        raise UnknownBackendError(f"unknown HF backend {kind!r}; supported: {', '.join(BACKENDS)}") from None
    from . import export
    for folder in (spec.model, spec.adapter):    # a training run's hf_best older than its best: said on stderr
        export.check(folder)
    return loader(spec)


__all__ = ["BACKENDS", "GENERATIVE", "BackendInputError", "ChoiceTokenError", "DualEncoder", "EngineError", "Generative", "ModelLoadError", "ModelSpec",
           "UnknownBackendError", "load_backend"]
