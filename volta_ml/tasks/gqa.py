"""GQA / xGQA (TASK15, `VL-classifier-GQA`): one question per example, 1842-way answer vocabulary.

Split rules as VOLTA: `train`/`val` read `dataroot/<split>_target.pkl`; `trainval` is `trainval_target.pkl`
minus its last 3000 entries and `minval` those 3000; `test` reads `dataroot/testdev_balanced_questions.json`;
`test_*` the GQA-format JSON and `train_*`/`dev_*` the target pickle given as annotation path.
Difference: an explicit annotation path is always honoured (its format follows its extension), and a GQA
JSON's `answer` fills the target when it is in the vocabulary (VOLTA leaves test targets empty).
Loss: BCE mean × num_labels; score: Σ one-hot(argmax)·soft target.
"""
from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import torch

from volta_ml.data.annotations import AnnotationError, read_json, read_pickle
from volta_ml.tasks.common import (
    TaskDataset, TextSource, bce_classify, check_images, prepare, region_arrays,
)
from volta_ml.tasks.config import entry_path
from volta_ml.tasks.serialized import gqa_records, is_serialized


def load_vocabulary(dataroot: str) -> tuple[dict[str, int], list[str]]:
    """`trainval_ans2label` / `trainval_label2ans` from `dataroot` (pickle, or the JSON twins)."""
    root = Path(dataroot)
    found = {}
    for stem in ("trainval_ans2label", "trainval_label2ans"):
        if (root / f"{stem}.pkl").is_file():
            found[stem] = read_pickle(root / f"{stem}.pkl", "GQA answer vocabulary")
        else:
            found[stem] = read_json(root / f"{stem}.json", "GQA answer vocabulary")
    ans2label, label2ans = found["trainval_ans2label"], list(found["trainval_label2ans"])
    return ans2label, label2ans


def read_question_dict(path: str, needed=("question", "imageId")):
    """GQA's question file (`questionId -> {question, imageId, answer, ...}`): yields (position from 1, key, row),
    each row checked for the `needed` fields."""
    data = read_json(path, "GQA question file")
    if not isinstance(data, dict):
        raise AnnotationError(f"{path}: expected a GQA question dict (questionId -> question), got a "
                              f"{type(data).__name__}")
    for position, (key, row) in enumerate(data.items(), start=1):
        if not isinstance(row, dict) or not set(needed) <= set(row):
            raise AnnotationError(f"{path}: question {key!r} (entry {position}) lacks "
                                  f"{' or '.join(repr(n) for n in needed)}")
        yield position, key, row


def _from_question_json(path: str, ans2label: dict) -> list[dict]:
    records = []
    for position, key, row in read_question_dict(path):
        answer = row.get("answer")
        labels = [ans2label[answer]] if answer in ans2label else []
        records.append({"question_id": int(key), "image_id": str(row["imageId"]), "text": row["question"],
                        "labels": labels, "scores": [1.0] * len(labels), "line": position})
    return records


def _from_target_pickle(path: str, part: slice | None = None) -> list[dict]:
    data = read_pickle(path, "GQA target pickle")
    if not isinstance(data, list):
        raise AnnotationError(f"{path}: expected a list of targets, got {type(data).__name__}")
    if part is not None:
        data = data[part]
    records = []
    for position, row in enumerate(data):
        try:
            records.append({"question_id": int(row["question_id"]), "image_id": str(row["image_id"]),
                            "text": row["question"], "labels": list(row.get("labels") or []),
                            "scores": [float(s) for s in (row.get("scores") or [])], "line": position + 1})
        except (KeyError, TypeError, ValueError) as err:
            raise AnnotationError(f"{path}: entry {position + 1} is malformed ({err!r})") from None
    return records


def read_examples(split: str, dataroot: str | None, annotation_path: str | None, ans2label: dict):
    if annotation_path:
        if str(annotation_path).endswith(".json"):
            return annotation_path, _from_question_json(annotation_path, ans2label)
        return annotation_path, _from_target_pickle(annotation_path)
    if not dataroot:
        raise AnnotationError(f"GQA split {split!r}: no annotation path and no dataroot")
    if split in ("train", "val"):
        path = os.path.join(dataroot, f"{split}_target.pkl")
        return path, _from_target_pickle(path)
    if split in ("trainval", "minval"):
        path = os.path.join(dataroot, "trainval_target.pkl")
        return path, _from_target_pickle(path, slice(None, -3000) if split == "trainval" else slice(-3000, None))
    if split == "test":
        path = os.path.join(dataroot, "testdev_balanced_questions.json")
        return path, _from_question_json(path, ans2label)
    raise AnnotationError(f"GQA split {split!r} needs --val_annotations_jsonpath (or one of train, val, trainval, "
                          f"minval, test)")


class GQADataset(TaskDataset):
    def __init__(self, records, annotation_path, region_view, task_entry, text, label2ans):
        super().__init__(records, annotation_path, region_view, task_entry)
        self.text = text
        self.label2ans = label2ans
        self.num_labels = int(task_entry.get("num_labels", len(label2ans)))

    def __getitem__(self, index: int) -> dict:
        record = self.records[index]
        target = np.zeros(self.num_labels, dtype=np.float32)
        if record["labels"]:
            target[record["labels"]] = record["scores"]
        return self.example(index, region_arrays(self.region_view, record["image_id"]), target)


def build_dataset(task_entry: dict, split: str, tokenizer, region_view, *, annotation_path=None,
                  token_cache=None, **_unused) -> GQADataset:
    dataroot = entry_path(task_entry, "dataroot")
    if not dataroot:
        raise AnnotationError(f"{task_entry.get('name')}: the task config has no dataroot (answer vocabulary)")
    ans2label, label2ans = load_vocabulary(dataroot)
    if is_serialized(task_entry, region_view):  # VOLTA's GQA training format: questions inside the store
        path, records = region_view.store.path, gqa_records(region_view)
    else:
        path, records = read_examples(split, dataroot, annotation_path, ans2label)
        check_images(region_view, [(r["image_id"], r["line"]) for r in records], path)
    text = TextSource.encode(tokenizer, [r["text"] for r in records], task_entry.get("max_seq_length", 40),
                             path, token_cache)
    return GQADataset(records, path, region_view, task_entry, text, label2ans)


def forward_and_loss(model, batch: dict, task_id: str, loss_name: str | None = None):
    """`(loss, score_sum, n_examples, logits)`: BCE mean × num_labels; soft one-hot score."""
    batch = prepare(model, batch)
    return bce_classify(model, task_id, batch, batch["target"], loss_scale=batch["target"].size(1))


def predictions(batch: dict, logits: torch.Tensor, dataset) -> list[dict]:
    """IGLUE's result format: `{"questionId": "<id>", "prediction": "<answer>"}` in dataset order."""
    picked = logits.argmax(dim=1).tolist()
    return [{"questionId": str(dataset.records[i]["question_id"]), "prediction": dataset.label2ans[c]}
            for i, c in zip(batch["example_index"], picked)]


def extra_metrics(records: list[dict], task_id: str) -> dict:
    return {}


def item_scores(rows: list[dict], dataset) -> None:
    """None: eval_task's GQA score is a placeholder (VOLTA logs 0); `gqa_items` scores the predictions against the
    truth file in GQA_score, which writes the per-item file."""
    return None


def gqa_accuracy(predictions: list[dict], truth: dict) -> tuple[float, int]:
    """IGLUE's GQA_score: exact string match, predictions whose questionId is not in `truth` are skipped
    (so the denominator counts matched ids only). Returns (accuracy × 100, denominator)."""
    correct = matched = 0
    for row in predictions:
        question = truth.get(str(row["questionId"]))
        if question is None:
            continue
        matched += 1
        correct += int(row["prediction"] == question["answer"])
    return (correct / matched * 100 if matched else 0.0), matched


def gqa_items(predictions: list[dict], truth: dict) -> list[dict]:
    """Per-item rows of `gqa_accuracy` (the same matched predictions): `{"id": questionId, "score": 100 | 0}`."""
    return [{"id": str(row["questionId"]), "score": 100.0 * (row["prediction"] == truth[str(row["questionId"])]["answer"])}
            for row in predictions if str(row["questionId"]) in truth]
