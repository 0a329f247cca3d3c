"""Building blocks of VOLTA's unified encoder: activations, masks and the two sub-layer kinds.

Every encoder sub-layer maps (text states, vision states) to a new pair. An attention sub-layer holds
any of text->text (tt), text->vision (tv), vision->text (vt) and vision->vision (vv) attention; a
feed-forward sub-layer holds a text and/or a vision block. `shared` sub-layers use one set of weights for
both modalities; the vision names (`v_query`, `v_dense`, ...) are then registered as aliases of the text
modules, so state dicts carry both names exactly as VOLTA's do.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .config import ConfigError, VLConfig

MASK_VALUE = -10000.0  # VOLTA's additive mask value; -inf gives the same numbers (no row is fully masked)


def swish(x: torch.Tensor) -> torch.Tensor:
    return x * torch.sigmoid(x)


ACT2FN = {"gelu": F.gelu, "relu": F.relu, "swish": swish}  # F.gelu is the exact erf form VOLTA uses


def get_activation(name):
    return ACT2FN[name] if isinstance(name, str) else name


def vision_activation(config: VLConfig):
    # VOLTA quirk: v_hidden_act is only consulted when hidden_act is a string.
    return get_activation(config.v_hidden_act if isinstance(config.hidden_act, str) else config.hidden_act)


def additive_mask(mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """[B, N] keep(1)/pad(0) mask -> [B, 1, 1, N] additive mask of 0 / -10000 in `dtype`."""
    return ((1.0 - mask[:, None, None, :].to(dtype)) * MASK_VALUE).to(dtype)


def _size(overrides: dict, n: int, default: int) -> int:
    return int(overrides.get(str(n), default))


class SublayerSpec:
    """What one sub-layer number means under a config."""

    def __init__(self, config: VLConfig, n: int):
        self.n = n
        self.tt = n in config.tt_attn_sublayers
        self.tv = n in config.tv_attn_sublayers
        self.vt = n in config.vt_attn_sublayers
        self.vv = n in config.vv_attn_sublayers
        self.t_ff = n in config.t_ff_sublayers
        self.v_ff = n in config.v_ff_sublayers
        self.shared = n in config.shared_sublayers
        self.single_ln = n in config.single_ln_sublayers
        self.is_attention = self.tt or self.tv or self.vt or self.vv
        self.is_ff = self.t_ff or self.v_ff


def encoder_specs(config: VLConfig) -> list[SublayerSpec]:
    attn = set(config.tt_attn_sublayers) | set(config.tv_attn_sublayers) | \
        set(config.vt_attn_sublayers) | set(config.vv_attn_sublayers)
    ff = set(config.t_ff_sublayers) | set(config.v_ff_sublayers)
    both = attn & ff
    if both:
        raise ConfigError(f"{config.source}: sublayers {sorted(both)} are listed both as attention and as "
                          "feed-forward sublayers")
    numbers = sorted(attn | ff)
    if numbers != list(range(len(numbers))):
        missing = sorted(set(range(max(numbers, default=-1) + 1)) - set(numbers))
        raise ConfigError(f"{config.source}: sublayer numbers must be 0..N-1 without gaps; missing {missing}")
    return [SublayerSpec(config, n) for n in numbers]


class AttentionProjections(nn.Module):
    """`attention_self`: query/key/value projections of one or both modalities."""

    def __init__(self, config: VLConfig, spec: SublayerSpec):
        super().__init__()
        n = spec.n
        self.has_text = spec.tt or spec.tv
        self.has_vision = spec.vv or spec.vt
        if (spec.vt and not self.has_text) or (spec.tv and not self.has_vision):
            raise ConfigError(f"{config.source}: sublayer {n} has cross-modal attention (tv/vt) without "
                              "the matching projections; pair tv with vt (VOLTA crashes at run time here)")
        self.A = _size(config.sublayer2attn_hidden_size, n, config.hidden_size)
        self.h = _size(config.sublayer2num_attention_heads, n, config.num_attention_heads)
        self.Av = _size(config.sublayer2v_attn_hidden_size, n, config.v_hidden_size)
        self.hv = _size(config.sublayer2v_num_attention_heads, n, config.v_num_attention_heads)
        if self.A % self.h or self.Av % self.hv:
            raise ConfigError(f"{config.source}: sublayer {n}: attention width {self.A}/{self.Av} is not a "
                              f"multiple of the number of heads {self.h}/{self.hv}")
        if (spec.tv or spec.vt) and (self.A != self.Av or self.h != self.hv):
            raise ConfigError(f"{config.source}: sublayer {n}: cross-attention needs equal text and vision "
                              f"attention sizes and heads, got {self.A}/{self.h} vs {self.Av}/{self.hv}")
        if self.has_text:
            self.query = nn.Linear(config.hidden_size, self.A)
            self.key = nn.Linear(config.hidden_size, self.A)
            self.value = nn.Linear(config.hidden_size, self.A)
        if self.has_vision:
            if self.has_text and spec.shared:
                if config.hidden_size != config.v_hidden_size or self.A != self.Av:
                    raise ConfigError(f"{config.source}: shared sublayer {n} needs equal text and vision sizes")
                self.v_query, self.v_key, self.v_value = self.query, self.key, self.value
            else:
                self.v_query = nn.Linear(config.v_hidden_size, self.Av)
                self.v_key = nn.Linear(config.v_hidden_size, self.Av)
                self.v_value = nn.Linear(config.v_hidden_size, self.Av)


class AttentionOutput(nn.Module):
    """`attention_output`: output projection, dropout, residual and post-LayerNorm per modality."""

    def __init__(self, config: VLConfig, spec: SublayerSpec, proj: AttentionProjections):
        super().__init__()
        eps = config.layer_norm_eps
        if proj.has_text:
            self.dense = nn.Linear(proj.A, config.hidden_size)
            self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=eps)
            self.dropout = nn.Dropout(config.hidden_dropout_prob)
        if proj.has_vision:
            if proj.has_text and spec.shared:
                self.v_dense, self.v_LayerNorm, self.v_dropout = self.dense, self.LayerNorm, self.dropout
            else:
                self.v_dense = nn.Linear(proj.Av, config.v_hidden_size)
                # VOLTA quirk kept: this LayerNorm has width Av (equal to Hv in every shipped config).
                self.v_LayerNorm = nn.LayerNorm(proj.Av, eps=eps)
                self.v_dropout = nn.Dropout(config.v_hidden_dropout_prob)


def _heads(x: torch.Tensor, h: int) -> torch.Tensor:
    b, n, a = x.shape
    return x.view(b, n, h, a // h).transpose(1, 2)


def _qkv(q: nn.Linear, k: nn.Linear, v: nn.Linear, x: torch.Tensor, h: int):
    """Query, key and value heads from one GEMM over the concatenated weights (the three Linear modules
    keep their own parameters, so state-dict keys do not change); the outputs are strided views."""
    w = torch.cat([q.weight, k.weight, v.weight])
    b = torch.cat([q.bias, k.bias, v.bias])
    return [_heads(y, h) for y in F.linear(x, w, b).chunk(3, -1)]


def _merge(x: torch.Tensor) -> torch.Tensor:
    b, h, n, d = x.shape
    return x.transpose(1, 2).reshape(b, n, h * d)


def _attend(q, k, v, mask, p: float) -> torch.Tensor:
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask.to(q.dtype), dropout_p=p)


class AttentionSublayer(nn.Module):
    def __init__(self, config: VLConfig, spec: SublayerSpec):
        super().__init__()
        self.spec = spec
        self.attention_self = AttentionProjections(config, spec)
        self.attention_output = AttentionOutput(config, spec, self.attention_self)
        self.p_text = config.attention_probs_dropout_prob
        self.p_vision = config.attention_probs_dropout_prob if spec.shared else config.v_attention_probs_dropout_prob
        # One joint attention over [text || vision] when both sides use the same weights and see everything.
        self.joint = spec.shared and spec.tt and spec.tv and spec.vt and spec.vv

    def forward_joint(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """Single-stream path on the concatenation x = [text || vision] with mask [B,1,1,L+R]."""
        sa, out = self.attention_self, self.attention_output
        q, k, v = _qkv(sa.query, sa.key, sa.value, x, sa.h)
        ctx = _attend(q, k, v, mask, self.p_text if self.training else 0.0)
        return out.LayerNorm(out.dropout(out.dense(_merge(ctx))) + x)

    def forward(self, t, v, mt, mv):
        if self.joint:
            L = t.shape[1]
            y = self.forward_joint(torch.cat([t, v], 1), torch.cat([mt, mv], -1))
            return y[:, :L], y[:, L:]
        s, sa, out = self.spec, self.attention_self, self.attention_output
        # A modality passed as None is not computed (pair-independent prefix, see VLEncoder.forward_prefix).
        has_text, has_vision = sa.has_text and t is not None, sa.has_vision and v is not None
        qt = kt = vt_ = qv = kv = vv_ = None
        if has_text:
            qt, kt, vt_ = _qkv(sa.query, sa.key, sa.value, t, sa.h)
        if has_vision:
            qv, kv, vv_ = _qkv(sa.v_query, sa.v_key, sa.v_value, v, sa.hv)
        t_new, v_new = t, v
        if has_text:
            keys = [(kt, vt_, mt)] if s.tt else []
            keys += [(kv, vv_, mv)] if s.tv else []
            ctx = self._attend_keys(qt, keys, self.p_text)
            t_new = out.LayerNorm(out.dropout(out.dense(ctx)) + t)
        if has_vision:
            keys = [(kt, vt_, mt)] if s.vt else []
            keys += [(kv, vv_, mv)] if s.vv else []
            ctx = self._attend_keys(qv, keys, self.p_vision)
            v_new = out.v_LayerNorm(out.v_dropout(out.v_dense(ctx)) + v)
        return t_new, v_new

    def _attend_keys(self, q, keys, p):
        # One softmax over all key groups (VOLTA's "gated" softmax over [text keys || vision keys]).
        if len(keys) == 1:
            k, v, m = keys[0]
        else:
            k = torch.cat([g[0] for g in keys], 2)
            v = torch.cat([g[1] for g in keys], 2)
            m = torch.cat([g[2] for g in keys], -1)
        return _merge(_attend(q, k, v, m, p if self.training else 0.0))


class Intermediate(nn.Module):
    def __init__(self, config: VLConfig, spec: SublayerSpec, I: int, Iv: int):
        super().__init__()
        if spec.t_ff:
            self.dense = nn.Linear(config.hidden_size, I)
        if spec.v_ff:
            if spec.t_ff and spec.shared:
                self.v_dense = self.dense
            else:
                self.v_dense = nn.Linear(config.v_hidden_size, Iv)


class FFOutput(nn.Module):
    def __init__(self, config: VLConfig, spec: SublayerSpec, I: int, Iv: int):
        super().__init__()
        eps = config.layer_norm_eps
        if spec.t_ff:
            self.dense = nn.Linear(I, config.hidden_size)
            self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=eps)
            self.dropout = nn.Dropout(config.hidden_dropout_prob)
        if spec.v_ff:
            if spec.t_ff and spec.shared:
                self.v_dense, self.v_LayerNorm, self.v_dropout = self.dense, self.LayerNorm, self.dropout
            else:
                self.v_dense = nn.Linear(Iv, config.v_hidden_size)
                self.v_LayerNorm = nn.LayerNorm(config.v_hidden_size, eps=eps)
                self.v_dropout = nn.Dropout(config.v_hidden_dropout_prob)


class FeedForwardSublayer(nn.Module):
    def __init__(self, config: VLConfig, spec: SublayerSpec):
        super().__init__()
        n = spec.n
        self.spec = spec
        I = _size(config.sublayer2intermediate_size, n, config.intermediate_size)
        Iv = _size(config.sublayer2v_intermediate_size, n, config.v_intermediate_size)
        if spec.shared and spec.t_ff and spec.v_ff and (I != Iv or config.hidden_size != config.v_hidden_size):
            raise ConfigError(f"{config.source}: shared feed-forward sublayer {n} needs equal text and "
                              "vision sizes")
        self.intermediate = Intermediate(config, spec, I, Iv)
        self.output = FFOutput(config, spec, I, Iv)
        self.act = get_activation(config.hidden_act)
        self.v_act = vision_activation(config)
        self.joint = spec.shared and spec.t_ff and spec.v_ff and self.act is self.v_act

    def forward_joint(self, x: torch.Tensor) -> torch.Tensor:
        o = self.output
        return o.LayerNorm(o.dropout(o.dense(self.act(self.intermediate.dense(x)))) + x)

    def forward(self, t, v, mt=None, mv=None):
        o, i = self.output, self.intermediate
        if self.spec.t_ff and t is not None:
            t = o.LayerNorm(o.dropout(o.dense(self.act(i.dense(t)))) + t)
        if self.spec.v_ff and v is not None:
            v = o.v_LayerNorm(o.v_dropout(o.v_dense(self.v_act(i.v_dense(v)))) + v)
        return t, v


class VLEncoder(nn.Module):
    """The sub-layers in number order; `layer.<n>` keys match VOLTA's state dicts."""

    def __init__(self, config: VLConfig):
        super().__init__()
        specs = encoder_specs(config)
        self.layer = nn.ModuleList(
            AttentionSublayer(config, s) if s.is_attention else FeedForwardSublayer(config, s) for s in specs)
        # Single-stream models (every sub-layer shared over both modalities) run on one concatenated
        # tensor end to end, which saves a concat/split per sub-layer.
        self.all_joint = len(self.layer) > 0 and all(m.joint for m in self.layer)
        # Leading sub-layers where neither modality reads the other (dual-stream text-only / vision-only
        # layers): their outputs depend on one caption or one image alone, not on the pair.
        cross = [s.n for s in specs if s.tv or s.vt]
        self.cross_start = 0 if self.all_joint else (cross[0] if cross else len(specs))

    def forward_prefix(self, t, v, mt, mv):
        """Sub-layers before `cross_start` on one modality or both; None skips a modality, and text and
        vision may have different batch sizes since nothing here mixes them."""
        for m in self.layer[:self.cross_start]:
            t, v = m(t, v, mt, mv)
        return t, v

    def forward(self, t, v, mt, mv, output_all_encoded_layers: bool = False, start: int = 0):
        """Returns (list of text states, list of vision states): [input, ..., final]. `start` > 0 resumes
        after states that already went through sub-layers [0, start) (see `forward_prefix`)."""
        all_t, all_v = [t], [v]
        if self.all_joint and start == 0:
            L = t.shape[1]
            x, mask = torch.cat([t, v], 1), torch.cat([mt, mv], -1)
            for m in self.layer:
                x = m.forward_joint(x, mask) if isinstance(m, AttentionSublayer) else m.forward_joint(x)
                if output_all_encoded_layers:
                    all_t.append(x[:, :L])
                    all_v.append(x[:, L:])
            if not output_all_encoded_layers:
                all_t.append(x[:, :L])
                all_v.append(x[:, L:])
            return all_t, all_v
        for m in self.layer[start:]:
            t, v = m(t, v, mt, mv)
            if output_all_encoded_layers:
                all_t.append(t)
                all_v.append(v)
        if not output_all_encoded_layers:
            all_t.append(t)
            all_v.append(v)
        return all_t, all_v


def init_weights(module: nn.Module, std: float) -> None:
    """VOLTA's init: N(0, initializer_range) for every Linear/Embedding weight (padding rows included),
    zero Linear biases. LayerNorms keep their construction values, as in VOLTA without apex."""
    for m in module.modules():
        if isinstance(m, (nn.Linear, nn.Embedding)):
            nn.init.normal_(m.weight, mean=0.0, std=std)
        if isinstance(m, nn.Linear) and m.bias is not None:
            nn.init.zeros_(m.bias)
