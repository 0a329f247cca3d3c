"""Named extraction presets: each one pins every number that changes the features.

`volta-butd36` and `volta-x101` are what VOLTA/IGLUE ran (features spec sections 1.6
and 3); anything else is a different feature set and is named differently.
"""
from __future__ import annotations

from dataclasses import dataclass, replace


@dataclass(frozen=True)
class Preset:
    name: str
    detector: str  # "butd" | "x101"
    min_size: int
    max_size: int
    description: str = ""
    # BUTD
    selection: str = "volta_maxnms"  # "volta_maxnms" | "caffe"
    rpn_pre_nms_topk: int = 6000
    rpn_post_nms_topk: int = 300
    num_boxes: int = 36  # volta_maxnms: exact count, else the image is a failure
    caffe_min_boxes: int = 10
    caffe_max_boxes: int = 100
    caffe_conf_thresh: float = 0.2
    # X101
    fpn_post_nms_top_n: int = 1000
    num_features: int = 100
    batch_size: int = 1  # X101: images padded together (changes features; VOLTA used 2)

    def with_settings(self, **settings) -> "Preset":
        """A copy with some numbers changed (e.g. from a fixture's `settings`)."""
        aliases = {"rpn_post_nms_topk": "rpn_post_nms_topk", "fpn_post_nms_top_n": "fpn_post_nms_top_n"}
        return replace(self, **{aliases.get(k, k): v for k, v in settings.items()})


PRESETS: dict[str, Preset] = {
    p.name: p
    for p in [
        Preset("volta-butd36", "butd", 800, 1333,
               "BUTD R101-C4 as VOLTA's detectron2_proposal_maxnms.py: 800/1333, 300 proposals, "
               "max-class NMS ladder, exactly 36 boxes (IGLUE boxes36 H5)"),
        Preset("butd-10-100", "butd", 600, 1000,
               "BUTD R101-C4 at the Caffe scale 600/1000 with the Caffe generate_tsv.py selection: "
               "per-class NMS 0.3, confidence 0.2, 10-100 boxes",
               selection="caffe"),
        Preset("butd-36-36", "butd", 600, 1000,
               "BUTD R101-C4 at 600/1000 with the Caffe selection clamped to 36 boxes "
               "(VOLTA's Conceptual Captions features)",
               selection="caffe", caffe_min_boxes=36, caffe_max_boxes=36),
        Preset("volta-x101", "x101", 800, 1333,
               "ResNeXt-101 64x4d FPN as VOLTA's extract_features_vmb.py: 800/1333, RGB/BGR quirk, "
               "batches of 2, 1000 proposals, 100 boxes of fc6 (IGLUE X101 npy)",
               batch_size=2),
        Preset("x101-single", "x101", 800, 1333,
               "volta-x101 with one image per batch (features independent of the batch partner)"),
    ]
}


def get_preset(name: str) -> Preset:
    try:
        return PRESETS[name]
    except KeyError:
        raise KeyError(f"unknown preset {name!r}; known: {', '.join(sorted(PRESETS))}") from None
