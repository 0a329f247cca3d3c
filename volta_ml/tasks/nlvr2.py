"""NLVR2 / MaRVL (TASK12, `VL-binary-classifier`, `process: nlvr`): one sentence, two images.

Each image is padded to R' rows (R' = max_region_num, +1 with a global feature) and the two are concatenated
to 2R' rows. For the forward pass the batch becomes 2B rows (image 0 and image 1 of example i at rows 2i and
2i+1, each with the same text), and the pair head turns the 2B pooled outputs into B×2 logits.
Labels: NLVR2's string `"False"` is 0 and anything else 1 (as VOLTA); MaRVL's JSON boolean is `int(label)`.
Consistency (TASK12 only): % of sentence groups whose predictions are all correct.
"""
from __future__ import annotations

import os
from collections import defaultdict

import numpy as np
import torch

from volta_ml.data.annotations import AnnotationError, read_jsonl, require
from volta_ml.stats import unique_ids
from volta_ml.tasks.common import (
    TaskDataset, TextSource, bce_classify, check_images, prepare, region_arrays,
)
from volta_ml.tasks.config import entry_path
from volta_ml.tasks.serialized import is_serialized, nlvr2_records


def _marvl_image_id(path: str) -> str:
    return os.path.basename(path).split(".")[0]


def _marvl_label(value, path, line_no) -> int:
    if isinstance(value, bool) or value in (0, 1):
        return int(value)
    raise AnnotationError(f"{path}:{line_no}: MaRVL label must be a JSON boolean, got {value!r}")


def read_examples(path: str) -> list[dict]:
    """NLVR2 (`identifier`, `sentence`, `label`) or MaRVL (`caption`, `left_img`, `right_img`) JSON-lines."""
    records = []
    for index, (line_no, row) in enumerate(read_jsonl(path)):
        if "left_img" in row or "caption" in row:
            images = (_marvl_image_id(require(row, "left_img", path, line_no)),
                      _marvl_image_id(require(row, "right_img", path, line_no)))
            sentence = require(row, "caption", path, line_no)
            label = _marvl_label(require(row, "label", path, line_no), path, line_no)
            example_id = row.get("id", index)
        else:
            identifier = str(require(row, "identifier", path, line_no))
            stem = "-".join(identifier.split("-")[:-1])
            images = (f"{stem}-img0", f"{stem}-img1")
            sentence = require(row, "sentence", path, line_no)
            label = 0 if require(row, "label", path, line_no) == "False" else 1
            example_id = identifier
        records.append({"question_id": index, "id": example_id, "line": line_no, "images": images,
                        "text": str(sentence), "label": label})
    return records


class NLVR2Dataset(TaskDataset):
    def __init__(self, records, annotation_path, region_view, task_entry, text):
        super().__init__(records, annotation_path, region_view, task_entry)
        self.text = text

    def __getitem__(self, index: int) -> dict:
        record = self.records[index]
        left = region_arrays(self.region_view, record["images"][0])
        right = region_arrays(self.region_view, record["images"][1])
        target = np.zeros(2, dtype=np.float32)
        target[record["label"]] = 1.0
        return self.example(index, {key: np.concatenate([left[key], right[key]], axis=0) for key in left}, target)


def build_dataset(task_entry: dict, split: str, tokenizer, region_view, *, annotation_path=None,
                  token_cache=None, **_unused) -> NLVR2Dataset:
    if is_serialized(task_entry, region_view):  # VOLTA's NLVR2 training format: text inside the store
        path, records = region_view.store.path, nlvr2_records(region_view)
    else:
        path = annotation_path
        if not path:
            dataroot = entry_path(task_entry, "dataroot")
            if not dataroot:
                raise AnnotationError(f"{task_entry.get('name')}: no annotation path and no dataroot for "
                                      f"{split}.jsonl")
            path = os.path.join(dataroot, f"{split}.jsonl")
        records = read_examples(path)
        check_images(region_view, [(i, r["line"]) for r in records for i in r["images"]], path)
    text = TextSource.encode(tokenizer, [r["text"] for r in records], task_entry.get("max_seq_length", 80),
                             path, token_cache)
    return NLVR2Dataset(records, path, region_view, task_entry, text)


def split_pairs(batch: dict) -> dict:
    """(B, 2R', ·) image arrays and (B, L) text -> 2B rows, one image each, text repeated per image."""
    inputs = {}
    for key in ("input_imgs", "image_loc", "image_attention_mask"):
        value = batch[key]
        inputs[key] = value.view(value.size(0) * 2, value.size(1) // 2, *value.shape[2:])
    for key in ("input_txt", "token_type_ids", "attention_mask"):
        value = batch[key]
        inputs[key] = value.repeat(1, 2).view(value.size(0) * 2, -1)
    return inputs


def forward_and_loss(model, batch: dict, task_id: str, loss_name: str | None = None):
    """`(loss, score_sum, n_examples, logits[B,2])`: BCE mean over B×2 with one-hot targets."""
    batch = prepare(model, batch)
    return bce_classify(model, task_id, split_pairs(batch), batch["target"])


def predictions(batch: dict, logits: torch.Tensor, dataset) -> list[dict]:
    """VOLTA's format: `{"sentence", "prediction": 0|1, "label": 0|1}` per example."""
    picked = logits.argmax(dim=1).tolist()
    return [{"sentence": dataset.records[i]["text"], "prediction": int(c), "label": dataset.records[i]["label"]}
            for i, c in zip(batch["example_index"], picked)]


def consistency(records: list[dict]) -> float:
    """% of sentence groups in which every prediction is correct (grouped by the sentence string, as VOLTA)."""
    groups = defaultdict(list)
    for row in records:
        groups[row["sentence"]].append(row["prediction"] == row["label"])
    if not groups:
        return 0.0
    # VOLTA's operation order (count / groups * 100): the logged repr matches IGLUE's logs digit for digit
    return sum(all(flags) for flags in groups.values()) / len(groups) * 100


def extra_metrics(records: list[dict], task_id: str) -> dict:
    return {"consistency": consistency(records)} if task_id == "TASK12" else {}


def item_scores(rows: list[dict], dataset) -> list[dict]:
    """100 for a correct prediction, 0 otherwise; id: MaRVL's `id` (else the line's index) or NLVR2's
    `identifier`, as `volta-ml iglue-hf` names them."""
    ids = unique_ids(r["id"] for r in dataset.records)
    return [{"id": i, "score": 100.0 * (row["prediction"] == row["label"])} for i, row in zip(ids, rows)]
