"""Tiny pretraining data in VOLTA's layout, built in the test (nothing is downloaded).

`make_pretrain_data(root, ...)` writes what `train_concap.py` / `train_concap_wiki.py` read:

    <root>/annotations/caption_train.json       {image_id: caption}, in record order
    <root>/annotations/caption_valid.json
    <root>/features/training_feat_all.lmdb      tensorpack td-LMDB (msgpack-numpy), one list record per image:
    <root>/features/training_feat_part_<r>.lmdb   [features, cls_prob, objects_id, objects_conf, attrs_id,
    <root>/features/validation_feat_all.lmdb       attrs_conf, attr_scores, boxes, num_boxes, image_h, image_w,
                                                   image_id, caption]  (VOLTA's preprocess_cc_*.py layout:
                                                   num_boxes / image_h / image_w / image_id are strings)
    <root>/wiki/<lg>.20180201.txt               one paragraph a line, with empty lines and short lines
    <root>/tokenizer/                           a WordPiece (BERT) tokenizer knowing every word used

The records are written with the project's own td-LMDB writer (`volta_ml.features.td_lmdb.TdLmdbWriter`).
Part files split the training records into `n_parts` contiguous blocks (VOLTA reads
`training_feat_part_<rank>.lmdb` on rank `rank` of a distributed run). `make_feature_store` writes the same
images into any store the project reads (`open_writer` formats), with a chosen subset of the extra fields.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

NUM_CLASSES = 1601   # Visual Genome objects + background (cls_prob width, KL-1601 target)
NUM_ATTRS = 401      # Visual Genome attributes + background (attr_scores width)
CC_FIELDS = ("features", "cls_prob", "objects_id", "objects_conf", "attrs_id", "attrs_conf", "attr_scores",
             "boxes", "num_boxes", "image_h", "image_w", "image_id", "caption")

WORDS = ("a man woman dog cat riding bike red blue green small large tree house street river car near the "
         "of on in with under over two three people playing ball park sky cloud water boat beach city night "
         "day old young running jumping sitting standing black white yellow table chair window door").split()
WIKI_WORDS = {
    "en": "the history of science is the study of the development of knowledge about nature".split(),
    "de": "die geschichte der wissenschaft ist das studium der entwicklung des wissens".split(),
    "fr": "l histoire de la science est l etude du developpement des connaissances".split(),
}


@dataclass
class PretrainPaths:
    root: Path
    annotations: Path            # --annotations_path
    features: Path               # --features_path
    wiki: Path                   # --dataroot of train_concap_wiki.py
    tokenizer: Path              # --bert_model / --m_pretrained (a local folder)
    train_ids: list[str]
    val_ids: list[str]
    parts: list[list[str]]       # image ids of training_feat_part_<r>.lmdb
    records: dict[str, dict] = field(repr=False, default_factory=dict)  # image id -> the fields written
    langs: tuple[str, ...] = ()


def tiny_vocab() -> list[str]:
    words = set(WORDS)
    for lang_words in WIKI_WORDS.values():
        words.update(lang_words)
    return ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + sorted(words) + ["##s", "##ing", "."]


def write_tokenizer(folder: Path) -> Path:
    """A lower-casing WordPiece tokenizer (`AutoTokenizer.from_pretrained(folder)`) over `tiny_vocab()`."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "vocab.txt").write_text("\n".join(tiny_vocab()) + "\n", encoding="utf-8")
    (folder / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "BertTokenizer", "do_lower_case": True, "model_max_length": 512}))
    return folder


def load_tiny_tokenizer(folder: Path):
    from transformers import AutoTokenizer
    return AutoTokenizer.from_pretrained(str(folder), do_lower_case=True, local_files_only=True)


def _softmax_rows(logits: np.ndarray) -> np.ndarray:
    e = np.exp(logits - logits.max(axis=1, keepdims=True))
    return (e / e.sum(axis=1, keepdims=True)).astype(np.float32)


def make_record(rng: np.random.Generator, image_id: str, caption: str, n_regions: int, feature_dim: int,
                image_w: int = 640, image_h: int = 480) -> dict:
    """One image's fields as BUTD's TSV gives them (boxes in pixels; every third box a jittered copy of
    the one before, so that masking's IoU > 0.4 rule has overlaps to find)."""
    x1 = rng.uniform(0, image_w * 0.6, n_regions)
    y1 = rng.uniform(0, image_h * 0.6, n_regions)
    bw = rng.uniform(20, image_w * 0.4, n_regions)
    bh = rng.uniform(20, image_h * 0.4, n_regions)
    boxes = np.stack([x1, y1, x1 + bw, y1 + bh], axis=1)
    for j in range(2, n_regions, 3):
        boxes[j] = boxes[j - 1] + rng.uniform(-8, 8, 4)
    boxes = np.clip(boxes, 0, [image_w - 1, image_h - 1, image_w - 1, image_h - 1]).astype(np.float32)
    cls_prob = _softmax_rows(rng.standard_normal((n_regions, NUM_CLASSES)) * 3)
    attr_scores = _softmax_rows(rng.standard_normal((n_regions, NUM_ATTRS)) * 3)
    objects_id = cls_prob[:, 1:].argmax(axis=1).astype(np.int64)
    attrs_id = attr_scores[:, 1:].argmax(axis=1).astype(np.int64)
    return {
        "features": np.abs(rng.standard_normal((n_regions, feature_dim))).astype(np.float32),
        "cls_prob": cls_prob,
        "objects_id": objects_id,
        "objects_conf": cls_prob[np.arange(n_regions), objects_id + 1].astype(np.float32),
        "attrs_id": attrs_id,
        "attrs_conf": attr_scores[np.arange(n_regions), attrs_id + 1].astype(np.float32),
        "attr_scores": attr_scores,
        "boxes": boxes,
        "num_boxes": str(n_regions),
        "image_h": str(image_h),
        "image_w": str(image_w),
        "image_id": image_id,
        "caption": caption,
    }


def _caption(rng: np.random.Generator, min_words: int = 4, max_words: int = 14) -> str:
    return " ".join(rng.choice(WORDS, size=int(rng.integers(min_words, max_words + 1))))


def write_td_lmdb(path: Path, records: list[dict], single_file: bool = False) -> Path:
    """VOLTA's CC records (lists, in `CC_FIELDS` order) into a td-LMDB, as tensorpack's LMDBSerializer does;
    `single_file`: in LMDB's one-file layout (`subdir=False`, what `LMDBSerializer.save` writes to a new path),
    written with plain lmdb + msgpack-numpy calls (`volta_ml.testing.legacy_layouts`), not the project's writer."""
    from volta_ml.features.td_lmdb import TdLmdbWriter

    if single_file:
        from volta_ml.testing.legacy_layouts import write_td_lmdb as write_plain
        return Path(write_plain(path, [[record[name] for name in CC_FIELDS] for record in records], subdir=False))

    writer = TdLmdbWriter(str(path), overwrite=True)
    try:
        for record in records:
            writer.put_record([record[name] for name in CC_FIELDS])
    except BaseException:
        writer.abort()
        raise
    writer.close()
    return Path(path)


def write_wiki(folder: Path, langs, lines_per_lang: int, seed: int) -> Path:
    """`<lg>.20180201.txt` per language: paragraphs of 3..40 words, some empty lines (dropped by the reader,
    as VOLTA's `filter(len > 0)`) and some one-word lines (which make the reader concatenate following lines)."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    for k, lang in enumerate(langs):
        rng = np.random.default_rng([seed, 7, k])
        words = WIKI_WORDS.get(lang, WIKI_WORDS["en"])
        lines = []
        for i in range(lines_per_lang):
            n = 1 if i % 5 == 3 else int(rng.integers(3, 41))
            lines.append(" ".join(rng.choice(words, size=n)))
            if i % 4 == 1:
                lines.append("")
        (folder / f"{lang}.20180201.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return folder


def make_pretrain_data(root, n_images: int = 24, n_val: int = 8, n_regions: int = 36, feature_dim: int = 2048,
                       n_parts: int = 2, langs=("en", "de"), wiki_lines: int = 40, seed: int = 0) -> PretrainPaths:
    """Build the whole VOLTA pretraining folder under `root` (see the module docstring); returns its paths."""
    root = Path(root)
    rng = np.random.default_rng(seed)
    annotations = root / "annotations"
    features = root / "features"
    annotations.mkdir(parents=True, exist_ok=True)
    features.mkdir(parents=True, exist_ok=True)
    train_ids = [str(3_000_000_000 + 7919 * i) for i in range(n_images)]   # crc32-like ids, as VOLTA's
    val_ids = [str(1_000_000 + 31 * i) for i in range(n_val)]
    records = {}
    for image_id in train_ids + val_ids:
        records[image_id] = make_record(rng, image_id, _caption(rng), n_regions, feature_dim)
    for name, ids in (("caption_train.json", train_ids), ("caption_valid.json", val_ids)):
        (annotations / name).write_text(json.dumps({i: records[i]["caption"] for i in ids}), encoding="utf-8")
    write_td_lmdb(features / "training_feat_all.lmdb", [records[i] for i in train_ids])
    write_td_lmdb(features / "validation_feat_all.lmdb", [records[i] for i in val_ids])
    parts = [list(block) for block in np.array_split(np.array(train_ids, dtype=object), n_parts)] if n_parts else []
    for rank, ids in enumerate(parts):
        write_td_lmdb(features / f"training_feat_part_{rank}.lmdb", [records[i] for i in ids])
    wiki = write_wiki(root / "wiki", langs, wiki_lines, seed) if langs else root / "wiki"
    tokenizer = write_tokenizer(root / "tokenizer")
    return PretrainPaths(root, annotations, features, wiki, tokenizer, train_ids, val_ids, parts, records,
                         tuple(langs or ()))


def make_feature_store(path, data: PretrainPaths, fmt: str = "native",
                       fields=("cls_prob", "objects_id", "objects_conf", "attrs_id", "attrs_conf", "attr_scores"),
                       ids=None) -> Path:
    """The images of `data` (train + val, or `ids`) in a project feature store of format `fmt`, with only
    the extra `fields` named (the store `ConceptCapData` reads when --features_path is not VOLTA's layout)."""
    from volta_ml.features import open_writer

    ids = list(data.train_ids) + list(data.val_ids) if ids is None else list(ids)
    with open_writer(path, fmt) as writer:
        for image_id in ids:
            r = data.records[image_id]
            writer.put(image_id, r["features"], r["boxes"], int(r["image_w"]), int(r["image_h"]),
                       **{name: r[name] for name in fields})
    return Path(path)
