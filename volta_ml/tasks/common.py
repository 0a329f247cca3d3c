"""Pieces every task family shares: image lookup with actionable errors, batching, losses, scores."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch.utils.data import Dataset

from volta_ml.data.cache import TokenCache
from volta_ml.features import MissingImageError


def store_description(region_view) -> str:
    for holder in (region_view, getattr(region_view, "store", None)):
        path = getattr(holder, "path", None)
        if path:
            return str(path)
    return type(getattr(region_view, "store", region_view)).__name__


def has_image(region_view, image_id: str) -> bool:
    if hasattr(region_view, "__contains__"):
        return image_id in region_view
    return image_id in region_view.store


def check_images(region_view, wanted: list[tuple[str, int]], annotation_path) -> None:
    """Fail before evaluating anything if an annotation line names an image absent from the store."""
    missing = [(image_id, line) for image_id, line in wanted if not has_image(region_view, image_id)]
    if missing:
        raise MissingImageError.in_annotations(missing, annotation_path, store_description(region_view))


def region_arrays(region_view, image_id: str, rows: int | None = None) -> dict[str, np.ndarray]:
    """Padded region features of one image in VOLTA's names; `rows` keeps only the first rows (VE quirk)."""
    features, image_loc, image_mask, _ = region_view.arrays(image_id)
    if rows is not None:
        features, image_loc, image_mask = features[:rows], image_loc[:rows], image_mask[:rows]
    return {"input_imgs": features, "image_loc": image_loc, "image_attention_mask": image_mask}


def text_arrays(ids: np.ndarray, length: int) -> dict[str, np.ndarray]:
    mask = np.zeros_like(ids)
    mask[:length] = 1
    return {"input_txt": ids, "attention_mask": mask, "token_type_ids": np.zeros_like(ids)}


def collate(items: list[dict]) -> dict:
    """Stack arrays into tensors; everything else (ids, strings) stays a list."""
    batch = {}
    for key in items[0]:
        values = [item[key] for item in items]
        if isinstance(values[0], np.ndarray):
            batch[key] = torch.from_numpy(np.stack(values))
        elif isinstance(values[0], torch.Tensor):
            batch[key] = torch.stack(values)
        else:
            batch[key] = values
    return batch


def move_to(batch: dict, device: torch.device) -> dict:
    return {k: v.to(device, non_blocking=True) if isinstance(v, torch.Tensor) else v for k, v in batch.items()}


def model_device(model) -> torch.device:
    try:
        return next(model.parameters()).device
    except StopIteration:
        return torch.device("cpu")


def call_model(model, task_id: str, input_txt, input_imgs, image_loc, token_type_ids, attention_mask,
               image_attention_mask):
    return model(input_txt, input_imgs, image_loc, task_id, token_type_ids=token_type_ids,
                 attention_mask=attention_mask, image_attention_mask=image_attention_mask)


def prepare(model, batch: dict) -> dict:
    """The batch on the model's device, so callers need not move it themselves."""
    return move_to(batch, model_device(model))


# ---- losses and scores (VOLTA's LossMap and compute_score_with_logits, device-agnostic) -----------------

def bce_mean(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return F.binary_cross_entropy_with_logits(logits.float(), target.float(), reduction="mean")


def triplet_loss(scores: torch.Tensor, margin: float = 0.2) -> torch.Tensor:
    """uc2's loss on `[B, K]` option logits, option 0 positive: mean hinge on sigmoid scores."""
    probs = torch.sigmoid(scores.float())
    return torch.clamp(margin + probs[:, 1:] - probs[:, :1], min=0).mean()


def onehot_score_sum(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Σ one-hot(argmax) · target: exact for hard targets, soft credit for GQA-style soft targets."""
    picked = target.float().gather(1, logits.argmax(dim=1, keepdim=True))
    return picked.sum()


def bce_classify(model, task_id: str, rows: dict, target: torch.Tensor, loss_scale: int = 1):
    """`(loss, score_sum, n_examples, logits)` of a classifier head trained as VOLTA does: BCE mean over every
    logit (times `loss_scale`), score = Σ one-hot(argmax) · target."""
    logits = call_model(model, task_id, rows["input_txt"], rows["input_imgs"], rows["image_loc"],
                        rows["token_type_ids"], rows["attention_mask"], rows["image_attention_mask"])
    loss = bce_mean(logits, target)
    if loss_scale != 1:
        loss = loss * loss_scale
    return loss, onehot_score_sum(logits.float(), target), target.size(0), logits


@dataclass
class TextSource:
    """Texts of one annotation file, tokenised once (through the content-keyed cache)."""
    ids: np.ndarray
    lengths: np.ndarray

    @classmethod
    def encode(cls, tokenizer, texts: list[str], max_seq_length: int, source, token_cache: TokenCache | None):
        cache = token_cache if token_cache is not None else TokenCache(None)
        ids, lengths = cache.encode(tokenizer, texts, int(max_seq_length), source=source)
        return cls(ids, lengths)

    def arrays(self, index: int) -> dict[str, np.ndarray]:
        return text_arrays(self.ids[index], int(self.lengths[index]))


class TaskDataset(Dataset):
    """Base for the per-family datasets: `records` are per-example dicts, `__getitem__` adds tensors."""

    collate_fn = staticmethod(collate)

    def __init__(self, records: list[dict], annotation_path, region_view, task_entry: dict):
        self.records = records
        self.annotation_path = str(annotation_path)
        self.region_view = region_view
        self.task_entry = task_entry

    def __len__(self) -> int:
        return len(self.records)

    def example(self, index: int, regions: dict, target: np.ndarray) -> dict:
        """One example in VOLTA's names: the region arrays, the tokenised text of `index` (`self.text`, a
        TextSource), the target and the bookkeeping ids."""
        return {**regions, **self.text.arrays(index), "target": target,
                "question_id": self.records[index]["question_id"], "example_index": index}


def max_region_rows(task_entry: dict) -> int:
    return int(task_entry.get("max_region_num", 36))
