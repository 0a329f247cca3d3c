"""The evaluation loop shared by eval_task and the trainer's validation.

`evaluate(model, dataset, family, task_id, ...)` runs the model over a task dataset (batched, DataLoader
workers, CPU or CUDA, optional autocast) and returns VOLTA's figures: loss = Σ(loss_b·B_b)/ΣB_b and
score = 100·Σscore_b/ΣB_b, where B_b counts examples; plus per-example prediction rows in dataset order.
All accumulators are sums and every prediction row carries its dataset index, so a sharded run can
all-reduce the sums and gather the rows.
"""
from __future__ import annotations

import sys
from contextlib import nullcontext
from dataclasses import dataclass, field

import torch
from torch.utils.data import DataLoader
from tqdm import tqdm

from volta_ml.engine.failures import die_with_parent

from volta_ml.tasks.common import model_device


@dataclass
class EvalResult:
    loss: float              # mean loss per example
    score: float             # 100 · Σ score / Σ examples
    loss_sum: float
    score_sum: float
    n_examples: int
    n_batches: int
    predictions: list[dict] = field(default_factory=list)
    metrics: dict = field(default_factory=dict)


def make_loader(dataset, batch_size: int, num_workers: int = 0, drop_last: bool = False, sampler=None,
                pin_memory: bool = False) -> DataLoader:
    return DataLoader(dataset, batch_size=batch_size, shuffle=False, sampler=sampler, num_workers=num_workers,
                      collate_fn=dataset.collate_fn, drop_last=drop_last, pin_memory=pin_memory,
                      persistent_workers=False, worker_init_fn=die_with_parent if num_workers else None)


def autocast_context(device: torch.device, amp: bool):
    if not amp:
        return nullcontext()
    dtype = torch.float16 if device.type == "cuda" else torch.bfloat16
    return torch.autocast(device_type=device.type, dtype=dtype)


def evaluate(model, dataset, family, task_id: str, *, batch_size: int = 30, num_workers: int = 0,
             loader: DataLoader | None = None, amp: bool = False, loss_name: str | None = None,
             max_batches: int | None = None, keep_predictions: bool = True, progress: bool = True,
             desc: str | None = None, progress_file=None) -> EvalResult:
    """Evaluate `model` on `dataset` with `family.forward_and_loss`.

    `loader` (optional) replaces the default sequential DataLoader (e.g. a sharded sampler); `max_batches`
    evaluates exactly that many batches (VOLTA's `--max_val_batches N` means N-1 of them: pass N-1).
    The model is put in eval mode and restored to its previous mode afterwards.
    """
    device = model_device(model)
    if loader is None:
        loader = make_loader(dataset, batch_size, num_workers, pin_memory=device.type == "cuda")
    was_training = model.training
    model.eval()
    loss_sum = score_sum = 0.0
    n_examples = n_batches = 0
    rows: list[tuple[int, dict]] = []
    total = len(loader) if max_batches is None else min(len(loader), max_batches)
    bar = tqdm(total=total, desc=desc or task_id, disable=not progress, file=progress_file or sys.stdout,
               dynamic_ncols=True, leave=False)
    try:
        with torch.no_grad():
            for batch in loader:
                if max_batches is not None and n_batches >= max_batches:
                    break
                with autocast_context(device, amp):
                    loss, score, count, logits = family.forward_and_loss(model, batch, task_id, loss_name)
                loss_sum += float(loss) * count
                score_sum += float(score)
                n_examples += int(count)
                n_batches += 1
                if keep_predictions:
                    predicted = family.predictions(batch, logits.float().cpu(), dataset)
                    rows.extend(zip(batch["example_index"], predicted))
                bar.update(1)
    finally:
        bar.close()
        model.train(was_training)
    rows.sort(key=lambda pair: pair[0])
    predictions = [row for _, row in rows]
    return EvalResult(
        loss=loss_sum / n_examples if n_examples else 0.0,
        score=100.0 * score_sum / n_examples if n_examples else 0.0,
        loss_sum=loss_sum, score_sum=score_sum, n_examples=n_examples, n_batches=n_batches,
        predictions=predictions,
        metrics=family.extra_metrics(predictions, task_id) if keep_predictions else {},
    )
