"""Adapter for `shared/tools/check_parity.py`: run VOLTA's golden fixtures through volta-ml's models."""
from __future__ import annotations

import json
import os

import torch

from volta_ml.models import build_model, load_checkpoint, load_config


def _load_model(fixture_dir: str, kind: str):
    meta = json.load(open(os.path.join(fixture_dir, "meta.json")))
    config = load_config(os.path.join(fixture_dir, "config.json"), is_m3p=bool(meta.get("is_m3p")))
    task_cfg = json.load(open(os.path.join(fixture_dir, "task_cfg.json")))
    model = build_model(config, task_cfg, list(task_cfg), kind=kind)
    return model, config


def load_for_parity(fixture_dir: str, kind: str = "tasks", dtype: torch.dtype = torch.float32,
                    device: str | torch.device = "cpu"):
    """`run(batch, task_ids) -> outputs` of the fixture's model on `device` (outputs stay there)."""
    model, config = _load_model(fixture_dir, kind)
    load_checkpoint(model, os.path.join(fixture_dir, "pytorch_model.bin"))
    model.to(dtype).to(device).eval()

    @torch.no_grad()
    def run(batch: dict, task_ids: list) -> dict:
        batch = {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in batch.items()}
        args = dict(input_txt=batch["input_txt"], input_imgs=batch["input_imgs"], image_loc=batch["image_loc"],
                    token_type_ids=batch.get("token_type_ids"), attention_mask=batch.get("attention_mask"),
                    image_attention_mask=batch.get("image_attention_mask"))
        if kind == "pretraining":
            out = model(**args)
            res = {"mlm_logits": out["mlm_logits"], "itm_logits": out["itm_logits"], "pooled": out["pooled"]}
            res.update({f"vis_logits/{k}": v for k, v in out["vis_logits"].items()})
            return res
        if config.image_embeddings == "m3p":
            _, pooled = model.encode(**args)
            res = {"pooled": pooled}
        else:
            enc, pooled = model.encode(**args, output_all_encoded_layers=True)
            res = {"seq_t": enc.seq_t, "seq_v": enc.seq_v, "pooled_t": enc.pooled_t, "pooled_v": enc.pooled_v,
                   "pooled": pooled, "layers_t": torch.stack(enc.layers_t), "layers_v": torch.stack(enc.layers_v)}
        for tid in task_ids:
            res[f"logits/{tid}"] = model(**args, task_id=tid)
        return {k: v for k, v in res.items() if v is not None}

    return run


def hf_init_for_parity(fixture_dir: str) -> dict:
    model, _ = _load_model(fixture_dir, "tasks")
    report = load_checkpoint(model, os.path.join(fixture_dir, "hf_text_checkpoint.bin"), from_hf=True)
    return {"state_dict": model.state_dict(), "missing_keys": report.missing_keys,
            "unexpected_keys": report.unexpected_keys}
