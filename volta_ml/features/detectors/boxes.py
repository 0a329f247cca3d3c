"""Anchors, box decoding, clipping and NMS in the two numeric conventions.

detectron2 (BUTD path): widths are x2 - x1, anchors centred on 0 and unrounded,
torchvision NMS (suppress when IoU > t, score order).
maskrcnn-benchmark / py-faster-rcnn (X101 path): "+1" pixel widths, rounded
anchors, and an NMS that suppresses when IoU >= float32(t) and returns kept
indices in ascending index order.
"""
from __future__ import annotations

import math

import numpy as np
import torch
from torchvision.ops import nms

# Largest allowed log-scale of a box-size delta (both originals: log(1000 / 16)).
SCALE_CLAMP = math.log(1000.0 / 16)


# ----------------------------------------------------------------------------- anchors
def detectron2_cell_anchors(sizes, ratios) -> torch.Tensor:
    """(len(sizes)*len(ratios), 4) anchors centred on (0, 0), size-major, unrounded."""
    rows = []
    for size in sizes:
        area = float(size) ** 2
        for ratio in ratios:
            w = math.sqrt(area / ratio)
            h = ratio * w
            rows.append([-w / 2.0, -h / 2.0, w / 2.0, h / 2.0])
    return torch.tensor(rows, dtype=torch.float32)


def legacy_cell_anchors(stride: int, size: int, ratios) -> torch.Tensor:
    """py-faster-rcnn anchors for one FPN level: ratio-major, rounded (half to even), +1 sizes."""
    base = float(stride)
    centre = (base - 1.0) / 2.0
    rows = []
    for ratio in ratios:
        w_r = np.round(math.sqrt(base * base / ratio))
        h_r = np.round(w_r * ratio)
        w = w_r * size / base
        h = h_r * size / base
        rows.append([centre - (w - 1) / 2, centre - (h - 1) / 2, centre + (w - 1) / 2, centre + (h - 1) / 2])
    return torch.tensor(rows, dtype=torch.float32)


def grid_anchors(cell: torch.Tensor, stride: int, height: int, width: int) -> torch.Tensor:
    """Anchors for every feature-map cell, flattened in (row, column, anchor) order."""
    shift_x = torch.arange(0, width * stride, step=stride, dtype=torch.float32, device=cell.device)
    shift_y = torch.arange(0, height * stride, step=stride, dtype=torch.float32, device=cell.device)
    sy, sx = torch.meshgrid(shift_y, shift_x, indexing="ij")
    sx, sy = sx.reshape(-1), sy.reshape(-1)
    shifts = torch.stack((sx, sy, sx, sy), dim=1)
    return (shifts.view(-1, 1, 4) + cell.view(1, -1, 4)).reshape(-1, 4)


# ----------------------------------------------------------------------------- decoding
def decode_boxes(deltas: torch.Tensor, boxes: torch.Tensor, weights, legacy: bool = False) -> torch.Tensor:
    """Apply (dx, dy, dw, dh) deltas to boxes.

    `deltas` is (R, 4*K) (K boxes per reference box, e.g. one per class), `boxes` is (R, 4).
    `legacy` switches to the +1 width convention with x2 = centre + w/2 - 1.
    """
    boxes = boxes.to(deltas.dtype)
    one = 1.0 if legacy else 0.0
    widths = boxes[:, 2] - boxes[:, 0] + one
    heights = boxes[:, 3] - boxes[:, 1] + one
    ctr_x = boxes[:, 0] + 0.5 * widths
    ctr_y = boxes[:, 1] + 0.5 * heights
    wx, wy, ww, wh = weights
    dx = deltas[:, 0::4] / wx
    dy = deltas[:, 1::4] / wy
    dw = torch.clamp(deltas[:, 2::4] / ww, max=SCALE_CLAMP)
    dh = torch.clamp(deltas[:, 3::4] / wh, max=SCALE_CLAMP)
    pred_ctr_x = dx * widths[:, None] + ctr_x[:, None]
    pred_ctr_y = dy * heights[:, None] + ctr_y[:, None]
    pred_w = torch.exp(dw) * widths[:, None]
    pred_h = torch.exp(dh) * heights[:, None]
    out = torch.empty_like(deltas)
    out[:, 0::4] = pred_ctr_x - 0.5 * pred_w
    out[:, 1::4] = pred_ctr_y - 0.5 * pred_h
    out[:, 2::4] = pred_ctr_x + 0.5 * pred_w - one
    out[:, 3::4] = pred_ctr_y + 0.5 * pred_h - one
    return out


def clip_boxes(boxes: torch.Tensor, height: float, width: float) -> torch.Tensor:
    """Clamp x to [0, width] and y to [0, height]; works on (..., 4k) layouts."""
    out = boxes.clone()
    out[..., 0::2] = out[..., 0::2].clamp(min=0, max=width)
    out[..., 1::2] = out[..., 1::2].clamp(min=0, max=height)
    return out


# ----------------------------------------------------------------------------- NMS
def legacy_nms(boxes: torch.Tensor, scores: torch.Tensor, threshold: float) -> torch.Tensor:
    """maskrcnn-benchmark NMS: +1 areas, suppress when IoU >= float32(t), ascending indices.

    Emulated with torchvision's kernel: shifting x2/y2 by one gives the +1 areas, and
    the largest double below float32(t) turns its strict '>' into '>='.
    """
    if boxes.numel() == 0:
        return torch.zeros(0, dtype=torch.int64, device=boxes.device)
    shifted = boxes.clone()
    shifted[:, 2:] += 1
    thr = float(np.nextafter(np.float32(threshold), np.float32(-np.inf)))
    keep = nms(shifted, scores, thr)
    return keep.sort().values


def caffe_nms_keep_mask(boxes: torch.Tensor, scores: torch.Tensor, threshold: float) -> torch.Tensor:
    """py-faster-rcnn NMS (+1 areas, suppress when IoU > t) -> boolean mask of kept boxes."""
    shifted = boxes.clone()
    shifted[:, 2:] += 1
    mask = torch.zeros(len(boxes), dtype=torch.bool)
    mask[nms(shifted, scores, float(threshold))] = True
    return mask


def volta_maxnms_ladder(boxes: torch.Tensor, scores: torch.Tensor, num_boxes: int):
    """VOLTA's threshold ladder: NMS at numpy.arange(0.5, 1.0, 0.1) until exactly `num_boxes` survive.

    Returns (keep, thresholds tried, survivor counts). When no threshold gives exactly
    `num_boxes`, the last try's result is returned (the caller decides to skip).
    """
    tried, counts = [], []
    keep = torch.zeros(0, dtype=torch.int64)
    for thr in np.arange(0.5, 1.0, 0.1):
        keep = nms(boxes, scores, float(thr))[:num_boxes]
        tried.append(float(thr))
        counts.append(int(len(keep)))
        if len(keep) == num_boxes:
            break
    return keep, tried, counts
