"""IGLUE task families: one module per family, chosen by the task config's `type` in `FAMILIES`.

Every family module satisfies `TaskFamily` (see docs/tasks.md); adding a family is a new module plus one
row in `FAMILIES`.
"""
from __future__ import annotations

from typing import Protocol

import torch
from torch.utils.data import Dataset

from volta_ml.tasks import gqa, nlvr2, retrieval, visual_entailment
from volta_ml.tasks.config import TaskConfigError, get_task_entry, load_task_config


class TaskFamily(Protocol):
    """The contract of a task family module."""

    def build_dataset(self, task_entry: dict, split: str, tokenizer, region_view, *, annotation_path=None,
                      token_cache=None, seed: int = 0) -> Dataset:
        """The examples of one split; batches come from `dataset.collate_fn`."""

    def forward_and_loss(self, model, batch: dict, task_id: str,
                         loss_name: str | None = None) -> tuple[torch.Tensor, torch.Tensor, int, torch.Tensor]:
        """(mean loss, score summed over the batch, examples in the batch, logits)."""

    def predictions(self, batch: dict, logits: torch.Tensor, dataset) -> list[dict]:
        """The batch's `<split>_result.json` rows."""

    def extra_metrics(self, prediction_rows: list[dict], task_id: str) -> dict:
        """Figures beyond loss and score (e.g. NLVR2/MaRVL consistency)."""

    def item_scores(self, prediction_rows: list[dict], dataset) -> list[dict] | None:
        """Per-item rows `{"id", "score"}` of the whole dataset (rows in dataset order) whose mean is the score
        (×100), written beside `<split>_result.json` as `<split>_items.jsonl` (volta_ml/stats.py); None where the
        score comes from another step (xGQA: GQA_score, against the truth file)."""


# task config `type` -> (family, the prefix its task `name` must have: VOLTA's only VL-logit tasks it
# evaluates this way are the Retrieval* ones)
FAMILIES: dict[str, tuple[TaskFamily, str]] = {
    "VL-tri-classifier": (visual_entailment, ""),     # XVNLI, SNLI-VE
    "VL-classifier-GQA": (gqa, ""),                   # GQA, xGQA
    "VL-binary-classifier": (nlvr2, ""),              # NLVR2, MaRVL
    "VL-logit": (retrieval, "Retrieval"),             # RetrievalFlickr30k, RetrievalxFlickrCO, RetrievalWIT
}


def family_for(task_entry: dict) -> TaskFamily:
    """The family module for a task entry, chosen by its `type` (and `name` for retrieval)."""
    task_type = task_entry.get("type")
    family, prefix = FAMILIES.get(task_type, (None, ""))
    if family is None or not str(task_entry.get("name", "")).startswith(prefix):
        raise TaskConfigError(f"task {task_entry.get('name')!r} of type {task_type!r} is not supported by "
                              f"volta-ml (supported: XVNLI/SNLI-VE, GQA/xGQA, NLVR2/MaRVL, Retrieval*)")
    return family


__all__ = ["FAMILIES", "TaskFamily", "family_for", "get_task_entry", "load_task_config", "gqa", "nlvr2",
           "retrieval", "visual_entailment"]
