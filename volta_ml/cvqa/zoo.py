"""Zero-shot CVQA scoring with an image-text matching head.

The CVQA paper scores embedding models by the similarity of the image with each of the four "question + option"
texts; our cross-encoders do the same with their matching head. Every question becomes four (image, text) rows,
each gets a matching score (higher = better match), and the prediction is the best option, ties going to the
lowest index (never random).

Which output means "match" (pinned per family by tests/test_cvqa_scoring.py):
- pretraining models (`kind="pretraining"`, every BERT-class family with fusion mul/sum/text): the ITM head
  `cls.bi_seq_relationship` has two classes and index 0 is "matched" (VOLTA's zero-shot retrieval reads
  `softmax(itm)[:, 0]`); `volta_ml.models.itm_match_score` computes it;
- a one-output ITM head (M3P's itm_dim 1) and a fine-tuned `VL-logit` retrieval head (`kind="tasks"`, any family
  including M3P): the logit itself, higher = match.
Families whose fusion gives no pooled vector (vl-bert_base, fusion "none") have no matching head.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from tqdm import tqdm

from volta_ml.models import itm_match_score

from .data import CVQAQuestion
from .prompts import EncodedTexts, encode_option_texts, option_texts
from .report import predict

NUM_OPTIONS = 4


class MatchingHeadError(ValueError):
    """A checkpoint without the matching head the run needs (its scores would be random)."""


class MatchingScorer:
    """Wraps a model so that `scorer(batch) -> [B]` float scores, higher = the text matches the image."""

    def __init__(self, model: torch.nn.Module, task_id: str | None = None):
        self.model = model
        self.task_id = task_id
        config = model.config
        if getattr(config, "fusion_method", None) in ("none", "vl-bert_vqa") and not config.is_m3p:
            raise MatchingHeadError(f"fusion_method {config.fusion_method!r} has no image-text matching head "
                                    "(no pooled vector); CVQA needs a family with fusion mul/sum/text or M3P")
        self.is_pretraining = hasattr(model, "cls")
        if self.is_pretraining:
            if getattr(model.cls, "bi_seq_relationship", None) is None:
                raise MatchingHeadError("this pretraining model has no ITM head (cls.bi_seq_relationship)")
            self.kind = "itm"
        else:
            heads = getattr(model, "task_cfg", {})
            if task_id is None:
                logit_ids = [t for t, entry in heads.items() if entry.get("type") == "VL-logit"]
                if len(logit_ids) != 1:
                    raise MatchingHeadError(f"a tasks model needs one VL-logit head for CVQA; pass task_id "
                                            f"(heads: {dict((t, e.get('type')) for t, e in heads.items())})")
                self.task_id = logit_ids[0]
            elif heads.get(task_id, {}).get("type") != "VL-logit":
                raise MatchingHeadError(f"task {task_id!r} is not a VL-logit (retrieval) head: "
                                        f"{heads.get(task_id)}")
            self.kind = "vl-logit"

    @property
    def convention(self) -> str:
        return "softmax(itm)[:, 0] (index 0 = matched)" if self.kind == "itm" and self.itm_dim == 2 else \
            "logit (higher = match)"

    @property
    def itm_dim(self) -> int:
        return self.model.cls.bi_seq_relationship.out_features if self.kind == "itm" else 1

    def __call__(self, batch: dict) -> torch.Tensor:
        if self.kind == "itm":
            out = self.model(batch["input_txt"], batch["input_imgs"], batch["image_loc"],
                             batch["token_type_ids"], batch["attention_mask"], batch["image_attention_mask"])
            return itm_match_score(out["itm_logits"]).float()
        logits = self.model(batch["input_txt"], batch["input_imgs"], batch["image_loc"], self.task_id,
                            batch["token_type_ids"], batch["attention_mask"], batch["image_attention_mask"])
        return logits[:, 0].float()


@dataclass
class ConditionScores:
    condition: str
    scores: np.ndarray        # [Q, 4]
    predictions: np.ndarray   # [Q]
    texts: EncodedTexts       # the Q*4 tokenised texts, row 4q+i = option i of question q


def blank_image(num_rows: int, feature_dim: int, num_locs: int):
    """The text-only control's "image": one all-zero region covering the whole picture, the rest padding."""
    from volta_ml.features import box_locations

    features = torch.zeros(num_rows, feature_dim)
    loc = torch.zeros(num_rows, num_locs)
    loc[0] = torch.from_numpy(box_locations(np.array([[0.0, 0.0, 1.0, 1.0]], dtype=np.float32), 1.0, 1.0,
                                            num_locs)[0])
    mask = torch.zeros(num_rows, dtype=torch.long)
    mask[0] = 1
    return features, loc, mask


def score_condition(scorer: MatchingScorer, questions: list[CVQAQuestion], condition: str, tokenizer,
                    region_view, *, max_seq_length: int = 40, template: str = "paper", batch_size: int = 64,
                    device="cpu", text_only: bool = False, amp: bool = False, progress: bool = True
                    ) -> ConditionScores:
    """Scores `[Q, 4]` for every question under one prompt condition. `text_only` replaces each image by
    `blank_image` (the blind baseline), as is any image missing from `region_view` (failed extraction; the run
    lists them); `batch_size` counts (image, text) rows."""
    pieces = [p for q in questions for p in option_texts(q, condition, template)]
    texts = encode_option_texts(tokenizer, pieces, max_seq_length)
    device = torch.device(device)
    scores = np.zeros(len(pieces), dtype=np.float64)
    per_step = max(NUM_OPTIONS, batch_size - batch_size % NUM_OPTIONS)
    blank = _blank_for(scorer.model.config, region_view)
    scorer.model.eval()
    bar = tqdm(total=len(questions), desc=f"CVQA {condition}{' text-only' if text_only else ''}",
               unit="q", disable=not progress)
    with torch.inference_mode():
        for start in range(0, len(pieces), per_step):
            stop = min(start + per_step, len(pieces))
            batch = _batch(questions, texts, start, stop, None if text_only else region_view, blank, device)
            with torch.autocast(device.type, enabled=amp and device.type == "cuda"):
                scores[start:stop] = scorer(batch).cpu().numpy()
            bar.update((stop - start) // NUM_OPTIONS)
    bar.close()
    scores = scores.reshape(len(questions), NUM_OPTIONS)
    return ConditionScores(condition, scores, predict(scores), texts)


def _batch(questions, texts: EncodedTexts, start: int, stop: int, region_view, blank, device) -> dict:
    feats, locs, masks = [], [], []
    cache: dict[str, tuple] = {}
    for row in range(start, stop):
        image_id = questions[row // NUM_OPTIONS].image_id
        if region_view is None or image_id not in region_view:   # text-only, or an image that failed extraction
            sample = blank
        else:
            if image_id not in cache:
                s = region_view[image_id]
                cache[image_id] = (s.features, s.image_loc, s.image_mask)
            sample = cache[image_id]
        feats.append(sample[0])
        locs.append(sample[1])
        masks.append(sample[2])
    ids = torch.from_numpy(texts.ids[start:stop])
    attention = (torch.arange(ids.shape[1])[None, :] < torch.from_numpy(texts.lengths[start:stop])[:, None]).long()
    return {"input_txt": ids.to(device), "input_imgs": torch.stack(feats).to(device),
            "image_loc": torch.stack(locs).to(device), "token_type_ids": torch.zeros_like(ids).to(device),
            "attention_mask": attention.to(device), "image_attention_mask": torch.stack(masks).to(device)}


def _blank_for(config, region_view):
    rows = region_view.num_rows if region_view is not None else 1
    locs = region_view.num_locs if region_view is not None else _num_locs(config)
    return blank_image(rows, _feature_dim(config), locs)


def _feature_dim(config) -> int:
    return 2048 if config.is_m3p else int(config.v_feature_size)


def _num_locs(config) -> int:
    return 5 if config.is_m3p else int(config.num_locs)
