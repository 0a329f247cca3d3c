"""The generative backends (`BACKENDS["mllm"]`): which class runs a model, by one table keyed by the family's
`layout` (`hf/families.py`) and whether its LM is an encoder-decoder.

    generative_backend(spec)                       # loads spec.model and its processor
    generative_backend(spec, model, processor)     # wraps an already built model (random-weight benchmarks)
"""
from __future__ import annotations

from .base import ModelSpec
from .blip import BlipBackend, BlipSeq2SeqBackend
from .families import family
from .loading import ModelLoadError, load_model, load_processor
from .mllm import GenerativeBackend, is_encoder_decoder

CLASSES = {
    ("image_tokens", False): GenerativeBackend,     # hf/mllm.py: image placeholders in the text, decoder-only LM
    ("query_tokens", False): BlipBackend,           # hf/blip.py: BLIP-2 / InstructBLIP / mBLIP with OPT, BLOOM
    ("query_tokens", True): BlipSeq2SeqBackend,     # hf/blip.py: the same with Flan-T5, mT0
}


def generative_backend(spec: ModelSpec, model=None, processor=None) -> GenerativeBackend:
    """The backend of `spec` (model and processor loaded unless given), of the class its family's row picks."""
    from transformers import AutoModelForImageTextToText, AutoProcessor
    model = model if model is not None else load_model(AutoModelForImageTextToText, spec,
                                                       "a generative image-text model")
    processor = processor if processor is not None else load_processor(AutoProcessor, spec)
    key = (family(model.config.model_type).layout, is_encoder_decoder(model.config))
    if key not in CLASSES:
        raise ModelLoadError(f"{spec.model}: model type {model.config.model_type!r} has an encoder-decoder LM behind "
                             "image tokens; no generative backend takes that layout")
    return CLASSES[key](spec, model, processor)
