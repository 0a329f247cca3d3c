"""Cross-encoder scores of (caption, image) pairs in large batches.

Speed without changing what the model computes:
- many pairs per forward (any mix of captions and images), instead of one caption per forward;
- trailing padding trimmed per batch: padded text tokens and padded regions are masked keys (weight
  exp(-10000) = 0 in the softmax) and never feed the pooled vector, so dropping them leaves every real
  position's output unchanged up to float rounding;
- dual-stream families (ViLBERT, LXMERT): the leading text-only / vision-only sub-layers run once per
  caption and once per image (`VLBertModel.encode_text_prefix/encode_image_prefix`), only the
  cross-modal rest runs per pair (`encode_pairs`);
- optional autocast (`precision` bf16/fp16).
Scores: the fine-tuned VL-logit head's raw logit, or with `zero_shot` the pretraining matching head's
probability of class 0 ("matched", `itm_match_score`).
"""
from __future__ import annotations

from contextlib import nullcontext

import torch

from volta_ml.engine.failures import UsageError
from volta_ml.models import VLBertModel, itm_match_score
from volta_ml.models.modeling import fuse

TEXT_KEYS = ("input_txt", "attention_mask", "token_type_ids")
IMAGE_KEYS = ("input_imgs", "image_loc", "image_attention_mask")
DTYPES = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}


class ScorerSetupError(UsageError):
    """The model cannot produce the requested scores (no such head): a usage error (exit code 2)."""


def used_width(mask: torch.Tensor) -> int:
    """Columns up to the last one any row keeps (trailing all-padding columns can be dropped)."""
    keep = mask.bool().any(dim=0).nonzero()
    return int(keep[-1]) + 1 if len(keep) else 1


def trim(rows: dict, mask_key: str, keys) -> dict:
    width = used_width(rows[mask_key])
    return {k: rows[k][:, :width] for k in keys}


class PairScorer:
    """Scores pairs (caption c, image i) given index tensors into the current caption block and gallery.

    `set_gallery` once (images on the device, plus their prefix states for dual-stream models),
    `set_captions` per caption block, then `score(caption_rows, image_rows)` per batch of pairs.
    """

    def __init__(self, model, task_id: str | None = None, zero_shot: bool = False, precision: str = "fp32",
                 reuse_prefix: bool = True, trim_padding: bool = True):
        self.model = model.eval()
        self.task_id, self.zero_shot = task_id, zero_shot
        self.device = next(model.parameters()).device
        self.autocast_dtype = DTYPES[precision]
        self.trim_padding = trim_padding
        bert = getattr(model, "bert", None)
        self.split = bool(reuse_prefix and isinstance(bert, VLBertModel) and bert.pair_independent_depth > 0)
        if zero_shot and getattr(getattr(model, "cls", None), "bi_seq_relationship", None) is None:
            raise ScorerSetupError("--zero_shot needs the pretraining model's image-text matching head "
                             f"(fusion_method {model.config.fusion_method!r} has none)")
        if not zero_shot and task_id not in getattr(model, "clfs_dict", {}):
            raise ScorerSetupError(f"the model has no head for {task_id}")
        self.gallery = self.image_states = None
        self.captions = self.text_states = None

    def autocast(self):
        if self.autocast_dtype is None:
            return nullcontext()
        return torch.autocast(device_type=self.device.type, dtype=self.autocast_dtype)

    @torch.no_grad()
    def set_gallery(self, gallery: dict, batch: int = 256) -> None:
        self.gallery = {k: gallery[k].to(self.device) for k in IMAGE_KEYS}
        if self.split:
            g = trim(self.gallery, "image_attention_mask", IMAGE_KEYS) if self.trim_padding else self.gallery
            self.gallery = g
            with self.autocast():
                self.image_states = torch.cat([
                    self.model.bert.encode_image_prefix(g["input_imgs"][s:s + batch], g["image_loc"][s:s + batch],
                                                        g["image_attention_mask"][s:s + batch])
                    for s in range(0, len(g["input_imgs"]), batch)])

    @torch.no_grad()
    def set_captions(self, captions: dict) -> None:
        rows = {k: captions[k].to(self.device) for k in TEXT_KEYS}
        self.captions = trim(rows, "attention_mask", TEXT_KEYS) if self.trim_padding else rows
        if self.split:
            c = self.captions
            with self.autocast():
                self.text_states = self.model.bert.encode_text_prefix(c["input_txt"], c["token_type_ids"],
                                                                      c["attention_mask"])

    @torch.no_grad()
    def score(self, caption_rows: torch.Tensor, image_rows: torch.Tensor) -> torch.Tensor:
        """float32 scores [B] of the pairs (caption_rows[b], image_rows[b])."""
        caption_rows, image_rows = caption_rows.to(self.device), image_rows.to(self.device)
        text = {k: v[caption_rows] for k, v in self.captions.items()}
        image = {k: v[image_rows] for k, v in self.gallery.items()}
        if self.trim_padding:
            text, image = trim(text, "attention_mask", TEXT_KEYS), trim(image, "image_attention_mask", IMAGE_KEYS)
        with self.autocast():
            if self.split:
                lt, lv = text["input_txt"].shape[1], image["input_imgs"].shape[1]
                out = self.model.bert.encode_pairs(self.text_states[caption_rows][:, :lt],
                                                   self.image_states[image_rows][:, :lv], text["attention_mask"],
                                                   image["image_attention_mask"], text["input_txt"])
                return self._head(out, fuse(self.model.config, out), image["image_attention_mask"])
            return self._full_forward(text, image)

    def _full_forward(self, text: dict, image: dict) -> torch.Tensor:
        if not self.zero_shot:
            logits = self.model(text["input_txt"], image["input_imgs"], image["image_loc"], self.task_id,
                                token_type_ids=text["token_type_ids"], attention_mask=text["attention_mask"],
                                image_attention_mask=image["image_attention_mask"])
            return logits[:, 0].float()
        out = self.model.bert(text["input_txt"], image["input_imgs"], image["image_loc"], text["token_type_ids"],
                              text["attention_mask"], image["image_attention_mask"])
        return self._head(out, fuse(self.model.config, out), image["image_attention_mask"])

    def _head(self, out, pooled, image_mask) -> torch.Tensor:
        if self.zero_shot:
            # only the matching head: the MLM / region heads of the full pretraining forward are not needed
            return itm_match_score(self.model.cls.bi_seq_relationship(self.model.dropout(pooled))).float()
        return self.model.head(self.task_id, out, pooled, image_mask)[:, 0].float()


@torch.no_grad()
def volta_scheme_scores(model, captions: dict, gallery: dict, task_id: str | None = None, zero_shot: bool = False,
                        num_subiters: int = 2, progress=None):
    """VOLTA's eval_retrieval loop, for reference and benchmarks: one caption repeated against one chunk of
    ceil(n_img / num_subiters) images per forward, full padding, fp32. Returns a float32 [C, N] tensor."""
    scorer = PairScorer(model, task_id, zero_shot, reuse_prefix=False, trim_padding=False)
    scorer.set_gallery(gallery)
    n_cap, n_img = len(captions["input_txt"]), len(gallery["input_imgs"])
    chunk = -(-n_img // num_subiters)
    scores = torch.empty(n_cap, n_img)
    for c in range(n_cap):
        scorer.set_captions({k: v[c:c + 1] for k, v in captions.items()})
        for start in range(0, n_img, chunk):
            images = torch.arange(start, min(start + chunk, n_img))
            scores[c, start:start + len(images)] = scorer.score(torch.zeros_like(images), images).cpu()
        if progress is not None:
            progress(c)
    return scores
