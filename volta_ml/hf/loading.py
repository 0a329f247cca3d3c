"""Loading a `ModelSpec`: local folder or hub id (+ pinned revision), dtype, device or accelerate's device_map.

Nothing here downloads on its own: a hub id goes to `from_pretrained` (which uses the local HF cache and the
hub as the user configured it); tests pass local folders only. Every failure is one line naming the model.

Weights are loaded with transformers' loading report: a checkpoint that misses tensors of the architecture
(they would be randomly initialised), has tensors it does not use, or has tensors of another shape is refused
with one line naming the first few keys and the counts, unless `spec.allow_missing_keys`; then the model
carries the report (`volta_loading_report`), which `loading_report(backend)` collects for the result files.
"""
from __future__ import annotations

import json
import re
from pathlib import Path

import torch
from safetensors import SafetensorError
from PIL import Image

from .base import ModelSpec

DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
BLANK_SIZE = 224          # side of the blank image that stands in for a missing photo (blind control)


class ModelLoadError(ValueError):
    """A model folder / hub id / architecture that cannot be loaded (one-line message naming the model)."""


def blank_image() -> Image.Image:
    """The blind control's stand-in photo for models that cannot run without an image: uniform mid-grey."""
    return Image.new("RGB", (BLANK_SIZE, BLANK_SIZE), (128, 128, 128))


def photo_rgb(image: Image.Image) -> Image.Image:
    """The RGB photo every HF backend sees: transparency (RGBA, LA, PA, a palette or grey image with a
    transparent colour) composited on white, as the transformers image processors' `convert_to_rgb` does;
    other modes converted as Pillow does. A plain `.convert("RGB")` would drop the alpha channel instead,
    showing the colours hidden under transparent pixels (scores moved by up to 6 points on an RGBA photo)."""
    if "A" in image.getbands() or image.info.get("transparency") is not None:
        rgba = image.convert("RGBA")
        return Image.alpha_composite(Image.new("RGBA", rgba.size, (255, 255, 255, 255)), rgba).convert("RGB")
    return image.convert("RGB")


def is_local(model: str) -> bool:
    return Path(model).expanduser().exists() or model.startswith((".", "/", "~")) or model.count("/") > 1


def source(spec: ModelSpec) -> str:
    """The folder or hub id to load; a local path that does not exist (or has no config.json) is an error."""
    if not is_local(spec.model):
        return spec.model
    path = Path(spec.model).expanduser()
    if not path.is_dir():
        raise ModelLoadError(f"model folder {spec.model} does not exist")
    if not (path / "config.json").is_file():
        raise ModelLoadError(f"model folder {spec.model} has no config.json (not a transformers model folder)")
    return str(path)


def torch_dtype(spec: ModelSpec) -> torch.dtype:
    try:
        return DTYPES[spec.dtype]
    except KeyError:
        raise ModelLoadError(f"{spec.model}: unknown dtype {spec.dtype!r}; use one of {', '.join(DTYPES)}") from None


def read_config(spec: ModelSpec) -> dict:
    """config.json as a dict (for layouts transformers does not know, e.g. M-CLIP's)."""
    from transformers.utils import cached_file
    try:
        file = cached_file(source(spec), "config.json", revision=spec.revision)
    except OSError as e:
        raise ModelLoadError(f"{spec.model}: cannot read config.json ({str(e).splitlines()[0]})") from None
    try:
        return json.loads(Path(file).read_text())
    except ValueError as e:
        raise ModelLoadError(f"{spec.model}: {file} is not valid JSON ({e})") from None


def one_line(e: BaseException) -> str:
    lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
    return lines[0] if lines else type(e).__name__


REPORT_KEYS = ("missing_keys", "unexpected_keys", "mismatched_keys")
SHOWN_KEYS = 3            # keys named per kind in the one-line refusal


def check_weights(spec: ModelSpec, report: dict, what: str) -> dict:
    """The non-empty kinds of `report` ({missing_keys: [...], ...}); refused unless `spec.allow_missing_keys`."""
    found = {kind: sorted(str(k) if not isinstance(k, tuple) else str(k[0]) for k in report.get(kind) or ())
             for kind in REPORT_KEYS}
    found = {kind: keys for kind, keys in found.items() if keys}
    if found and not spec.allow_missing_keys:
        parts = []
        for kind, keys in found.items():
            more = f", ... {len(keys) - SHOWN_KEYS} more" if len(keys) > SHOWN_KEYS else ""
            parts.append(f"{len(keys)} {kind.replace('_keys', '')} ({', '.join(keys[:SHOWN_KEYS])}{more})")
        raise ModelLoadError(f"{spec.model}: the weights do not match {what}: {'; '.join(parts)}; missing tensors "
                             "would be randomly initialised (--allow_missing_keys scores anyway and records them)")
    return found


def loading_report(backend) -> dict:
    """{attribute: {missing_keys: [...], ...}} of the backend's models loaded with accepted mismatches."""
    return {name: value.volta_loading_report for name, value in sorted(vars(backend).items())
            if isinstance(value, torch.nn.Module) and getattr(value, "volta_loading_report", None)}


def load_model(auto_cls, spec: ModelSpec, what: str, **kwargs):
    """`auto_cls.from_pretrained` with the spec's revision, dtype and device / device_map; eval mode. The loading
    report is checked (`check_weights`) and kept on the model as `volta_loading_report`."""
    src = source(spec)
    kwargs = dict(revision=spec.revision, dtype=torch_dtype(spec), output_loading_info=True, **kwargs)
    if spec.device_map:
        kwargs["device_map"] = spec.device_map          # accelerate places the layers (models > one GPU)
    try:
        model, report = auto_cls.from_pretrained(src, **kwargs)
    except (ValueError, KeyError) as e:
        raise ModelLoadError(f"{spec.model}: unknown or unsupported architecture for {what} ({one_line(e)})") from None
    except (OSError, SafetensorError) as e:   # SafetensorError: a truncated or damaged weights file
        raise ModelLoadError(f"{spec.model}: cannot load {what} ({one_line(e)})") from None
    model.volta_loading_report = check_weights(spec, report, what)
    if not spec.device_map:
        model = model.to(spec.device)
    return model.eval()


def load_processor(auto_cls, spec: ModelSpec, **kwargs):
    try:
        return auto_cls.from_pretrained(source(spec), revision=spec.revision, **kwargs)
    except ImportError as e:
        raise ModelLoadError(missing_package(spec, e)) from None
    except (ValueError, KeyError, OSError, TypeError) as e:
        raise ModelLoadError(f"{spec.model}: cannot load its processor/tokenizer ({one_line(e)})") from None


def missing_package(spec: ModelSpec, e: ImportError) -> str:
    """One line naming the optional package a processor needs (SmolVLM2: num2words), from the ImportError."""
    name = e.name or next(iter(re.findall(r"`([\w.-]+)`", str(e))), None)
    what = f"the Python package {name!r}" if name else "a Python package that is not installed"
    hint = f"; install it (pip install {name})" if name else ""
    return f"{spec.model}: its processor needs {what}{hint} ({one_line(e)})"


def input_device(model: torch.nn.Module) -> torch.device:
    """Where inputs go: the model's device, or under a device_map the device of the input embeddings."""
    try:
        return model.get_input_embeddings().weight.device
    except (AttributeError, NotImplementedError):
        pass
    return next(model.parameters()).device


def float_dtype(model: torch.nn.Module) -> torch.dtype:
    return next(p.dtype for p in model.parameters() if p.is_floating_point())


ADAPTER_FILES = ("adapter_config.json",)   # what peft's save_pretrained always writes


def attach_adapter(model: torch.nn.Module, path: str, trainable: bool = False):
    """The peft adapter folder `path` (LoRA, written by `save_pretrained`) injected into `model` in place; returns
    the `PeftModel` around it. `model` itself then computes with the adapter (its linear layers are replaced by
    LoRA layers), so a backend holding it needs no other change. One-line `ModelLoadError` when the folder is
    missing, is not an adapter, or does not fit the model."""
    folder = Path(path).expanduser()
    if not folder.is_dir():
        raise ModelLoadError(f"adapter folder {path} does not exist")
    if not all((folder / name).is_file() for name in ADAPTER_FILES):
        raise ModelLoadError(f"adapter folder {path} has no adapter_config.json (not a peft save_pretrained folder)")
    try:
        from peft import PeftModel
    except ImportError as e:
        raise ModelLoadError(f"adapter {path}: the Python package 'peft' is not installed (pip install peft)") from e
    try:
        return PeftModel.from_pretrained(model, str(folder), is_trainable=trainable)
    except (ValueError, KeyError, RuntimeError, OSError, SafetensorError) as e:
        raise ModelLoadError(f"adapter {path}: cannot apply it to this model ({one_line(e)})") from None
