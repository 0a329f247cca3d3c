"""VL-BERT's joint embedding (`image_embeddings: "vl-bert"`)."""
from __future__ import annotations

import torch
from torch import nn

from .config import ConfigError, VLConfig


def box_sinusoids(image_loc: torch.Tensor, dim: int) -> torch.Tensor:
    """[B,R,>=4] normalised (x1,y1,x2,y2,...) -> [B,R,8*dim] sin/cos of (xc,yc,w,h)*100, coordinate-major."""
    x1, y1, x2, y2 = image_loc[..., 0], image_loc[..., 1], image_loc[..., 2], image_loc[..., 3]
    geom = torch.stack([(x1 + x2) / 2, (y1 + y2) / 2, x2 - x1, y2 - y1], -1) * 100.0   # [B,R,4]
    k = torch.arange(dim, device=image_loc.device, dtype=image_loc.dtype)
    div = torch.pow(torch.tensor(1000.0, dtype=image_loc.dtype, device=image_loc.device), k / dim)
    angles = geom[..., None] / div                                                    # [B,R,4,dim]
    return torch.cat([angles.sin(), angles.cos()], -1).flatten(-2)                    # [B,R,4*2*dim]


class VLBertEmbeddings(nn.Module):
    def __init__(self, config: VLConfig):
        super().__init__()
        H, Hv, F = config.hidden_size, config.v_hidden_size, config.v_feature_size
        d = config.v_coordinate_embeddings_dim
        if d is None or 8 * d != F:
            raise ConfigError(f"{config.source}: vl-bert needs v_coordinate_embeddings_dim with 8*dim == "
                              f"v_feature_size ({F}), got {d}")
        if config.type_vocab_size < 3:
            raise ConfigError(f"{config.source}: vl-bert needs type_vocab_size >= 3 (objects use type 2)")
        self.coord_dim = d
        self.obj_downsample = nn.Sequential(nn.Dropout(config.v_attention_probs_dropout_prob),
                                            nn.Linear(2 * F, Hv), nn.ReLU(inplace=False))
        self.object_linguistic_embeddings = nn.Embedding(1, H)
        if float(config.visual_target_weights.get("6", 0) or 0) > 0:
            self.object_mask_word_embedding = nn.Embedding(1, H)
        else:
            self.object_mask_word_embedding = None
        self.object_mask_visual_embedding = nn.Embedding(1, F)
        self.end_embedding = nn.Embedding(1, H)
        self.word_embeddings = nn.Embedding(config.vocab_size, H, padding_idx=0)
        self.position_embeddings = nn.Embedding(config.max_position_embeddings, H)
        self.token_type_embeddings = nn.Embedding(config.type_vocab_size, H)
        if Hv != H:
            self.visual_1x1_text = nn.Linear(Hv, H)
            self.visual_1x1_object = nn.Linear(Hv, H)
        else:
            self.visual_1x1_text = self.visual_1x1_object = None
        self.visual_ln_text = nn.LayerNorm(H, eps=config.layer_norm_eps)
        self.visual_ln_object = nn.LayerNorm(H, eps=config.layer_norm_eps)
        self.LayerNorm = nn.LayerNorm(H, eps=config.layer_norm_eps)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)
        # VL-BERT starts its visual LayerNorms at weight 0 so the visual input fades in during training.
        nn.init.zeros_(self.visual_ln_text.weight)
        nn.init.zeros_(self.visual_ln_object.weight)

    def forward(self, input_ids, image_feat, image_loc, token_type_ids=None):
        B, L = input_ids.shape
        R = image_feat.shape[1]
        # All-zero regions (padding, or masked for pretraining) take the learned mask feature. VOLTA writes
        # this into the caller's tensor; we compute the same values without touching the input.
        masked = (image_feat == 0).all(-1)                                   # [B,R]
        feat = torch.where(masked[..., None], self.object_mask_visual_embedding.weight[0].to(image_feat.dtype),
                           image_feat)
        final = self.obj_downsample(torch.cat([box_sinusoids(image_loc, self.coord_dim), feat], -1))
        obj_in = self.visual_1x1_object(final) if self.visual_1x1_object is not None else final
        txt_in = self.visual_1x1_text(final[:, -1]) if self.visual_1x1_text is not None else final[:, -1]

        text_end = (input_ids != 0).sum(1)                                   # VOLTA hard-codes pad id 0
        # Quirk kept (the numbers depend on it): VOLTA shifts text positions through a view shared by all
        # rows, so every row's positions j >= min(text_end) move by R, whatever its own length.
        text_pos = torch.arange(L, device=input_ids.device)
        text_pos = torch.where(text_pos >= text_end.min(), text_pos + R, text_pos).expand(B, L)
        obj_pos = text_end[:, None].expand(B, R).clone()
        obj_pos[:, -1] += 1

        ling = self.object_linguistic_embeddings.weight[0].expand(B, R, -1)
        if self.object_mask_word_embedding is not None:
            ling = torch.where(masked[..., None], self.object_mask_word_embedding.weight[0], ling)
        last = torch.zeros(R, dtype=torch.bool, device=input_ids.device)
        last[-1] = True
        ling = torch.where(last[None, :, None], self.end_embedding.weight[0], ling)

        types = self.token_type_embeddings
        objects = self.visual_ln_object(obj_in) + ling + self.position_embeddings(obj_pos) + types.weight[2]
        text = self.word_embeddings(input_ids) + self.visual_ln_text(txt_in)[:, None] + \
            self.position_embeddings(text_pos) + \
            types(torch.zeros_like(input_ids) if token_type_ids is None else token_type_ids)
        return self.dropout(self.LayerNorm(text)), self.dropout(self.LayerNorm(objects))
