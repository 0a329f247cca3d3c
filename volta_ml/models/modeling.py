"""The VOLTA model classes: backbone (`bert`), fine-tuning model with task heads, pretraining model."""
from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import nn

from .config import ConfigError, VLConfig
from .embeddings import build_embeddings
from .heads import Pooler, PreTrainingHeads, build_task_head, is_region_head, region_logits
from .layers import VLEncoder, additive_mask, init_weights


@dataclass
class EncoderOutput:
    seq_t: torch.Tensor                     # [B, L, H] final text states (padded rows included)
    seq_v: torch.Tensor                     # [B, R, Hv] final vision states
    pooled_t: torch.Tensor | None           # [B, P] (None for fusion "none")
    pooled_v: torch.Tensor | None           # [B, Pv] (fusion mul/sum only)
    layers_t: list[torch.Tensor] = field(default_factory=list)  # embeddings + every sub-layer, if asked
    layers_v: list[torch.Tensor] = field(default_factory=list)


def default_masks(input_txt, input_imgs, attention_mask, image_attention_mask):
    if attention_mask is None:
        attention_mask = torch.ones_like(input_txt)
    if image_attention_mask is None:
        image_attention_mask = torch.ones(input_imgs.shape[:2], dtype=torch.long, device=input_imgs.device)
    return attention_mask, image_attention_mask


class VLBertModel(nn.Module):
    """VOLTA's BertModel: embeddings, the unified sub-layer encoder and the poolers."""

    def __init__(self, config: VLConfig):
        super().__init__()
        self.config = config
        self.embeddings, v_embeddings = build_embeddings(config)
        if v_embeddings is not None:
            self.v_embeddings = v_embeddings
        self.encoder = VLEncoder(config)
        fusion = config.fusion_method
        if fusion != "none":
            self.t_pooler = Pooler(config.hidden_size, config.pooler_size, config.fusion_act)
        if fusion in ("mul", "sum"):
            if config.pooler_size != config.v_pooler_size:
                raise ConfigError(f"{config.source}: fusion {fusion!r} needs pooler_size == v_pooler_size, got "
                                  f"{config.pooler_size} and {config.v_pooler_size}")
            self.v_pooler = Pooler(config.v_hidden_size, config.v_pooler_size, config.fusion_act)

    def embed(self, input_txt, input_imgs, image_loc, token_type_ids=None):
        if hasattr(self, "v_embeddings"):
            return self.embeddings(input_txt, token_type_ids), self.v_embeddings(input_imgs, image_loc)
        return self.embeddings(input_txt, input_imgs, image_loc, token_type_ids)

    def forward(self, input_txt, input_imgs, image_loc, token_type_ids=None, attention_mask=None,
                image_attention_mask=None, output_all_encoded_layers: bool = False) -> EncoderOutput:
        attention_mask, image_attention_mask = default_masks(input_txt, input_imgs, attention_mask,
                                                              image_attention_mask)
        t, v = self.embed(input_txt, input_imgs, image_loc, token_type_ids)
        dtype = t.dtype
        all_t, all_v = self.encoder(t, v, additive_mask(attention_mask, dtype),
                                    additive_mask(image_attention_mask, dtype), output_all_encoded_layers)
        return self._pool(input_txt, all_t, all_v, output_all_encoded_layers)

    # ---- pair-independent prefix (dual-stream families): used to score many (caption, image) pairs -------

    @property
    def pair_independent_depth(self) -> int:
        """How many leading sub-layers see one modality only (0 for single-stream models, whose shared
        embedding already mixes text and image)."""
        return self.encoder.cross_start if hasattr(self, "v_embeddings") else 0

    def _need_split(self) -> None:
        if not hasattr(self, "v_embeddings"):
            raise ConfigError(f"{self.config.source}: {self.config.image_embeddings!r} embeds text and image "
                              "jointly, so there is no per-caption / per-image prefix to compute")

    def encode_text_prefix(self, input_txt, token_type_ids=None, attention_mask=None) -> torch.Tensor:
        """Text states after the first `pair_independent_depth` sub-layers: the same for every image."""
        self._need_split()
        if attention_mask is None:
            attention_mask = torch.ones_like(input_txt)
        t = self.embeddings(input_txt, token_type_ids)
        return self.encoder.forward_prefix(t, None, additive_mask(attention_mask, t.dtype), None)[0]

    def encode_image_prefix(self, input_imgs, image_loc, image_attention_mask=None) -> torch.Tensor:
        """Vision states after the first `pair_independent_depth` sub-layers: the same for every caption."""
        self._need_split()
        if image_attention_mask is None:
            image_attention_mask = torch.ones(input_imgs.shape[:2], dtype=torch.long, device=input_imgs.device)
        v = self.v_embeddings(input_imgs, image_loc)
        return self.encoder.forward_prefix(None, v, None, additive_mask(image_attention_mask, v.dtype))[1]

    def encode_pairs(self, text_prefix, image_prefix, attention_mask, image_attention_mask,
                     input_txt=None) -> EncoderOutput:
        """The rest of the encoder and the poolers on aligned rows of prefix states (row i = pair i); equal to
        `forward` on the same pairs. `input_txt` is needed only by VL-BERT's VQA pooling."""
        self._need_split()
        dtype = text_prefix.dtype
        all_t, all_v = self.encoder(text_prefix, image_prefix, additive_mask(attention_mask, dtype),
                                    additive_mask(image_attention_mask, dtype), start=self.pair_independent_depth)
        return self._pool(input_txt, all_t, all_v, False)

    def _pool(self, input_txt, all_t, all_v, output_all_encoded_layers: bool) -> EncoderOutput:
        seq_t, seq_v = all_t[-1], all_v[-1]
        pooled_t = pooled_v = None
        if hasattr(self, "t_pooler"):
            index = None
            if self.config.fusion_method == "vl-bert_vqa":
                index = (input_txt != 0).sum(1) - 2   # the [MASK] the VQA loader inserts after the text
            pooled_t = self.t_pooler(seq_t, index)
        if hasattr(self, "v_pooler"):
            pooled_v = self.v_pooler(seq_v)
        return EncoderOutput(seq_t, seq_v, pooled_t, pooled_v,
                             all_t if output_all_encoded_layers else [], all_v if output_all_encoded_layers else [])


def fuse(config: VLConfig, out: EncoderOutput) -> torch.Tensor | None:
    fusion = config.fusion_method
    if fusion == "mul":
        return out.pooled_t * out.pooled_v
    if fusion == "sum":
        return out.pooled_t + out.pooled_v
    if fusion in ("text", "vl-bert_vqa"):
        return out.pooled_t
    return None


def _check_task_ids(task_cfg: dict, task_ids) -> list[str]:
    task_ids = list(task_cfg) if task_ids is None else list(task_ids)
    unknown = [t for t in task_ids if t not in task_cfg]
    if unknown:
        raise ConfigError(f"task ids {unknown} are not in the task config (it has {sorted(task_cfg)})")
    return task_ids


class TasksModel(nn.Module):
    """VOLTA's *ForVLTasks: a backbone `bert`, dropout, and one head per task id in `clfs_dict`.

    A family supplies `build_backbone(config)` and `encode(...) -> (EncoderOutput, pooled vector or None)`;
    construction, `head()` and `forward()` are shared, so every family's task model is called the same way.
    """

    region_heads = True   # V-logit heads (one logit per region)

    def __init__(self, config: VLConfig, task_cfg: dict | None = None, task_ids=None, dropout_prob: float = 0.1):
        super().__init__()
        self.config = config
        self.task_cfg = dict(task_cfg or {})
        self.bert = self.build_backbone(config)
        self.dropout = nn.Dropout(dropout_prob)   # fixed 0.1 in VOLTA, independent of the config
        self.clfs_dict = nn.ModuleDict()
        for tid in _check_task_ids(self.task_cfg, task_ids):
            if is_region_head(self.task_cfg[tid]) and not self.region_heads:
                raise NotImplementedError(f"{type(self).__name__} has no V-logit (region) heads, as in VOLTA")
            self.clfs_dict[tid] = build_task_head(config, tid, self.task_cfg[tid], config.pooler_size)
        init_weights(self, config.initializer_range)

    def build_backbone(self, config: VLConfig) -> nn.Module:
        raise NotImplementedError

    def encode(self, input_txt, input_imgs, image_loc, token_type_ids=None, attention_mask=None,
               image_attention_mask=None) -> tuple[EncoderOutput, torch.Tensor | None]:
        raise NotImplementedError

    def forward(self, input_txt, input_imgs, image_loc, task_id: str, token_type_ids=None, attention_mask=None,
                image_attention_mask=None):
        out, pooled = self.encode(input_txt, input_imgs, image_loc, token_type_ids, attention_mask,
                                  image_attention_mask)
        return self.head(task_id, out, pooled, image_attention_mask)

    def head(self, task_id: str, out: EncoderOutput, pooled, image_attention_mask=None) -> torch.Tensor:
        if task_id not in self.clfs_dict:
            raise KeyError(f"no head for task {task_id!r}; this model has {list(self.clfs_dict)}")
        head = self.clfs_dict[task_id]
        if is_region_head(self.task_cfg[task_id]):
            mask = image_attention_mask if image_attention_mask is not None else \
                torch.ones(out.seq_v.shape[:2], device=out.seq_v.device)
            return region_logits(head, self.dropout(out.seq_v), mask)
        if pooled is None:
            raise ConfigError(f"fusion_method {self.config.fusion_method!r} gives no pooled vector; only "
                              "V-logit heads work with it")
        return head(self.dropout(pooled))


class VLTasksModel(TasksModel):
    """VOLTA's BertForVLTasks: backbone `bert` (VLBertModel), heads on the fused pooled vector."""

    def build_backbone(self, config: VLConfig) -> nn.Module:
        return VLBertModel(config)

    def encode(self, input_txt, input_imgs, image_loc, token_type_ids=None, attention_mask=None,
               image_attention_mask=None, output_all_encoded_layers=False) -> tuple[EncoderOutput, torch.Tensor]:
        out = self.bert(input_txt, input_imgs, image_loc, token_type_ids, attention_mask, image_attention_mask,
                        output_all_encoded_layers)
        return out, fuse(self.config, out)


class VLPreTrainingModel(nn.Module):
    """VOLTA's BertForVLPreTraining without the losses: backbone `bert` + heads `cls`.

    As in VOLTA, the heads keep Xavier initialisation (`cls.*`: Xavier-uniform Linear weights, zero biases),
    applied after the backbone's N(0, initializer_range); the MLM decoder is the word-embedding table, so
    a model built from scratch starts with Xavier word embeddings, as VOLTA's does.
    """

    def __init__(self, config: VLConfig):
        super().__init__()
        self.config = config
        self.bert = VLBertModel(config)
        self.cls = PreTrainingHeads(config, self.bert.embeddings.word_embeddings)
        self.dropout = nn.Dropout(0.1)
        init_weights(self.bert, config.initializer_range)
        for module in self.cls.modules():
            if isinstance(module, nn.Linear):
                nn.init.xavier_uniform_(module.weight)
                if module.bias is not None:
                    nn.init.zeros_(module.bias)

    def forward(self, input_txt, input_imgs, image_loc, token_type_ids=None, attention_mask=None,
                image_attention_mask=None, text_positions=None, region_positions=None) -> dict:
        """The heads' outputs (see `PreTrainingHeads`). `text_positions` [B, L] / `region_positions` [B, R]
        (bool) restrict the MLM / visual heads to those slots: their outputs are then `[M, n]`, the selected
        rows in row-major order, the same numbers as the full outputs indexed by the mask (a pretraining
        loss reads only the masked slots, and the MLM decoder over every token is most of a step's work)."""
        out = self.bert(input_txt, input_imgs, image_loc, token_type_ids, attention_mask, image_attention_mask)
        pooled = fuse(self.config, out)
        seq_t = out.seq_t if text_positions is None else out.seq_t[text_positions]
        seq_v = out.seq_v if region_positions is None else out.seq_v[region_positions]
        heads = self.cls(seq_t, seq_v, self.dropout(pooled) if pooled is not None else None)
        heads["pooled"] = pooled
        return heads
