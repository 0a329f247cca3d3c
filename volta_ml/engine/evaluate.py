"""The one evaluation loop: eval_task.py's evaluation and the trainer's validation.

`evaluate(model, dataset, family, task_id, ...)` runs the model over a task dataset (batched, DataLoader
workers, CPU or CUDA, autocast in `precision` "none" | "bf16" | "fp16") and returns VOLTA's figures:
loss = Σ(loss_b·B_b)/ΣB_b and score = Σscore_b/ΣB_b (a fraction; `score_percent` is the ×100 that VOLTA's
Validation line prints), where B_b counts examples; plus per-example prediction rows in dataset order.
A job whose loss is defined for only some examples (an answer loss, where rows without a gold answer count
in the score but have no target) returns it as `MeanLoss(mean, count)`: the loss is then Σ(mean_b·count_b)/
Σcount_b, the mean over those examples whatever the batch size or the number of ranks.
Batches are moved to the model's device here. With `info` of a multi-process run, the sums are all-reduced,
so every rank returns the figures of the whole set (pass a sharded `loader`).
"""
from __future__ import annotations

import contextlib
import logging
import sys
from dataclasses import dataclass, field
from typing import Callable, NamedTuple

import torch
from torch.utils.data import DataLoader
from tqdm import tqdm

from volta_ml.engine.distributed import DistInfo, all_reduce_max, all_reduce_sum
from volta_ml.engine.failures import die_with_parent
from volta_ml.tasks.common import model_device

logger = logging.getLogger("volta_ml.evaluate")
PRECISIONS = {"none": None, "bf16": torch.bfloat16, "fp16": torch.float16}


class MeanLoss(NamedTuple):
    """A batch's loss that is the mean over `count` of its examples (those with a target), not over all of
    them: the evaluation weights it by `count`, and the score still by the batch's n_examples."""
    mean: torch.Tensor
    count: torch.Tensor | int


def loss_and_count(loss, n_examples) -> tuple:
    """(mean loss, examples it is the mean over) of what a `forward_and_loss` returned."""
    return (loss.mean, loss.count) if isinstance(loss, MeanLoss) else (loss, n_examples)


@dataclass
class EvalResult:
    loss: float              # mean loss per example (per example with a target, for a MeanLoss)
    score: float             # Σ score / Σ examples (a fraction)
    loss_sum: float
    score_sum: float
    n_examples: int
    n_batches: int
    predictions: list[dict] = field(default_factory=list)
    metrics: dict = field(default_factory=dict)
    score_sums: list[float] = field(default_factory=list)   # every entry of a vector score (score_width > 1)
    loss_examples: int = 0   # the examples the loss is the mean over (n_examples unless MeanLoss)

    @property
    def score_percent(self) -> float:
        return 100.0 * self.score_sum / self.n_examples if self.n_examples else 0.0


def make_loader(dataset, batch_size: int, num_workers: int = 0, drop_last: bool = False, sampler=None,
                pin_memory: bool = False) -> DataLoader:
    return DataLoader(dataset, batch_size=batch_size, shuffle=False, sampler=sampler, num_workers=num_workers,
                      collate_fn=dataset.collate_fn, drop_last=drop_last, pin_memory=pin_memory,
                      persistent_workers=False, worker_init_fn=die_with_parent if num_workers else None)


def autocast(precision: str, device: torch.device):
    """`torch.autocast` for "bf16" / "fp16", nothing for "none"."""
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {', '.join(PRECISIONS)}, got {precision!r}")
    if PRECISIONS[precision] is None:
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=PRECISIONS[precision])


def amp_precision(amp: bool, device: torch.device) -> str:
    """The evaluation commands' `--amp` switch: fp16 on CUDA, bf16 on CPU."""
    return "none" if not amp else "fp16" if device.type == "cuda" else "bf16"


def move_to_device(batch, device: torch.device):
    if isinstance(batch, torch.Tensor):
        return batch.to(device, non_blocking=True)
    if isinstance(batch, dict):
        return {key: move_to_device(value, device) for key, value in batch.items()}
    if isinstance(batch, (list, tuple)):
        return type(batch)(move_to_device(value, device) for value in batch)
    return batch


def as_tensor(value, device) -> torch.Tensor:
    if isinstance(value, torch.Tensor):
        return value.detach().to(device=device, dtype=torch.float64)
    return torch.tensor(float(value), dtype=torch.float64, device=device)


def evaluate(model, dataset, family=None, task_id: str = "", *, forward_and_loss: Callable | None = None,
             batch_size: int = 30, num_workers: int = 0, loader: DataLoader | None = None,
             precision: str = "none", loss_name: str | None = None, max_batches: int | None = None,
             keep_predictions: bool = True, progress: bool = True, desc: str | None = None, progress_file=None,
             info: DistInfo | None = None, score_width: int = 1, lockstep: bool = False,
             device: torch.device | None = None) -> EvalResult:
    """Evaluate `model` on `dataset` with `family.forward_and_loss` (or `forward_and_loss(model, batch,
    task_id)`, e.g. a training job's; then there are no prediction rows).

    `loader` (optional) replaces the default sequential DataLoader (e.g. a sharded sampler); `max_batches`
    evaluates exactly that many batches (VOLTA's `--max_val_batches N` means N-1 of them: pass N-1).
    `score_width` > 1: the score of a batch is a vector of that many sums (pretraining's loss parts, each summed
    over the examples); `score_sums` holds their totals, `score_sum` / `score` the first.
    The model is put in eval mode and restored to its previous mode afterwards.
    `lockstep` (a sharded model, whose forwards are collective): every rank runs as many batches as the rank with
    the most; a rank whose shard has ended runs its last batch again (or the set's first example) and counts
    nothing of it. `device`: where batches go (default: the model's; a model offloaded to the CPU computes
    elsewhere).
    """
    device = device or model_device(model)
    if forward_and_loss is None:
        def forward_and_loss(model, batch, task_id):
            return family.forward_and_loss(model, batch, task_id, loss_name)
    keep_predictions = keep_predictions and family is not None
    if loader is None:
        loader = make_loader(dataset, batch_size, num_workers, pin_memory=device.type == "cuda")
    was_training = model.training
    model.eval()
    # Σ loss·m, Σ score, Σ n, Σ m (m: the examples a batch's loss is the mean over): no sync
    sums = torch.zeros(3 + score_width, dtype=torch.float64, device=device)
    n_batches = 0
    rows: list[tuple[int, dict]] = []
    total = len(loader) if max_batches is None else min(len(loader), max_batches)
    steps = int(all_reduce_max(torch.tensor(float(total), device=device), info).item()) if lockstep else total
    bar = tqdm(total=total, desc=desc or task_id, disable=not progress, file=progress_file or sys.stdout,
               dynamic_ncols=True, leave=False)
    batch = None
    try:
        with torch.no_grad():
            for batch in loader:
                if max_batches is not None and n_batches >= max_batches:
                    break
                batch = move_to_device(batch, device)
                with autocast(precision, device):
                    loss, score, count, logits = forward_and_loss(model, batch, task_id)
                mean, over = loss_and_count(loss, count)
                m = as_tensor(over, device)
                sums += torch.cat([(as_tensor(mean, device) * m).reshape(1), as_tensor(score, device).reshape(-1),
                                   as_tensor(count, device).reshape(1), m.reshape(1)])
                n_batches += 1
                if keep_predictions:
                    predicted = family.predictions(batch, logits.float().cpu(), dataset)
                    rows.extend(zip(batch["example_index"], predicted))
                bar.update(1)
            for _ in range(steps - n_batches):     # lockstep: the forwards the other ranks still run
                if batch is None:
                    batch = move_to_device(loader.collate_fn([loader.dataset[0]]), device)
                with autocast(precision, device):
                    forward_and_loss(model, batch, task_id)
    finally:
        bar.close()
        model.train(was_training)
    if info is not None:
        all_reduce_sum(sums, info)
    loss_sum, *score_sums, n_examples, loss_count = sums.tolist()
    score_sum = score_sums[0]
    n_examples = int(n_examples)
    if n_examples == 0:
        logger.warning("%s: evaluated no examples (an empty set, or --max_val_batches 1, which evaluates 0 "
                       "batches as in VOLTA)", desc or task_id)
    rows.sort(key=lambda pair: pair[0])
    predictions = [row for _, row in rows]
    return EvalResult(
        loss=loss_sum / loss_count if loss_count else 0.0,
        score=score_sum / n_examples if n_examples else 0.0,
        loss_sum=loss_sum, score_sum=score_sum, n_examples=n_examples, n_batches=n_batches,
        predictions=predictions,
        metrics=family.extra_metrics(predictions, task_id) if keep_predictions else {},
        score_sums=score_sums, loss_examples=int(round(loss_count)),
    )
