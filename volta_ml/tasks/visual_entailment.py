"""XVNLI / SNLI-VE (TASK19, `VL-tri-classifier`): one hypothesis and one Flickr30k image per example.

Behaviour kept from VOLTA: the premise (`sentence1`) is unused; a `-` gold label gives an all-zero target that
stays in the denominator (counts as wrong); regions are *not* padded to max_region_num + 1 for the global
feature, so with a global feature the last detector box is dropped; loss is BCE (not CE) over 3 outputs.
Difference: any split name is accepted (VOLTA asserts train/dev/test); the split only picks the default file.
"""
from __future__ import annotations

import os

import numpy as np
import torch

from volta_ml.data.annotations import AnnotationError, read_jsonl, require
from volta_ml.stats import unique_ids
from volta_ml.tasks.config import entry_path
from volta_ml.tasks.common import (
    TaskDataset, TextSource, bce_classify, check_images, max_region_rows, prepare, region_arrays,
)

LABELS = {"contradiction": 0, "neutral": 1, "entailment": 2}
LABEL_NAMES = ["contradiction", "neutral", "entailment"]


def annotation_file(task_entry: dict, split: str, annotation_path: str | None) -> str:
    if annotation_path:
        return annotation_path
    dataroot = entry_path(task_entry, "dataroot")
    if not dataroot:
        raise AnnotationError(f"{task_entry.get('name')}: no annotation path and no dataroot to find {split}.jsonl")
    return os.path.join(dataroot, f"{split}.jsonl")


def read_examples(path: str) -> list[dict]:
    records = []
    for index, (line_no, row) in enumerate(read_jsonl(path)):
        gold = require(row, "gold_label", path, line_no)
        if gold != "-" and gold not in LABELS:
            raise AnnotationError(f"{path}:{line_no}: gold_label {gold!r} is not one of "
                                  f"{', '.join(LABELS)} or '-'")
        flickr_id = str(require(row, "Flikr30kID", path, line_no))
        try:
            image_id = str(int(flickr_id.split(".")[0]))
        except ValueError:
            raise AnnotationError(f"{path}:{line_no}: Flikr30kID {flickr_id!r} is not a Flickr30k number") from None
        records.append({
            "question_id": index, "line": line_no, "image_id": image_id,
            "text": str(require(row, "sentence2", path, line_no)),
            "label": LABELS.get(gold, -1), "pair_id": row.get("pairID"),
        })
    return records


class VisualEntailmentDataset(TaskDataset):
    def __init__(self, records, annotation_path, region_view, task_entry, text: TextSource):
        super().__init__(records, annotation_path, region_view, task_entry)
        self.text = text
        self.rows = max_region_rows(task_entry)  # VOLTA quirk: no +1 for the global feature here

    def __getitem__(self, index: int) -> dict:
        record = self.records[index]
        target = np.zeros(3, dtype=np.float32)
        if record["label"] >= 0:
            target[record["label"]] = 1.0
        return self.example(index, region_arrays(self.region_view, record["image_id"], rows=self.rows), target)


def build_dataset(task_entry: dict, split: str, tokenizer, region_view, *, annotation_path=None,
                  token_cache=None, **_unused) -> VisualEntailmentDataset:
    path = annotation_file(task_entry, split, annotation_path)
    records = read_examples(path)
    check_images(region_view, [(r["image_id"], r["line"]) for r in records], path)
    text = TextSource.encode(tokenizer, [r["text"] for r in records], task_entry.get("max_seq_length", 80),
                             path, token_cache)
    return VisualEntailmentDataset(records, path, region_view, task_entry, text)


def forward_and_loss(model, batch: dict, task_id: str, loss_name: str | None = None):
    """`(loss, score_sum, n_examples, logits)`: BCE mean over B×3, score = Σ one-hot(argmax)·target."""
    batch = prepare(model, batch)
    return bce_classify(model, task_id, batch, batch["target"])


def predictions(batch: dict, logits: torch.Tensor, dataset) -> list[dict]:
    """Per example: line index, pairID, predicted and gold label names (VOLTA itself writes `[]`)."""
    picked = logits.argmax(dim=1).tolist()
    out = []
    for index, choice in zip(batch["example_index"], picked):
        record = dataset.records[index]
        out.append({"question_id": record["question_id"], "pairID": record["pair_id"],
                    "prediction": LABEL_NAMES[choice],
                    "label": LABEL_NAMES[record["label"]] if record["label"] >= 0 else "-"})
    return out


def extra_metrics(records: list[dict], task_id: str) -> dict:
    return {}


def item_scores(rows: list[dict], dataset) -> list[dict]:
    """100 for a correct prediction, 0 otherwise (a `-` gold label counts as wrong); id: the pairID (else the
    line's index), as `volta-ml iglue-hf` names XVNLI items."""
    ids = unique_ids(r["pair_id"] or r["question_id"] for r in dataset.records)
    return [{"id": i, "score": 100.0 * (row["prediction"] == row["label"])} for i, row in zip(ids, rows)]
