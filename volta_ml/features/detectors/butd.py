"""BUTD Faster R-CNN (ResNet-101 C4, Visual Genome 1600 classes / 400 attributes).

Computation as the detectron2 fork VOLTA used (features spec section 1); selection
rules live in `select_butd.py`.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from torchvision.ops import RoIPool

from .backbone import build_butd_trunk
from .boxes import clip_boxes, decode_boxes, detectron2_cell_anchors, grid_anchors
from .rpn import RPNHead, detectron2_proposals

NUM_CLASSES = 1600  # + background, which is the LAST logit
NUM_ATTRIBUTES = 400  # + "no attribute", which is the LAST logit
ANCHOR_SIZES = (64, 128, 256, 512)
ANCHOR_RATIOS = (0.5, 1.0, 2.0)
STRIDE = 16
BOX_WEIGHTS = (10.0, 10.0, 5.0, 5.0)


class BoxPredictor(nn.Module):
    """Class logits, class-specific box deltas and the VG attribute head."""

    def __init__(self, with_attributes: bool = True):
        super().__init__()
        self.cls_score = nn.Linear(2048, NUM_CLASSES + 1)
        self.bbox_pred = nn.Linear(2048, NUM_CLASSES * 4)
        self.with_attributes = with_attributes
        if with_attributes:
            self.cls_embedding = nn.Embedding(NUM_CLASSES + 1, 256)
            self.fc_attr = nn.Linear(2048 + 256, 512)
            self.attr_score = nn.Linear(512, NUM_ATTRIBUTES + 1)

    def forward(self, pooled: torch.Tensor):
        logits = self.cls_score(pooled)
        deltas = self.bbox_pred(pooled)
        attr_logits = None
        if self.with_attributes:
            # The embedding is looked up with the arg-max over ALL 1601 logits (background included).
            emb = self.cls_embedding(logits.argmax(dim=1))
            attr_logits = self.attr_score(F.relu(self.fc_attr(torch.cat([pooled, emb], dim=1))))
        return logits, deltas, attr_logits


@dataclass
class RegionOutputs:
    """Per-RoI outputs of the box head, in resized-image coordinates."""

    pooled: torch.Tensor  # (R, 2048) mean-pooled res5 features
    cls_logits: torch.Tensor  # (R, 1601)
    box_deltas: torch.Tensor  # (R, 6400)
    attr_logits: torch.Tensor | None  # (R, 401)


class BUTDDetector(nn.Module):
    def __init__(self, with_attributes: bool = True, rpn_pre_nms_topk: int = 6000, rpn_post_nms_topk: int = 300,
                 rpn_nms_thresh: float = 0.7, roi_chunk: int = 64, blocks=(3, 4, 23, 3), width_per_group: int = 64):
        super().__init__()
        self.backbone, self.res5 = build_butd_trunk(blocks, width_per_group)
        self.rpn_head = RPNHead(1024, 512, len(ANCHOR_SIZES) * len(ANCHOR_RATIOS), "objectness_logits",
                                "anchor_deltas")
        self.box_predictor = BoxPredictor(with_attributes)
        self.roi_pool = RoIPool((14, 14), 1.0 / STRIDE)
        self.register_buffer("cell_anchors", detectron2_cell_anchors(ANCHOR_SIZES, ANCHOR_RATIOS), persistent=False)
        self.rpn_pre_nms_topk = rpn_pre_nms_topk
        self.rpn_post_nms_topk = rpn_post_nms_topk
        self.rpn_nms_thresh = rpn_nms_thresh
        self.roi_chunk = roi_chunk

    @property
    def with_attributes(self) -> bool:
        return self.box_predictor.with_attributes

    def res4(self, image: torch.Tensor) -> torch.Tensor:
        return self.backbone(image)[-1]

    def proposals(self, res4: torch.Tensor, image_hw: tuple[int, int], pre_nms_topk: int | None = None,
                  post_nms_topk: int | None = None):
        """RPN boxes (N, 4) in resized-image pixels and their objectness logits, descending."""
        logits, deltas = self.rpn_head(res4)
        h, w = res4.shape[-2:]
        anchors = grid_anchors(self.cell_anchors, STRIDE, h, w)
        return detectron2_proposals(logits[0], deltas[0], anchors, image_hw, pre_nms_topk or self.rpn_pre_nms_topk,
                                    post_nms_topk or self.rpn_post_nms_topk, self.rpn_nms_thresh)

    def box_head(self, res4: torch.Tensor, boxes: torch.Tensor) -> RegionOutputs:
        """RoIPool 14x14 -> dilated res5 -> mean -> predictor, `roi_chunk` RoIs at a time."""
        pooled_parts = []
        for start in range(0, len(boxes), self.roi_chunk):
            chunk = boxes[start:start + self.roi_chunk].to(res4.dtype)
            rois = torch.cat([torch.zeros(len(chunk), 1, dtype=chunk.dtype, device=chunk.device), chunk], dim=1)
            pooled_parts.append(self.res5(self.roi_pool(res4, rois)).mean(dim=(2, 3)))
        pooled = torch.cat(pooled_parts) if pooled_parts else res4.new_zeros(0, 2048)
        logits, deltas, attr_logits = self.box_predictor(pooled)
        return RegionOutputs(pooled, logits, deltas, attr_logits)

    def class_boxes(self, proposals: torch.Tensor, deltas: torch.Tensor, image_hw) -> torch.Tensor:
        """(R, 1600, 4) regressed boxes per class, clipped to the resized image."""
        boxes = decode_boxes(deltas, proposals, BOX_WEIGHTS)
        return clip_boxes(boxes, *image_hw).view(len(proposals), NUM_CLASSES, 4)
