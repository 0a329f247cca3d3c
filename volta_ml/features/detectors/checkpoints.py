"""Loading the original detector checkpoints safely, and converting them once to safetensors.

- BUTD: detectron2 pickle (`faster_rcnn_from_caffe[_attr].pkl`): a dict with "model" ->
  {detectron2 name: numpy array}. Read with a restricted unpickler that can only rebuild
  numpy arrays and plain containers, so a hostile file cannot run code.
- X101: maskrcnn-benchmark `torch.save` file with the state dict under "model"; read with
  `torch.load(weights_only=True)` (PyTorch's own restricted unpickler).
Names go through the strict key maps of keymap.py (every key used, shapes checked).
`convert_checkpoint` writes `<out>.safetensors` (this package's module names) plus a
`<out>.json` manifest (source file, its sha256, preset, detector, key-map version).
"""
from __future__ import annotations

import json
import pickle
from pathlib import Path

import numpy as np
import torch
from torch import nn

from volta_ml.digest import file_digest

from .butd import BUTDDetector
from .keymap import butd_key, load_mapped, x101_key
from .presets import Preset, get_preset
from .x101_fpn import X101Detector

KEY_MAP_VERSION = "volta-ml-detectors-keymap-v1"
_ATTRIBUTE_KEYS = ("roi_heads.box_predictor.cls_embedding.weight", "roi_heads.box_predictor.attr_score.weight")

# The only globals a detectron2 weight pickle needs: numpy array reconstruction.
_ALLOWED_GLOBALS = {
    ("numpy.core.multiarray", "_reconstruct"),
    ("numpy._core.multiarray", "_reconstruct"),
    ("numpy.core.multiarray", "scalar"),
    ("numpy._core.multiarray", "scalar"),
    ("numpy", "ndarray"),
    ("numpy", "dtype"),
    ("collections", "OrderedDict"),
    # Python 3 pickles of bytes at protocol <= 2 rebuild them with codecs.encode(str, "latin1").
    ("_codecs", "encode"),
}


class UnsafeCheckpoint(pickle.UnpicklingError):
    pass


class _RestrictedUnpickler(pickle.Unpickler):
    def __init__(self, file, source: str):
        super().__init__(file, encoding="latin1")
        self._source = source

    def find_class(self, module, name):
        if (module, name) in _ALLOWED_GLOBALS:
            return super().find_class(module, name)
        raise UnsafeCheckpoint(f"{self._source}: refusing to load global {module}.{name} "
                               "(only numpy arrays are allowed in a detectron2 weight pickle)")


def _state_from(obj, source: str) -> dict:
    if isinstance(obj, dict) and "model" in obj and isinstance(obj["model"], dict):
        obj = obj["model"]
    if not isinstance(obj, dict) or not obj:
        raise ValueError(f"{source}: no weight dictionary found (expected a dict with a 'model' entry)")
    state = {}
    for key, value in obj.items():
        if not isinstance(key, str):
            raise ValueError(f"{source}: non-string key {key!r} in the weight dictionary")
        if isinstance(value, np.ndarray):
            value = torch.from_numpy(np.ascontiguousarray(value))
        if not isinstance(value, torch.Tensor):
            raise ValueError(f"{source}: entry {key!r} is a {type(value).__name__}, not an array")
        state[key] = value
    return state


def read_detectron2_pickle(path: str | Path) -> dict[str, torch.Tensor]:
    path = Path(path)
    with open(path, "rb") as f:
        obj = _RestrictedUnpickler(f, str(path)).load()
    return _state_from(obj, str(path))


def read_maskrcnn_pth(path: str | Path) -> dict[str, torch.Tensor]:
    path = Path(path)
    try:
        obj = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as err:
        raise UnsafeCheckpoint(f"{path}: not loadable as plain tensors ({err})") from err
    return _state_from(obj, str(path))


def _unprefixed_x101_key(key: str) -> str | None:
    """maskrcnn-benchmark matches names by suffix; accept any leading prefix before a known root."""
    parts = key.split(".")
    for i in range(len(parts)):
        name = x101_key(".".join(parts[i:]))
        if name is not None:
            return name
    return None


def build_detector(preset: Preset | str, with_attributes: bool = True, **arch) -> nn.Module:
    """An uninitialised detector for `preset` (arch kwargs only for tiny test models)."""
    preset = get_preset(preset) if isinstance(preset, str) else preset
    if preset.detector == "butd":
        return BUTDDetector(with_attributes=with_attributes, rpn_pre_nms_topk=preset.rpn_pre_nms_topk,
                            rpn_post_nms_topk=preset.rpn_post_nms_topk, **arch)
    if preset.detector == "x101":
        return X101Detector(fpn_post_nms_top_n=preset.fpn_post_nms_top_n, **arch)
    raise ValueError(f"preset {preset.name!r}: unknown detector {preset.detector!r}")


def load_original(path: str | Path, preset: Preset | str, **arch) -> nn.Module:
    """Build the preset's detector and load an original checkpoint (.pkl or .pth) strictly."""
    preset = get_preset(preset) if isinstance(preset, str) else preset
    path = Path(path)
    if preset.detector == "butd":
        state = read_detectron2_pickle(path)
        with_attr = all(k in state for k in _ATTRIBUTE_KEYS)
        model = build_detector(preset, with_attributes=with_attr, **arch)
        load_mapped(model, state, butd_key, str(path))
    else:
        state = read_maskrcnn_pth(path)
        model = build_detector(preset, **arch)
        load_mapped(model, state, _unprefixed_x101_key, str(path))
    return model.eval()


def convert_checkpoint(src: str | Path, out: str | Path, preset: Preset | str, **arch) -> tuple[Path, Path]:
    """Original checkpoint -> `<out>.safetensors` + `<out>.json` manifest. Returns both paths."""
    from safetensors.torch import save_file

    preset = get_preset(preset) if isinstance(preset, str) else preset
    src = Path(src)
    model = load_original(src, preset, **arch)
    out = Path(out)
    weights_path = out.with_suffix(".safetensors")
    manifest_path = out.with_suffix(".json")
    weights_path.parent.mkdir(parents=True, exist_ok=True)
    tensors = {k: v.contiguous() for k, v in model.state_dict().items()}
    save_file(tensors, str(weights_path), metadata={"preset": preset.name, "detector": preset.detector})
    manifest = {
        "source": str(src.resolve()),
        "source_name": src.name,
        "source_sha256": file_digest(src),
        "preset": preset.name,
        "detector": preset.detector,
        "with_attributes": bool(getattr(model, "with_attributes", False)),
        "arch": {k: list(v) if isinstance(v, tuple) else v for k, v in arch.items()},
        "key_map": KEY_MAP_VERSION,
        "safetensors": weights_path.name,
        "safetensors_sha256": file_digest(weights_path),
        "num_tensors": len(tensors),
    }
    manifest_path.write_text(json.dumps(manifest, indent=2) + "\n")
    return weights_path, manifest_path


def load_converted(weights_path: str | Path, preset: Preset | str | None = None, verify: bool = True) -> nn.Module:
    """Load `<name>.safetensors` written by `convert_checkpoint`, using its manifest."""
    from safetensors.torch import load_file

    weights_path = Path(weights_path)
    manifest_path = weights_path.with_suffix(".json")
    if not manifest_path.is_file():
        raise FileNotFoundError(f"{weights_path}: manifest {manifest_path.name} is missing "
                                "(convert the original checkpoint with `volta-ml features convert-detector`)")
    manifest = json.loads(manifest_path.read_text())
    if verify and file_digest(weights_path) != manifest["safetensors_sha256"]:
        raise ValueError(f"{weights_path}: sha256 does not match its manifest (file changed or corrupt)")
    base = get_preset(manifest["preset"])
    preset = base if preset is None else (get_preset(preset) if isinstance(preset, str) else preset)
    if preset.detector != manifest["detector"]:
        raise ValueError(f"{weights_path}: holds a {manifest['detector']} detector, preset {preset.name!r} "
                         f"needs {preset.detector}")
    arch = {k: tuple(v) if isinstance(v, list) else v for k, v in manifest.get("arch", {}).items()}
    kwargs = {"with_attributes": manifest.get("with_attributes", True)} if preset.detector == "butd" else {}
    model = build_detector(preset, **kwargs, **arch)
    state = load_file(str(weights_path))
    missing, unexpected = model.load_state_dict(state, strict=False)
    if missing or unexpected:
        raise ValueError(f"{weights_path}: missing keys {missing[:5]}, unexpected keys {unexpected[:5]}")
    return model.eval()


def load_weights(path: str | Path, preset: Preset | str, **arch) -> nn.Module:
    """Any supported weight file: converted .safetensors, detectron2 .pkl or maskrcnn .pth."""
    path = Path(path)
    if path.suffix == ".safetensors":
        return load_converted(path, preset)
    return load_original(path, preset, **arch)
