"""Deterministic detector weights ("golden-extract-recipe-v1").

The golden fixtures in `../shared/golden_extract` were produced with weights drawn
from one seeded torch generator while walking the original checkpoint's key table.
This module rebuilds those weights so parity tests (and benchmarks) need no
checkpoint file. The rules are documented in that folder's README, section 2.
"""
from __future__ import annotations

import math
from pathlib import Path

import torch

RECIPE_NAME = "golden-extract-recipe-v1"

# Per-key gain on He-normal init: keeps logits O(1-10), no saturated probabilities.
_GAINS = {
    "proposal_generator.rpn_head.objectness_logits.weight": 0.02,
    "proposal_generator.rpn_head.anchor_deltas.weight": 0.005,
    "roi_heads.box_predictor.cls_score.weight": 0.05,
    "roi_heads.box_predictor.bbox_pred.weight": 0.02,
    "roi_heads.box_predictor.cls_embedding.weight": 50.0,
    "roi_heads.box_predictor.attr_score.weight": 0.1,
    "backbone.fpn.fpn_layer1.weight": 0.1,
    "backbone.fpn.fpn_layer2.weight": 0.25,
    "backbone.fpn.fpn_layer3.weight": 0.6,
    "backbone.fpn.fpn_layer4.weight": 1.5,
    "rpn.head.cls_logits.weight": 0.01,
    "rpn.head.bbox_pred.weight": 0.002,
    "roi_heads.box.predictor.cls_score.weight": 0.05,
    "roi_heads.box.predictor.bbox_pred.weight": 0.005,
}

# (key, index, offset): makes background / "no attribute" units compete.
_BIAS_OFFSETS = [
    ("roi_heads.box_predictor.cls_score.bias", 1600, 7.0),
    ("roi_heads.box_predictor.attr_score.bias", 400, 20.0),
    ("roi_heads.box.predictor.cls_score.bias", 0, 8.0),
]

_BN_MARKERS = (".norm.", ".bn1.", ".bn2.", ".bn3.", ".downsample.1.")
_BN_LEAVES = ("weight", "bias", "running_mean", "running_var")


def read_key_table(path: str | Path) -> list[tuple[str, tuple[int, ...]]]:
    """Parse a `key<TAB>(shape)<TAB>dtype` table into (key, shape) pairs, in order."""
    entries = []
    for lineno, line in enumerate(Path(path).read_text().splitlines(), 1):
        if not line.strip():
            continue
        parts = line.split("\t")
        if len(parts) != 3:
            raise ValueError(f"{path}:{lineno}: expected 3 tab-separated fields, got {len(parts)}")
        key, shape_text, _dtype = parts
        dims = [d.strip() for d in shape_text.strip("()").split(",") if d.strip()]
        entries.append((key, tuple(int(d) for d in dims)))
    return entries


def _is_frozen_bn(key: str) -> bool:
    return key.rsplit(".", 1)[-1] in _BN_LEAVES and any(m in key for m in _BN_MARKERS)


def recipe_weights(key_table: list[tuple[str, tuple[int, ...]]], seed: int) -> dict[str, torch.Tensor]:
    """Generate the recipe's float32 tensors, keyed by the original checkpoint names."""
    g = torch.Generator(device="cpu")
    g.manual_seed(int(seed))
    out: dict[str, torch.Tensor] = {}

    def uniform(shape):
        return torch.rand(shape, generator=g, dtype=torch.float32)

    def normal(shape):
        return torch.randn(shape, generator=g, dtype=torch.float32)

    for key, shape in key_table:
        if "cell_anchors" in key:
            continue
        if _is_frozen_bn(key):
            leaf = key.rsplit(".", 1)[-1]
            if leaf == "weight":
                lo = 0.1 if key.endswith("conv3.norm.weight") or key.endswith(".bn3.weight") else 0.5
                t = lo + lo * uniform(shape)
            elif leaf == "running_var":
                t = 0.5 + uniform(shape)
            else:  # bias, running_mean
                t = 0.05 * normal(shape)
        elif len(shape) >= 2:
            fan_in = math.prod(shape[1:])
            std = _GAINS.get(key, 1.0) * math.sqrt(2.0 / fan_in)
            t = normal(shape) * std
        else:
            t = 0.01 * normal(shape)
        out[key] = t
    for key, index, offset in _BIAS_OFFSETS:
        if key in out:
            out[key][index] += offset
    return out
