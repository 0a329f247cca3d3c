"""Tiny random-weight detectors and synthetic images for the extractor's CPU tests.

Same module layout and code paths as the real detectors, with fewer/narrower blocks, so
every test runs in about a second. Never used for parity.
"""
from __future__ import annotations

import numpy as np
import torch

from volta_ml.features.detectors.checkpoints import build_detector
from volta_ml.features.detectors.presets import get_preset

TINY_BUTD = dict(blocks=(1, 1, 1, 1), width_per_group=16)
TINY_X101 = dict(blocks=(1, 1, 1, 1), groups=4, width_per_group=4, fpn_channels=64)

SMALL_BUTD = get_preset("volta-butd36").with_settings(min_size=160, max_size=256, rpn_post_nms_topk=80)
SMALL_X101 = get_preset("x101-single").with_settings(min_size=160, max_size=256, fpn_post_nms_top_n=150)


def tiny_model(detector: str, seed: int = 0, with_attributes: bool = True):
    torch.manual_seed(seed)
    if detector == "butd":
        model = build_detector(SMALL_BUTD, with_attributes=with_attributes, **TINY_BUTD)
    else:
        model = build_detector(SMALL_X101, **TINY_X101)
    with torch.no_grad():  # random, non-identity frozen-BN statistics
        for name, buf in model.named_buffers():
            if name.endswith("running_var"):
                buf.uniform_(0.5, 1.5)
            elif name.endswith("running_mean"):
                buf.normal_(0, 0.05)
        for name, p in model.named_parameters():
            if name.endswith("bias") and p.dim() == 1:
                p.normal_(0, 0.05)
        for name, p in model.named_parameters():  # moderate box regression, as trained models
            if name.endswith("bbox_pred.weight") or name.endswith("anchor_deltas.weight"):
                p.mul_(0.05)
    return model.eval()


def synthetic_image(h: int, w: int, seed: int = 0) -> np.ndarray:
    """uint8 BGR: gradient, rectangles and noise, so proposals vary."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:h, 0:w]
    img = np.stack([x * 255 // max(w - 1, 1), y * 255 // max(h - 1, 1), (x + y) % 256], axis=2).astype(np.float64)
    for _ in range(6):
        y0, x0 = rng.integers(0, h - 4), rng.integers(0, w - 4)
        img[y0:y0 + rng.integers(4, h // 2 + 5), x0:x0 + rng.integers(4, w // 2 + 5)] = rng.integers(0, 256, 3)
    img += rng.normal(0, 5, img.shape)
    return np.clip(img, 0, 255).astype(np.uint8)


def write_png(path, img_bgr: np.ndarray) -> None:
    from PIL import Image

    Image.fromarray(np.ascontiguousarray(img_bgr[:, :, ::-1])).save(path)
