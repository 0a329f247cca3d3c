"""VOLTA's serialized (tensorpack td-LMDB) training stores feed the same task datasets."""
from __future__ import annotations

import json

import numpy as np
import pytest

from helpers_tasks import IGLUE, bert_uncased_dir, need_iglue, read_jsonl
from volta_ml.data import TokenCache, load_tokenizer
from volta_ml.tasks import gqa, nlvr2, retrieval


@pytest.fixture(scope="module")
def bert(tmp_path_factory):
    return load_tokenizer(str(bert_uncased_dir(tmp_path_factory.mktemp("tok"))), do_lower_case=True)


def regions(rng, n=5, dim=16):
    x1 = rng.uniform(0, 200, n)
    boxes = np.stack([x1, x1, x1 + 50, x1 + 60], 1).astype(np.float32)
    return rng.standard_normal((n, dim)).astype(np.float32), boxes


def td_view(path, records):
    from volta_ml.features import RegionView, open_store, open_writer
    with open_writer(path, "td-lmdb") as writer:
        for record in records:
            writer.put_record(record)
    return RegionView(open_store(path), 5, "first", 36)


def test_gqa_from_serialized_store(tmp_path, bert):
    root = need_iglue()
    questions = list(json.loads((root / "xGQA/annotations/few_shot/en/train_5.json").read_text()).items())[:12]
    ans2label = json.loads((root / "gqa/annotations/trainval_ans2label.json").read_text())
    rng = np.random.default_rng(0)
    records = []
    for qid, q in questions:  # one record per question, features repeated per image (as VOLTA's files)
        features, boxes = regions(rng)
        records.append({"features": features, "boxes": boxes, "img_w": 640, "img_h": 480, "img_id": q["imageId"],
                        "entry": {"question_id": qid, "image_id": q["imageId"], "question": q["question"],
                                  "labels": [ans2label[q["answer"]]], "scores": [1.0]}})
    view = td_view(tmp_path / "gqa-train.lmdb", records)
    entry = {"name": "GQA", "type": "VL-classifier-GQA", "num_labels": 1842, "max_seq_length": 40,
             "max_region_num": 36, "format": "serialized_lmdb", "dataroot": str(root / "gqa/annotations")}
    dataset = gqa.build_dataset(entry, "train", bert, view, token_cache=TokenCache(tmp_path / "cache"))
    assert len(dataset) == 12 and len(list((tmp_path / "cache").glob("*.npz"))) == 1
    item = dataset[3]
    assert item["question_id"] == int(questions[3][0])
    assert item["target"][ans2label[questions[3][1]["answer"]]] == 1.0
    assert item["input_imgs"].shape == (37, 16) and item["image_attention_mask"].sum() == 6


def test_nlvr2_from_serialized_store(tmp_path, bert):
    rows = read_jsonl(need_iglue() / "nlvr2/annotations/dev.jsonl")[:10]
    rng = np.random.default_rng(1)
    records = []
    for row in rows:
        stem = "-".join(row["identifier"].split("-")[:-1])
        record = {"question_id": row["identifier"], "sentence": row["sentence"],
                  "labels": [0 if row["label"] == "False" else 1], "scores": [1.0]}
        for side in ("0", "1"):
            features, boxes = regions(rng)
            record.update({f"features_{side}": features, f"boxes_{side}": boxes, f"img_w_{side}": 640,
                           f"img_h_{side}": 480, f"img_id_{side}": f"{stem}-img{side}"})
        records.append(record)
    view = td_view(tmp_path / "nlvr2-train.lmdb", records)
    entry = {"name": "NLVR2", "type": "VL-binary-classifier", "max_seq_length": 80, "max_region_num": 36,
             "format": "serialized_lmdb"}
    dataset = nlvr2.build_dataset(entry, "train", bert, view)
    assert [int(dataset[i]["target"].argmax()) for i in range(10)] == \
        [0 if r["label"] == "False" else 1 for r in rows]
    assert dataset[0]["input_imgs"].shape == (74, 16)


def test_wit_from_serialized_store(tmp_path, bert):
    path = need_iglue() / "wit/annotations/val_en.jsonl"
    rows = read_jsonl(path)
    ids = list(dict.fromkeys(r["wit_ix"] for r in rows))[:8]
    rng = np.random.default_rng(2)
    records = []
    for wit_ix in ids:
        features, boxes = regions(rng)
        records.append({"features": features, "boxes": boxes, "img_w": 640, "img_h": 480, "img_id": wit_ix})
    view = td_view(tmp_path / "wit-val.lmdb", records)
    entry = {"name": "RetrievalWIT", "type": "VL-logit", "max_seq_length": 30, "max_region_num": 36,
             "format": "serialized_lmdb"}
    dataset = retrieval.build_dataset(entry, "val", bert, view, annotation_path=str(path))
    last_caption = {r["wit_ix"]: r["caption_reference_description"] for r in rows}
    assert dataset.images == ids
    assert [c["text"] for c in dataset.records] == [last_caption[i] for i in ids]
    assert dataset[0]["input_imgs"].shape == (4, 37, 16)
    # split `train` with a dataroot that has no hard_negative.pkl: VOLTA's serialized loader never reads it
    # (the per-image Flickr30k/COCO path still requires it: tests/test_tasks_data.py)
    (tmp_path / "wit").mkdir()
    train = retrieval.build_dataset(dict(entry, dataroot=str(tmp_path / "wit")), "train", bert, view,
                                    annotation_path=str(path))
    assert train.hard_negatives is None and len(train) == len(ids)
