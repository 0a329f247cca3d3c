"""VOLTA's optimisation semantics: AdamW variant, parameter groups, schedule, freezing."""
import math
from types import SimpleNamespace

import pytest
import torch
from torch import nn

from volta_ml.engine.optim import (VoltaAdamW, build_optimizer, freeze_fixed_layers, lr_multiplier,
                                   parameter_groups, schedule_lengths)


def reference_adamw(p, grads, lr, betas, eps, wd, correct_bias):
    """pytorch-transformers' AdamW written out element by element (independent of the foreach code)."""
    p = [float(v) for v in p]
    m = [0.0] * len(p)
    v = [0.0] * len(p)
    for step, grad in enumerate(grads, start=1):
        for i, g in enumerate(grad):
            m[i] = betas[0] * m[i] + (1 - betas[0]) * g
            v[i] = betas[1] * v[i] + (1 - betas[1]) * g * g
            denom = math.sqrt(v[i]) + eps
            step_size = lr
            if correct_bias:
                step_size = lr * math.sqrt(1 - betas[1] ** step) / (1 - betas[0] ** step)
            p[i] = p[i] - step_size * m[i] / denom
            p[i] = p[i] - lr * wd * p[i]  # decay after the update, on the updated value
    return p


@pytest.mark.parametrize("correct_bias", [True, False])
def test_volta_adamw_matches_pytorch_transformers_formula(correct_bias):
    torch.manual_seed(0)
    start = torch.randn(5, dtype=torch.float64)
    grads = [torch.randn(5, dtype=torch.float64) for _ in range(4)]
    param = nn.Parameter(start.clone())
    opt = VoltaAdamW([param], lr=0.1, betas=(0.9, 0.999), eps=1e-6, weight_decay=0.01, correct_bias=correct_bias)
    for grad in grads:
        param.grad = grad.clone()
        opt.step()
    expected = reference_adamw(start.tolist(), [g.tolist() for g in grads], 0.1, (0.9, 0.999), 1e-6, 0.01,
                               correct_bias)
    assert param.detach().tolist() == pytest.approx(expected, rel=1e-12, abs=1e-14)


def test_volta_adamw_differs_from_torch_adamw_in_eps_placement():
    torch.manual_seed(0)
    start = torch.randn(5, dtype=torch.float64) * 1e-3
    ours, theirs = nn.Parameter(start.clone()), nn.Parameter(start.clone())
    a = VoltaAdamW([ours], lr=0.1, eps=1e-6, weight_decay=0.0, correct_bias=True)
    b = torch.optim.AdamW([theirs], lr=0.1, eps=1e-6, weight_decay=0.0)
    grad = torch.full((5,), 1e-6, dtype=torch.float64)
    ours.grad, theirs.grad = grad.clone(), grad.clone()
    a.step()
    b.step()
    # same direction, different magnitude: eps enters before the bias correction in VOLTA
    assert torch.all(torch.sign(ours - start) == torch.sign(theirs - start))
    assert not torch.allclose(ours, theirs, rtol=1e-3)


def test_parameter_groups_exclude_bias_and_layernorm_from_decay():
    model = nn.Sequential()
    model.add_module("dense", nn.Linear(2, 2))
    model.add_module("LayerNorm", nn.LayerNorm(2))
    groups = parameter_groups(model, weight_decay=1e-4)
    by_decay = {g["weight_decay"]: g["params"] for g in groups}
    assert [id(p) for p in by_decay[1e-4]] == [id(model.dense.weight)]
    assert {id(p) for p in by_decay[0.0]} == {id(model.dense.bias), id(model.LayerNorm.weight),
                                              id(model.LayerNorm.bias)}


def test_fixed_layers_prefix_rule():
    model = nn.Module()
    model.embeddings = nn.Linear(2, 2)
    model.embeddings_v = nn.Linear(2, 2)
    frozen = freeze_fixed_layers(model, ["embeddings"])
    assert frozen == ["embeddings.weight", "embeddings.bias"]
    assert model.embeddings_v.weight.requires_grad and not model.embeddings.weight.requires_grad
    groups = parameter_groups(model, 0.01)
    assert sum(len(g["params"]) for g in groups) == 2


def test_warmup_linear_schedule_and_horizon():
    args = SimpleNamespace(optim_train_epochs=20, grad_acc_steps=4, warmup_steps=None, warmup_proportion=0.1)
    total, warmup = schedule_lengths(micro_batches_per_epoch=100, args=args)
    assert (total, warmup) == (500, 50.0)
    assert lr_multiplier(0, total, warmup, "warmup_linear") == 0.0  # first step at LR 0
    assert lr_multiplier(25, total, warmup, "warmup_linear") == 0.5
    assert lr_multiplier(50, total, warmup, "warmup_linear") == 1.0
    assert lr_multiplier(275, total, warmup, "warmup_linear") == 0.5
    assert lr_multiplier(600, total, warmup, "warmup_linear") == 0.0
    assert lr_multiplier(400, total, warmup, "constant") == 1.0
    # 5 of 20 scheduled epochs (GQA) end at ~83% of the peak LR
    assert lr_multiplier(125, total, warmup, "warmup_linear") == pytest.approx(375 / 450)
    args.warmup_steps = 7.0
    assert schedule_lengths(100, args)[1] == 7.0


def _args(**kw):
    base = dict(weight_decay=0.01, adam_betas=[0.9, 0.999], optim="AdamW", adam_impl="volta", lr=1e-3,
                adam_epsilon=1e-6, adam_correct_bias=True)
    base.update(kw)
    return SimpleNamespace(**base)


def test_build_optimizer_choices_and_errors():
    model = nn.Linear(2, 2)
    cpu = torch.device("cpu")
    assert isinstance(build_optimizer(model, _args(), cpu), VoltaAdamW)
    assert isinstance(build_optimizer(model, _args(adam_impl="torch"), cpu), torch.optim.AdamW)
    assert isinstance(build_optimizer(model, _args(optim="RAdam"), cpu), torch.optim.RAdam)
    with pytest.raises(ValueError, match="--optim must be"):
        build_optimizer(model, _args(optim="SGD"), cpu)
    with pytest.raises(ValueError, match="adam_correct_bias"):
        build_optimizer(model, _args(adam_impl="torch", adam_correct_bias=False), cpu)
    with pytest.raises(ValueError, match="two values"):
        build_optimizer(model, _args(adam_betas=[0.9]), cpu)
