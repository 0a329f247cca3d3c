"""Conceptual Captions pretraining samples and batches, as VOLTA's `ConceptCapLoaderTrain/Val` build them.

Contract (the pretraining job codes against it):

`ConceptCapData(annotations_path, features_path, tokenizer, seq_len, split="train", objective=0, num_locs=5,
add_global_imgfeat=None, rank=None, seed=0, region_len=36, visual_target_weights=None, token_cache=None,
feature_dim=None, feature_dim_from="v_feature_size")` is a map-style torch Dataset with one sample per image record;
`len()` is the record count (VOLTA's `num_dataset`). `token_cache` (a `volta_ml.data.cache.TokenCache`) keeps the
encoded captions file between runs and ranks. `feature_dim` (the model's `v_feature_size`; `feature_dim_from` says
where it comes from, for the message) is the region feature width every record must have.
`ds.sharded` is True when the file read is this rank's part of VOLTA's distributed layout (training split with
`rank`): shard nothing further. The validation split always reads all of `validation_feat_all.lmdb`.
`set_epoch(epoch)` selects the epoch; `ds[i]` is a `ConceptCapExample` that depends only on (seed, epoch,
rank, i): masking and the negative caption come from the sample's own random stream
(`masking.sample_uniforms`), so a resumed run regenerates the same batches, in any batch composition and any
DataLoader worker, and ranks differ. `ds.__getitems__(indices)` (what a DataLoader calls with a batch's
indices) preprocesses the samples together, with the same result. `epoch_order(n, seed, epoch, block=None)`
gives a reproducible visiting order (VOLTA's tensorpack stream instead shuffles locally within a 5000-record
buffer, differently in each of its ZMQ workers, so its epochs are not exact passes).

`collate_concap(examples)` -> VOLTA's 16-tuple:
    (input_ids, input_mask, segment_ids, lm_label_ids, is_next, image_feat, image_loc, image_cls, obj_labels,
     obj_confs, attr_labels, attr_confs, image_attrs, image_label, image_mask, image_ids)
with B samples, T = seq_len, R = region_len, G = 1 with a global image feature (else 0), D = feature width:
    input_ids / input_mask / segment_ids / lm_label_ids  int64 [B, T]  (padding: id 0, mask 0, label -1)
    is_next       int64 [B]            1 when the caption was replaced by a random one
    image_feat    float32 [B, R+G, D]  picked regions zeroed (90% of them); the global row is the sum of the
                                       R region rows divided by the number of regions outside `masked_label`
                                       (at least 1), placed first or last
    image_loc     float32 [B, R+G, num_locs]  (x1/W, y1/H, x2/W, y2/H[, area fraction]); global [0,0,1,1,1..]
    image_cls     float32 [B, R, 1601] cls_prob         obj_labels  int64 [B, R]   obj_confs  float32 [B, R]
    image_attrs   float32 [B, R, 401]  attr_scores      attr_labels int64 [B, R]   attr_confs float32 [B, R]
    image_label   int64 [B, R]         1 on picked regions, -1 elsewhere (no global row: VOLTA's heads drop it)
    image_mask    int64 [B, R+G]       1 on real regions and on the global row
    image_ids     list[str]
Validation batches (`split="val"`) put the global feature FIRST whatever `add_global_imgfeat` says, as VOLTA's
`ConceptCapLoaderVal` does (it only tests the value for truth); None adds none.

Reading: with VOLTA's layout, `features_path` is the folder holding `training_feat_all.lmdb`
(`training_feat_part_<rank>.lmdb` when `rank` is given: that file is the rank's shard, do not shard it
again) or `validation_feat_all.lmdb`: tensorpack td-LMDB records `[features, cls_prob, objects_id,
objects_conf, attrs_id, attrs_conf, attr_scores, boxes, num_boxes, image_h, image_w, image_id, caption]` read by
record index. Any other `features_path` is a feature store the project reads (`volta_ml.features.open_store`:
native, LMDB, td-LMDB, H5, npy, TSV): the split's images are then the ids of `caption_<train|valid>.json`, in
file order, with their captions from that file, and extra fields under the names their format uses
(`cls_prob`, `objects_id`/`obj_id`/`objects`, `objects_conf`/`obj_conf`, `attrs_id`/`attr_id`,
`attrs_conf`/`attr_conf`, `attr_scores`/`attrs` [N, 401]).
What the model's visual targets need (`visual_target_weights` of its config, VOLTA's default {"0": 1}) must be
there: "0" (KL-1601) cls_prob with 1601 classes, "3" (LXMERT objects) object labels and confidences, "4"
(LXMERT attributes) attribute labels and confidences, "6" (xent-1601) object labels; a field no target needs
and the record lacks (or holds with another width) is zeros. A missing field, a caption id the captions file
lacks, an image the store lacks, features of another width than `feature_dim`, a captions file without captions
where the split's images or the negative captions come from it, an unknown objective or visual target:
`PretrainDataError`, `FeatureStoreError` or `MissingImageError` (usage errors: one line, exit code 2; checked on the
first record before training, on the others when read).

Objectives: the data of 0 and 1 is the same (half the captions replaced); 2 replaces none. Objective 1's
rule that a replaced caption carries no masking target is applied to the batch by the training step
(`masking.ignore_mismatched_labels`, as VOLTA's training loop does).

Kept from VOLTA: the negative caption is drawn from the first `len(records)` captions of the captions file,
in file order (with a rank's part file, the first `len(part)` ones); it may be the true caption (is_next is
still 1). Captions are encoded without special tokens, cut to `seq_len - 2` tokens (its end dropped), masked,
then wrapped in the tokenizer's special tokens ([CLS] ... [SEP]); padding uses id 0 whatever the tokenizer's
pad id; segment ids are 0. Differences, where VOLTA cannot run: records with fewer than R regions are padded
(VOLTA's overlap mask only broadcasts with exactly 36), and their global feature averages over real regions
only; records with more than R regions keep the first R; labels and confidences are padded to R rows.

Speed (docs/training.md, "Pretraining data"): the captions file is encoded once, at construction, in batches
(`text.CaptionTokens`; a record's caption is looked up there when it is the file's caption for that image);
td-LMDB records are decoded without copying their arrays (`zero_copy_unpack`: views of the LMDB map); the
masking rules run on the whole batch at once; `collate_concap` copies each record's arrays once, into the batch.
"""
from __future__ import annotations

import json
import math
import os
import re
import struct
from typing import NamedTuple

import msgpack
import numpy as np
import torch

from volta_ml.features import FeatureStoreError, MissingImageError, open_store
from volta_ml.features.td_lmdb import TdLmdbStore, box_count, split_images, unpack_value
from volta_ml.features.volta_lmdb import record_from_volta_dict

from .losses import VISUAL_CRITERIA
from .masking import (CONCAP_STREAM, NEGATIVE_PROB, OBJECTIVES, mask_region_batch, mask_token_batch, pick_below,
                      sample_uniforms)
from .text import CaptionTokens, PretrainDataError, TextEncoder

NUM_CLASSES = 1601
NUM_ATTRIBUTES = 401
CAPTION_FILES = {"train": "caption_train.json", "val": "caption_valid.json"}
VOLTA_FILES = {"train": "training_feat_all.lmdb", "val": "validation_feat_all.lmdb"}
GLOBAL_MODES = (None, "first", "last")

# visual target (VOLTA's `pre_vis_criterions` key) -> (its name, the record fields its loss reads)
# the record field each visual criterion's batch field comes from (the criteria, with what they read, are the one
# table `losses.VISUAL_CRITERIA`; `image_feat` is the region features, in every record)
CRITERION_RECORD_FIELDS = {"image_cls": "cls_prob", "obj_labels": "obj_labels", "obj_confs": "obj_confs",
                           "attr_labels": "attr_labels", "attr_confs": "attr_confs"}
# batch field -> the names a record may hold it under (CC td-LMDB / TSV, H5, npy)
FIELD_NAMES = {
    "cls_prob": ("cls_prob",),
    "obj_labels": ("objects_id", "obj_id", "objects"),
    "obj_confs": ("objects_conf", "obj_conf"),
    "attr_labels": ("attrs_id", "attr_id"),
    "attr_confs": ("attrs_conf", "attr_conf"),
    "image_attrs": ("attr_scores", "attrs"),
}
_CC_POSITIONS = {"cls_prob": 1, "obj_labels": 2, "obj_confs": 3, "attr_labels": 4, "attr_confs": 5,
                 "image_attrs": 6}   # in VOLTA's 13-field Conceptual Captions list record
_VECTOR_FIELDS = {"obj_labels": np.int64, "obj_confs": np.float32, "attr_labels": np.int64,
                  "attr_confs": np.float32}


class ConceptCapExample(NamedTuple):
    input_ids: np.ndarray      # int64 [T]
    input_mask: np.ndarray     # int64 [T]
    segment_ids: np.ndarray    # int64 [T]
    lm_label_ids: np.ndarray   # int64 [T]
    is_next: int
    features: np.ndarray       # [n, D] as stored (read-only); n <= R real regions
    zeroed: np.ndarray         # bool [n]: rows whose features the batch sets to 0
    image_loc: np.ndarray      # float32 [R, num_locs]
    fields: dict               # cls_prob [n, 1601] / image_attrs [n, 401] / labels, confs [n]: those present
    image_label: np.ndarray    # int64 [R]
    image_mask: np.ndarray     # int64 [R]
    masked_label: np.ndarray   # bool [R]
    image_id: str
    add_global: str | None     # where the batch puts the global image feature


class _Raw(NamedTuple):
    key: str                   # where the record is, for messages
    image_id: str
    caption: str | None
    features: np.ndarray
    boxes: np.ndarray
    image_w: float
    image_h: float
    fields: dict               # batch field name -> array, as stored


def _text(value) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _find(item: dict, field: str):
    for name in FIELD_NAMES[field]:
        value = item.get(name)
        if value is None:
            continue
        value = np.asarray(value)
        if field == "image_attrs" and value.ndim != 2:   # "attrs" holds attribute ids in some formats
            continue
        return value
    return None


def _raw_from_record(key, image_id, record, caption) -> _Raw:
    fields = {f: v for f in FIELD_NAMES if (v := _find(record.extra, f)) is not None}
    return _Raw(key, str(image_id), None if caption is None else _text(caption), record.features,
                record.boxes, float(record.image_w), float(record.image_h), fields)


_DATA_KEY = re.compile(re.escape(b"\xc4\x04data"))    # msgpack-numpy's b"data" key (a bin8 of length 4)
_BIN_HEADERS = {0xc4: struct.Struct(">B"), 0xc5: struct.Struct(">H"), 0xc6: struct.Struct(">I")}
_MSGPACK_ERRORS = (ValueError, TypeError, IndexError, KeyError, msgpack.exceptions.ExtraData,
                   msgpack.exceptions.FormatError, msgpack.exceptions.StackError)


_DTYPES: dict = {}


def _dtype(descr) -> np.dtype:
    dtype = _DTYPES.get(descr)
    if dtype is None:
        dtype = _DTYPES[descr] = np.dtype(descr)
    return dtype


def zero_copy_unpack(value):
    """A msgpack-numpy td-LMDB value (tensorpack's layout: every array a map ending with its b"data" bin)
    decoded with its arrays as read-only views of `value` (no copy); None when the value is not laid out so
    (pickle, another key order, a bin that merely contains the key...): decode it with `td_lmdb.unpack_value`.
    Each array's bytes are cut out and replaced by an empty bin, the small rest is decoded by msgpack, and every
    array map gets its bytes back in order, checked against its dtype and shape."""
    payloads, pieces, pos = [], [], 0
    search = _DATA_KEY.search
    while (match := search(value, pos)) is not None:
        head = match.end()
        header = _BIN_HEADERS.get(value[head])
        if header is None:
            return None
        start = head + 1 + header.size
        end = start + header.unpack_from(value, head + 1)[0]
        pieces += (value[pos:head], b"\xc4\x00")
        payloads.append(value[start:end])
        pos = end
    if not payloads:
        return None
    pieces.append(value[pos:])
    payloads.reverse()

    def numpy_map(obj):
        if b"nd" not in obj or obj.get(b"data") != b"" or obj.get(b"kind", b"") != b"":
            return obj
        data, dtype = payloads.pop(), _dtype(obj[b"type"])
        if not obj[b"nd"]:
            if len(data) != dtype.itemsize:
                raise ValueError
            return np.frombuffer(data, dtype=dtype)[0]
        shape = obj[b"shape"]
        if len(data) != math.prod(shape) * dtype.itemsize:
            raise ValueError
        return np.frombuffer(data, dtype=dtype).reshape(shape)

    try:
        item = msgpack.unpackb(b"".join(pieces), raw=False, object_hook=numpy_map, strict_map_key=False)
    except _MSGPACK_ERRORS:
        return None
    return None if payloads else item


class _TdRecords:
    """VOLTA's td-LMDB read by record index, zero-copy from the LMDB map up to the msgpack decode."""

    def __init__(self, store: TdLmdbStore):
        self.store = store
        self.path = store.path

    def __len__(self) -> int:
        return self.store.num_records

    def read(self, index: int) -> _Raw:
        record_key = self.store.record_keys[index]
        key = record_key.decode()
        value = self.store.get_value(record_key)
        if value is None:
            raise FeatureStoreError(self.path, "listed in b'__keys__' but missing", key)
        item = zero_copy_unpack(value) if value[:1] != b"\x80" else None
        if item is None:
            item = unpack_value(value, self.path, key)
        if not (isinstance(item, (list, tuple)) and len(item) >= 12):   # dict layouts: the record's first image
            (image_id, d), = split_images(self.path, key, item)[:1]
            return _raw_from_record(key, image_id, record_from_volta_dict(self.path, key, d), d.get("caption"))
        features, boxes = item[0], item[7]
        if not (isinstance(features, np.ndarray) and isinstance(boxes, np.ndarray) and features.ndim == 2
                and boxes.shape == (len(features), 4)):
            raise FeatureStoreError(self.path, "Conceptual Captions record whose features "
                                    f"{getattr(features, 'shape', type(features))} and boxes "
                                    f"{getattr(boxes, 'shape', type(boxes))} do not match", key)
        try:   # TSV strings ("36", "877.0"): VOLTA's reader takes int(num_boxes), float(image_w), float(image_h)
            num_boxes, image_w, image_h = box_count(item[8]), float(_text(item[10])), float(_text(item[9]))
        except ValueError as err:
            raise FeatureStoreError(self.path, f"Conceptual Captions record with a bad num_boxes / image_h / "
                                               f"image_w ({err})", key) from None
        if num_boxes != len(features):
            raise FeatureStoreError(self.path, f"num_boxes {_text(item[8])} but {len(features)} feature rows", key)
        fields = {f: item[p] for f, p in _CC_POSITIONS.items() if isinstance(item[p], np.ndarray)}
        caption = _text(item[12]) if len(item) > 12 and item[12] is not None else None
        return _Raw(key, _text(item[11]), caption, features, boxes, image_w, image_h, fields)


class _StoreRecords:
    """Any project feature store, read by image id in the order of `ids`."""

    def __init__(self, store, ids: list[str]):
        self.store = store
        self.path = store.path
        self.ids = ids

    def __len__(self) -> int:
        return len(self.ids)

    def read(self, index: int) -> _Raw:
        image_id = self.ids[index]
        record = self.store[image_id]
        return _raw_from_record(image_id, image_id, record, record.extra.get("caption"))


def check_objective(objective) -> int:
    if objective not in OBJECTIVES:
        choices = "; ".join(f"{k}: {v}" for k, v in OBJECTIVES.items())
        raise PretrainDataError(f"--objective {objective}: VOLTA's objectives are {choices}")
    return int(objective)


def required_fields(visual_target_weights) -> dict[str, str]:
    """Record field -> the visual target that needs it, for the targets with a positive weight."""
    weights = {"0": 1} if visual_target_weights is None else dict(visual_target_weights)
    needed = {}
    for target, weight in weights.items():
        target = str(target)
        criterion = VISUAL_CRITERIA.get(int(target)) if target.isdigit() else None
        if criterion is None:
            raise PretrainDataError(f"visual_target_weights: unknown visual target {target!r}; VOLTA's are "
                                    + ", ".join(f"{k} ({c.name})" for k, c in VISUAL_CRITERIA.items()))
        if float(weight) > 0:
            for field in criterion.needs:
                if field in CRITERION_RECORD_FIELDS:
                    needed.setdefault(CRITERION_RECORD_FIELDS[field], f"visual target {target} ({criterion.name})")
    return needed


def is_volta_layout(features_path: str) -> bool:
    """A folder holding VOLTA's pretraining LMDBs (rather than a feature store itself)."""
    if not os.path.isdir(features_path) or os.path.exists(os.path.join(features_path, "data.mdb")):
        return False
    return any(name in VOLTA_FILES.values() or (name.startswith("training_feat_part_") and name.endswith(".lmdb"))
               for name in os.listdir(features_path))


def epoch_order(num_records: int, seed: int, epoch: int, block: int | None = None) -> np.ndarray:
    """A reproducible visiting order of one epoch: a permutation from (seed, epoch); with `block`, the blocks
    of `block` consecutive records are visited in random order and shuffled inside (sequential reads of a
    large LMDB, as VOLTA's locally shuffled stream)."""
    rng = np.random.default_rng([seed, epoch, 0x6F72646572])
    if not block or block >= num_records:
        return rng.permutation(num_records)
    starts = rng.permutation(np.arange(0, num_records, block))
    return np.concatenate([s + rng.permutation(min(block, num_records - s)) for s in starts])


def read_captions(path: str) -> dict[str, str]:
    try:
        with open(path, encoding="utf-8") as handle:
            captions = json.load(handle)
    except FileNotFoundError:
        raise PretrainDataError(f"{path}: captions file not found (VOLTA's annotations layout: "
                                "caption_train.json / caption_valid.json)") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise PretrainDataError(f"{path}: not a JSON captions file ({err})") from None
    if not isinstance(captions, dict) or not all(isinstance(c, str) for c in captions.values()):
        raise PretrainDataError(f"{path}: expected a JSON object {{image id: caption}}")
    return {str(k): v for k, v in captions.items()}


class ConceptCapData(torch.utils.data.Dataset):
    """VOLTA's Conceptual Captions pretraining samples (see the module docstring)."""

    def __init__(self, annotations_path, features_path, tokenizer, seq_len: int, split: str = "train",
                 objective: int = 0, num_locs: int = 5, add_global_imgfeat=None, rank: int | None = None,
                 seed: int = 0, region_len: int = 36, visual_target_weights=None, token_cache=None,
                 feature_dim: int | None = None, feature_dim_from: str = "v_feature_size"):
        if split not in CAPTION_FILES:
            raise PretrainDataError(f"split {split!r}: choose train or val")
        self.objective = check_objective(objective)
        if add_global_imgfeat not in GLOBAL_MODES:
            raise PretrainDataError(f"add_global_imgfeat {add_global_imgfeat!r}: choose first, last or none")
        if num_locs < 4:
            raise PretrainDataError(f"num_locs {num_locs}: VOLTA's spatial features have at least 4 columns")
        self.split, self.seq_len, self.num_locs, self.region_len = split, int(seq_len), int(num_locs), region_len
        self.add_global = ("first" if add_global_imgfeat else None) if split == "val" else add_global_imgfeat
        self.rank, self.seed, self.epoch = rank, int(seed), 0
        self.feature_dim, self.feature_dim_from = feature_dim, feature_dim_from
        self.required = required_fields(visual_target_weights)
        self.text = TextEncoder(tokenizer)
        self.content_len = self.seq_len - self.text.num_special
        if self.content_len < 1:
            raise PretrainDataError(f"seq_len {seq_len} leaves no room for a caption between the tokenizer's "
                                    "special tokens")
        self.captions_path = os.path.join(str(annotations_path), CAPTION_FILES[split])
        captions = read_captions(self.captions_path)
        self.records, self.sharded = self._open_records(str(features_path), split, rank, captions)
        self.features_path = self.records.path
        self.num_dataset = len(self.records)
        if self.num_dataset == 0:
            raise PretrainDataError(f"{self.features_path}: no records for the {split} split")
        self.caption_ids = {image_id: j for j, image_id in enumerate(captions)}
        self.caption_texts = list(captions.values())
        self.caption_tokens = CaptionTokens.load_or_encode(self.text, self.caption_texts, self.captions_path,
                                                           getattr(token_cache, "cache_dir", None))
        self.num_negatives = min(self.num_dataset, len(self.caption_texts))   # VOLTA's pool: the first num_dataset
        if self.num_negatives == 0 and self.objective != 2:
            raise PretrainDataError(f"{self.captions_path}: no captions, but objective {self.objective} replaces half "
                                    "the captions by negatives drawn from this file (VOLTA's pool: its first "
                                    f"{self.num_dataset}); give the split's captions, or --objective 2")
        self._draws = 2 + 2 * self.content_len + region_len   # uniforms per sample (masking.py, draw layout)
        self._read(0)   # fail now, not in a DataLoader worker, when the first record lacks what is needed

    # -- opening ----------------------------------------------------------------------------------------------
    def _open_records(self, features_path: str, split: str, rank, captions: dict):
        if is_volta_layout(features_path):
            name = VOLTA_FILES[split] if (split == "val" or rank is None) else f"training_feat_part_{rank}.lmdb"
            path = os.path.join(features_path, name)
            if not os.path.exists(path):
                present = sorted(n for n in os.listdir(features_path) if n.endswith(".lmdb"))
                what = f"rank {rank}'s part of VOLTA's distributed layout" if name.startswith("training_feat_part") \
                    else f"VOLTA's {split} features"
                raise PretrainDataError(f"{features_path}: no {name} ({what}); it holds {', '.join(present)}")
            store = open_store(path)
            records = _TdRecords(store) if isinstance(store, TdLmdbStore) else _StoreRecords(store, store.keys_list())
            return records, rank is not None and split == "train"
        if not captions:
            raise PretrainDataError(f"{self.captions_path}: no captions; with a feature store as --features_path "
                                    f"the {split} split's images are this file's image ids")
        store = open_store(features_path)
        ids = list(captions)
        missing = [(i, n + 1) for n, i in enumerate(ids) if i not in store]
        if missing:
            raise MissingImageError.in_annotations(missing, self.captions_path, store.path)
        return _StoreRecords(store, ids), False

    def _read(self, index: int) -> _Raw:
        raw = self.records.read(index)
        if self.feature_dim is not None and raw.features.shape[1] != self.feature_dim:
            raise PretrainDataError(f"{self.features_path}: record {raw.key!r} (image {raw.image_id}) has "
                                    f"{raw.features.shape[1]}-wide region features, but {self.feature_dim_from} is "
                                    f"{self.feature_dim}")
        for field, value in raw.fields.items():
            if value.ndim == 0 or len(value) != len(raw.features):
                raise FeatureStoreError(self.features_path, f"{FIELD_NAMES[field][0]} of shape {value.shape} for "
                                                            f"{len(raw.features)} regions", raw.key)
        for field, why in self.required.items():
            value = raw.fields.get(field)
            if value is None:
                raise PretrainDataError(f"{self.features_path}: record {raw.key!r} (image {raw.image_id}) has no "
                                        f"{'/'.join(FIELD_NAMES[field])}, which {why} needs")
            if field == "cls_prob" and (value.ndim != 2 or value.shape[1] != NUM_CLASSES):
                raise PretrainDataError(f"{self.features_path}: record {raw.key!r} (image {raw.image_id}) has "
                                        f"cls_prob of shape {tuple(value.shape)}; {why} needs [N, {NUM_CLASSES}]")
        return raw

    def _caption_tokens(self, raw: _Raw) -> np.ndarray:
        """The record's own caption, from the pre-encoded captions file when it is the file's caption."""
        j = self.caption_ids.get(raw.image_id)
        if raw.caption is None:
            if j is None:
                raise PretrainDataError(f"{self.captions_path}: no caption for image id {raw.image_id!r} "
                                        f"(record {raw.key!r} of {self.features_path})")
            return self.caption_tokens[j]
        if j is not None and self.caption_texts[j] == raw.caption:
            return self.caption_tokens[j]
        return np.asarray(self.text.encode(raw.caption), dtype=np.int32)

    # -- sampling ---------------------------------------------------------------------------------------------
    def set_epoch(self, epoch: int) -> None:
        self.epoch = int(epoch)

    def __len__(self) -> int:
        return self.num_dataset

    def __getitem__(self, index: int) -> ConceptCapExample:
        return self.__getitems__([index])[0]

    def __getitems__(self, indices) -> list[ConceptCapExample]:
        """The samples of `indices`, preprocessed together (DataLoader calls this with a batch's indices)."""
        indices = [int(i) for i in indices]
        raws = [self._read(i) for i in indices]
        B, T, C, R = len(indices), self.seq_len, self.content_len, self.region_len
        u = np.stack([sample_uniforms(self.seed, CONCAP_STREAM, i, self._draws, self.epoch, self.rank)
                      for i in indices])
        # draw layout: [negative coin, negative caption, C token picks, C random ids, R region picks]
        if self.objective == 2:
            is_next = np.zeros(B, dtype=np.int64)
        else:
            is_next = (u[:, 0] > NEGATIVE_PROB).astype(np.int64)
        negatives = pick_below(u[:, 1], self.num_negatives)

        content = np.zeros((B, C), dtype=np.int64)
        lengths = np.zeros(B, dtype=np.int64)
        for b, raw in enumerate(raws):
            tokens = self.caption_tokens[negatives[b]] if is_next[b] else self._caption_tokens(raw)
            tokens = tokens[:C]
            content[b, :len(tokens)] = tokens
            lengths[b] = len(tokens)
        ids, labels = mask_token_batch(content, lengths, u[:, 2:2 + C], u[:, 2 + C:2 + 2 * C],
                                       self.text.mask_id, self.text.vocab_size)
        P, S = len(self.text.prefix), len(self.text.suffix)
        input_ids = np.zeros((B, T), dtype=np.int64)
        lm_label_ids = np.full((B, T), -1, dtype=np.int64)
        input_ids[:, :P] = self.text.prefix
        input_ids[:, P:P + C] = ids
        lm_label_ids[:, P:P + C] = labels
        rows = np.arange(B)
        for k, token in enumerate(self.text.suffix):
            input_ids[rows, P + lengths + k] = token
        input_mask = (np.arange(T) < (P + S + lengths)[:, None]).astype(np.int64)
        segment_ids = np.zeros((B, T), dtype=np.int64)

        boxes = np.zeros((B, R, 4), dtype=np.float32)
        counts = np.array([min(len(raw.features), R) for raw in raws], dtype=np.int64)
        for b, raw in enumerate(raws):
            boxes[b, :counts[b]] = raw.boxes[:counts[b]]
        real = np.arange(R) < counts[:, None]
        zeroed, image_label, masked_label = mask_region_batch(boxes, real, u[:, 2 + 2 * C:])
        image_loc = _locations(boxes, np.array([raw.image_w for raw in raws]), np.array([raw.image_h for raw in raws]),
                               self.num_locs)
        image_mask = real.astype(np.int64)
        return [ConceptCapExample(input_ids[b], input_mask[b], segment_ids[b], lm_label_ids[b], int(is_next[b]),
                                  raw.features[:counts[b]], zeroed[b, :counts[b]], image_loc[b],
                                  {k: v[:counts[b]] for k, v in raw.fields.items()}, image_label[b], image_mask[b],
                                  masked_label[b], raw.image_id, self.add_global)
                for b, raw in enumerate(raws)]

    def close(self) -> None:
        self.records.store.close()


def _locations(boxes: np.ndarray, image_w: np.ndarray, image_h: np.ndarray, num_locs: int) -> np.ndarray:
    """VOLTA's spatial features of pixel boxes `[B, R, 4]` (zero rows stay zero): x1/W, y1/H, x2/W, y2/H, then
    the area fraction (y2 - y1) * (x2 - x1) / (W * H) of the pixel box in the last column when num_locs >= 5, then
    the normalised width and height in columns 4 and 5 when num_locs > 5; float32 operations in VOLTA's order
    (`volta_ml.features.box_locations` per image gives the same values)."""
    B, R, _ = boxes.shape
    loc = np.zeros((B, R, num_locs), dtype=np.float32)
    loc[..., :4] = boxes
    if num_locs >= 5:
        wh = (image_w.astype(np.float64) * image_h.astype(np.float64)).astype(np.float32)
        loc[..., -1] = (boxes[..., 3] - boxes[..., 1]) * (boxes[..., 2] - boxes[..., 0]) / wh[:, None]
    scale = np.stack([image_w, image_h, image_w, image_h], axis=1).astype(np.float32)
    loc[..., :4] /= scale[:, None, :]
    if num_locs > 5:
        loc[..., 4:6] = loc[..., 2:4] - loc[..., 0:2]
    return loc


def collate_concap(examples: list[ConceptCapExample]) -> tuple:
    """VOLTA's batch (see the module docstring) from `ConceptCapData` samples; torch tensors + image ids."""
    B = len(examples)
    first = examples[0]
    R, L, D = len(first.image_label), first.image_loc.shape[1], first.features.shape[1]
    where = first.add_global
    G = int(where is not None)
    off = 1 if where == "first" else 0            # row of region 0 in image_feat / image_loc / image_mask
    g = 0 if where == "first" else R              # row of the global feature
    image_feat = np.empty((B, R + G, D), dtype=np.float32)
    image_cls = np.empty((B, R, NUM_CLASSES), dtype=np.float32)
    image_attrs = np.empty((B, R, NUM_ATTRIBUTES), dtype=np.float32)
    vectors = {name: np.zeros((B, R), dtype=dtype) for name, dtype in _VECTOR_FIELDS.items()}
    for b, ex in enumerate(examples):
        n = len(ex.features)
        regions = image_feat[b, off:off + R]
        regions[:n] = ex.features
        regions[n:] = 0
        regions[:n][ex.zeroed] = 0
        for name, out in (("cls_prob", image_cls), ("image_attrs", image_attrs)):
            value = ex.fields.get(name)
            if value is not None and value.shape[1] == out.shape[2]:
                out[b, :n] = value
                out[b, n:] = 0
            else:
                out[b] = 0
        for name, out in vectors.items():
            value = ex.fields.get(name)
            if value is not None:
                out[b, :n] = value
    image_loc = np.zeros((B, R + G, L), dtype=np.float32)
    image_mask = np.zeros((B, R + G), dtype=np.int64)
    image_loc[:, off:off + R] = np.stack([ex.image_loc for ex in examples])
    image_mask[:, off:off + R] = np.stack([ex.image_mask for ex in examples])
    if G:
        count = np.array([(~ex.masked_label[:len(ex.features)]).sum() for ex in examples], dtype=np.int64)
        count[count == 0] = 1
        # VOLTA divides the float32 sum by an int64 count (a float64 quotient), then casts back to float32
        image_feat[:, g] = image_feat[:, off:off + R].sum(axis=1) / count[:, None]
        image_loc[:, g, :4] = (0, 0, 1, 1)
        image_loc[:, g, 4:] = 1
        image_mask[:, g] = 1
    batch = (
        np.stack([ex.input_ids for ex in examples]),
        np.stack([ex.input_mask for ex in examples]),
        np.stack([ex.segment_ids for ex in examples]),
        np.stack([ex.lm_label_ids for ex in examples]),
        np.array([ex.is_next for ex in examples], dtype=np.int64),
        image_feat, image_loc, image_cls,
        vectors["obj_labels"], vectors["obj_confs"], vectors["attr_labels"], vectors["attr_confs"],
        image_attrs,
        np.stack([ex.image_label for ex in examples]),
        image_mask,
    )
    return tuple(torch.from_numpy(a) for a in batch) + ([ex.image_id for ex in examples],)
