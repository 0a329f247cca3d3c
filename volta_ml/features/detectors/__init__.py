"""Region detectors on torchvision ops: BUTD ResNet-101 C4 (VG attributes) and ResNeXt-101 FPN.

Entry points: `get_preset`, `load_weights` (original .pkl/.pth or converted .safetensors),
`butd_extract` (one image) and `x101_extract_batch` (one padded batch).
"""
from .checkpoints import build_detector, convert_checkpoint, load_converted, load_original, load_weights
from .presets import PRESETS, Preset, get_preset
from .select_butd import TooFewBoxes, butd_extract
from .x101_fpn import x101_extract_batch

__all__ = ["PRESETS", "Preset", "get_preset", "build_detector", "load_weights", "load_original",
           "load_converted", "convert_checkpoint", "butd_extract", "x101_extract_batch", "TooFewBoxes"]
