"""Region proposal heads and the two originals' test-time proposal filters."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torchvision.ops import nms

from .boxes import clip_boxes, decode_boxes, legacy_nms


class RPNHead(nn.Module):
    """3x3 conv + ReLU, then 1x1 convs for objectness (one logit per anchor) and deltas."""

    def __init__(self, in_channels: int, hidden: int, num_anchors: int, logits_name: str, deltas_name: str):
        super().__init__()
        self.conv = nn.Conv2d(in_channels, hidden, 3, padding=1)
        setattr(self, logits_name, nn.Conv2d(hidden, num_anchors, 1))
        setattr(self, deltas_name, nn.Conv2d(hidden, num_anchors * 4, 1))
        self._names = (logits_name, deltas_name)

    def forward(self, feature: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """One image's map (1, C, H, W) -> logits (H*W*A,), deltas (H*W*A, 4)."""
        t = F.relu(self.conv(feature))
        logits = getattr(self, self._names[0])(t)
        deltas = getattr(self, self._names[1])(t)
        n, a, h, w = logits.shape
        logits = logits.permute(0, 2, 3, 1).reshape(n, -1)
        deltas = deltas.view(n, a, 4, h, w).permute(0, 3, 4, 1, 2).reshape(n, -1, 4)
        return logits, deltas


def detectron2_proposals(logits, deltas, anchors, image_hw, pre_nms_topk, post_nms_topk, nms_thresh=0.7,
                         min_size=0.0):
    """detectron2's single-level test filter for one image.

    Sort logits, keep the top `pre_nms_topk`, decode (no +1), clip to the resized image,
    drop boxes not wider/taller than `min_size`, NMS, keep `post_nms_topk`, in
    descending objectness. Returns (boxes (N, 4), logits (N,)).
    """
    order = torch.sort(logits, descending=True, stable=True).indices[:pre_nms_topk]
    scores = logits[order]
    boxes = decode_boxes(deltas[order], anchors[order], (1.0, 1.0, 1.0, 1.0))
    h, w = image_hw
    boxes = clip_boxes(boxes, h, w)
    keep = ((boxes[:, 2] - boxes[:, 0]) > min_size) & ((boxes[:, 3] - boxes[:, 1]) > min_size)
    boxes, scores = boxes[keep], scores[keep]
    keep = nms(boxes, scores, nms_thresh)[:post_nms_topk]
    boxes, scores = boxes[keep], scores[keep]
    order = torch.sort(scores, descending=True, stable=True).indices
    return boxes[order], scores[order]


def fpn_legacy_proposals(level_logits, level_deltas, level_anchors, canvas_hw, pre_nms_topn=1000,
                         post_nms_topn=1000, fpn_post_nms_topn=1000, nms_thresh=0.7):
    """maskrcnn-benchmark's FPN test filter for one image (sigmoid scores, +1 boxes).

    Per level: top `pre_nms_topn` by sigmoid, decode (+1), clip to the padded canvas
    [0, W-1] x [0, H-1], legacy NMS, keep `post_nms_topn`; then the top
    `fpn_post_nms_topn` over all levels. Returns (boxes, sigmoid objectness).
    """
    h, w = canvas_hw
    all_boxes, all_scores = [], []
    for logits, deltas, anchors in zip(level_logits, level_deltas, level_anchors):
        prob = logits.sigmoid()
        k = min(pre_nms_topn, prob.numel())
        prob, idx = prob.topk(k, sorted=True)
        boxes = decode_boxes(deltas[idx], anchors[idx], (1.0, 1.0, 1.0, 1.0), legacy=True)
        boxes = clip_boxes(boxes, h - 1, w - 1)
        keep = ((boxes[:, 2] - boxes[:, 0] + 1) >= 0) & ((boxes[:, 3] - boxes[:, 1] + 1) >= 0)
        boxes, prob = boxes[keep], prob[keep]
        keep = legacy_nms(boxes, prob, nms_thresh)[:post_nms_topn]
        all_boxes.append(boxes[keep])
        all_scores.append(prob[keep])
    boxes, scores = torch.cat(all_boxes), torch.cat(all_scores)
    k = min(fpn_post_nms_topn, len(scores))
    scores, idx = scores.topk(k, sorted=True)
    return boxes[idx], scores
