"""Region detectors on torchvision ops: BUTD ResNet-101 C4 (VG attributes) and ResNeXt-101 FPN.

Entry points: `get_preset`, `load_weights` (original .pkl/.pth or converted .safetensors),
`butd_extract` (one image) and `x101_extract_batch` (one padded batch).

The names are imported on first use (PEP 562), so that reading a preset (`detectors.presets`, which every
`volta-ml` command's parser reads) does not import torchvision and torch._dynamo (about 2.5 s per process).
"""
import importlib

_WHERE = {"build_detector": "checkpoints", "convert_checkpoint": "checkpoints", "load_converted": "checkpoints",
          "load_original": "checkpoints", "load_weights": "checkpoints", "PRESETS": "presets", "Preset": "presets",
          "get_preset": "presets", "TooFewBoxes": "select_butd", "butd_extract": "select_butd",
          "x101_extract_batch": "x101_fpn"}
__all__ = list(_WHERE)


def __getattr__(name: str):
    if name not in _WHERE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{_WHERE[name]}", __name__), name)
    globals()[name] = value
    return value
