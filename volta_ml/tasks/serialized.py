"""Examples embedded in serialized (`format: serialized_lmdb`, tensorpack td-LMDB) stores.

VOLTA trains NLVR2, GQA and WIT from these: the text sits in each record next to the image features. Here
one sequential pass collects the examples; features are then read per image through the same store's
`RegionView`, so serialized stores feed the ordinary task datasets (no ZMQ workers, hence none of VOLTA's
duplicated or skipped examples).
"""
from __future__ import annotations

from tqdm import tqdm

from volta_ml.data.annotations import AnnotationError


def is_serialized(task_entry: dict, region_view) -> bool:
    store = getattr(region_view, "store", None)
    return task_entry.get("format") == "serialized_lmdb" and hasattr(store, "iter_records")


def _plain(value):
    if isinstance(value, bytes):
        return value.decode("utf-8")
    if isinstance(value, dict):
        return {_plain(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if hasattr(value, "item") and getattr(value, "ndim", 1) == 0:
        return value.item()
    if hasattr(value, "tolist") and getattr(value, "ndim", 0) == 1 and value.size < 64:
        return value.tolist()
    return value


_TEXT_FIELDS = ("question_id", "image_id", "question", "labels", "scores", "sentence", "img_id", "img_id_0",
                "img_id_1", "entry")


def iter_text_records(region_view):
    """(record key, the record's non-feature fields as plain Python values), in store order."""
    store = region_view.store
    records = store.iter_records()
    if getattr(store, "num_records", 0) > 2000:
        records = tqdm(records, total=store.num_records, desc="reading serialized examples")
    for key, item in records:
        if not isinstance(item, dict):
            raise AnnotationError(f"{store.path}: record {key} is not a dict (not a GQA/NLVR2/WIT record)")
        item = {(k.decode() if isinstance(k, bytes) else k): v for k, v in item.items()}
        yield key, {k: _plain(item[k]) for k in _TEXT_FIELDS if k in item}


def gqa_records(region_view) -> list[dict]:
    out = []
    for key, item in iter_text_records(region_view):
        entry = item.get("entry")
        if not isinstance(entry, dict) or "question" not in entry:
            raise AnnotationError(f"{region_view.store.path}: record {key} has no GQA 'entry' with a question")
        out.append({"question_id": int(entry["question_id"]), "image_id": str(item.get("img_id", key)),
                    "text": entry["question"], "labels": [int(l) for l in entry.get("labels") or []],
                    "scores": [float(s) for s in entry.get("scores") or []], "line": key})
    return out


def nlvr2_records(region_view) -> list[dict]:
    out = []
    for index, (key, item) in enumerate(iter_text_records(region_view)):
        if "sentence" not in item:
            raise AnnotationError(f"{region_view.store.path}: record {key} has no NLVR2 'sentence'")
        labels = item.get("labels") or [0]
        out.append({"question_id": index, "id": item.get("question_id", key), "line": key,
                    "images": (str(item.get("img_id_0", f"{key}_0")), str(item.get("img_id_1", f"{key}_1"))),
                    "text": item["sentence"], "label": int(labels[0])})
    return out


def wit_image_ids(region_view) -> list[str]:
    return [str(item.get("img_id", key)) for key, item in iter_text_records(region_view)]
