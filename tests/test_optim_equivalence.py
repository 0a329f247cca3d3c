"""VoltaAdamW's fused step against pytorch-transformers' per-tensor AdamW over 100 steps.

Tolerance (fp32). The fused kernel computes the same formula with the step size and the decay folded
together (and m as a lerp), so each step rounds differently from the per-tensor loop. With a fixed
gradient sequence, after 100 steps both fp32 results are equally far from a float64 run of the formula
(ours within 1.5x of the per-tensor loop's own error; measured 0.5-1.35x) and at most 16 fp32 ulps of
the tensor's largest value apart (measured <= 7.5). When gradients come from a model (frozen layers,
groups), the two trajectories feed their rounding back through the forward pass: parameters agree
within 1e-5 x max(1, |p|) in fp32 and 1e-4 x max(1, |p|) under fp16 autocast + GradScaler, moments
within 10x that relative to the tensor's largest moment.
"""
import math

import pytest
import torch
from torch import nn

from volta_ml.engine.optim import VoltaAdamW, freeze_fixed_layers, parameter_groups



class PerTensorAdamW(torch.optim.Optimizer):
    """pytorch_transformers.optimization.AdamW's loop, written from its formula (modern call signatures)."""

    def __init__(self, params, lr, betas=(0.9, 0.999), eps=1e-6, weight_decay=0.0, correct_bias=True):
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay,
                                      correct_bias=correct_bias))

    @torch.no_grad()
    def step(self, closure=None):
        for group in self.param_groups:
            beta1, beta2 = group["betas"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                if not state:
                    state.update(step=0, exp_avg=torch.zeros_like(p), exp_avg_sq=torch.zeros_like(p))
                state["step"] += 1
                m, v = state["exp_avg"], state["exp_avg_sq"]
                m.mul_(beta1).add_(p.grad, alpha=1.0 - beta1)
                v.mul_(beta2).addcmul_(p.grad, p.grad, value=1.0 - beta2)
                denom = v.sqrt().add_(group["eps"])
                step_size = group["lr"]
                if group["correct_bias"]:
                    step_size = step_size * math.sqrt(1.0 - beta2 ** state["step"]) / (1.0 - beta1 ** state["step"])
                p.addcdiv_(m, denom, value=-step_size)
                if group["weight_decay"] > 0.0:
                    p.add_(p, alpha=-group["lr"] * group["weight_decay"])


class Tiny(nn.Module):
    def __init__(self):
        super().__init__()
        self.embeddings = nn.Embedding(50, 16)
        self.dense = nn.Linear(16, 32)
        self.LayerNorm = nn.LayerNorm(32)
        self.out = nn.Linear(32, 4)
        self.unused = nn.Linear(4, 4)   # requires grad, never gets one

    def forward(self, ids):
        return self.out(self.LayerNorm(torch.tanh(self.dense(self.embeddings(ids))))).mean(1)


def _pair(fixed=()):
    torch.manual_seed(0)
    a = Tiny()
    b = Tiny()
    b.load_state_dict(a.state_dict())
    for m in (a, b):
        freeze_fixed_layers(m, fixed)
    return a, b


def _batches(n, seed=1):
    g = torch.Generator().manual_seed(seed)
    return [(torch.randint(0, 50, (6, 5), generator=g), torch.randint(0, 4, (6,), generator=g)) for _ in range(n)]


def _train(model, opt, batches, lrs, scaler=None, amp_dtype=None):
    for (ids, y), lr in zip(batches, lrs):
        for group in opt.param_groups:
            group["lr"] = lr
        with torch.autocast("cpu", dtype=amp_dtype or torch.float16, enabled=amp_dtype is not None):
            loss = nn.functional.cross_entropy(model(ids).float(), y)
        if scaler is None:
            loss.backward()
            opt.step()
        else:
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
        opt.zero_grad(set_to_none=True)


def _assert_close(ours, ref, opt_ours, opt_ref, rel=1e-5):
    for (name, p), q in zip(ours.named_parameters(), ref.parameters()):
        assert ((p - q).abs() / q.abs().clamp_min(1.0)).max().item() <= rel, name
    for p, q in zip(ours.parameters(), ref.parameters()):
        assert set(opt_ours.state[p]) == set(opt_ref.state[q])
        if opt_ref.state[q]:
            assert opt_ours.state[p]["step"] == opt_ref.state[q]["step"]
            for key in ("exp_avg", "exp_avg_sq"):
                a, b = opt_ours.state[p][key], opt_ref.state[q][key]
                assert (a - b).abs().max() <= 10 * rel * b.abs().max()


SHAPES = {"word_embeddings": (300, 24), "dense.weight": (48, 24), "dense.bias": (48,), "LayerNorm.weight": (24,)}


@pytest.mark.parametrize("correct_bias", [True, False])
def test_fused_step_is_the_formula_within_fp32_rounding(correct_bias):
    g = torch.Generator().manual_seed(0)
    start = {n: torch.randn(s, generator=g) * 0.05 for n, s in SHAPES.items()}
    grads = []
    for _ in range(100):
        step = {n: torch.randn(s, generator=g) * 10 ** torch.randint(-6, -1, (), generator=g).item()
                for n, s in SHAPES.items()}
        step["word_embeddings"][torch.rand(300, generator=g) < 0.8] = 0.0   # rows absent from the batch
        grads.append(step)
    runs = {}
    for name, cls, dtype in (("ours", VoltaAdamW, torch.float32), ("ref", PerTensorAdamW, torch.float32),
                             ("exact", PerTensorAdamW, torch.float64)):
        params = {n: nn.Parameter(t.to(dtype, copy=True)) for n, t in start.items()}
        decay = [p for n, p in params.items() if "LayerNorm" not in n and "bias" not in n]
        rest = [p for n, p in params.items() if "LayerNorm" in n or "bias" in n]
        opt = cls([{"params": decay, "weight_decay": 0.01}, {"params": rest, "weight_decay": 0.0}],
                  lr=1e-3, eps=1e-6, correct_bias=correct_bias)
        for i, step in enumerate(grads):
            for group in opt.param_groups:
                group["lr"] = 1e-3 * i / 100   # VOLTA's schedule: the first step runs at LR 0
            for n, p in params.items():
                p.grad = step[n].to(dtype)
            opt.step()
        runs[name] = params
    for n in SHAPES:
        ours, ref, exact = runs["ours"][n].detach(), runs["ref"][n].detach(), runs["exact"][n].detach()
        err_ours, err_ref = (ours.double() - exact).abs().max(), (ref.double() - exact).abs().max()
        assert err_ours <= 1.5 * err_ref + 1e-12, n
        ulp = torch.finfo(torch.float32).eps * ref.abs().max()
        assert (ours - ref).abs().max() <= 16 * ulp, n
        assert (ours - start[n]).abs().max() > 1e-4   # it moved


@pytest.mark.parametrize("correct_bias", [True, False])
def test_fused_matches_per_tensor_formula_over_100_model_steps(correct_bias):
    ours, ref = _pair()
    kw = dict(lr=1e-3, eps=1e-6, correct_bias=correct_bias)
    opt_ours = VoltaAdamW(parameter_groups(ours, 0.01), **kw)
    opt_ref = PerTensorAdamW(parameter_groups(ref, 0.01), **kw)
    lrs = [0.0] + [1e-3 * (1 - i / 100) for i in range(99)]   # VOLTA's first step runs at LR 0
    batches = _batches(100)
    _train(ours, opt_ours, batches, lrs)
    _train(ref, opt_ref, batches, lrs)
    _assert_close(ours, ref, opt_ours, opt_ref)
    assert ours.dense.weight.sub(Tiny().dense.weight).abs().max() > 1e-3  # it did train
    assert opt_ours.state[ours.unused.weight] == {}                       # no grad: untouched, no state


def test_weight_decay_groups_and_frozen_layers():
    ours, ref = _pair(fixed=["embeddings", "dense.bias"])
    start = {n: p.detach().clone() for n, p in ours.named_parameters()}
    groups = lambda m: [{"params": [m.dense.weight], "weight_decay": 0.1},       # noqa: E731
                        {"params": [m.out.weight, m.unused.weight], "weight_decay": 0.01},
                        {"params": [m.out.bias, m.LayerNorm.weight, m.LayerNorm.bias], "weight_decay": 0.0}]
    opt_ours = VoltaAdamW(groups(ours), lr=1e-3, correct_bias=True)
    opt_ref = PerTensorAdamW(groups(ref), lr=1e-3, correct_bias=True)
    batches = _batches(100, seed=2)
    _train(ours, opt_ours, batches, [1e-3] * 100)
    _train(ref, opt_ref, batches, [1e-3] * 100)
    _assert_close(ours, ref, opt_ours, opt_ref)
    assert torch.equal(ours.embeddings.weight, start["embeddings.weight"])
    assert torch.equal(ours.dense.bias, start["dense.bias"])
    assert torch.equal(ours.unused.weight, start["unused.weight"])


def test_fp16_grad_scaler_including_skipped_steps():
    ours, ref = _pair()
    opt_ours = VoltaAdamW(parameter_groups(ours, 0.01), lr=1e-3)
    opt_ref = PerTensorAdamW(parameter_groups(ref, 0.01), lr=1e-3)
    # an initial scale of 2^24 overflows fp16 gradients, so the first steps are skipped and the scale backs off
    scalers = [torch.amp.GradScaler("cpu", init_scale=2.0 ** 24, growth_interval=20) for _ in range(2)]
    batches = _batches(100, seed=3)
    _train(ours, opt_ours, batches, [1e-3] * 100, scalers[0], torch.float16)
    _train(ref, opt_ref, batches, [1e-3] * 100, scalers[1], torch.float16)
    assert scalers[0].get_scale() == scalers[1].get_scale() < 2.0 ** 24
    steps = opt_ours.state[ours.dense.weight]["step"]
    assert 0 < steps < 100   # some steps skipped on inf/nan, the same ones on both sides
    _assert_close(ours, ref, opt_ours, opt_ref, rel=1e-4)


def test_per_tensor_fallback_is_the_formula_bit_for_bit():
    torch.manual_seed(0)
    base = torch.randn(6, 4)
    ours = nn.Parameter(base.t().contiguous().t())   # non-contiguous: the fused kernel is skipped for it
    assert not ours.is_contiguous()
    ref = nn.Parameter(base.clone())
    fast = nn.Parameter(base.clone())
    opt_ours = VoltaAdamW([ours], lr=1e-2, weight_decay=0.01)
    opt_ref = PerTensorAdamW([ref], lr=1e-2, weight_decay=0.01)
    opt_plain = VoltaAdamW([fast], lr=1e-2, weight_decay=0.01, fused=False)
    plain_ref = nn.Parameter(base.clone())
    opt_plain_ref = PerTensorAdamW([plain_ref], lr=1e-2, weight_decay=0.01)
    for _ in range(20):
        grad = torch.randn(6, 4)
        for p, o in ((ours, opt_ours), (ref, opt_ref), (fast, opt_plain), (plain_ref, opt_plain_ref)):
            p.grad = grad.clone()
            o.step()
    assert torch.equal(ours, ref)
    assert torch.equal(fast, plain_ref)


def test_sparse_gradients_are_refused():
    emb = nn.Embedding(5, 2, sparse=True)
    emb(torch.tensor([1])).sum().backward()
    with pytest.raises(RuntimeError, match="sparse"):
        VoltaAdamW(emb.parameters()).step()
