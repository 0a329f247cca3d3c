"""IGLUE task families. Each family module offers the same functions:

- `build_dataset(task_entry, split, tokenizer, region_view, *, annotation_path=None, token_cache=None,
  seed=0) -> Dataset` (batches through `dataset.collate_fn`);
- `forward_and_loss(model, batch, task_id, loss_name=None) -> (loss, score_sum, n_examples, logits)`;
- `predictions(batch, logits, dataset) -> list[dict]` (the `<split>_result.json` rows);
- `extra_metrics(prediction_rows, task_id) -> dict` (e.g. NLVR2/MaRVL consistency).
See docs/tasks.md.
"""
from __future__ import annotations

from types import ModuleType

from volta_ml.tasks import gqa, nlvr2, retrieval, visual_entailment
from volta_ml.tasks.config import TaskConfigError, get_task_entry, load_task_config

FAMILIES = (visual_entailment, gqa, nlvr2, retrieval)


def family_for(task_entry: dict) -> ModuleType:
    """The family module for a task entry, chosen by its `type` (and `name` for retrieval)."""
    task_type = task_entry.get("type")
    for family in FAMILIES:
        if task_type in family.TYPES:
            if family is retrieval and not str(task_entry.get("name", "")).startswith("Retrieval"):
                break
            return family
    raise TaskConfigError(f"task {task_entry.get('name')!r} of type {task_type!r} is not supported by volta-ml "
                          f"(supported: XVNLI/SNLI-VE, GQA/xGQA, NLVR2/MaRVL, Retrieval*)")


__all__ = ["FAMILIES", "family_for", "get_task_entry", "load_task_config", "gqa", "nlvr2", "retrieval",
           "visual_entailment"]
