"""Tiny caption sets and galleries for the retrieval tests."""
from __future__ import annotations

import torch

from volta_ml.models import build_model

TASK8 = {"TASK8": {"name": "RetrievalxFlickrCO", "type": "VL-logit", "num_labels": 1}}


def tiny_captions(config, n: int, max_len: int = 12, seed: int = 0) -> dict:
    """Captions of varying length, padded at the end as VOLTA's datasets do."""
    g = torch.Generator().manual_seed(seed)
    vocab = config.n_words if config.is_m3p else config.vocab_size
    pad = config.pad_token_id if (config.is_m3p or config.text_model == "roberta") else 0
    ids = torch.full((n, max_len), pad)
    mask = torch.zeros(n, max_len, dtype=torch.long)
    for i in range(n):
        length = int(torch.randint(3, max_len - 2, (1,), generator=g))
        ids[i, :length] = torch.randint(5, vocab, (length,), generator=g)
        mask[i, :length] = 1
    return {"input_txt": ids, "attention_mask": mask, "token_type_ids": torch.zeros_like(ids)}


def tiny_gallery(config, n: int, regions: int = 9, seed: int = 1) -> dict:
    g = torch.Generator().manual_seed(seed)
    feat_dim = 2048 if config.is_m3p else config.v_feature_size
    locs = 5 if config.is_m3p else config.num_locs
    mask = torch.zeros(n, regions, dtype=torch.long)
    for i in range(n):
        mask[i, :int(torch.randint(2, regions + 1, (1,), generator=g))] = 1
    feats = torch.rand(n, regions, feat_dim, generator=g) * mask[..., None]
    loc = torch.rand(n, regions, locs, generator=g) * mask[..., None]
    return {"input_imgs": feats, "image_loc": loc, "image_attention_mask": mask}


def tiny_model(config, kind: str = "tasks", seed: int = 0):
    torch.manual_seed(seed)
    return build_model(config, TASK8 if kind == "tasks" else None, ["TASK8"] if kind == "tasks" else None,
                       kind=kind).eval()


