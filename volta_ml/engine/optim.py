"""Optimizer, learning-rate schedule and layer freezing with VOLTA/IGLUE's semantics.

VOLTA uses the AdamW of `pytorch-transformers`, which differs from `torch.optim.AdamW`
in two ways that change numbers slightly:
- eps is added to sqrt(v) *before* the bias correction is folded into the step size;
- the decoupled weight decay is applied *after* the Adam update (p <- p - lr*wd*p on the
  already-updated p), and bias correction can be switched off (`--adam_correct_bias`).
`VoltaAdamW` reproduces this exactly with multi-tensor (`torch._foreach_*`) kernels.
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
    decay, no_decay = [], []
    for name, param in model.named_parameters():
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
    """AdamW exactly as `pytorch_transformers.optimization.AdamW` computes it."""

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-6, weight_decay=0.0, correct_bias=True):
        if lr < 0.0 or eps < 0.0 or not (0.0 <= betas[0] < 1.0 and 0.0 <= betas[1] < 1.0):
            raise UsageError(f"invalid AdamW hyper-parameters (--lr, --adam_betas, --adam_epsilon): lr={lr}, "
                             f"betas={betas}, eps={eps}")
        defaults = dict(lr=lr, betas=tuple(betas), eps=eps, weight_decay=weight_decay, correct_bias=correct_bias)
        super().__init__(params, defaults)

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            params = [p for p in group["params"] if p.grad is not None]
            if not params:
                continue
            if any(p.grad.is_sparse for p in params):
                raise RuntimeError("VoltaAdamW does not support sparse gradients")
            beta1, beta2 = group["betas"]
            grads, exp_avgs, exp_avg_sqs, steps = [], [], [], []
            for p in params:
                state = self.state[p]
                if not state:
                    state["step"] = 0
                    state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                    state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                state["step"] += 1
                grads.append(p.grad)
                exp_avgs.append(state["exp_avg"])
                exp_avg_sqs.append(state["exp_avg_sq"])
                steps.append(state["step"])
            # All tensors of a group are created together, so they share one step count;
            # split by step if a caller added parameters later.
            for step in sorted(set(steps)):
                idx = [i for i, s in enumerate(steps) if s == step]
                self._update([params[i] for i in idx], [grads[i] for i in idx], [exp_avgs[i] for i in idx],
                             [exp_avg_sqs[i] for i in idx], step, group, beta1, beta2)
        return loss

    @staticmethod
    def _update(params, grads, exp_avgs, exp_avg_sqs, step, group, beta1, beta2):
        torch._foreach_mul_(exp_avgs, beta1)
        torch._foreach_add_(exp_avgs, grads, alpha=1.0 - beta1)
        torch._foreach_mul_(exp_avg_sqs, beta2)
        torch._foreach_addcmul_(exp_avg_sqs, grads, grads, value=1.0 - beta2)
        denoms = torch._foreach_sqrt(exp_avg_sqs)
        torch._foreach_add_(denoms, group["eps"])
        step_size = group["lr"]
        if group["correct_bias"]:
            step_size = step_size * math.sqrt(1.0 - beta2 ** step) / (1.0 - beta1 ** step)
        torch._foreach_addcdiv_(params, exp_avgs, denoms, value=-step_size)
        if group["weight_decay"] > 0.0:
            torch._foreach_add_(params, params, alpha=-group["lr"] * group["weight_decay"])


def build_optimizer(model: nn.Module, args, device: torch.device) -> torch.optim.Optimizer:
    """The optimizer named by `--optim` / `--adam_impl` over the model's trainable tensors."""
    groups = parameter_groups(model, args.weight_decay)
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
