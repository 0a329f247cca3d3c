"""One factory for every family: build a model from a config name/file, optionally load a checkpoint."""
from __future__ import annotations

import os

from torch import nn

from .checkpoint import LoadReport, load_checkpoint
from .config import VLConfig, load_config
from .m3p import M3PTasksModel
from .modeling import VLPreTrainingModel, VLTasksModel


def build_model(config: VLConfig | str | os.PathLike | dict, task_cfg: dict | None = None, task_ids=None,
                kind: str = "tasks", dropout_prob: float = 0.1) -> nn.Module:
    """`kind="tasks"`: VOLTA's BertForVLTasks (M3PForVLTasks for M3P configs); `"pretraining"`: the
    pretraining model with MLM / matching / visual heads."""
    if not isinstance(config, VLConfig):
        config = load_config(config)
    if kind == "tasks":
        cls = M3PTasksModel if config.image_embeddings == "m3p" else VLTasksModel
        return cls(config, task_cfg, task_ids, dropout_prob)
    if kind == "pretraining":
        if config.image_embeddings == "m3p":
            raise NotImplementedError("the M3P pretraining heads are not part of VOLTA's M3P port")
        return VLPreTrainingModel(config)
    raise ValueError(f"kind must be 'tasks' or 'pretraining', got {kind!r}")


def from_pretrained(checkpoint, config, task_cfg: dict | None = None, task_ids=None, kind: str = "tasks",
                    from_hf: bool = False) -> tuple[nn.Module, LoadReport]:
    """Build a model and load `checkpoint` into it (VOLTA's `from_pretrained`); returns (model, report)."""
    model = build_model(config, task_cfg, task_ids, kind)
    report = load_checkpoint(model, checkpoint, from_hf=from_hf)
    model.eval()
    return model, report
