"""Checkpoint I/O: VOLTA `.bin` files (legacy and zip torch formats), safetensors, HuggingFace text inits.

Loading follows VOLTA's `from_pretrained` renames (gamma/beta, RoBERTa and BERT-layer names) and prefix
rules, but is strict where VOLTA was silent: a tensor whose shape does not match is an error naming the
key and both shapes, and files are always read with `weights_only=True` so a checkpoint cannot run code.
"""
from __future__ import annotations

import json
import logging
import os
import pickle
import re
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import nn

from volta_ml.atomic import atomic_open

logger = logging.getLogger(__name__)


class CheckpointError(RuntimeError):
    """A checkpoint that cannot be loaded safely or does not fit the model; the message says why."""


@dataclass
class LoadReport:
    missing_keys: list[str] = field(default_factory=list)      # model keys the checkpoint did not provide
    unexpected_keys: list[str] = field(default_factory=list)   # checkpoint keys the model has no place for
    loaded_keys: list[str] = field(default_factory=list)

    def summary(self) -> str:
        def show(keys):
            return ", ".join(keys[:6]) + (f", ... ({len(keys)} in all)" if len(keys) > 6 else "")
        lines = [f"loaded {len(self.loaded_keys)} tensors"]
        if self.missing_keys:
            lines.append(f"missing (kept at initialisation): {show(self.missing_keys)}")
        if self.unexpected_keys:
            lines.append(f"unexpected (ignored): {show(self.unexpected_keys)}")
        return "; ".join(lines)


def _resolve(path: str | os.PathLike) -> Path:
    p = Path(path)
    if p.is_dir():
        for name in ("pytorch_model.bin", "model.safetensors", "pytorch_model.safetensors"):
            if (p / name).is_file():
                return p / name
        raise CheckpointError(f"{p}: directory has no pytorch_model.bin or model.safetensors")
    if not p.is_file():
        raise CheckpointError(f"checkpoint {p} does not exist")
    return p


def read_state_dict(path: str | os.PathLike) -> dict[str, torch.Tensor]:
    """Read a state dict from a `.bin`/`.pt`/`.tar` torch file or a `.safetensors` file, safely."""
    p = _resolve(path)
    if p.suffix == ".safetensors":
        return read_safetensors(p)
    try:
        obj = torch.load(p, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as e:
        raise CheckpointError(
            f"{p}: refused to load: the file holds Python objects other than tensors, and unpickling them "
            f"could run code ({str(e).splitlines()[0][:200]}). Only plain state dicts are read.") from e
    except (RuntimeError, EOFError, OSError) as e:
        raise CheckpointError(f"{p}: not a readable torch checkpoint ({str(e).splitlines()[0][:200]})") from e
    if isinstance(obj, dict) and "model_state_dict" in obj and isinstance(obj["model_state_dict"], dict):
        obj = obj["model_state_dict"]          # a training checkpoint (pytorch_ckpt_latest.tar)
    if not isinstance(obj, dict) or not all(isinstance(v, torch.Tensor) for v in obj.values()):
        raise CheckpointError(f"{p}: expected a dict of tensors (a state dict), got {type(obj).__name__}")
    return dict(obj)


def read_safetensors(path: Path) -> dict[str, torch.Tensor]:
    from safetensors import safe_open
    with safe_open(str(path), framework="pt") as f:
        sd = {k: f.get_tensor(k) for k in f.keys()}
        meta = f.metadata() or {}
    for alias, primary in json.loads(meta.get("aliases", "{}")).items():
        sd[alias] = sd[primary]
    return sd


def _aliases(model: nn.Module) -> dict[str, str]:
    """alias key -> first key of the same tensor, for parameters/buffers registered under several names."""
    seen: dict[int, str] = {}
    aliases = {}
    for k, t in model.state_dict(keep_vars=True).items():
        key = id(t)
        if key in seen:
            aliases[k] = seen[key]
        else:
            seen[key] = k
    return aliases


def save_checkpoint(model: nn.Module, path: str | os.PathLike, config=None) -> Path:
    """Write the model's state dict: `.safetensors` (aliases recorded in metadata) or VOLTA's torch format."""
    model = getattr(model, "module", model)
    sd = {k: v.detach().cpu() for k, v in model.state_dict().items()}
    return save_state_dict(sd, path, _aliases(model), config)


def save_state_dict(sd: dict[str, torch.Tensor], path: str | os.PathLike, aliases: dict[str, str] | None = None,
                    config=None) -> Path:
    """`.safetensors` (each tensor once; `aliases` {alias key: stored key} and the config in the metadata) or
    VOLTA's torch format (every key). Written through `volta_ml.atomic`, so an interrupted save never leaves a
    truncated checkpoint under the final name."""
    p = Path(path)
    aliases = aliases or {}
    with atomic_open(p) as handle:
        if p.suffix == ".safetensors":
            from safetensors.torch import save
            unique = {k: v.contiguous() for k, v in sd.items() if k not in aliases}
            meta = {"format": "pt", "producer": "volta-ml", "aliases": json.dumps(aliases)}
            if config is not None:
                meta["config"] = config.to_json_string()
            handle.write(save(unique, metadata=meta))
        else:
            torch.save(sd, handle)
    return p


def rename_volta_keys(sd: dict, text_model: str) -> dict:
    """VOLTA's load-time renames: gamma->weight, beta->bias in every key; RoBERTa names for model 'roberta'."""
    out = {}
    for k, v in sd.items():
        k = k.replace("gamma", "weight").replace("beta", "bias")
        if k.startswith("module."):
            k = k[len("module."):]
        if text_model == "roberta":
            k = k.replace("roberta", "bert")
            k = k.replace("lm_head.dense", "cls.predictions.transform.dense")
            k = k.replace("lm_head.layer_norm", "cls.predictions.transform.LayerNorm")
            k = k.replace("lm_head", "cls.predictions")
        out[k] = v
    return out


_LAYER = re.compile(r"^(.*\.layer\.)(\d+)\.(attention|intermediate|output)\.(.*)$")


def remap_bert_layers(sd: dict, attn_map: dict, ff_map: dict) -> dict:
    """Text-only BERT layer k -> the sub-layers that VOLTA's `bert_layer2*_sublayer` maps name."""
    out = {}
    for k, v in sd.items():
        m = _LAYER.match(k)
        if m:
            prefix, n, part, rest = m.group(1), m.group(2), m.group(3), m.group(4)
            if part == "attention":
                k = f"{prefix}{attn_map.get(n, n)}.attention_{rest}"
            else:
                k = f"{prefix}{ff_map.get(n, n)}.{part}.{rest}"
        out[k] = v
    return out


def load_state_dict_into(model: nn.Module, sd: dict[str, torch.Tensor], source: str = "<state dict>",
                         strict_shapes: bool = True) -> LoadReport:
    """Copy matching tensors into `model`, VOLTA style (non-strict), with a precise report."""
    target = model.state_dict()
    if hasattr(model, "bert") and not any(k.startswith("bert") for k in sd):
        sd = {f"bert.{k}": v for k, v in sd.items()}   # a bare backbone dict
    mismatched = [(k, tuple(v.shape), tuple(target[k].shape)) for k, v in sd.items()
                  if k in target and tuple(v.shape) != tuple(target[k].shape)]
    if mismatched and strict_shapes:
        lines = "\n".join(f"  {k}: checkpoint {a} vs model {b}" for k, a, b in mismatched[:20])
        raise CheckpointError(f"{source}: {len(mismatched)} tensor(s) have the wrong shape for this model "
                              f"(is the config right?):\n{lines}")
    bad = {k for k, _, _ in mismatched}
    usable = {k: v for k, v in sd.items() if k in target and k not in bad}
    model.load_state_dict(usable, strict=False)
    if hasattr(model, "tie_weights"):
        model.tie_weights()
    return LoadReport(missing_keys=[k for k in target if k not in usable],
                      unexpected_keys=[k for k in sd if k not in target],
                      loaded_keys=list(usable))


def load_checkpoint(model: nn.Module, path_or_state_dict, from_hf: bool = False) -> LoadReport:
    """Load a VOLTA checkpoint (or, with `from_hf`, a text-only HuggingFace BERT/XLM-R one) into `model`."""
    config = model.config
    if isinstance(path_or_state_dict, dict):
        sd, source = path_or_state_dict, "<state dict>"
    else:
        sd, source = read_state_dict(path_or_state_dict), str(path_or_state_dict)
    sd = {k.replace("gamma", "weight").replace("beta", "bias"): v for k, v in sd.items()}
    if from_hf:
        sd = remap_bert_layers(sd, {str(k): v for k, v in config.bert_layer2attn_sublayer.items()},
                               {str(k): v for k, v in config.bert_layer2ff_sublayer.items()})
    sd = rename_volta_keys(sd, config.text_model)
    report = load_state_dict_into(model, sd, source)
    logger.info("%s: %s", source, report.summary())
    return report
