"""Text, image and joint embeddings of every VOLTA family.

Every module returns `(text_embeddings [B,L,H], vision_embeddings [B,R,Hv])` from the VOLTA inputs.
Dual-stream models combine a text module (`bert.embeddings`) with an image module (`bert.v_embeddings`);
single-stream models use one joint module under `bert.embeddings`. Attribute names are VOLTA's key names.
"""
from __future__ import annotations

import torch
from torch import nn

from .config import ConfigError, VLConfig


def roberta_position_ids(input_ids: torch.Tensor, pad: int) -> torch.Tensor:
    """Real tokens get pad+1, pad+2, ...; padding tokens get `pad`."""
    keep = (input_ids != pad).long()
    return torch.cumsum(keep, dim=1) * keep + pad


def plain_position_ids(input_ids: torch.Tensor) -> torch.Tensor:
    return torch.arange(input_ids.shape[1], device=input_ids.device).expand_as(input_ids)


def _default_types(input_ids, token_type_ids):
    return torch.zeros_like(input_ids) if token_type_ids is None else token_type_ids


class BertTextEmbeddings(nn.Module):
    """Text side of dual-stream models; RoBERTa-style positions when bert_model names a RoBERTa."""

    def __init__(self, config: VLConfig, roberta: bool = False):
        super().__init__()
        self.roberta = roberta
        self.pad = config.pad_token_id
        H = config.hidden_size
        self.word_embeddings = nn.Embedding(config.vocab_size, H, padding_idx=self.pad if roberta else 0)
        self.position_embeddings = nn.Embedding(config.max_position_embeddings, H,
                                                padding_idx=self.pad if roberta else None)
        self.token_type_embeddings = nn.Embedding(config.type_vocab_size, H)
        self.LayerNorm = nn.LayerNorm(H, eps=config.layer_norm_eps)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)
        if roberta:
            self.register_buffer("position_ids", torch.arange(config.max_position_embeddings)[None], persistent=True)

    def forward(self, input_ids, token_type_ids=None):
        pos = roberta_position_ids(input_ids, self.pad) if self.roberta else plain_position_ids(input_ids)
        x = self.word_embeddings(input_ids) + self.position_embeddings(pos) + \
            self.token_type_embeddings(_default_types(input_ids, token_type_ids))
        return self.dropout(self.LayerNorm(x))


class VilbertImageEmbeddings(nn.Module):
    """`vilbert`: LN(features + locations)."""

    def __init__(self, config: VLConfig):
        super().__init__()
        self.image_embeddings = nn.Linear(config.v_feature_size, config.v_hidden_size)
        self.image_location_embeddings = nn.Linear(config.num_locs, config.v_hidden_size)
        self.LayerNorm = nn.LayerNorm(config.v_hidden_size, eps=config.layer_norm_eps)
        self.dropout = nn.Dropout(config.v_hidden_dropout_prob)

    def forward(self, image_feat, image_loc):
        return self.dropout(self.LayerNorm(self.image_embeddings(image_feat) + self.image_location_embeddings(image_loc)))


class LxmertImageEmbeddings(nn.Module):
    """`lxmert`: the average of two LayerNorms (note the division by 2)."""

    def __init__(self, config: VLConfig):
        super().__init__()
        Hv, eps = config.v_hidden_size, config.layer_norm_eps
        self.image_embeddings = nn.Linear(config.v_feature_size, Hv)
        self.image_location_embeddings = nn.Linear(config.num_locs, Hv)
        self.ImgLayerNorm = nn.LayerNorm(Hv, eps=eps)
        self.LocLayerNorm = nn.LayerNorm(Hv, eps=eps)
        self.dropout = nn.Dropout(config.v_hidden_dropout_prob)

    def forward(self, image_feat, image_loc):
        x = (self.ImgLayerNorm(self.image_embeddings(image_feat)) +
             self.LocLayerNorm(self.image_location_embeddings(image_loc))) / 2
        return self.dropout(x)


class UniterEmbeddings(nn.Module):
    """`uniter` (UNITER, mUNITER, xUNITER) and `uc2` joint embeddings."""

    def __init__(self, config: VLConfig, uc2: bool = False):
        super().__init__()
        H, eps = config.hidden_size, config.layer_norm_eps
        if config.v_hidden_size != H:
            raise ConfigError(f"{config.source}: {config.image_embeddings} embeddings need v_hidden_size == "
                              f"hidden_size, got {config.v_hidden_size} and {H}")
        roberta_model = config.text_model == "roberta"
        self.uc2 = uc2
        self.pad = config.pad_token_id
        self.roberta_positions = uc2 or roberta_model
        # UNITER's image token type is 1 with BERT vocabularies, 0 with RoBERTa ones; UC2 always uses 1.
        self.image_type_id = 1 if (uc2 or not roberta_model) else 0
        self.word_embeddings = nn.Embedding(config.vocab_size, H, padding_idx=self.pad)
        self.position_embeddings = nn.Embedding(config.max_position_embeddings, H)
        types = nn.Embedding(config.type_vocab_size, H)
        if uc2:
            self.new_token_type_embeddings = types
        else:
            self.token_type_embeddings = types
        self.LayerNorm = nn.LayerNorm(H, eps=eps)
        self.image_embeddings = nn.Linear(config.v_feature_size, H)
        self.image_location_embeddings = nn.Linear(config.num_locs, H)
        # Shared with the text table except for UNITER on a RoBERTa vocabulary (VOLTA aliases the module).
        self.image_token_type_embeddings = types if (uc2 or not roberta_model) else nn.Embedding(config.type_vocab_size, H)
        self.image_layer_norm = nn.LayerNorm(H, eps=eps)
        self.image_location_layer_norm = nn.LayerNorm(H, eps=eps)
        self.v_LayerNorm = nn.LayerNorm(H, eps=eps)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)

    @property
    def text_type_embeddings(self) -> nn.Embedding:
        return self.new_token_type_embeddings if self.uc2 else self.token_type_embeddings

    def forward(self, input_ids, image_feat, image_loc, token_type_ids=None):
        pos = roberta_position_ids(input_ids, self.pad) if self.roberta_positions else plain_position_ids(input_ids)
        t = self.word_embeddings(input_ids) + self.position_embeddings(pos) + \
            self.text_type_embeddings(_default_types(input_ids, token_type_ids))
        t = self.dropout(self.LayerNorm(t))
        img_type = self.image_token_type_embeddings.weight[self.image_type_id]
        v = self.image_layer_norm(self.image_embeddings(image_feat)) + \
            self.image_location_layer_norm(self.image_location_embeddings(image_loc)) + img_type
        return t, self.dropout(self.v_LayerNorm(v))


class VisualBertEmbeddings(nn.Module):
    """`visualbert`: box locations are ignored; every region gets visual position 0 and visual type 1."""

    def __init__(self, config: VLConfig):
        super().__init__()
        H = config.hidden_size
        self.word_embeddings = nn.Embedding(config.vocab_size, H, padding_idx=0)
        self.position_embeddings = nn.Embedding(config.max_position_embeddings, H)
        self.token_type_embeddings = nn.Embedding(config.type_vocab_size, H)
        self.LayerNorm = nn.LayerNorm(H, eps=config.layer_norm_eps)
        self.projection = nn.Linear(config.v_feature_size, H)
        self.token_type_embeddings_visual = nn.Embedding(config.type_vocab_size, H)
        self.position_embeddings_visual = nn.Embedding(config.max_position_embeddings, H)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)

    def forward(self, input_ids, image_feat, image_loc, token_type_ids=None):
        t = self.word_embeddings(input_ids) + self.position_embeddings(plain_position_ids(input_ids)) + \
            self.token_type_embeddings(_default_types(input_ids, token_type_ids))
        v = self.projection(image_feat) + self.position_embeddings_visual.weight[0] + \
            self.token_type_embeddings_visual.weight[1]
        return self.dropout(self.LayerNorm(t)), self.dropout(self.LayerNorm(v))


from .vlbert_embeddings import VLBertEmbeddings  # noqa: E402  (kept in its own file: it is the longest)


def _dual_stream(image_embeddings):
    def build(config: VLConfig):
        # the text embedding class follows the config's bert_model, as VOLTA's BertModel chooses it
        return BertTextEmbeddings(config, roberta="roberta" in config.bert_model), image_embeddings(config)
    return build


# image_embeddings -> (config -> (`bert.embeddings`, `bert.v_embeddings` or None)): one row per family
EMBEDDINGS = {
    "vilbert": _dual_stream(VilbertImageEmbeddings),
    "lxmert": _dual_stream(LxmertImageEmbeddings),
    "uniter": lambda config: (UniterEmbeddings(config), None),
    "uc2": lambda config: (UniterEmbeddings(config, uc2=True), None),
    "visualbert": lambda config: (VisualBertEmbeddings(config), None),
    "vl-bert": lambda config: (VLBertEmbeddings(config), None),
}


def build_embeddings(config: VLConfig) -> tuple[nn.Module, nn.Module | None]:
    """(`bert.embeddings`, `bert.v_embeddings` or None) for a config."""
    build = EMBEDDINGS.get(config.image_embeddings)
    if build is None:
        raise ConfigError(f"{config.source}: image_embeddings {config.image_embeddings!r} has no BertModel "
                          "embedding; M3P configs build the M3P model (image_embeddings \"m3p\")")
    return build(config)
