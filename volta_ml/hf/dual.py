"""Dual encoders: the `transformers` CLIP family (CLIP, SigLIP, SigLIP-2) and M-CLIP.

Both embed images and texts separately and return L2-normalised float32 CPU rows, so a score is a dot product
(the learned logit scale / bias only rescales it and never changes a ranking). Inputs are processed in chunks
of `spec.extra["batch_size"]` (default 64); a `None` image is the blind control's blank photo.
"""
from __future__ import annotations

from pathlib import Path
from typing import Sequence

import torch
import torch.nn.functional as F
from PIL import Image

from .base import ModelSpec
from .loading import (ModelLoadError, blank_image, check_weights, float_dtype, input_device, is_local,
                      load_model, load_processor, one_line, read_config, source, torch_dtype, weights_errors)


def _features(out) -> torch.Tensor:
    """get_*_features returns a tensor (transformers 4) or an output whose pooler_output is projected (5)."""
    return out if isinstance(out, torch.Tensor) else out.pooler_output


def _chunks(items: Sequence, size: int):
    for i in range(0, len(items), size):
        yield items[i:i + size]


class _Embedder:
    spec: ModelSpec

    def _batch_size(self) -> int:
        return int(self.spec.extra.get("batch_size", 64))

    @torch.inference_mode()
    def _embed(self, items: Sequence, encode) -> torch.Tensor:
        rows = [F.normalize(encode(chunk).float(), dim=-1).cpu() for chunk in _chunks(list(items), self._batch_size())]
        return torch.cat(rows) if rows else torch.zeros(0, 0)

    def _to(self, enc: dict, model: torch.nn.Module) -> dict:
        dev, dt = input_device(model), float_dtype(model)
        return {k: (v.to(dev, dt) if v.is_floating_point() else v.to(dev)) for k, v in enc.items()}


class ClipBackend(_Embedder):
    """Any `AutoModel` with `get_image_features` / `get_text_features` (CLIPModel, SiglipModel, Siglip2Model).
    SigLIP models were trained on texts padded to a fixed length, so their texts are padded to max_length."""

    def __init__(self, spec: ModelSpec, model=None, processor=None):
        """Loads `spec`; or wraps an already built `model` + `processor` (benchmarks with random weights)."""
        from transformers import AutoModel, AutoProcessor
        self.spec = spec
        self.model = model if model is not None else load_model(AutoModel, spec, "a CLIP-family dual encoder")
        if not (hasattr(self.model, "get_image_features") and hasattr(self.model, "get_text_features")):
            raise ModelLoadError(f"{spec.model}: {type(self.model).__name__} is not a dual encoder "
                                 "(no get_image_features/get_text_features); use the mllm backend for generative models")
        self.processor = processor if processor is not None else load_processor(AutoProcessor, spec)
        text_cfg = getattr(self.model.config, "text_config", self.model.config)
        self.max_length = int(text_cfg.max_position_embeddings)
        self.padding = "max_length" if self.model.config.model_type.startswith("siglip") else True

    def embed_images(self, images: Sequence[Image.Image | None]) -> torch.Tensor:
        def encode(chunk):
            enc = self.processor(images=[im if im is not None else blank_image() for im in chunk], return_tensors="pt")
            return _features(self.model.get_image_features(**self._to(dict(enc), self.model)))
        return self._embed(images, encode)

    def embed_texts(self, texts: Sequence[str]) -> torch.Tensor:
        def encode(chunk):
            enc = self.processor(text=list(chunk), padding=self.padding, truncation=True, max_length=self.max_length,
                                 return_tensors="pt")
            return _features(self.model.get_text_features(**self._to(dict(enc), self.model)))
        return self._embed(texts, encode)


def _load_state(spec: ModelSpec) -> dict:
    """M-CLIP's published weights: pytorch_model.bin (as released) or model.safetensors."""
    from transformers.utils import cached_file
    for name in ("model.safetensors", "pytorch_model.bin"):
        file = cached_file(source(spec), name, revision=spec.revision, _raise_exceptions_for_missing_entries=False)
        if file:
            try:
                with weights_errors(spec.model, file):
                    if name.endswith(".safetensors"):
                        from safetensors.torch import load_file
                        return load_file(file)
                    return torch.load(file, map_location="cpu", weights_only=True)
            except ModelLoadError:
                raise
            except Exception as error:  # a damaged or truncated file: say which, in one line
                raise ModelLoadError(f"{spec.model}: cannot read {file}: {one_line(error)}") from None
    raise ModelLoadError(f"{spec.model}: no pytorch_model.bin or model.safetensors (M-CLIP weights)")


class MClipBackend(_Embedder):
    """M-CLIP (Carlsson et al.): an XLM-R text tower, mean-pooled over the attention mask, then one linear layer
    into the image space of the CLIP model it was distilled against. Loaded from the layout the
    `multilingual-clip` package publishes (config.json with model_type "M-CLIP", modelBase,
    transformerDimensions, numDims; weights `transformer.*` + `LinearTransformation.*`) into transformers'
    `XLMRobertaModel` + `nn.Linear` (the package itself builds its tower from the hub at init and overrides a
    loading hook transformers 5 no longer has). The XLM-R architecture comes from the config of `modelBase`
    (override: `spec.extra["text_base"]`, a hub id in the local HF cache or a local folder; only its config.json
    is read, the weights are M-CLIP's own). Images: the CLIP vision tower + projection of
    `spec.extra["image_model"]` (a CLIPModel; default `openai/clip-vit-base-patch32`, the
    tower of M-CLIP/XLM-Roberta-Large-Vit-B-32; `spec.extra["image_revision"]` pins it).
    config.json may carry `text_base`, `image_model` and `image_revision` as defaults of those extra keys; a
    relative folder there is read beside config.json (how `volta-ml train` exports a fine-tuned M-CLIP:
    iglue_hf/mclip_train.py)."""

    def __init__(self, spec: ModelSpec, parts: dict | None = None):
        """Loads `spec`; or wraps already built `parts` (text, linear, tokenizer, vision, image_processor)."""
        self.spec = spec
        parts = parts if parts is not None else self._load(spec)
        self.text, self.linear, self.tokenizer = parts["text"], parts["linear"], parts["tokenizer"]
        self.vision, self.image_processor = parts["vision"], parts["image_processor"]
        self.max_length = min(int(self.text.config.max_position_embeddings) - 2, 512)
        if getattr(self.vision.config, "projection_dim", None) != self.linear.out_features:
            raise ModelLoadError(f"{spec.model}: text embeddings have {self.linear.out_features} dims but the image "
                                 f"tower projects to {getattr(self.vision.config, 'projection_dim', None)}")

    @staticmethod
    def _load(spec: ModelSpec) -> dict:
        from transformers import AutoConfig, AutoImageProcessor, AutoModel, AutoTokenizer, XLMRobertaModel
        cfg = read_config(spec)
        if cfg.get("model_type") != "M-CLIP":
            raise ModelLoadError(f"{spec.model}: config.json model_type is {cfg.get('model_type')!r}, not 'M-CLIP'")
        base = (spec.extra.get("text_base") or _beside(spec, cfg.get("text_base"))
                or cfg.get("modelBase", "xlm-roberta-large"))
        try:
            xcfg = AutoConfig.from_pretrained(base)
        except (OSError, ValueError) as e:   # transformers' message runs over several lines: keep its first
            raise ModelLoadError(
                f"{spec.model}: cannot read the config of its XLM-R text base {base!r}: M-CLIP builds the text "
                "tower from it, so it must be in the local Hugging Face cache or be given as a local folder "
                f"(--text-base / text_base) ({one_line(e)})") from None
        state = _load_state(spec)
        text, linear = XLMRobertaModel(xcfg), torch.nn.Linear(int(cfg["transformerDimensions"]), int(cfg["numDims"]))
        report = {"missing_keys": [], "unexpected_keys": [k for k in state
                                                          if not k.startswith(("transformer.", "LinearTransformation."))]}
        for module, prefix in ((text, "transformer."), (linear, "LinearTransformation.")):
            part = {k[len(prefix):]: v for k, v in state.items() if k.startswith(prefix)}
            missing, unexpected = module.load_state_dict(part, strict=False)
            report["missing_keys"] += [prefix + k for k in missing if not k.startswith("pooler.")]   # never used
            report["unexpected_keys"] += [prefix + k for k in unexpected]
        text.volta_loading_report = check_weights(spec, report, "M-CLIP's text tower")
        dt = torch_dtype(spec)
        image_spec = ModelSpec(*image_tower(spec, cfg), spec.dtype, spec.device, spec.device_map,
                               allow_missing_keys=spec.allow_missing_keys)
        return {"text": text.to(spec.device, dt).eval(), "linear": linear.to(spec.device, dt).eval(),
                "tokenizer": load_processor(AutoTokenizer, spec),
                "vision": load_model(AutoModel, image_spec, "M-CLIP's CLIP image tower"),
                "image_processor": load_processor(AutoImageProcessor, image_spec)}

    def embed_images(self, images: Sequence[Image.Image | None]) -> torch.Tensor:
        def encode(chunk):
            enc = self.image_processor(images=[im if im is not None else blank_image() for im in chunk],
                                       return_tensors="pt")
            return _features(self.vision.get_image_features(**self._to(dict(enc), self.vision)))
        return self._embed(images, encode)

    def embed_texts(self, texts: Sequence[str]) -> torch.Tensor:
        def encode(chunk):
            enc = self.tokenizer(list(chunk), padding=True, truncation=True, max_length=self.max_length,
                                 return_tensors="pt").to(self.linear.weight.device)
            return mclip_text_features(self.text, self.linear, enc["input_ids"], enc["attention_mask"])
        return self._embed(texts, encode)


def mclip_text_features(text, linear, input_ids, attention_mask) -> torch.Tensor:
    """ M-CLIP's text embedding (not normalised): XLM-R's last hidden states mean-pooled over the attention mask,
    then the linear map into the image space."""
    hidden = text(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
    mask = attention_mask.unsqueeze(-1).to(hidden.dtype)
    return linear((hidden * mask).sum(1) / mask.sum(1))


def image_tower(spec: ModelSpec, cfg: dict) -> tuple[str, str | None]:
    """(model, revision) of M-CLIP's CLIP image tower: `spec.extra`, else config.json, else OpenAI's ViT-B/32."""
    if spec.extra.get("image_model"):
        return spec.extra["image_model"], spec.extra.get("image_revision")
    if cfg.get("image_model"):
        return _beside(spec, cfg["image_model"]), cfg.get("image_revision")
    return "openai/clip-vit-base-patch32", spec.extra.get("image_revision")


def _beside(spec: ModelSpec, name: str | None) -> str | None:
    """A folder a config.json value names: beside config.json when the model is a local folder holding it."""
    if not name or Path(name).is_absolute() or not is_local(spec.model):
        return name
    folder = Path(spec.model).expanduser() / name
    return str(folder) if folder.is_dir() else name
