"""Contrastive losses of the dual encoders, as each family was trained, and the module the engine trains.

Both losses take the rows of this process (`text`, `image`: [b, D], L2-normalised) and the columns of the
whole global batch (`all_text`, `all_image`: [N*b, D], this process's rows at `offset`..`offset+b`); in one
process the two are the same tensors and `offset` is 0. Each loss is a mean over the local rows, so the
mean over ranks (what DDP's gradient average computes) is the loss of one process holding the whole batch:

- `infonce_loss` (CLIP): symmetric cross-entropy over the scaled cosine similarities, text->image and
  image->text, averaged (CLIP's `logit_scale` is an exp-parameterised temperature, capped at 100 as in CLIP's
  training).
- `sigmoid_loss` (SigLIP, SigLIP-2): every (text, image) pair is a binary problem, label +1 on the diagonal and
  -1 elsewhere, logit = exp(logit_scale) * cos + logit_bias; the negative log-likelihood is summed over the
  columns and averaged over the rows (SigLIP's normalisation by the batch size).

`transformers` computes the same two numbers with `return_loss=True` on one process (tests/test_hf_train.py).

`TrainableDualEncoder` is what the training job needs of a family (the module, its text and image
preprocessing, how its fine-tuned weights are exported); `DualEncoderForTraining` is the CLIP-family module,
`iglue_hf.mclip_train.MClipForTraining` M-CLIP's. `enable_gradient_checkpointing` switches on transformers'
activation checkpointing in the trained towers of either.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn

MAX_LOGIT_SCALE = 100.0   # CLIP clips exp(logit_scale) at 100 during training
LOSSES = {"clip": "infonce", "siglip": "sigmoid", "siglip2": "sigmoid"}   # config model_type -> loss


def infonce_loss(text, image, all_text, all_image, scale, offset: int = 0) -> torch.Tensor:
    labels = torch.arange(offset, offset + text.shape[0], device=text.device)
    text_to_image = scale * text @ all_image.T
    image_to_text = scale * image @ all_text.T
    return (F.cross_entropy(text_to_image, labels) + F.cross_entropy(image_to_text, labels)) / 2


def sigmoid_loss(text, all_image, scale, bias, offset: int = 0) -> torch.Tensor:
    logits = scale * text @ all_image.T + bias
    signs = -torch.ones_like(logits)
    rows = torch.arange(text.shape[0], device=text.device)
    signs[rows, rows + offset] = 1.0
    return -F.logsigmoid(signs * logits).sum(dim=1).mean()


def pair_loss(loss: str, text, image, all_text, all_image, scale, bias, offset: int = 0) -> torch.Tensor:
    if loss == "infonce":
        return infonce_loss(text, image, all_text, all_image, scale, offset)
    return sigmoid_loss(text, all_image, scale, bias, offset)


def _features(out) -> torch.Tensor:
    """get_*_features returns a tensor (transformers 4) or an output whose pooler_output is projected (5)."""
    return out if isinstance(out, torch.Tensor) else out.pooler_output


class DualEncoderForTraining(nn.Module):
    """A `transformers` CLIP / SigLIP / SigLIP-2 model (`self.hf`, saved with its own `save_pretrained`) whose
    forward returns what the loss needs: L2-normalised float32 text and image embeddings, the scale and the
    bias (None for CLIP). The scale and bias come out of the forward, not from the parameters directly, so
    DDP sees them used."""

    def __init__(self, hf_model: nn.Module, loss: str):
        super().__init__()
        if loss not in ("infonce", "sigmoid"):
            raise ValueError(f"loss must be infonce or sigmoid, got {loss!r}")
        self.hf, self.loss = hf_model, loss

    def forward(self, text_inputs: dict, image_inputs: dict):
        text = F.normalize(_features(self.hf.get_text_features(**text_inputs)).float(), dim=-1)
        image = F.normalize(_features(self.hf.get_image_features(**image_inputs)).float(), dim=-1)
        scale = self.hf.logit_scale.float().exp()
        if self.loss == "infonce":
            return text, image, scale.clamp(max=MAX_LOGIT_SCALE).squeeze(), None
        return text, image, scale.squeeze(), self.hf.logit_bias.float().squeeze()


@dataclass
class TrainableDualEncoder:
    """A dual encoder ready for the training job (`iglue_hf.train`)."""
    module: nn.Module                 # forward(text_inputs, image_inputs) -> (text, image, scale, bias or None)
    loss: str                         # "infonce" or "sigmoid"
    tokenizer: Callable
    image_processor: Callable
    max_length: int                   # caption tokens
    padding: bool | str               # True, or "max_length" (SigLIP was trained on padded texts)
    config: dict                      # recorded in command.txt
    family: str                       # for the log: "clip", "siglip", "M-CLIP", ...
    save: Callable[[Path, dict], None]   # (folder, the module's whole state): writes what `volta-ml iglue-hf
    #                                        --model <folder>` loads


def checkpoint_activations(model) -> None:
    """transformers' activation checkpointing on one `PreTrainedModel` (`activation_checkpointing_enable`, called
    `gradient_checkpointing_enable` before transformers 5.x deprecated that name) with non-reentrant
    torch.utils.checkpoint, which restores the RNG state, so dropout draws the same masks when a layer is
    recomputed. Each layer's activations are recomputed in the backward pass instead of being kept: less memory,
    about one more forward pass of time."""
    if not model.supports_gradient_checkpointing:
        raise ValueError(f"{type(model).__name__} does not support gradient checkpointing")
    kwargs = {"use_reentrant": False}
    if hasattr(model, "activation_checkpointing_enable"):
        model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)


def enable_gradient_checkpointing(module: nn.Module) -> list[str]:
    """`checkpoint_activations` on each `transformers` model among the children of `module` that has trainable
    parameters; returns their class names."""
    from transformers import PreTrainedModel
    done = []
    for child in module.children():
        if isinstance(child, PreTrainedModel) and any(p.requires_grad for p in child.parameters()):
            checkpoint_activations(child)
            done.append(type(child).__name__)
    return done
