"""M3P (`image_embeddings: "m3p"`): VOLTA's M3PForVLTasks around an XLM-style cross-modal transformer.

Only the embeddings, the N post-LN layers and the pooler take part in the forward pass; the other modules
of the original checkpoint (refine/alignment/latent heads) are built so that its keys load and save.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .config import M3PConfig
from .modeling import EncoderOutput, TasksModel, default_masks

M3P_FEATURE_SIZE = 2048   # hard-coded in M3P, whatever v_feature_size says
M3P_NUM_LOCS = 5
M3P_POSITIONS = 514
M3P_LN_EPS = 1e-12


class MultiHeadAttention(nn.Module):
    def __init__(self, heads: int, D: int, dropout: float, names=("q_lin", "k_lin", "v_lin", "out_lin")):
        super().__init__()
        self.heads, self.dropout = heads, dropout
        for name in names:
            setattr(self, name, nn.Linear(D, D))

    def forward(self, x: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
        B, N, D = x.shape
        h, dh = self.heads, D // self.heads

        def split(t):
            return t.view(B, N, h, dh).transpose(1, 2)
        q, k, v = split(self.q_lin(x)), split(self.k_lin(x)), split(self.v_lin(x))
        p = self.dropout if self.training else 0.0
        if x.dtype == torch.float64:
            # M3P computes the softmax in float32 even in a float64 run; reproduce that exactly.
            scores = (q / dh ** 0.5) @ k.transpose(-1, -2)
            scores = scores.masked_fill(~keep[:, None, None, :], float("-inf"))
            w = F.dropout(F.softmax(scores.float(), -1).type_as(scores), p, self.training)
            ctx = w @ v
        else:
            ctx = F.scaled_dot_product_attention(q, k, v, attn_mask=keep[:, None, None, :], dropout_p=p)
        return self.out_lin(ctx.transpose(1, 2).reshape(B, N, D))


class FeedForward(nn.Module):
    def __init__(self, D: int, inner: int, dropout: float):
        super().__init__()
        self.lin1, self.lin2, self.dropout = nn.Linear(D, inner), nn.Linear(inner, D), dropout

    def forward(self, x):
        return F.dropout(self.lin2(F.gelu(self.lin1(x))), self.dropout, self.training)


class ImageEmbeddings(nn.Module):
    def __init__(self, D: int):
        super().__init__()
        self.image_embeddings = nn.Linear(M3P_FEATURE_SIZE, D)
        self.image_distbution_embeddings = nn.Linear(1600, D)   # unused by the forward pass, as in M3P
        self.image_location_embeddings = nn.Linear(M3P_NUM_LOCS, D)
        self.LayerNorm = nn.LayerNorm(D, eps=M3P_LN_EPS)

    def forward(self, feat, loc):
        return self.LayerNorm(self.image_embeddings(feat) + self.image_location_embeddings(loc))


def _linears(n: int, width_in: int, width_out: int) -> nn.ModuleList:
    return nn.ModuleList(nn.Linear(width_in, width_out) for _ in range(n))


class _Named(nn.Module):
    def __init__(self, **modules):
        super().__init__()
        for name, m in modules.items():
            setattr(self, name, m)


def _refine_layer(D: int) -> nn.Module:
    return _Named(self_attn=_Named(linears=_linears(3, D, D), aoa_layer=nn.Sequential(nn.Linear(2 * D, 2 * D))),
                  feed_forward=_Named(lin1=nn.Linear(D, 4 * D), lin2=nn.Linear(4 * D, D)),
                  sublayer=nn.ModuleList(_Named(norm=nn.LayerNorm(D)) for _ in range(2)))


class M3PTransformer(nn.Module):
    """`bert.encoder`: the XLM-style transformer; module names are the original checkpoint's keys."""

    def __init__(self, config: M3PConfig):
        super().__init__()
        D, N, heads = config.emb_dim, config.n_layers, config.n_heads
        self.n_layers, self.dropout = N, config.dropout
        self.position_embeddings = nn.Embedding(M3P_POSITIONS, D)
        if config.n_langs > 1:
            self.cross_lang_embeddings = nn.Embedding(config.n_langs, D)
        self.embeddings = nn.Embedding(config.n_words, D, padding_idx=config.pad_index)
        self.layer_norm_emb = nn.LayerNorm(D, eps=M3P_LN_EPS)
        self.image_embeddings = ImageEmbeddings(D)
        self.refine_embeddings = _Named(layers=nn.ModuleList(_refine_layer(D) for _ in range(config.refine_layers)),
                                        norm=nn.LayerNorm(D))
        self.cross_alignment = _Named(att_weight_c=nn.Linear(D, 1), att_weight_q=nn.Linear(D, 1),
                                      att_weight_cq=nn.Linear(D, 1), align_output=nn.Linear(D, D),
                                      layer_norm=nn.LayerNorm(D))
        self.attentions = nn.ModuleList(MultiHeadAttention(heads, D, config.attention_dropout) for _ in range(N))
        self.layer_norm1 = nn.ModuleList(nn.LayerNorm(D, eps=M3P_LN_EPS) for _ in range(N))
        self.ffns = nn.ModuleList(FeedForward(D, 4 * D, config.dropout) for _ in range(N))
        self.layer_norm2 = nn.ModuleList(nn.LayerNorm(D, eps=M3P_LN_EPS) for _ in range(N))
        self.layer_norm15 = nn.ModuleList(nn.LayerNorm(D, eps=M3P_LN_EPS) for _ in range(N))
        self.encoder_attn = nn.ModuleList(MultiHeadAttention(heads, D, config.attention_dropout) for _ in range(N))
        self.latent_transforms = nn.ModuleList(
            _Named(x_to_mu=nn.Linear(D, D), x_to_logvar=nn.Linear(D, D), out_dense=nn.Linear(2 * D, D))
            for _ in range(2))
        self.original_transforms = nn.ModuleList(
            _Named(dense=nn.Linear(D, D), dense_mu=nn.Linear(D, D), LayerNorm=nn.LayerNorm(D)) for _ in range(2))
        self.pooled_layer = _Named(dense=nn.Linear(D, D))
        self.seq_relationship = nn.Linear(D, 1)
        self.pooled_layer2 = _Named(dense=nn.Linear(D, D))
        self.seq_relationship2 = nn.Linear(D, 1)
        self.mrfr_dense = nn.Linear(D, M3P_FEATURE_SIZE)
        self.transformer_obj = _Named(dense=nn.Linear(D, D), LayerNorm=nn.LayerNorm(D))

    def forward(self, input_txt, input_imgs, image_loc, attention_mask, image_attention_mask):
        B, L = input_txt.shape
        R = input_imgs.shape[1]
        lengths = attention_mask.sum(1) + image_attention_mask.sum(1)
        # Quirk kept (the numbers depend on it): the mask covers the first li+lt slots of [image || text],
        # wherever the padding really is.
        keep = torch.arange(R + L, device=input_txt.device)[None] < lengths[:, None]       # [B, R+L]
        x = torch.cat([self.image_embeddings(input_imgs, image_loc), self.embeddings(input_txt)], 1)
        x = x + self.position_embeddings.weight[: R + L]
        zero_masked = keep[..., None].to(x.dtype)
        x = self.layer_norm_emb(x * zero_masked)
        x = F.dropout(x, self.dropout, self.training)
        for i in range(self.n_layers):
            a = F.dropout(self.attentions[i](x, keep), self.dropout, self.training)
            x = self.layer_norm1[i](x + a)
            x = self.layer_norm2[i](x + self.ffns[i](x))
            x = x * zero_masked
        return x, torch.tanh(self.pooled_layer.dense(x[:, 0]))


class M3PModel(nn.Module):
    def __init__(self, config: M3PConfig):
        super().__init__()
        self.encoder = M3PTransformer(config)
        self.pooler = self.encoder.pooled_layer   # alias key bert.pooler.dense.*


class M3PTasksModel(TasksModel):
    """VOLTA's M3PForVLTasks: backbone `bert` (M3PModel), heads on the pooled first position."""

    region_heads = False

    def build_backbone(self, config: M3PConfig) -> nn.Module:
        return M3PModel(config)

    def encode(self, input_txt, input_imgs, image_loc, token_type_ids=None, attention_mask=None,
               image_attention_mask=None) -> tuple[EncoderOutput, torch.Tensor]:
        """The joint sequence is [image || text]: `seq_v` is its first R rows, `seq_t` the rest."""
        attention_mask, image_attention_mask = default_masks(input_txt, input_imgs, attention_mask,
                                                             image_attention_mask)
        joint, pooled = self.bert.encoder(input_txt, input_imgs, image_loc, attention_mask, image_attention_mask)
        regions = input_imgs.shape[1]
        out = EncoderOutput(seq_t=joint[:, regions:], seq_v=joint[:, :regions], pooled_t=pooled, pooled_v=None)
        return out, pooled
