"""Optimizer, learning-rate schedule and layer freezing with VOLTA/IGLUE's semantics.

VOLTA uses the AdamW of `pytorch-transformers`, which differs from `torch.optim.AdamW`
in two ways that change numbers slightly:
- eps is added to sqrt(v) *before* the bias correction is folded into the step size;
- the decoupled weight decay is applied *after* the Adam update (p <- p - lr*wd*p on the
  already-updated p), and bias correction can be switched off (`--adam_correct_bias`).
`VoltaAdamW` reproduces this with torch's fused AdamW kernel and re-mapped hyper-parameters.
`--adam_impl torch` selects `torch.optim.AdamW` (fused on CUDA), which is faster on GPU
but only close to, not identical with, VOLTA's numbers.
"""
from __future__ import annotations

import math
from typing import Iterable

import torch
from torch import nn

from volta_ml.engine.failures import UsageError

NO_DECAY_MARKERS = ("bias", "LayerNorm.bias", "LayerNorm.weight")


def freeze_fixed_layers(model: nn.Module, fixed_layers: Iterable[str]) -> list[str]:
    """Freeze parameters named by the model config's `fixed_layers` (VOLTA's prefix rule).

    A parameter is frozen when `name + "."` starts with `entry + "."`, so `bert.embeddings`
    freezes `bert.embeddings.word_embeddings.weight` but not `bert.embeddings_v.*`.
    Returns the frozen names.
    """
    prefixes = [entry.rstrip(".") + "." for entry in (fixed_layers or [])]
    frozen = []
    for name, param in model.named_parameters():
        if any((name + ".").startswith(prefix) for prefix in prefixes):
            param.requires_grad_(False)
            frozen.append(name)
    return frozen


def parameter_groups(model: nn.Module, weight_decay: float) -> list[dict]:
    """Trainable parameters split into decay / no-decay groups by VOLTA's name rule.

    VOLTA builds one group per tensor; every group has the same LR, so two groups give
    identical updates and let the multi-tensor kernels batch the whole model.
    """
    return split_decay(model.named_parameters(), weight_decay)


def split_decay(named_parameters, weight_decay: float) -> list[dict]:
    """(name, parameter) pairs as `parameter_groups` splits them: trainable ones only, decay / no decay."""
    decay, no_decay = [], []
    for name, param in named_parameters:
        if not param.requires_grad:
            continue
        (no_decay if any(marker in name for marker in NO_DECAY_MARKERS) else decay).append(param)
    groups = []
    if decay:
        groups.append({"params": decay, "weight_decay": weight_decay})
    if no_decay:
        groups.append({"params": no_decay, "weight_decay": 0.0})
    return groups


class VoltaAdamW(torch.optim.Optimizer):
    """AdamW exactly as `pytorch_transformers.optimization.AdamW` computes it, in one fused pass.

    pytorch-transformers' step per tensor (s = lr * sqrt(1 - b2^t) / (1 - b1^t), or lr without bias
    correction; k = 1 - lr * wd):
        m = b1 m + (1 - b1) g;  v = b2 v + (1 - b2) g^2;  p = (p - s m / (sqrt(v) + eps)) * k
    torch's fused AdamW kernel (`torch._fused_adamw_`, CPU and CUDA) computes, with bias correction
    neutralised by a step count of +inf (1 - b^inf = 1 exactly):
        m, v as above;  p = p (1 - lr' wd') - lr' m / (sqrt(v) + eps)
    which is the same update with lr' = s k and lr' wd' = lr wd: eps sits where VOLTA puts it, and the
    decay of the updated value becomes a decay of the old one plus a k-scaled step. One pass over p, g,
    m and v (multi-threaded on CPU, multi-tensor on CUDA) and no temporaries; the numbers differ from
    the per-tensor loop by fp32 rounding only (tolerance in tests/test_optim_equivalence.py). Tensors the
    kernel cannot take, a step at LR 0, and `fused=False` go through the per-tensor loop.
    """

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-6, weight_decay=0.0, correct_bias=True,
                 fused: bool | None = None):
        if lr < 0.0 or eps < 0.0 or not (0.0 <= betas[0] < 1.0 and 0.0 <= betas[1] < 1.0):
            raise UsageError(f"invalid AdamW hyper-parameters (--lr, --adam_betas, --adam_epsilon): lr={lr}, "
                             f"betas={betas}, eps={eps}")
        defaults = dict(lr=lr, betas=tuple(betas), eps=eps, weight_decay=weight_decay, correct_bias=correct_bias)
        super().__init__(params, defaults)
        self.fused = hasattr(torch, "_fused_adamw_") if fused is None else fused  # False: per-tensor loop

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            buckets: dict[tuple, list[torch.Tensor]] = {}
            for p in group["params"]:
                if p.grad is None:
                    continue
                if p.grad.is_sparse:
                    raise RuntimeError("VoltaAdamW does not support sparse gradients")
                state = self.state[p]
                if not state:
                    state["step"] = 0
                    state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                    state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                state["step"] += 1
                fusable = self.fused and p.device.type in _FUSED_DEVICES and p.dtype in _FUSED_DTYPES and \
                    p.grad.dtype == p.dtype and p.is_contiguous() and p.grad.is_contiguous()
                key = (fusable, p.device, p.dtype, state["step"])
                buckets.setdefault(key, []).append(p)
            for (fusable, device, _, step), params in buckets.items():
                s = _step_size(group, step)
                k = 1.0 - group["lr"] * group["weight_decay"] if group["weight_decay"] > 0.0 else 1.0
                if fusable and s * k > 0.0:
                    _fused_update(self.state, params, group, s, k, device)
                else:
                    for p in params:
                        _reference_update(p, p.grad, self.state[p]["exp_avg"], self.state[p]["exp_avg_sq"],
                                          group, s)
        return loss


_FUSED_DEVICES = ("cpu", "cuda")   # where the kernel is tested; other devices take the per-tensor loop
_FUSED_DTYPES = (torch.float64, torch.float32, torch.float16, torch.bfloat16)


def _step_size(group: dict, step: int) -> float:
    beta1, beta2 = group["betas"]
    if not group["correct_bias"]:
        return group["lr"]
    return group["lr"] * math.sqrt(1.0 - beta2 ** step) / (1.0 - beta1 ** step)


def _reference_update(p, grad, exp_avg, exp_avg_sq, group, step_size) -> None:
    """pytorch-transformers' per-tensor update (one denominator temporary at a time)."""
    beta1, beta2 = group["betas"]
    exp_avg.mul_(beta1).add_(grad, alpha=1.0 - beta1)
    exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1.0 - beta2)
    p.addcdiv_(exp_avg, exp_avg_sq.sqrt().add_(group["eps"]), value=-step_size)
    if group["weight_decay"] > 0.0:
        p.add_(p, alpha=-group["lr"] * group["weight_decay"])


def _fused_update(state, params, group, step_size: float, keep: float, device) -> None:
    lr = step_size * keep
    steps = [torch.full((), math.inf, dtype=torch.float32, device=device)] * len(params)
    torch._fused_adamw_(params, [p.grad for p in params], [state[p]["exp_avg"] for p in params],
                        [state[p]["exp_avg_sq"] for p in params], [], steps, lr=lr, beta1=group["betas"][0],
                        beta2=group["betas"][1], weight_decay=(1.0 - keep) / lr,
                        eps=group["eps"], amsgrad=False, maximize=False)


def build_optimizer(model: nn.Module, args, device: torch.device, groups: list[dict] | None = None
                    ) -> torch.optim.Optimizer:
    """The optimizer named by `--optim` / `--adam_impl` over the model's trainable tensors, in `groups` when
    given (a group may set its own "lr"; default: `parameter_groups`)."""
    groups = parameter_groups(model, args.weight_decay) if groups is None else groups
    if not groups:
        raise UsageError("no trainable parameters: every parameter is frozen by fixed_layers")
    betas = tuple(args.adam_betas)
    if len(betas) != 2:
        raise UsageError(f"--adam_betas needs exactly two values, got {list(args.adam_betas)}")
    if args.optim == "RAdam":
        return torch.optim.RAdam(groups, lr=args.lr, betas=betas, eps=args.adam_epsilon,
                                 weight_decay=args.weight_decay, decoupled_weight_decay=True)
    if args.optim != "AdamW":
        raise UsageError(f"--optim must be AdamW or RAdam, got {args.optim!r}")
    if args.adam_impl == "torch":
        if not args.adam_correct_bias:
            raise UsageError("--adam_impl torch always corrects the bias; pass --adam_correct_bias or use --adam_impl volta")
        return torch.optim.AdamW(groups, lr=args.lr, betas=betas, eps=args.adam_epsilon,
                                 weight_decay=args.weight_decay, fused=device.type == "cuda")
    return VoltaAdamW(groups, lr=args.lr, betas=betas, eps=args.adam_epsilon,
                      weight_decay=args.weight_decay, correct_bias=args.adam_correct_bias)


def schedule_lengths(micro_batches_per_epoch: int, args) -> tuple[int, float]:
    """(total optimizer steps T, warmup steps W) as VOLTA sizes them.

    T = len(train loader) * --optim_train_epochs // grad_acc: it uses --optim_train_epochs
    (default 20), not --num_epoch, so shorter runs end before the LR reaches 0 (quirk kept).
    """
    total = micro_batches_per_epoch * args.optim_train_epochs // args.grad_acc_steps
    warmup = args.warmup_steps if args.warmup_steps is not None else args.warmup_proportion * total
    return total, warmup


def lr_multiplier(step: int, total: int, warmup: float, kind: str) -> float:
    """pytorch-transformers' WarmupLinearSchedule (or WarmupConstantSchedule for any other kind).

    Step 0 gives multiplier 0, so the very first optimizer step runs at LR 0 (quirk kept).
    """
    if step < warmup:
        return float(step) / float(max(1.0, warmup))
    if kind != "warmup_linear":
        return 1.0
    return max(0.0, float(total - step) / float(max(1.0, total - warmup)))


def build_scheduler(optimizer: torch.optim.Optimizer, total: int, warmup: float, kind: str):
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: lr_multiplier(step, total, warmup, kind))
