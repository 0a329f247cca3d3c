"""BUTD per-image extraction: VOLTA max-NMS, Caffe per-class selection, given boxes."""
from __future__ import annotations

import numpy as np
import torch

from ..images import butd_input, butd_resize
from .boxes import caffe_nms_keep_mask, clip_boxes, volta_maxnms_ladder
from .butd import NUM_ATTRIBUTES, NUM_CLASSES, BUTDDetector
from .presets import Preset


class DegenerateImage(ValueError):
    """The resized image is too thin for the backbone (the original crashes on it)."""


# Stem + res2..res4 reduce a side by 16; below this the Caffe max-pool has no output.
MIN_RESIZED_SIDE = 32


class TooFewBoxes(Exception):
    """VOLTA's `assert num_objects == 36` failed: the image gets no entry.

    `partial` holds what was computed (the debug intermediates when requested)."""

    def __init__(self, message: str, partial: dict | None = None):
        super().__init__(message)
        self.partial = partial or {}


def _attributes(attr_logits: torch.Tensor | None, n: int):
    if attr_logits is None:  # model without attribute head
        return np.full(n, -1, dtype=np.int64), np.zeros(n, dtype=np.float32)
    # The last unit means "no attribute": dropped BEFORE the softmax (renormalised over 400).
    conf, ids = attr_logits[:, :NUM_ATTRIBUTES].softmax(dim=-1).max(dim=-1)
    return ids.numpy().astype(np.int64), conf.numpy().astype(np.float32)


def scale_boxes(boxes: torch.Tensor, sx: float, sy: float) -> torch.Tensor:
    out = boxes.clone()
    out[:, 0::2] *= sx
    out[:, 1::2] *= sy
    return out


def caffe_select(raw_boxes: torch.Tensor, fg_probs: torch.Tensor, min_boxes: int, max_boxes: int,
                 conf_thresh: float, nms_thresh: float = 0.3):
    """Caffe generate_tsv.py: per-class NMS keeps raise max_conf; threshold, then clamp the count.

    Returns (keep indices, max_conf float64)."""
    max_conf = torch.zeros(len(raw_boxes), dtype=torch.float64)
    for c in range(fg_probs.shape[1]):
        scores = fg_probs[:, c]
        kept = caffe_nms_keep_mask(raw_boxes, scores, nms_thresh)
        max_conf[kept] = torch.maximum(max_conf[kept], scores[kept].double())
    keep = torch.nonzero(max_conf >= conf_thresh).flatten()
    if len(keep) < min_boxes:
        keep = torch.sort(max_conf, descending=True, stable=True).indices[:min_boxes]
    elif len(keep) > max_boxes:
        keep = torch.sort(max_conf, descending=True, stable=True).indices[:max_boxes]
    return keep, max_conf


@torch.no_grad()
def butd_extract(model: BUTDDetector, img_bgr: np.ndarray, preset: Preset, given_boxes=None,
                 debug: bool = False, device: str | torch.device = "cpu") -> dict:
    """Run one image; returns the H5 fields (`features`, `boxes`, `obj_id`, ...).

    `given_boxes` (N x 4 raw-image xyxy) switches to given-box mode. With `debug`,
    intermediates are added under `x_*` / `caffe*` names. Raises TooFewBoxes when
    VOLTA's 36-box rule fails.
    """
    raw_h, raw_w = img_bgr.shape[:2]
    resized = butd_resize(img_bgr, preset.min_size, preset.max_size)
    h, w = resized.shape[:2]
    if min(h, w) < MIN_RESIZED_SIDE:
        raise DegenerateImage(f"{raw_w}x{raw_h} image resizes to {w}x{h}; a side under {MIN_RESIZED_SIDE} px "
                              "is too thin for the detector")
    res4 = model.res4(butd_input(resized).to(device))
    out: dict = {}
    if debug:
        out["x_resized_hw"] = np.array([h, w], dtype=np.int64)
        out["x_resized_channel_sums"] = resized.reshape(-1, 3).sum(axis=0).astype(np.int64)
        out["x_resized_bgr"] = resized

    if given_boxes is not None:
        given = np.asarray(given_boxes)
        boxes = torch.as_tensor(given, dtype=torch.float32).reshape(-1, 4)
        # Scaled to the resized image, NOT clipped (RoIPool treats the outside as empty bins).
        region = model.box_head(res4, scale_boxes(boxes, w / raw_w, h / raw_h).to(device))
        region = _cpu(region)
        conf, ids = region.cls_logits.softmax(dim=-1)[:, :NUM_CLASSES].max(dim=-1)
        attr_id, attr_conf = _attributes(region.attr_logits, len(boxes))
        out.update(features=region.pooled.numpy(), boxes=given.reshape(-1, 4), obj_id=ids.numpy().astype(np.int64),
                   obj_conf=conf.numpy(), attr_id=attr_id, attr_conf=attr_conf,
                   img_w=np.int64(raw_w), img_h=np.int64(raw_h), num_objects=np.int64(len(boxes)))
        return out

    proposals, objectness = model.proposals(res4, (h, w), preset.rpn_pre_nms_topk, preset.rpn_post_nms_topk)
    region = _cpu(model.box_head(res4, proposals))
    proposals, objectness = proposals.cpu(), objectness.cpu()
    probs = region.cls_logits.softmax(dim=-1)
    fg_probs = probs[:, :NUM_CLASSES]  # background is the last column
    max_prob, max_class = fg_probs.max(dim=-1)
    if debug:
        out.update(x_rpn_proposals=proposals.numpy(), x_rpn_objectness=objectness.numpy(),
                   x_max_prob=max_prob.numpy(), x_max_class=max_class.numpy().astype(np.int64))

    if preset.selection == "caffe":
        raw_props = scale_boxes(proposals, raw_w / w, raw_h / h)
        keep, max_conf = caffe_select(raw_props, fg_probs, preset.caffe_min_boxes, preset.caffe_max_boxes,
                                      preset.caffe_conf_thresh)
        attr_id, attr_conf = _attributes(region.attr_logits, len(proposals))
        kept = keep.numpy()
        out.update(features=region.pooled[keep].numpy(), boxes=raw_props[keep].numpy(),
                   obj_id=max_class[keep].numpy().astype(np.int64), obj_conf=max_prob[keep].numpy(),
                   attr_id=attr_id[kept], attr_conf=attr_conf[kept], img_w=np.int64(raw_w), img_h=np.int64(raw_h),
                   num_boxes=np.int64(len(keep)))
        if debug:
            out.update(x_keep=kept.astype(np.int64), caffe_max_conf=max_conf.numpy())
        return out

    class_boxes = model.class_boxes(proposals, region.box_deltas, (h, w))
    max_boxes = class_boxes[torch.arange(len(proposals)), max_class]
    keep, tried, counts = volta_maxnms_ladder(max_boxes, max_prob, preset.num_boxes)
    if debug:
        out.update(x_keep=keep.numpy().astype(np.int64), x_ladder_thresh=np.array(tried, dtype=np.float64),
                   x_ladder_count=np.array(counts, dtype=np.int64))
    boxes = clip_boxes(scale_boxes(max_boxes[keep], raw_w / w, raw_h / h), raw_h, raw_w)
    nonempty = ((boxes[:, 2] - boxes[:, 0]) > 0) & ((boxes[:, 3] - boxes[:, 1]) > 0)
    if int(nonempty.sum()) != preset.num_boxes:
        raise TooFewBoxes(f"{int(nonempty.sum())} boxes after the NMS ladder {counts}, "
                          f"{preset.num_boxes} required", out)
    attr_id, attr_conf = _attributes(region.attr_logits, len(proposals))
    kept = keep.numpy()
    out.update(features=region.pooled[keep].numpy(), boxes=boxes.numpy(),
               obj_id=max_class[keep].numpy().astype(np.int64), obj_conf=max_prob[keep].numpy(),
               attr_id=attr_id[kept], attr_conf=attr_conf[kept], img_w=np.int64(raw_w), img_h=np.int64(raw_h))
    if debug:
        out["x_fg_probs"] = fg_probs.numpy()
        out["x_pooled"] = region.pooled.numpy()
    return out


def _cpu(region):
    from .butd import RegionOutputs

    return RegionOutputs(region.pooled.cpu(), region.cls_logits.cpu(), region.box_deltas.cpu(),
                         None if region.attr_logits is None else region.attr_logits.cpu())
