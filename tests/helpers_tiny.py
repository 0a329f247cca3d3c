"""Tiny model configs and batches built from the real family configs (shrunk), for fast tests."""
from __future__ import annotations

import torch

from volta_ml.models import load_config

IGLUE_TASKS = {
    "TASK19": {"name": "XVNLI", "type": "VL-tri-classifier", "num_labels": 3},
    "TASK15": {"name": "GQA", "type": "VL-classifier-GQA", "num_labels": 7},
    "TASK12": {"name": "NLVR2", "type": "VL-binary-classifier", "num_labels": 2},
    "TASK8": {"name": "RetrievalxFlickrCO", "type": "VL-logit", "num_labels": 1},
}


def tiny_config(family: str = "ctrl_uniter_base", hidden: int = 32, layers: int = 2, vocab: int = 100,
                feature_size: int = 16):
    """A shrunken copy of a shipped config: same family semantics, `layers` BERT layers."""
    base = load_config(family).to_dict()
    base.update(hidden_size=hidden, v_hidden_size=hidden, num_attention_heads=4, v_num_attention_heads=4,
                intermediate_size=2 * hidden, v_intermediate_size=2 * hidden, pooler_size=hidden,
                v_pooler_size=hidden, clf_hidden_size=2 * hidden, vocab_size=vocab, max_position_embeddings=64,
                v_feature_size=feature_size)
    if base["image_embeddings"] == "m3p":
        base.update(emb_dim=hidden, n_heads=4, n_layers=layers, n_words=vocab, n_langs=1, refine_layers=1)
        return load_config(base, is_m3p=True)
    if base["image_embeddings"] == "vl-bert":
        base["v_coordinate_embeddings_dim"] = feature_size // 8
    for key in ("sublayer2attn_hidden_size", "sublayer2num_attention_heads", "sublayer2intermediate_size",
                "sublayer2v_attn_hidden_size", "sublayer2v_num_attention_heads", "sublayer2v_intermediate_size"):
        base[key] = {}
    if base["image_embeddings"] in ("vilbert", "lxmert"):
        return load_config(base)
    n = 2 * layers   # single-stream: even = joint attention, odd = joint feed-forward, all shared
    base.update(tt_attn_sublayers=list(range(0, n, 2)), tv_attn_sublayers=list(range(0, n, 2)),
                vt_attn_sublayers=list(range(0, n, 2)), vv_attn_sublayers=list(range(0, n, 2)),
                t_ff_sublayers=list(range(1, n, 2)), v_ff_sublayers=list(range(1, n, 2)),
                shared_sublayers=list(range(n)), single_ln_sublayers=list(range(n)),
                bert_layer2attn_sublayer={str(i): 2 * i for i in range(layers)},
                bert_layer2ff_sublayer={str(i): 2 * i + 1 for i in range(layers)})
    return load_config(base)


def tiny_batch(config, batch: int = 4, text_len: int = 8, regions: int = 6, seed: int = 0) -> dict:
    g = torch.Generator().manual_seed(seed)
    vocab = config.n_words if config.is_m3p else config.vocab_size
    ids = torch.randint(5, vocab, (batch, text_len), generator=g)
    mask = torch.ones(batch, text_len, dtype=torch.long)
    mask[1:, text_len - 2:] = 0
    ids[mask == 0] = config.pad_token_id if config.text_model == "roberta" else 0
    feat_dim = 2048 if config.is_m3p else config.v_feature_size
    locs = 5 if config.is_m3p else config.num_locs
    image_mask = torch.ones(batch, regions, dtype=torch.long)
    image_mask[0, regions - 2:] = 0
    feats = torch.rand(batch, regions, feat_dim, generator=g) * image_mask[..., None]
    loc = torch.rand(batch, regions, locs, generator=g) * image_mask[..., None]
    return dict(input_txt=ids, input_imgs=feats, image_loc=loc, token_type_ids=torch.zeros_like(ids),
                attention_mask=mask, image_attention_mask=image_mask)
