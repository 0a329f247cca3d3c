"""Contrastive fine-tuning of M-CLIP (Carlsson et al., 2022) in the dual-encoder training job (`iglue_hf.train`).

M-CLIP's text tower (XLM-R, mean pooling, one linear map; `hf.dual.MClipBackend`) was trained by distillation:
the mean-squared error between its embedding of a (machine-translated) caption and the original CLIP's text
embedding of the English caption. It has no temperature of its own. Here it is fine-tuned with CLIP's
symmetric InfoNCE loss (`contrastive.infonce_loss`) against the embeddings of the CLIP image tower it was
distilled towards, at a fixed logit scale 1 / `--hf_temperature`: by default 100 (temperature 0.01), the value
CLIP's learned `logit_scale` reaches, at its cap, by the end of CLIP's training, so the similarities are as
sharp as those the image embeddings were trained under.

The image tower is frozen by default, and run without building a graph: it is the original CLIP's, what
M-CLIP trained is the text side. `--hf_train_image_tower` trains its vision transformer and projection too.

Export (`hf_best/`, what `volta-ml iglue-hf --backend mclip --model <run dir>/hf_best` loads): the
multilingual-clip layout (config.json with model_type "M-CLIP", modelBase, transformerDimensions, numDims;
model.safetensors with `transformer.*` and `LinearTransformation.*`; the tokenizer), plus `text_base/` (the
XLM-R config the tower is built from, so no Hugging Face cache is needed) and the image tower: frozen, a
reference in config.json (`image_model`, `image_revision`: the tower it was loaded from); trained, a copy in
`image_model/` (`save_pretrained` of the CLIPModel and its image processor). The same folder is a valid
`--hf_model` (IGLUE's few-shot runs start from the English fine-tuned model).
"""
from __future__ import annotations

import json
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from volta_ml.hf.dual import image_tower, mclip_text_features

from .contrastive import TrainableDualEncoder, _features

DEFAULT_TEMPERATURE = 0.01        # 1 / CLIP's final logit scale (100, the cap of exp(logit_scale))
TEXT_BASE_DIR, IMAGE_MODEL_DIR = "text_base", "image_model"


class MClipForTraining(nn.Module):
    """XLM-R `text` + `linear` (trained) and a CLIPModel `vision` (frozen unless `train_image_tower`); forward
    returns what the loss needs: L2-normalised float32 text and image embeddings, the fixed scale, no bias."""

    def __init__(self, text: nn.Module, linear: nn.Linear, vision: nn.Module, temperature: float,
                 train_image_tower: bool = False):
        super().__init__()
        if not temperature > 0:
            raise ValueError(f"temperature must be > 0, got {temperature}")
        self.text, self.linear, self.vision = text, linear, vision
        self.scale, self.train_image_tower = 1.0 / temperature, train_image_tower
        vision.requires_grad_(False)
        if train_image_tower:      # CLIPModel's own text tower stays frozen: it is never run
            for part in (vision.vision_model, vision.visual_projection):
                part.requires_grad_(True)

    def train(self, mode: bool = True):
        super().train(mode)
        if not self.train_image_tower:
            self.vision.eval()
        return self

    def forward(self, text_inputs: dict, image_inputs: dict):
        text = mclip_text_features(self.text, self.linear, text_inputs["input_ids"], text_inputs["attention_mask"])
        with torch.set_grad_enabled(self.train_image_tower and torch.is_grad_enabled()):
            image = _features(self.vision.get_image_features(**image_inputs))
        text, image = F.normalize(text.float(), dim=-1), F.normalize(image.float(), dim=-1)
        return text, image, torch.tensor(self.scale, device=text.device), None


def load_mclip(spec, temperature: float | None, train_image_tower: bool) -> TrainableDualEncoder:
    """M-CLIP as the `mclip` backend loads it (`spec.extra`: image_model, image_revision, text_base), wrapped for
    training; raises `ModelLoadError` (one line) when it cannot be loaded."""
    from volta_ml.hf.dual import MClipBackend
    from volta_ml.hf.loading import read_config
    backend = MClipBackend(spec)
    config = read_config(spec)
    image_model, image_revision = image_tower(spec, config)
    if Path(image_model).expanduser().exists():    # a local tower: referenced by its absolute path
        image_model = str(Path(image_model).expanduser().resolve())
    module = MClipForTraining(backend.text, backend.linear, backend.vision, temperature or DEFAULT_TEMPERATURE,
                              train_image_tower)

    def save(folder: Path, trained: dict) -> None:
        """`trained`: the whole state of the trained module (text.*, linear.*, vision.*)."""
        from safetensors.torch import save_file

        def part(prefix: str) -> dict:
            return {k.removeprefix(prefix): v for k, v in trained.items() if k.startswith(prefix)}
        state = {f"transformer.{k}": v for k, v in part("text.").items()}
        state.update({f"LinearTransformation.{k}": v for k, v in part("linear.").items()})
        folder.mkdir(parents=True, exist_ok=True)
        save_file({k: v.detach().cpu().contiguous() for k, v in state.items()}, str(folder / "model.safetensors"))
        backend.tokenizer.save_pretrained(folder)
        module.text.config.save_pretrained(folder / TEXT_BASE_DIR)
        out = {k: v for k, v in config.items() if k not in ("image_model", "image_revision")}
        out["text_base"] = TEXT_BASE_DIR
        if train_image_tower:
            module.vision.save_pretrained(folder / IMAGE_MODEL_DIR, state_dict=part("vision."))
            backend.image_processor.save_pretrained(folder / IMAGE_MODEL_DIR)
            out["image_model"] = IMAGE_MODEL_DIR
        else:
            out["image_model"] = image_model
            if image_revision:
                out["image_revision"] = image_revision
        (folder / "config.json").write_text(json.dumps(out, indent=1) + "\n", encoding="utf-8")

    return TrainableDualEncoder(
        module=module, loss="infonce", tokenizer=backend.tokenizer, image_processor=backend.image_processor,
        max_length=backend.max_length, padding=True, family="M-CLIP", save=save,
        config={"m_clip": config, "text": backend.text.config.to_dict(),
                "image_model": image_model, "image_revision": image_revision, "scale": module.scale,
                "train_image_tower": train_image_tower})
