"""ResNeXt-101 64x4d FPN detector of vqa-maskrcnn-benchmark, as VOLTA's MMF script runs it.

Features spec section 3 / golden README section 5. Legacy "+1" conventions throughout.
"""
from __future__ import annotations


import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torchvision.ops import roi_align

from ..images import pad_batch, x101_input
from .backbone import FPN, build_x101_body
from .boxes import grid_anchors, legacy_cell_anchors, legacy_nms
from .presets import Preset
from .rpn import RPNHead, fpn_legacy_proposals

NUM_CLASSES = 1600  # + background at column 0
ANCHOR_STRIDES = (4, 8, 16, 32, 64)
ANCHOR_SIZES = (32, 64, 128, 256, 512)
ANCHOR_RATIOS = (0.5, 1.0, 2.0)
POOLER_SCALES = (1 / 4, 1 / 8, 1 / 16, 1 / 32)


def fpn_levels(boxes: torch.Tensor) -> torch.Tensor:
    """Level index 0..3 (P2..P5): floor(4 + log2(sqrt(area)/224 + 1e-6)), +1 areas."""
    area = (boxes[:, 2] - boxes[:, 0] + 1) * (boxes[:, 3] - boxes[:, 1] + 1)
    lvl = torch.floor(4 + torch.log2(torch.sqrt(area) / 224 + 1e-6))
    return lvl.clamp(min=2, max=5).to(torch.int64) - 2


class X101Detector(nn.Module):
    def __init__(self, fpn_post_nms_top_n: int = 1000, pre_nms_top_n: int = 1000, post_nms_top_n: int = 1000,
                 blocks=(3, 4, 23, 3), groups: int = 64, width_per_group: int = 4, fpn_channels: int = 512):
        """Defaults are the real model; smaller `blocks`/widths only for tiny plumbing tests."""
        super().__init__()
        self.body = build_x101_body(blocks, groups, width_per_group)
        self.fpn = FPN((256, 512, 1024, 2048), fpn_channels)
        self.rpn_head = RPNHead(fpn_channels, fpn_channels, len(ANCHOR_RATIOS), "cls_logits", "bbox_pred")
        self.fc6 = nn.Linear(fpn_channels * 7 * 7, 2048)
        self.fc7 = nn.Linear(2048, 2048)
        self.cls_score = nn.Linear(2048, NUM_CLASSES + 1)
        self.bbox_pred = nn.Linear(2048, (NUM_CLASSES + 1) * 4)  # loaded, unused by the extractor
        for i, (stride, size) in enumerate(zip(ANCHOR_STRIDES, ANCHOR_SIZES)):
            self.register_buffer(f"cell_anchors_{i}", legacy_cell_anchors(stride, size, ANCHOR_RATIOS),
                                 persistent=False)
        self.fpn_post_nms_top_n = fpn_post_nms_top_n
        self.pre_nms_top_n = pre_nms_top_n
        self.post_nms_top_n = post_nms_top_n

    def forward(self, batch: torch.Tensor, fpn_post_nms_top_n: int | None = None):
        """(B, 3, Hp, Wp) padded input -> per image (proposals, objectness, fc6, class probs)."""
        levels = self.fpn(self.body(batch))
        canvas = batch.shape[-2:]
        results = []
        for b in range(batch.shape[0]):
            logits, deltas, anchors = [], [], []
            for i, feat in enumerate(levels):
                lg, dl = self.rpn_head(feat[b:b + 1])
                logits.append(lg[0])
                deltas.append(dl[0])
                anchors.append(grid_anchors(getattr(self, f"cell_anchors_{i}"), ANCHOR_STRIDES[i], *feat.shape[-2:]))
            boxes, scores = fpn_legacy_proposals(logits, deltas, anchors, canvas, self.pre_nms_top_n,
                                                 self.post_nms_top_n,
                                                 fpn_post_nms_top_n or self.fpn_post_nms_top_n)
            fc6, probs = self.box_head([lv[b:b + 1] for lv in levels[:4]], boxes)
            results.append((boxes, scores, fc6, probs))
        return results

    def box_head(self, levels: list[torch.Tensor], boxes: torch.Tensor):
        level = fpn_levels(boxes)
        pooled = boxes.new_zeros(len(boxes), levels[0].shape[1], 7, 7)
        rois = torch.cat([boxes.new_zeros(len(boxes), 1), boxes], dim=1)
        for i, (feat, scale) in enumerate(zip(levels, POOLER_SCALES)):
            idx = torch.nonzero(level == i).flatten()
            if len(idx):
                pooled[idx] = roi_align(feat, rois[idx], (7, 7), spatial_scale=scale, sampling_ratio=2,
                                        aligned=False)
        fc6 = F.relu(self.fc6(pooled.flatten(1)))
        logits = self.cls_score(F.relu(self.fc7(fc6)))
        return fc6, logits.softmax(dim=-1)


def x101_select(dets: torch.Tensor, probs: torch.Tensor, num_features: int, nms_thresh: float = 0.5,
                conf_thresh: float = 0.0):
    """MMF's per-class selection: legacy NMS per foreground class raises max_conf; top `num_features`."""
    max_conf = torch.zeros(len(dets), dtype=probs.dtype, device=probs.device)
    for c in range(1, probs.shape[1]):
        scores = probs[:, c]
        keep = legacy_nms(dets, scores, nms_thresh)
        s, cur = scores[keep], max_conf[keep]
        max_conf[keep] = torch.where((s > cur) & (s >= conf_thresh), s, cur)
    order = torch.sort(max_conf, descending=True, stable=True).indices[:num_features]
    return order, max_conf


@torch.no_grad()
def x101_extract_batch(model: X101Detector, images_bgr: list[np.ndarray], preset: Preset, debug: bool = False,
                       device: str | torch.device = "cpu") -> list[dict]:
    """Run one batch (padded together, as the original); one npy-info dict per image."""
    prepared = [x101_input(img, preset.min_size, preset.max_size) for img in images_bgr]
    batch = pad_batch([im for im, _ in prepared]).to(device)
    outputs = model(batch, preset.fpn_post_nms_top_n)
    results = []
    for b, (img, (_, scale), (boxes, scores, fc6, probs)) in enumerate(zip(images_bgr, prepared, outputs)):
        dets = boxes / scale
        # The 1600 per-class NMS calls run where the tensors are (one kernel each on CUDA).
        keep, max_conf = x101_select(dets, probs, preset.num_features)
        boxes, scores, fc6, probs = boxes.cpu(), scores.cpu(), fc6.cpu(), probs.cpu()
        dets, keep, max_conf = dets.cpu(), keep.cpu(), max_conf.cpu()
        fg = probs[keep][:, 1:]
        out = {
            "features": fc6[keep].numpy(),
            "bbox": dets[keep].numpy(),
            "num_boxes": int((max_conf[keep] != 0).sum()),
            "objects": fg.argmax(dim=1).numpy().astype(np.int64),
            "cls_prob": fg.numpy(),
            "image_width": int(img.shape[1]),
            "image_height": int(img.shape[0]),
        }
        if debug:
            out.update(x_im_scale=scale, x_padded_hw=np.array(batch.shape[-2:], dtype=np.int64),
                       x_input=batch[b].cpu().numpy(), x_rpn_proposals=boxes.numpy(),
                       x_rpn_objectness=scores.numpy(), x_max_conf=max_conf.numpy(),
                       x_keep=keep.numpy().astype(np.int64))
        results.append(out)
    return results
