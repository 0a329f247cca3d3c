"""Loading a `ModelSpec`: local folder or hub id (+ pinned revision), dtype, device or accelerate's device_map.

Nothing here downloads on its own: a hub id goes to `from_pretrained` (which uses the local HF cache and the
hub as the user configured it); tests pass local folders only. Every failure is one line naming the model.

Weights are loaded with transformers' loading report: a checkpoint that misses tensors of the architecture
(they would be randomly initialised) or has tensors it does not use is refused with one line naming the first few
keys and the counts, unless `spec.allow_missing_keys`; then the model carries the report (`volta_loading_report`),
which `loading_report(backend)` collects for the result files. Tensors of another shape than the config's (a
config that does not describe the weights) are always refused, naming the tensor and both shapes.

The loader's error mapping (`weights_errors`, around every weights load: models, M-CLIP's text tower, adapters):
a pickle (`pytorch_model.bin`, `adapter_model.bin`) that holds more than tensors, which torch's `weights_only`
loader refuses (nothing in it runs), and a tensor whose shape differs from the model's (torch's
`size mismatch for ...`) are one line naming the file or tensor, never torch's advice.

Adapters (`attach_adapter`, `spec.adapter`): what is checked is in docs/hf_models.md ("What is checked when an
adapter is attached"): the folder and its `adapter_config.json` (JSON, a peft type), its weights file, the base
model it records (`adapter_base_mismatch`: refused unless `spec.allow_adapter_base_mismatch`, then recorded in the
loading report), and after peft has loaded it, that every tensor of the file went into the model and every adapter
tensor of the model came from the file.
"""
from __future__ import annotations

import contextlib
import json
import logging
import pickle
import re
import warnings
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


REPORT_KEYS = ("missing_keys", "unexpected_keys")
SHOWN_KEYS = 3            # keys named per kind in the one-line refusal


def _shape(shape) -> str:
    return "[" + ", ".join(str(int(n)) for n in shape) + "]"


def _keys(keys: list[str]) -> str:
    more = f", ... {len(keys) - SHOWN_KEYS} more" if len(keys) > SHOWN_KEYS else ""
    return ", ".join(keys[:SHOWN_KEYS]) + more


def check_weights(spec: ModelSpec, report: dict, what: str) -> dict:
    """The non-empty kinds of `report` ({missing_keys: [...], ...}); refused unless `spec.allow_missing_keys`.
    Tensors of another shape than the config's (`mismatched_keys`: (key, weights' shape, model's shape)) are
    refused always: the config does not describe the weights."""
    mismatched = sorted((str(k[0]), k[1], k[2]) for k in report.get("mismatched_keys") or ())
    if mismatched:
        key, weights, model = mismatched[0]
        more = f" (and {len(mismatched) - 1} more tensors)" if len(mismatched) > 1 else ""
        raise ModelLoadError(f"{spec.model}: tensor {key} has shape {_shape(weights)} in the weights, "
                             f"{_shape(model)} in {what} built from its config.json{more}: the config does not "
                             "describe these weights")
    found = {kind: sorted(str(k) if not isinstance(k, tuple) else str(k[0]) for k in report.get(kind) or ())
             for kind in REPORT_KEYS}
    found = {kind: keys for kind, keys in found.items() if keys}
    if found and not spec.allow_missing_keys:
        parts = [f"{len(keys)} {kind.replace('_keys', '')} ({_keys(keys)})" for kind, keys in found.items()]
        raise ModelLoadError(f"{spec.model}: the weights do not match {what}: {'; '.join(parts)}; missing tensors "
                             "would be randomly initialised (--allow_missing_keys scores anyway and records them)")
    return found


# torch's "size mismatch" line of a load_state_dict error (peft's loading of an adapter)
SIZE_MISMATCH = re.compile(r"size mismatch for (?P<key>\S+): copying a param with shape "
                           r"torch\.Size\(\[(?P<saved>[^\]]*)\]\) from checkpoint, "
                           r"the shape in current model is torch\.Size\(\[(?P<model>[^\]]*)\]\)")


def _unpickler_detail(error: BaseException) -> str:
    """What torch's weights-only unpickler met (`Unsupported global: ...`), without its advice to load the file
    with `weights_only=False`."""
    lines = [ln.strip() for ln in str(error).splitlines() if ln.strip()]
    kept = [ln for ln in lines if "weights_only" not in ln and not ln.startswith(("Weights only load failed",
                                                                                   "Check the documentation"))]
    return kept[0] if kept else type(error).__name__


@contextlib.contextmanager
def weights_errors(subject: str, pickle_files: str):
    """The loader's error mapping around a weights load (`subject`: "<model>" or "adapter <folder>";
    `pickle_files`: the pickle weights it may read, for the message): a pickle holding more than tensors (torch's
    weights-only loader refused it: nothing in it ran) and a tensor of another shape than the model's are one
    `ModelLoadError` line; anything else passes through."""
    try:
        yield
    except pickle.UnpicklingError as e:
        raise ModelLoadError(f"{subject}: {pickle_files}: a pickle that holds more than tensors "
                             f"({_unpickler_detail(e)}); volta-ml reads only tensors from pickle weights and ran "
                             "nothing from it: use safetensors weights (save_pretrained's default) from a source you "
                             "trust") from None
    except RuntimeError as e:
        found = SIZE_MISMATCH.search(str(e))
        if found is None:
            raise
        key = found["key"].replace(".default.", ".")
        raise ModelLoadError(f"{subject}: tensor {key} has shape [{found['saved']}] in the weights, "
                             f"[{found['model']}] in the model built from its config: the config does not describe "
                             "these weights") from None


class _NoLoadReport(logging.Filter):
    """transformers' multi-line LOAD REPORT table: `check_weights` says it in one line (or records it)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "LOAD REPORT" not in str(record.msg)


@contextlib.contextmanager
def _quiet_load_report():
    log = logging.getLogger("transformers.modeling_utils")
    quiet = _NoLoadReport()
    log.addFilter(quiet)
    try:
        yield
    finally:
        log.removeFilter(quiet)


def loading_report(backend) -> dict:
    """{attribute: {missing_keys: [...], ...}} of the backend's models loaded with accepted mismatches."""
    return {name: value.volta_loading_report for name, value in sorted(vars(backend).items())
            if isinstance(value, torch.nn.Module) and getattr(value, "volta_loading_report", None)}


def _pickle_names(src: str) -> str:
    """The pickle weights files of a model folder (for a message), or their usual name."""
    names = sorted(p.name for p in Path(src).glob("*.bin")) if Path(src).is_dir() else []
    return ", ".join(names) or "its pytorch_model*.bin"


def meta_model(auto_cls, spec: ModelSpec, src: str, what: str):
    """`spec.device == "meta"`: the model built from its config.json on the meta device (shapes and dtypes, no
    storage; no weights file is read), with the folder's generation config. What `--sharding fsdp` builds on the
    ranks other than 0, which receive rank 0's tensors unit by unit as they are sharded (`engine/sharding.py`)."""
    from transformers import AutoConfig, GenerationConfig
    try:
        config = AutoConfig.from_pretrained(src, revision=spec.revision)
        with torch.device("meta"):
            model = auto_cls.from_config(config, dtype=torch_dtype(spec))
    except (ValueError, KeyError) as e:
        raise ModelLoadError(f"{spec.model}: unknown or unsupported architecture for {what} ({one_line(e)})") from None
    except OSError as e:
        raise ModelLoadError(f"{spec.model}: cannot load {what} ({one_line(e)})") from None
    with contextlib.suppress(OSError, ValueError):
        model.generation_config = GenerationConfig.from_pretrained(src, revision=spec.revision)
    model.volta_loading_report = {}
    return model.eval()


def load_model(auto_cls, spec: ModelSpec, what: str, **kwargs):
    """`auto_cls.from_pretrained` with the spec's revision, dtype and device / device_map; eval mode. The loading
    report is checked (`check_weights`) and kept on the model as `volta_loading_report`. Device "meta": the model
    without its weights (`meta_model`)."""
    src = source(spec)
    if spec.device == "meta" and not spec.device_map:
        return meta_model(auto_cls, spec, src, what)
    # mismatched shapes: into the report (check_weights names the tensor and both shapes) instead of transformers'
    # RuntimeError that names none
    kwargs = dict(revision=spec.revision, dtype=torch_dtype(spec), output_loading_info=True,
                  ignore_mismatched_sizes=True, **kwargs)
    if spec.device_map:
        kwargs["device_map"] = spec.device_map          # accelerate places the layers (models > one GPU)
    try:
        with weights_errors(spec.model, _pickle_names(src)), _quiet_load_report():
            model, report = auto_cls.from_pretrained(src, **kwargs)
    except ModelLoadError:
        raise
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


ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = ("adapter_model.safetensors", "adapter_model.bin")   # what peft's save_pretrained writes
HF_CACHE_SNAPSHOT = re.compile(r"models--(?P<repo>[^/\\]+)[/\\]snapshots[/\\](?P<commit>[0-9a-f]{40})(?:[/\\]|$)")
COMMIT = re.compile(r"[0-9a-f]{40}")


def _read_adapter_config(folder: Path, path: str) -> dict:
    """adapter_config.json as a dict: JSON, with a `peft_type` peft knows (one line naming the folder otherwise)."""
    from peft.mapping import PEFT_TYPE_TO_CONFIG_MAPPING
    file = folder / ADAPTER_CONFIG
    try:
        config = json.loads(file.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as e:
        raise ModelLoadError(f"adapter {path}: {ADAPTER_CONFIG} is not valid JSON ({e})") from None
    if not isinstance(config, dict):
        raise ModelLoadError(f"adapter {path}: {ADAPTER_CONFIG} is not a JSON object")
    known = sorted(str(getattr(t, "value", t)) for t in PEFT_TYPE_TO_CONFIG_MAPPING)
    if config.get("peft_type") not in known:
        raise ModelLoadError(f"adapter {path}: {ADAPTER_CONFIG} has peft_type {config.get('peft_type')!r}, not an "
                             f"adapter type of the installed peft (LORA, IA3, ... {len(known)} types)")
    return config


def model_identity(ref: str, revision: str | None = None) -> dict:
    """What names a model, to compare an adapter's recorded base with the model loaded: `repo` (a hub id, or the
    repo of a folder inside a Hugging Face cache, `models--org--name/snapshots/<commit>`; lower-case), `commit` (a
    full commit hash: that folder's, or a 40-hex `revision`), `folder` (a local folder, resolved) and `name` (the
    last component of the repo or folder, lower-case)."""
    commit = revision.lower() if revision and COMMIT.fullmatch(revision.lower()) else None
    if not is_local(ref):
        repo = ref.strip("/").lower()
        return {"repo": repo, "commit": commit, "folder": None, "name": repo.rsplit("/", 1)[-1]}
    folder = Path(ref).expanduser().resolve()
    cached = HF_CACHE_SNAPSHOT.search(folder.as_posix() + "/")
    if cached:
        repo = cached["repo"].replace("--", "/").lower()
        return {"repo": repo, "commit": commit or cached["commit"], "folder": str(folder),
                "name": repo.rsplit("/", 1)[-1]}
    return {"repo": None, "commit": commit, "folder": str(folder), "name": folder.name.lower()}


def same_model(recorded: dict, loaded: dict) -> bool:
    """The rule (docs/hf_models.md): the same folder; else, when both name a hub repo, the same repo (letter case
    aside); else (a plain folder on either side: a local copy) the same name, the last component of the folder /
    repo. Where both carry a commit, the commits must be equal too."""
    if recorded["commit"] and loaded["commit"] and recorded["commit"] != loaded["commit"]:
        return False
    if recorded["folder"] and recorded["folder"] == loaded["folder"]:
        return True
    if recorded["repo"] and loaded["repo"]:
        return recorded["repo"] == loaded["repo"]
    return recorded["name"] == loaded["name"]


def adapter_base_mismatch(config: dict, model: torch.nn.Module, spec: ModelSpec) -> str | None:
    """How the base model the adapter records differs from `model` (loaded from `spec`), None when it does not: its
    base model class (peft's `auto_mapping.base_model_class`) must be the model's class, its
    `base_model_name_or_path` (+ `revision`) must name the same model as `spec.model` (+ `spec.revision`,
    `same_model`). What the adapter does not record is not compared."""
    found = []
    recorded_class = (config.get("auto_mapping") or {}).get("base_model_class")
    if recorded_class and recorded_class != type(model).__name__:
        found.append(f"base model class {recorded_class}, the model is a {type(model).__name__}")
    recorded = config.get("base_model_name_or_path")
    if recorded and not same_model(model_identity(str(recorded), config.get("revision")),
                                   model_identity(spec.model, spec.revision)):
        at = f"@{config['revision']}" if config.get("revision") else ""
        found.append(f"base model {recorded}{at}, the model is {spec.pinned}")
    return "; ".join(found) or None


def _weights_file(folder: Path, path: str) -> Path:
    for name in ADAPTER_WEIGHTS:
        if (folder / name).is_file():
            return folder / name
    raise ModelLoadError(f"adapter folder {path} has no {' or '.join(ADAPTER_WEIGHTS)} (the weights peft's "
                         "save_pretrained writes beside adapter_config.json)")


def _check_loaded(peft_model, folder: Path, weights: Path, path: str, key_mapping: dict) -> None:
    """Every tensor of the adapter's file went into the model and every adapter tensor of the model came from the
    file (peft only warns about the second and says nothing of the first): otherwise one line naming them."""
    from peft.utils import get_peft_model_state_dict, load_peft_weights
    with weights_errors(f"adapter {path}", weights.name):
        saved = set(load_peft_weights(str(folder), device="cpu", key_mapping=key_mapping or None))
    # the adapter's own tensors, under the file's names (save_embedding_layers=False: "auto" would look the base
    # model's config up, on the hub for a hub id); a file tensor named as one of the model's (a saved embedding
    # layer) was loaded into it too
    expected = set(get_peft_model_state_dict(peft_model, save_embedding_layers=False))
    unused = sorted(saved - expected - set(peft_model.state_dict()))
    missing = sorted(expected - saved)
    parts = []
    if unused:
        parts.append(f"{len(unused)} of its {len(saved)} tensors match no adapter module of this model "
                     f"({_keys(unused)})")
    if missing:
        parts.append(f"{len(missing)} of the {len(expected)} adapter tensors its {ADAPTER_CONFIG} puts into this "
                     f"model are not in {weights.name} ({_keys(missing)}; they would keep their initial values)")
    if parts:
        raise ModelLoadError(f"adapter {path}: {'; '.join(parts)}: an adapter for other modules or another model "
                             "is not applied")


def attach_adapter(model: torch.nn.Module, spec: ModelSpec, trainable: bool = False):
    """The peft adapter folder `spec.adapter` (LoRA, written by `save_pretrained`) injected into `model` (loaded
    from `spec`) in place; returns the `PeftModel` around it. `model` itself then computes with the adapter (its
    linear layers are replaced by LoRA layers), so a backend holding it needs no other change. One-line
    `ModelLoadError` when the folder is missing, is not an adapter, records another base model (unless
    `spec.allow_adapter_base_mismatch`: then the mismatch goes into the model's loading report, hence the result
    files) or does not fit the model, or when a tensor of either side is left out. `trainable`: the adapter is
    trained on (`volta-ml train --hf_adapter`); its config then records this model as its base."""
    path = str(spec.adapter)
    folder = Path(path).expanduser()
    if not folder.is_dir():
        raise ModelLoadError(f"adapter folder {path} does not exist")
    if not (folder / ADAPTER_CONFIG).is_file():
        raise ModelLoadError(f"adapter folder {path} has no {ADAPTER_CONFIG} (not a peft save_pretrained folder)")
    try:
        from peft import PeftModel
    except ImportError as e:
        raise ModelLoadError(f"adapter {path}: the Python package 'peft' is not installed (pip install peft)") from e
    config = _read_adapter_config(folder, path)
    weights = _weights_file(folder, path)
    mismatch = adapter_base_mismatch(config, model, spec)
    if mismatch and not spec.allow_adapter_base_mismatch:
        raise ModelLoadError(f"adapter {path} was trained on another model ({mismatch}); "
                             "--allow_adapter_base_mismatch applies it anyway and records that in the results")
    key_mapping = getattr(model, "_checkpoint_conversion_mapping", None) or {}
    try:
        with weights_errors(f"adapter {path}", weights.name), warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="Found missing adapter keys")   # _check_loaded says it
            peft_model = PeftModel.from_pretrained(model, str(folder), is_trainable=trainable)
    except ModelLoadError:
        raise
    except (ValueError, KeyError, TypeError, RuntimeError, OSError, SafetensorError) as e:   # TypeError: a config
        # field of the wrong type
        raise ModelLoadError(f"adapter {path}: cannot apply it to this model ({one_line(e)})") from None
    try:
        _check_loaded(peft_model, folder, weights, path, key_mapping)
    except ModelLoadError:
        peft_model.unload()          # the model as it was loaded: no LoRA layers left in it
        raise
    if mismatch:
        model.volta_loading_report = {**(getattr(model, "volta_loading_report", None) or {}),
                                      "adapter_base_mismatch": f"{path}: {mismatch}"}
    if trainable:   # what it is trained on from now on: the export records this base
        adapter = peft_model.peft_config[next(iter(peft_model.peft_config))]
        adapter.base_model_name_or_path, adapter.revision = getattr(model, "name_or_path", spec.model), spec.revision
    return peft_model
