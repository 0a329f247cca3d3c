"""Rename tables from the original checkpoints' key names to this package's modules."""
from __future__ import annotations

import re

import torch
from torch import nn

_BLOCK_PART = [  # detectron2 block-internal names -> torchvision Bottleneck names
    (re.compile(r"^conv(\d)\.norm\.(.+)$"), r"bn\1.\2"),
    (re.compile(r"^conv(\d)\.weight$"), r"conv\1.weight"),
    (re.compile(r"^shortcut\.norm\.(.+)$"), r"downsample.1.\1"),
    (re.compile(r"^shortcut\.weight$"), r"downsample.0.weight"),
]


def _block(rest: str) -> str | None:
    for pattern, repl in _BLOCK_PART:
        if pattern.match(rest):
            return pattern.sub(repl, rest)
    return None


def butd_key(key: str) -> str | None:
    """detectron2 BUTD name -> BUTDDetector name; None for keys that are not parameters."""
    if "cell_anchors" in key:
        return None
    if key.startswith("backbone.stem.conv1.norm."):
        return "backbone.bn1." + key[len("backbone.stem.conv1.norm."):]
    if key == "backbone.stem.conv1.weight":
        return "backbone.conv1.weight"
    m = re.match(r"^backbone\.res([234])\.(\d+)\.(.+)$", key)
    if m:
        rest = _block(m.group(3))
        return None if rest is None else f"backbone.layer{int(m.group(1)) - 1}.{m.group(2)}.{rest}"
    m = re.match(r"^roi_heads\.res5\.(\d+)\.(.+)$", key)
    if m:
        rest = _block(m.group(2))
        return None if rest is None else f"res5.{m.group(1)}.{rest}"
    if key.startswith("proposal_generator.rpn_head."):
        return "rpn_head." + key[len("proposal_generator.rpn_head."):]
    if key.startswith("roi_heads.box_predictor."):
        return "box_predictor." + key[len("roi_heads.box_predictor."):]
    return None


def x101_key(key: str) -> str | None:
    """maskrcnn-benchmark X101 name (optionally `module.`-prefixed) -> X101Detector name."""
    if key.startswith("module."):
        key = key[len("module."):]
    if "cell_anchors" in key:
        return None
    for prefix, target in [
        ("backbone.body.stem.", "body."),
        ("backbone.body.", "body."),
        ("backbone.fpn.", "fpn."),
        ("rpn.head.", "rpn_head."),
        ("roi_heads.box.feature_extractor.", ""),
        ("roi_heads.box.predictor.", ""),
    ]:
        if key.startswith(prefix):
            return target + key[len(prefix):]
    return None


def is_anchor_buffer(key: str) -> bool:
    return "cell_anchors" in key


class CheckpointMismatch(ValueError):
    pass


def load_mapped(model: nn.Module, source: dict, rename, source_name: str = "checkpoint") -> None:
    """Strictly load `source` (original names) into `model` through `rename`.

    Every source key must map to a parameter/buffer of matching shape (anchor buffers are
    ignored); every model entry must be provided, except frozen-BN running statistics,
    which default to mean 0 / var 1 as detectron2 fills them in.
    """
    target = model.state_dict()
    mapped: dict[str, torch.Tensor] = {}
    seen: set[str] = set()
    errors = []
    for key, value in source.items():
        if is_anchor_buffer(key):
            continue
        name = rename(key)
        if name is None or name not in target:
            errors.append(f"unexpected key {key!r}" + (f" (mapped to {name!r})" if name else ""))
            continue
        if name in mapped:
            errors.append(f"key {key!r} maps to {name!r}, which another key already filled")
            continue
        tensor = torch.as_tensor(value)
        seen.add(name)
        if tuple(tensor.shape) != tuple(target[name].shape):
            errors.append(f"shape mismatch for {key!r}: file {tuple(tensor.shape)}, "
                          f"model {tuple(target[name].shape)}")
            continue
        mapped[name] = tensor.to(target[name].dtype)
    for name in target:
        if name not in seen:
            if name.endswith("running_mean"):
                mapped[name] = torch.zeros_like(target[name])
            elif name.endswith("running_var"):
                mapped[name] = torch.ones_like(target[name])
            else:
                errors.append(f"missing key for model entry {name!r}")
    if errors:
        shown = "\n  ".join(errors[:20])
        more = f"\n  ... and {len(errors) - 20} more" if len(errors) > 20 else ""
        raise CheckpointMismatch(f"{source_name}: {len(errors)} problem(s) loading weights:\n  {shown}{more}")
    model.load_state_dict(mapped, strict=True)
