"""Flickr30k / xFlickr&CO / WIT retrieval (TASK8, TASK20; `VL-logit`, `process: retrieval`).

Two datasets over the same annotation reader:
- `RetrievalDataset`: one item per caption, expanded to 4 (image, text) options with the positive first, as
  VOLTA's training/validation dataset: (pos image, own caption), (pos image, caption of another image),
  (another image, own caption), (pos image, hard-negative caption when the split is exactly `train` and
  the annotations are per-image (Flickr30k/COCO, `dataroot/hard_negative.pkl` must then exist), else another
  random caption). Serialized stores (WIT, `format: serialized_lmdb`) never use hard negatives: VOLTA's
  serialized retrieval loader does not read hard_negative.pkl. Negatives come from a per-item RNG
  seeded by (seed, epoch, index), so evaluation is reproducible and workers never repeat each other's draws.
- `RetrievalGallery`: eval_retrieval's layout, item k = (caption k // num_subiters, image chunk
  k % num_subiters) with a 0/1 target over the chunk. Reused by the retrieval evaluator.
Image keys follow the feature store: `img_path`, its stem, or the stem as an integer, whichever the store has
(VOLTA uses the int stem for Flickr30k training and the full file name for xFlickr&CO test); WIT uses `wit_ix`.
"""
from __future__ import annotations

import math
import os
import random

import numpy as np
import torch
import torch.nn.functional as F

from volta_ml.data.annotations import AnnotationError, read_jsonl, read_pickle
from volta_ml.features import MissingImageError
from volta_ml.tasks.common import (
    TaskDataset, TextSource, call_model, has_image, prepare, region_arrays, store_description,
    triplet_loss,
)
from volta_ml.tasks.config import entry_path
from volta_ml.tasks.serialized import is_serialized, wit_image_ids

NUM_OPTIONS = 4


def key_candidates(row: dict) -> list[str]:
    if "wit_ix" in row:
        return [str(row["wit_ix"])]
    img_path = str(row.get("img_path") or row.get("id"))
    stem = img_path.split(".")[0]
    candidates = [img_path, stem]
    try:
        candidates.append(str(int(stem)))
    except ValueError:
        pass
    if "id" in row:
        candidates.append(str(row["id"]))
    return candidates


def row_captions(row: dict, path, line_no) -> list[str]:
    if "sentences" in row:
        return [str(s) for s in row["sentences"]]
    if "caption_reference_description" in row:
        return [str(row["caption_reference_description"])]
    raise AnnotationError(f"{path}:{line_no}: expected 'sentences' (Flickr30k/xFlickr&CO) or "
                          f"'caption_reference_description' (WIT); fields: {', '.join(sorted(row))}")


def read_captions(path: str, region_view) -> tuple[list[str], list[dict]]:
    """Unique image keys in file order and every caption `{text, image, line}` in file order."""
    images, image_index, captions, missing = [], {}, [], []
    for line_no, row in read_jsonl(path):
        texts = row_captions(row, path, line_no)
        candidates = key_candidates(row)
        key = next((c for c in candidates if has_image(region_view, c)), None)
        if key is None:
            missing.append((candidates[0], line_no))
            continue
        if key not in image_index:
            image_index[key] = len(images)
            images.append(key)
        captions.extend({"text": t, "image": image_index[key], "line": line_no} for t in texts)
    if missing:
        raise MissingImageError.in_annotations(missing, path, store_description(region_view))
    return images, captions


def read_wit_serialized(path: str, region_view) -> tuple[list[str], list[dict]]:
    """WIT training from a serialized store: one example per image record, the caption looked up by `wit_ix`
    in the annotation file (the last row wins when an id repeats, as VOLTA)."""
    caption_of = {}
    for line_no, row in read_jsonl(path):
        if "wit_ix" in row:
            caption_of[str(row["wit_ix"])] = (row_captions(row, path, line_no)[0], line_no)
    images = list(dict.fromkeys(wit_image_ids(region_view)))
    missing = [i for i in images if i not in caption_of]
    if missing:
        raise AnnotationError(f"{len(missing)} image(s) of {region_view.store.path} have no caption (wit_ix) in "
                              f"{path}, e.g. {', '.join(map(repr, missing[:5]))}")
    captions = [{"text": caption_of[key][0], "image": index, "line": caption_of[key][1]}
                for index, key in enumerate(images)]
    return images, captions


def _annotation_file(task_entry: dict, split: str, annotation_path: str | None) -> str:
    if annotation_path:
        return annotation_path
    key = "train_annotations_jsonpath" if split.startswith("train") else "val_annotations_jsonpath"
    path = entry_path(task_entry, key)
    if not path:
        raise AnnotationError(f"{task_entry.get('name')}: split {split!r} needs an annotation path "
                              f"({key} in the task config or on the command line)")
    return path


class RetrievalDataset(TaskDataset):
    """4-way (image, caption) classification items; option 0 is the positive."""

    def __init__(self, images, captions, annotation_path, region_view, task_entry, text, mask_text,
                 hard_negatives=None, seed: int = 0):
        super().__init__(captions, annotation_path, region_view, task_entry)
        self.images, self.text, self.mask_text = images, text, mask_text
        self.hard_negatives = hard_negatives
        self.seed, self.epoch = seed, 0
        self.image_index = {key: i for i, key in enumerate(images)}
        self.captions_of = [[] for _ in images]
        for index, caption in enumerate(captions):
            self.captions_of[caption["image"]].append(index)

    def set_epoch(self, epoch: int) -> None:
        """Draw fresh negatives each training epoch (call before iterating)."""
        self.epoch = epoch

    def _other_caption(self, rng, image: int):
        if len(self.images) < 2:
            return None  # VOLTA falls back to the text "[MASK]" for a single-image dataset
        other = rng.randrange(len(self.images) - 1)
        other += other >= image
        return rng.choice(self.captions_of[other])

    def _other_image(self, rng, image: int) -> str:
        if len(self.images) >= 2:
            other = rng.randrange(len(self.images) - 1)
            return self.images[other + (other >= image)]
        # a single-image dataset: VOLTA takes a random image of the whole store
        keys = [k for k in self.region_view.keys() if k != self.images[image]]
        return rng.choice(keys) if keys else self.images[image]

    def _hard_caption(self, rng, image: int):
        """A caption of one of the 99 nearest images (pool columns 1..99; column 0 is the image itself)."""
        row_of, pool, names = self.hard_negatives
        row = row_of.get(self.images[image])
        if row is None:
            raise AnnotationError(f"image {self.images[image]!r} is not in hard_negative.pkl's train_image_list")
        neighbour = names[int(pool[row, rng.randrange(1, pool.shape[1])])]
        index = self.image_index.get(neighbour)
        return rng.choice(self.captions_of[index]) if index is not None else self._other_caption(rng, image)

    def _text(self, caption_index):
        return self.mask_text if caption_index is None else self.text.arrays(caption_index)

    def __getitem__(self, index: int) -> dict:
        rng = random.Random(f"{self.seed}:{self.epoch}:{index}")
        caption = self.records[index]
        image = caption["image"]
        negative_text = self._other_caption(rng, image)
        negative_image = self._other_image(rng, image)
        hard_text = self._hard_caption(rng, image) if self.hard_negatives else self._other_caption(rng, image)
        options = [(self.images[image], index), (self.images[image], negative_text),
                   (negative_image, index), (self.images[image], hard_text)]
        regions = {key: region_arrays(self.region_view, key) for key in dict.fromkeys(k for k, _ in options)}
        parts = [dict(regions[image_key], **self._text(text_index)) for image_key, text_index in options]
        item = {key: np.stack([p[key] for p in parts]) for key in parts[0]}
        item["target"] = np.array(0, dtype=np.int64)
        item["question_id"] = index
        item["example_index"] = index
        return item


def _load_hard_negatives(task_entry: dict, split: str, dataset: RetrievalDataset) -> None:
    dataroot = entry_path(task_entry, "dataroot")
    path = os.path.join(dataroot or "", "hard_negative.pkl")
    if split != "train":
        return
    if not dataroot or not os.path.isfile(path):
        raise FileNotFoundError(f"split 'train' of the per-image {task_entry.get('name', 'retrieval')} task uses "
                                f"hard negatives from {path}, which does not exist (VOLTA's RetrievalDataset "
                                f"needs it too; use a split name other than 'train' to train without)")
    data = read_pickle(path, "hard negatives")
    names = [str(i) for i in data["train_image_list"]]
    dataset.hard_negatives = ({name: row for row, name in enumerate(names)}, np.asarray(data["train_hard_pool"]),
                              names)


def build_dataset(task_entry: dict, split: str, tokenizer, region_view, *, annotation_path=None,
                  token_cache=None, seed: int = 0, **_unused) -> RetrievalDataset:
    path = _annotation_file(task_entry, split, annotation_path)
    serialized = is_serialized(task_entry, region_view)
    if serialized:
        images, captions = read_wit_serialized(path, region_view)
    else:
        images, captions = read_captions(path, region_view)
    max_len = task_entry.get("max_seq_length", 80)
    text = TextSource.encode(tokenizer, [c["text"] for c in captions], max_len, path, token_cache)
    mask = TextSource.encode(tokenizer, [tokenizer.mask_token or "[MASK]"], max_len, None, None).arrays(0)
    dataset = RetrievalDataset(images, captions, path, region_view, task_entry, text, mask, seed=seed)
    if not serialized:  # VOLTA's serialized (WIT) loader has no hard negatives
        _load_hard_negatives(task_entry, split, dataset)
    return dataset


def option_rows(batch: dict) -> dict:
    """(B, 4, ...) -> (4B, ...): `process: retrieval`."""
    return {key: batch[key].reshape(-1, *batch[key].shape[2:])
            for key in ("input_txt", "input_imgs", "image_loc", "token_type_ids", "attention_mask",
                        "image_attention_mask")}


def forward_and_loss(model, batch: dict, task_id: str, loss_name: str | None = None):
    """`(loss, score_sum, n_examples, logits[B,4])`: CE (or uc2's triplet) with the positive at index 0;
    score = number of examples whose argmax is option 0."""
    batch = prepare(model, batch)
    rows = option_rows(batch)
    logits = call_model(model, task_id, rows["input_txt"], rows["input_imgs"], rows["image_loc"],
                        rows["token_type_ids"], rows["attention_mask"], rows["image_attention_mask"])
    logits = logits.view(batch["input_txt"].size(0), -1).float()
    positive = torch.zeros(logits.size(0), dtype=torch.long, device=logits.device)
    if loss_name == "TripletLoss":
        loss = triplet_loss(logits)
    else:
        loss = F.cross_entropy(logits, positive)
    score = (logits.argmax(dim=1) == positive).sum().float()
    return loss, score, logits.size(0), logits


def predictions(batch: dict, logits: torch.Tensor, dataset) -> list[dict]:
    """VOLTA's VL-logit eval_task format: `{"question_id", "answer": softmax over the 4 options}`."""
    probs = torch.softmax(logits.float(), dim=1).tolist()
    return [{"question_id": int(i), "answer": p} for i, p in zip(batch["example_index"], probs)]


def extra_metrics(records: list[dict], task_id: str) -> dict:
    return {}


def item_scores(rows: list[dict], dataset) -> None:
    """None: eval_task's VL-logit score picks the caption's image among 3 negatives drawn from the seed; IGLUE's retrieval
    numbers come from eval_retrieval, which writes the per-query items (`engine/retrieval_job.print_report`)."""
    return None


class RetrievalGallery(torch.utils.data.Dataset):
    """eval_retrieval items: (one caption repeated, one chunk of the image gallery, 0/1 targets)."""

    collate_fn = None

    def __init__(self, images: list[str], captions: list[dict], region_view, text: TextSource,
                 num_subiters: int = 2):
        self.images, self.captions, self.text = images, captions, text
        self.num_subiters = max(1, int(num_subiters))
        self.chunk = math.ceil(len(images) / self.num_subiters)
        # All image features are loaded once (float32; VOLTA keeps float64), as eval_retrieval does.
        arrays = [region_arrays(region_view, key) for key in images]
        self.gallery = {k: torch.from_numpy(np.stack([a[k] for a in arrays])) for k in arrays[0]}

    def __len__(self) -> int:
        return len(self.captions) * self.num_subiters

    def __getitem__(self, k: int) -> dict:
        caption_index, chunk_index = divmod(k, self.num_subiters)
        start = chunk_index * self.chunk
        stop = min(start + self.chunk, len(self.images))
        size = stop - start
        item = {key: value[start:stop] for key, value in self.gallery.items()}
        text = self.text.arrays(caption_index)
        item.update({key: torch.from_numpy(np.repeat(value[None], size, axis=0)) for key, value in text.items()})
        target = torch.zeros(size)
        gold = self.captions[caption_index]["image"]
        if start <= gold < stop:
            target[gold - start] = 1.0
        item.update(target=target, caption_index=caption_index, chunk_index=chunk_index, image_offset=start)
        return item


def build_gallery(task_entry: dict, tokenizer, region_view, annotation_path: str, *, num_subiters: int = 2,
                  token_cache=None) -> RetrievalGallery:
    images, captions = read_captions(annotation_path, region_view)
    text = TextSource.encode(tokenizer, [c["text"] for c in captions], task_entry.get("max_seq_length", 80),
                             annotation_path, token_cache)
    return RetrievalGallery(images, captions, region_view, text, num_subiters)
