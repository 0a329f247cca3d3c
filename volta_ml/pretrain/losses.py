"""VOLTA's pretraining objectives (`train_concap.py` with `BertForVLPreTraining`), written from their definitions.

A Conceptual Captions batch gives three losses, summed for the backward pass:
- masked language modelling: cross-entropy over the vocabulary at the masked tokens (`lm_label_ids` != -1),
  averaged over them;
- masked region modelling: for every `visual_target_weights` entry k with weight w > 0, w times criterion k of
  `VISUAL_CRITERIA` on the masked regions (`image_label` == 1), summed over the entries;
- image-text matching ("NSP" in VOLTA's log lines): cross-entropy of the matching head against `is_next`
  (0: the image's own caption, 1: a random caption), averaged over the batch; absent for fusion "none"/
  "vl-bert_vqa" (VL-BERT), which has no matching head.

`objective` (VOLTA's `--objective`) changes training only, as in VOLTA's loop (validation computes the plain
losses): 0 as above; 1 also drops the masked-token and masked-region targets of the mismatched pairs (VOLTA
multiplies the labels by `is_next == 0` and turns the zeros into -1); 2 multiplies the matching loss by 0 (the
data then draws no random captions). A Wikipedia batch of `train_concap_wiki.py` has the MLM loss only.

Visual targets are the region slots of the model's vision sequence: with `add_global_imgfeat` "first" the global
feature is slot 0 and the regions are slots 1.., with "last" it is the final slot (VOLTA scores predictions
`[:, 1:]` / `[:, :-1]`). The feature targets of criteria 1, 2 and 5 are the batch's `image_feat` (the model's
input: masked regions are zeroed there, as in VOLTA) at the same region slots; VOLTA passed the whole tensor,
global row included, which only lines up without a global feature (its LXMERT setting) and fails otherwise.

Fixes, each on inputs where VOLTA's result is NaN or an exception: a batch without any masked token gives MLM
loss 0 (VOLTA: NaN, which stops training), a batch without a masked region gives NCE loss 0, and NCE with a
per-process batch of one image draws its "other image" negatives from that image.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn.functional as F

from volta_ml.pretrain.masking import ignore_mismatched_labels

# VOLTA's batch tuple (train_concap.py unpacks it in this order; the data loader adds the image ids last).
CONCAP_FIELDS = ("input_ids", "input_mask", "segment_ids", "lm_label_ids", "is_next", "image_feat", "image_loc",
                 "image_cls", "obj_labels", "obj_confs", "attr_labels", "attr_confs", "image_attrs", "image_label",
                 "image_mask", "image_id")
WIKI_FIELDS = ("input_ids", "input_mask", "segment_ids", "lm_label_ids", "image_feat", "image_loc", "image_mask")
NCE_NEGATIVES = 128   # VOLTA: 70% (89) from other images of the batch, 30% (38) from other regions of the same one
IGNORE = -1


def masked_mean(values: torch.Tensor, mask: torch.Tensor, count: torch.Tensor | int | None = None) -> torch.Tensor:
    """sum(values over mask) / max(count, 1) with count = the number of masked slots unless given."""
    total = (values * mask.to(values.dtype)).sum()
    count = mask.sum() if count is None else count
    return total / torch.clamp(torch.as_tensor(count, device=values.device, dtype=values.dtype), min=1)


# ---- the visual criteria (VOLTA's losses.py: pre_vis_criterions), on the masked regions only ----------------
# `pred` is [M, n]: the head's output at the M masked regions (in row-major order of `image_label == 1`);
# `targets` holds the batch fields, also restricted to those M regions (see `region_targets`).

def kl_1601(pred, targets) -> torch.Tensor:
    """KL(detector class distribution || softmax(pred)), summed over the 1601 classes, mean over regions."""
    kl = F.kl_div(F.log_softmax(pred.float(), dim=-1), targets["image_cls"].float(), reduction="sum")
    return kl / max(pred.shape[0], 1)


def mse_2048(pred, targets) -> torch.Tensor:
    """Mean squared error against the (input) region feature, averaged over every feature entry."""
    return F.mse_loss(pred.float(), targets["image_feat"].float(), reduction="sum") / max(pred.numel(), 1)


def huber_2048(pred, targets) -> torch.Tensor:
    """Smooth-L1 (beta 1) against the (input) region feature, averaged over every feature entry (LXMERT's feat)."""
    return F.smooth_l1_loss(pred.float(), targets["image_feat"].float(), reduction="sum") / max(pred.numel(), 1)


def xent_1600(pred, targets) -> torch.Tensor:
    """Cross-entropy to the detector's object label, weighted by its confidence, mean over regions (LXMERT obj)."""
    loss = F.cross_entropy(pred.float(), targets["obj_labels"].long(), reduction="none")
    return (loss * targets["obj_confs"].float()).sum() / max(pred.shape[0], 1)


def xent_400(pred, targets) -> torch.Tensor:
    """Cross-entropy to the detector's attribute label, weighted by its confidence (LXMERT attr)."""
    loss = F.cross_entropy(pred.float(), targets["attr_labels"].long(), reduction="none")
    return (loss * targets["attr_confs"].float()).sum() / max(pred.shape[0], 1)


def xent_1601(pred, targets) -> torch.Tensor:
    """Cross-entropy to the detector's object label over 1601 classes, unweighted (VL-BERT)."""
    return F.cross_entropy(pred.float(), targets["obj_labels"].long(), reduction="sum") / max(pred.shape[0], 1)


def nce_negative_indices(batch_index: torch.Tensor, region_index: torch.Tensor, batch_size: int,
                         num_regions: int, generator: torch.Generator | None = None) -> torch.Tensor:
    """[M, 127] flat indices (b * R + r) of the negatives of each masked region (b_m, r_m), drawn as VOLTA does:
    89 from a uniformly drawn *other* image of the batch (any of its R slots), 38 from another slot of the same
    image. The draws use the torch RNG of the device (or `generator`), which resume files restore."""
    device, m = batch_index.device, batch_index.shape[0]
    across, inside = int(NCE_NEGATIVES * 0.7), int(NCE_NEGATIVES * 0.3)
    rows = torch.randint(0, max(batch_size - 1, 1), (m, across), device=device, generator=generator)
    rows[rows == batch_index[:, None]] = batch_size - 1     # other images: B-1 stands in for the image itself
    cols = torch.randint(0, num_regions, (m, across), device=device, generator=generator)
    own = torch.randint(0, max(num_regions - 1, 1), (m, inside), device=device, generator=generator)
    own[own == region_index[:, None]] = num_regions - 1       # other slots: R-1 stands in for the region itself
    return torch.cat([rows * num_regions + cols, batch_index[:, None] * num_regions + own], dim=1)


def nce_loss(pred: torch.Tensor, all_features: torch.Tensor, positive_index: torch.Tensor,
             negative_index: torch.Tensor) -> torch.Tensor:
    """Cross-entropy of picking the region's own feature among it and its negatives by the dot product with `pred`.
    `all_features` [B*R, D] (flat), `positive_index` [M], `negative_index` [M, K]."""
    if pred.shape[0] == 0:
        return pred.sum() * 0.0
    candidates = all_features[torch.cat([positive_index[:, None], negative_index], dim=1)].float()  # [M, 1+K, D]
    scores = torch.einsum("mkd,md->mk", candidates, pred.float())
    return F.cross_entropy(scores, torch.zeros(pred.shape[0], dtype=torch.long, device=pred.device))


def nce_2048(pred, targets) -> torch.Tensor:
    """NCE against the (input) region features of the batch (see `nce_negative_indices`)."""
    b, r = targets["batch_index"], targets["region_index"]
    features = targets["all_features"]                       # [B, R, D] region slots of the batch
    batch_size, num_regions = features.shape[:2]
    negatives = nce_negative_indices(b, r, batch_size, num_regions)
    return nce_loss(pred, features.reshape(batch_size * num_regions, -1), b * num_regions + r, negatives)


@dataclass(frozen=True)
class VisualCriterion:
    name: str                       # as docs/training.md names it
    width: int                      # the head's output width (decoder_dict.<k>)
    needs: tuple[str, ...]          # batch fields it reads
    loss: Callable                  # (pred [M, width], targets) -> scalar


# One row per `visual_target_weights` key (VOLTA's pre_vis_targets / pre_vis_criterions).
VISUAL_CRITERIA = {
    0: VisualCriterion("KL-1601 (detector class distribution)", 1601, ("image_cls",), kl_1601),
    1: VisualCriterion("MSE-2048 (feature regression)", 2048, ("image_feat",), mse_2048),
    2: VisualCriterion("NCE-2048 (feature contrast)", 2048, ("image_feat",), nce_2048),
    3: VisualCriterion("XENT-1600 (LXMERT object labels)", 1600, ("obj_labels", "obj_confs"), xent_1600),
    4: VisualCriterion("XENT-400 (LXMERT attribute labels)", 400, ("attr_labels", "attr_confs"), xent_400),
    5: VisualCriterion("Huber-2048 (LXMERT feature regression)", 2048, ("image_feat",), huber_2048),
    6: VisualCriterion("XENT-1601 (VL-BERT object labels)", 1601, ("obj_labels",), xent_1601),
}


def active_targets(config) -> dict[int, float]:
    """{criterion id: weight} of the config's `visual_target_weights` with weight > 0 (VOLTA builds and scores
    only those)."""
    out = {}
    for key, weight in (config.visual_target_weights or {}).items():
        if float(weight or 0) > 0:
            if int(key) not in VISUAL_CRITERIA:
                raise ValueError(f"{getattr(config, 'source', 'config')}: visual_target_weights key {key!r} is not "
                                 f"a VOLTA visual target (known: {sorted(VISUAL_CRITERIA)})")
            out[int(key)] = float(weight)
    return out


def needed_fields(config) -> set[str]:
    """The batch fields the config's visual criteria read (a data set lacking one cannot train this config)."""
    return {field for key in active_targets(config) for field in VISUAL_CRITERIA[key].needs}


# ---- slots ----------------------------------------------------------------------------------------------------

def region_slots(image_label: torch.Tensor, vision_length: int, add_global_imgfeat) -> torch.Tensor:
    """[B, vision_length] bool: the vision-sequence slots of the masked regions (the global feature, when there
    is one, is never a target)."""
    masked = image_label == 1
    extra = vision_length - masked.shape[1]
    if extra != (1 if add_global_imgfeat in ("first", "last") else 0):
        raise ValueError(f"image_label has {masked.shape[1]} regions but the vision sequence has {vision_length} "
                         f"slots (add_global_imgfeat {add_global_imgfeat!r})")
    if not extra:
        return masked
    pad = torch.zeros_like(masked[:, :1])
    return torch.cat([pad, masked], 1) if add_global_imgfeat == "first" else torch.cat([masked, pad], 1)


def region_features(image_feat: torch.Tensor, add_global_imgfeat) -> torch.Tensor:
    """[B, R, D] the region rows of `image_feat` (the global feature row dropped)."""
    if add_global_imgfeat == "first":
        return image_feat[:, 1:]
    if add_global_imgfeat == "last":
        return image_feat[:, :-1]
    return image_feat


def region_targets(fields: dict, needs: set[str], add_global_imgfeat) -> dict:
    """The target fields of the masked regions, in row-major order of `image_label == 1`."""
    masked = fields["image_label"] == 1
    batch_index, region_index = masked.nonzero(as_tuple=True)
    out = {"batch_index": batch_index, "region_index": region_index}
    for name in needs:
        value = region_features(fields[name], add_global_imgfeat) if name == "image_feat" else fields[name]
        if name == "image_feat":
            out["all_features"] = value
        out[name] = value[batch_index, region_index]
    return out


# ---- the losses of one batch ------------------------------------------------------------------------------------

def apply_objective(lm_label_ids: torch.Tensor, image_label: torch.Tensor, is_next: torch.Tensor,
                    objective: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The labels a training batch is scored on: objective 1 drops the targets of mismatched pairs
    (`masking.ignore_mismatched_labels`, VOLTA's rule); objectives 0 and 2 keep them."""
    if objective != 1:
        return lm_label_ids, image_label
    return ignore_mismatched_labels(lm_label_ids, image_label, is_next)


def mlm_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Cross-entropy at the masked tokens. `logits` is [M, V] at the slots `labels != -1` (the model's
    `text_positions`) or the full [B, L, V]."""
    if logits.dim() == 3:
        logits, labels = logits[labels != IGNORE], labels[labels != IGNORE]
    else:
        labels = labels[labels != IGNORE]
    if labels.numel() == 0:
        return logits.sum() * 0.0
    return F.cross_entropy(logits.float(), labels.long())


def itm_loss(logits: torch.Tensor | None, is_next: torch.Tensor) -> torch.Tensor | None:
    """Cross-entropy of the matching head against is_next (-1 ignored); None without a matching head."""
    if logits is None:
        return None
    return F.cross_entropy(logits.float().view(-1, logits.shape[-1]), is_next.view(-1).long(), ignore_index=IGNORE)


def visual_loss(vis_logits: dict, fields: dict, config, image_label: torch.Tensor) -> torch.Tensor | None:
    """Σ_k w_k · criterion_k over the masked regions. `vis_logits[str(k)]` is [M, n_k] at the masked region slots
    (the model's `region_positions`); None when no criterion is active."""
    targets_by = active_targets(config)
    if not targets_by:
        return None
    add_global = getattr(config, "add_global_imgfeat", None)
    targets = region_targets(dict(fields, image_label=image_label), needed_fields(config), add_global)
    total = None
    for key, weight in targets_by.items():
        value = weight * VISUAL_CRITERIA[key].loss(vis_logits[str(key)], targets)
        total = value if total is None else total + value
    return total


def as_fields(batch, names=CONCAP_FIELDS) -> dict:
    """VOLTA's batch tuple (or a dict with its names) as a dict."""
    if isinstance(batch, dict):
        return batch
    if len(batch) < len(names) - (names[-1] == "image_id"):
        raise ValueError(f"a pretraining batch has {len(names)} fields ({', '.join(names)}), got {len(batch)}")
    return dict(zip(names, batch))


def concap_losses(model, batch, config, objective: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(masked_t, masked_v, matching) of a Conceptual Captions batch, as VOLTA's train_concap.py computes them in
    training (model.training: `objective` applies) and validation. Heads run on the masked slots only."""
    fields = as_fields(batch)
    lm_labels, image_label, is_next = fields["lm_label_ids"], fields["image_label"], fields["is_next"]
    if model.training:
        lm_labels, image_label = apply_objective(lm_labels, image_label, is_next, objective)
    image_feat = fields["image_feat"]
    slots = region_slots(image_label, image_feat.shape[1], getattr(config, "add_global_imgfeat", None)) \
        if active_targets(config) else torch.zeros(image_feat.shape[:2], dtype=torch.bool, device=image_feat.device)
    out = model(fields["input_ids"], image_feat, fields["image_loc"], fields["segment_ids"], fields["input_mask"],
                fields["image_mask"], text_positions=lm_labels != IGNORE, region_positions=slots)
    masked_t = mlm_loss(out["mlm_logits"], lm_labels)
    zero = masked_t.detach() * 0.0
    masked_v = visual_loss(out["vis_logits"], fields, config, image_label)
    masked_v = zero if masked_v is None else masked_v
    matching = itm_loss(out["itm_logits"], is_next)
    if matching is None:
        matching = zero
    elif model.training and objective == 2:
        matching = matching * 0     # VOLTA computes it and multiplies by 0: the head's gradients are zeros
    return masked_t, masked_v, matching


def wiki_loss(model, batch) -> torch.Tensor:
    """The MLM loss of a Wikipedia text batch (no regions: VOLTA passes zero features with an all-zero mask)."""
    fields = as_fields(batch, WIKI_FIELDS)
    labels = fields["lm_label_ids"]
    out = model(fields["input_ids"], fields["image_feat"], fields["image_loc"], fields["segment_ids"],
                fields["input_mask"], fields["image_mask"], text_positions=labels != IGNORE,
                region_positions=torch.zeros(fields["image_feat"].shape[:2], dtype=torch.bool,
                                             device=labels.device))
    return mlm_loss(out["mlm_logits"], labels)
