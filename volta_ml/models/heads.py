"""Poolers, fusion, task heads and pretraining heads."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .config import ConfigError, VLConfig
from .layers import MASK_VALUE, get_activation

# Output width of each pretraining visual target (decoder_dict.<k>).
VISUAL_TARGET_SIZES = {0: 1601, 1: 2048, 2: 2048, 3: 1600, 4: 400, 5: 2048, 6: 1601}


class Pooler(nn.Module):
    """act(dense(states[:, index])); VOLTA's poolers use ReLU unless fusion_act says otherwise."""

    def __init__(self, width_in: int, width_out: int, fusion_act: str):
        super().__init__()
        self.dense = nn.Linear(width_in, width_out)
        self.activation = nn.ReLU() if fusion_act == "relu" else nn.Tanh()

    def forward(self, states: torch.Tensor, index: torch.Tensor | None = None) -> torch.Tensor:
        first = states[:, 0] if index is None else states[torch.arange(states.shape[0], device=states.device), index]
        return self.activation(self.dense(first))


class SimpleClassifier(nn.Module):
    """Linear -> GeLU(erf) -> LayerNorm -> Linear; keys logit_fc.{0,2,3}."""

    def __init__(self, width_in: int, hidden: int, width_out: int, eps: float):
        super().__init__()
        self.logit_fc = nn.Sequential(nn.Linear(width_in, hidden), nn.GELU(), nn.LayerNorm(hidden, eps=eps),
                                      nn.Linear(hidden, width_out))

    def forward(self, x):
        return self.logit_fc(x)


class PairClassifier(SimpleClassifier):
    """NLVR2/MaRVL: rows 2k and 2k+1 (left, right image of example k) are concatenated."""

    def forward(self, x):
        return self.logit_fc(x.reshape(-1, 2 * x.shape[-1]))


def build_task_head(config: VLConfig, task_id: str, task: dict, pooled_width: int) -> nn.Module:
    kind = task.get("type")
    C, eps = config.clf_hidden_size, config.layer_norm_eps
    if kind in ("VL-classifier", "VL-classifier-GQA"):
        return SimpleClassifier(pooled_width, C, int(task["num_labels"]), eps)
    if kind == "VL-binary-classifier":
        return PairClassifier(2 * pooled_width, C, 2, eps)
    if kind == "VL-tri-classifier":
        return nn.Linear(pooled_width, 3)
    if kind == "VL-logit":
        return nn.Linear(pooled_width, 1)
    if isinstance(kind, str) and kind.startswith("V-logit"):
        if int(task.get("num_clf_layers", 1)) == 2:
            W = config.v_hidden_size
            return nn.Sequential(nn.Linear(W, W), nn.GELU(), nn.Dropout(config.v_attention_probs_dropout_prob),
                                 nn.Linear(W, 1))
        return nn.Linear(config.v_hidden_size, 1)
    raise ConfigError(f"task {task_id}: unknown head type {kind!r} (known: VL-classifier, VL-classifier-GQA, "
                      "VL-binary-classifier, VL-tri-classifier, VL-logit, V-logit)")


def is_region_head(task: dict) -> bool:
    return isinstance(task.get("type"), str) and task["type"].startswith("V-logit")


def region_logits(head: nn.Module, v: torch.Tensor, image_mask: torch.Tensor) -> torch.Tensor:
    return head(v) + ((1.0 - image_mask.to(v.dtype)) * MASK_VALUE)[..., None]


class HeadTransform(nn.Module):
    def __init__(self, width: int, act, eps: float, layer_norm: bool = True):
        super().__init__()
        self.dense = nn.Linear(width, width)
        self.act = get_activation(act)
        self.LayerNorm = nn.LayerNorm(width, eps=eps) if layer_norm else None

    def forward(self, x):
        x = self.act(self.dense(x))
        return self.LayerNorm(x) if self.LayerNorm is not None else x


class MLMHead(nn.Module):
    """`cls.predictions`: transform, then a decoder tied to the word embeddings, plus a separate bias."""

    def __init__(self, config: VLConfig, word_embeddings: nn.Embedding):
        super().__init__()
        self.bias = nn.Parameter(torch.zeros(word_embeddings.num_embeddings))
        self.transform = HeadTransform(config.hidden_size, config.hidden_act, config.layer_norm_eps)
        self.decoder = nn.Linear(config.hidden_size, word_embeddings.num_embeddings, bias=False)
        self.decoder.weight = word_embeddings.weight

    def forward(self, t):
        return self.decoder(self.transform(t)) + self.bias


class ImagePredictionHead(nn.Module):
    def __init__(self, config: VLConfig):
        super().__init__()
        Hv = config.v_hidden_size
        self.transform = HeadTransform(Hv, config.hidden_act, config.layer_norm_eps, config.image_head_ln)
        targets = [int(k) for k, w in config.visual_target_weights.items() if float(w or 0) > 0]
        self.decoder_dict = nn.ModuleDict({str(k): nn.Linear(Hv, VISUAL_TARGET_SIZES[k]) for k in sorted(targets)})

    def forward(self, v):
        x = self.transform(v)
        return {k: dec(x) for k, dec in self.decoder_dict.items()}


class QAHead(nn.Module):
    """LXMERT's pretraining QA head (LayerNorm eps hard-coded 1e-12)."""

    def __init__(self, config: VLConfig):
        super().__init__()
        Hv = config.v_hidden_size
        self.logit_fc = nn.Sequential(nn.Linear(Hv, 2 * Hv), nn.GELU(), nn.LayerNorm(2 * Hv, eps=1e-12),
                                      nn.Linear(2 * Hv, config.qa_num_answers))

    def forward(self, pooled):
        return self.logit_fc(pooled)


class PreTrainingHeads(nn.Module):
    """`cls.*` of VOLTA's BertForVLPreTraining."""

    def __init__(self, config: VLConfig, word_embeddings: nn.Embedding):
        super().__init__()
        self.predictions = MLMHead(config, word_embeddings)
        if config.fusion_method in ("mul", "sum", "text"):
            self.bi_seq_relationship = nn.Linear(config.pooler_size, config.itm_dim)
        else:
            self.bi_seq_relationship = None
        self.imagePredictions = ImagePredictionHead(config)
        self.qaPredictions = QAHead(config) if config.qa_task_weight else None

    def forward(self, t, v, pooled):
        return {
            "mlm_logits": self.predictions(t),
            "vis_logits": self.imagePredictions(v),
            "itm_logits": self.bi_seq_relationship(pooled) if self.bi_seq_relationship is not None and
            pooled is not None else None,
            "qa_logits": self.qaPredictions(pooled) if self.qaPredictions is not None else None,
        }


def itm_match_score(itm_logits: torch.Tensor) -> torch.Tensor:
    """Zero-shot matching score from the pretraining ITM head: softmax probability of class 0 ("matched").

    A one-output head (M3P's itm_dim 1) is read as a logit where higher means a better match.
    """
    if itm_logits.shape[-1] == 1:
        return itm_logits[..., 0]
    return F.softmax(itm_logits.float(), dim=-1)[..., 0]
