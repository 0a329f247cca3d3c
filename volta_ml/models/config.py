"""Model configuration read from VOLTA's config JSON.

VOLTA builds a config by taking every constructor default and then setting every key of the JSON
verbatim. `VLConfig` keeps those semantics (so configs that VOLTA accepts load unchanged) and adds what
VOLTA lacks: unknown keys are reported by name, values of the wrong type or an invalid value are errors
that name the key and the file.
"""
from __future__ import annotations

import copy
import json
import logging
import os
import warnings
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

IMAGE_EMBEDDINGS = ("vilbert", "lxmert", "vl-bert", "visualbert", "uniter", "uc2", "m3p")
DUAL_STREAM_EMBEDDINGS = ("vilbert", "lxmert")
FUSION_METHODS = ("mul", "sum", "text", "vl-bert_vqa", "none")
ACTIVATIONS = ("gelu", "relu", "swish")

# Defaults of VOLTA's BertConfig constructor (from-JSON path: vocab_size becomes -1).
BERT_DEFAULTS: dict[str, Any] = {
    "vocab_size": -1,
    "hidden_size": 768,
    "num_attention_heads": 12,
    "intermediate_size": 3072,
    "hidden_act": "gelu",
    "hidden_dropout_prob": 0.1,
    "attention_probs_dropout_prob": 0.1,
    "max_position_embeddings": 512,
    "type_vocab_size": 2,
    "pad_token_id": 0,
    "layer_norm_eps": 1e-12,
    "do_lower_case": True,
    "bert_model": "bert-base-uncased",
    "initializer_range": 0.02,
    "pooler_size": 768,
    "num_locs": 5,
    "v_coordinate_embeddings_dim": None,
    "add_global_imgfeat": None,
    "image_embeddings": "vilbert",
    "v_feature_size": 2048,
    "v_hidden_size": 768,
    "v_num_attention_heads": 12,
    "v_intermediate_size": 3072,
    "v_pooler_size": 1024,
    "v_attention_probs_dropout_prob": 0.1,
    "v_hidden_act": "gelu",
    "v_hidden_dropout_prob": 0.1,
    "v_initializer_range": 0.2,
    "visual_target_weights": {"0": 1},
    "qa_task_weight": 0.0,
    "qa_num_answers": 0,
    "fixed_layers": [],
    "fusion_method": "mul",
    "fusion_act": "relu",
    "objective": 0,
    "clf_hidden_size": 1536,
    "image_head_ln": True,
    "itm_dim": 2,
    "visualization": False,
    "tt_attn_sublayers": [],
    "tv_attn_sublayers": [],
    "vt_attn_sublayers": [],
    "vv_attn_sublayers": [],
    "t_ff_sublayers": [],
    "v_ff_sublayers": [],
    "shared_sublayers": [],
    "single_ln_sublayers": [],
    "sublayer2attn_hidden_size": {},
    "sublayer2num_attention_heads": {},
    "sublayer2intermediate_size": {},
    "sublayer2v_attn_hidden_size": {},
    "sublayer2v_num_attention_heads": {},
    "sublayer2v_intermediate_size": {},
    "bert_layer2attn_sublayer": {},
    "bert_layer2ff_sublayer": {},
    "norm_embeddings": False,
}

# Keys VOLTA stores but never reads; accepted silently.
UNUSED_KEYS = {"m_encoder", "m_layer", "v_layers", "has_mapping", "has_mapping_bias", "load_x_model",
               "fixed_embs", "max_boxes", "v_biattention_id", "t_biattention_id", "model"}

# Extra defaults of VOLTA's M3PConfig.
M3P_DEFAULTS: dict[str, Any] = {
    "n_heads": 12,
    "n_layers": 12,
    "emb_dim": 768,
    "n_langs": 100,
    "n_words": 250002,
    "eos_index": 2,
    "pad_index": 1,
    "dropout": 0.1,
    "attention_dropout": 0.1,
    "sinusoidal_embeddings": False,
    "refine_layers": 6,
    "attention_setting": "v1",
    "use_externel_att": False,
    "gelu_activation": True,
    "max_boxes": 100,
    "model": "bert",
}

_NUMBER = (int, float)
# key -> accepted python types (bool is excluded from numbers explicitly below)
_TYPES: dict[str, tuple] = {
    **{k: (int,) for k in ("vocab_size", "hidden_size", "num_attention_heads", "intermediate_size",
                           "max_position_embeddings", "type_vocab_size", "pad_token_id", "pooler_size",
                           "num_locs", "v_feature_size", "v_hidden_size", "v_num_attention_heads",
                           "v_intermediate_size", "v_pooler_size", "clf_hidden_size", "itm_dim",
                           "qa_num_answers", "n_heads", "n_layers", "emb_dim", "n_langs", "n_words",
                           "pad_index", "eos_index", "refine_layers")},
    **{k: _NUMBER for k in ("hidden_dropout_prob", "attention_probs_dropout_prob", "layer_norm_eps",
                            "initializer_range", "v_attention_probs_dropout_prob", "v_hidden_dropout_prob",
                            "v_initializer_range", "qa_task_weight", "dropout", "attention_dropout")},
    **{k: (list,) for k in ("fixed_layers", "tt_attn_sublayers", "tv_attn_sublayers", "vt_attn_sublayers",
                            "vv_attn_sublayers", "t_ff_sublayers", "v_ff_sublayers", "shared_sublayers",
                            "single_ln_sublayers")},
    **{k: (dict,) for k in ("visual_target_weights", "sublayer2attn_hidden_size",
                            "sublayer2num_attention_heads", "sublayer2intermediate_size",
                            "sublayer2v_attn_hidden_size", "sublayer2v_num_attention_heads",
                            "sublayer2v_intermediate_size", "bert_layer2attn_sublayer",
                            "bert_layer2ff_sublayer")},
    **{k: (str,) for k in ("bert_model", "image_embeddings", "fusion_method")},
}


class ConfigError(ValueError):
    """A model config that cannot describe a model; the message names the file and key."""


class VLConfig:
    """A VOLTA model config: every constructor default, then every JSON key verbatim."""

    is_m3p = False

    def __init__(self, source: str | None = None, **values: Any):
        self._source = source or "<config>"
        defaults = copy.deepcopy(BERT_DEFAULTS)
        if self.is_m3p:
            defaults.update(copy.deepcopy(M3P_DEFAULTS))
        self.__dict__.update(defaults)
        self.update(values)

    # --- construction -------------------------------------------------------------------------
    @classmethod
    def from_dict(cls, values: dict[str, Any], source: str | None = None) -> "VLConfig":
        return cls(source=source, **values)

    @classmethod
    def from_json_file(cls, path: str | os.PathLike) -> "VLConfig":
        return cls(source=str(path), **read_config_json(path))

    def update(self, values: dict[str, Any]) -> None:
        known = set(BERT_DEFAULTS) | UNUSED_KEYS | (set(M3P_DEFAULTS) if self.is_m3p else set())
        for key, value in values.items():
            if key not in known and not key.startswith("_") and key not in ("id2lang", "lang2id"):
                warnings.warn(f"{self._source}: unknown model config key {key!r} (kept, not used)", stacklevel=3)
            self._check_type(key, value)
            setattr(self, key, value)
        self.validate()

    def _check_type(self, key: str, value: Any) -> None:
        types = _TYPES.get(key)
        if types is None or value is None and key in ("v_coordinate_embeddings_dim",):
            return
        ok = isinstance(value, types) and not (isinstance(value, bool) and bool not in types)
        if not ok:
            want = " or ".join(t.__name__ for t in types)
            raise ConfigError(f"{self._source}: key {key!r} must be {want}, got {value!r}")

    def validate(self) -> None:
        src = self._source
        if self.image_embeddings not in IMAGE_EMBEDDINGS:
            raise ConfigError(f"{src}: image_embeddings {self.image_embeddings!r} is not one of "
                              f"{', '.join(IMAGE_EMBEDDINGS)}")
        if self.fusion_method not in FUSION_METHODS:
            raise ConfigError(f"{src}: fusion_method {self.fusion_method!r} is not one of {', '.join(FUSION_METHODS)}")
        if self.num_locs not in (4, 5, 7) and not self.is_m3p:
            raise ConfigError(f"{src}: num_locs must be 4, 5 or 7, got {self.num_locs}")
        for key in ("hidden_act", "v_hidden_act"):
            act = getattr(self, key)
            if isinstance(act, str) and act not in ACTIVATIONS:
                raise ConfigError(f"{src}: {key} {act!r} is not one of {', '.join(ACTIVATIONS)}")
        for key in ("add_global_imgfeat",):
            if getattr(self, key) not in (None, "first", "last"):
                raise ConfigError(f"{src}: {key} must be null, \"first\" or \"last\", got {getattr(self, key)!r}")
        model = self.__dict__.get("model")
        if model is not None and model not in ("bert", "roberta"):
            raise ConfigError(f"{src}: model must be \"bert\" or \"roberta\", got {model!r}")
        if self.image_embeddings in DUAL_STREAM_EMBEDDINGS and "roberta" not in self.bert_model \
                and "bert" not in self.bert_model:
            raise ConfigError(f"{src}: bert_model {self.bert_model!r} must name a BERT or RoBERTa tokenizer "
                              "(it selects the text embedding of dual-stream models)")

    # --- derived properties ------------------------------------------------------------------
    @property
    def text_model(self) -> str:
        """VOLTA's `config.model`; a missing key means "bert" unless bert_model names a RoBERTa."""
        model = self.__dict__.get("model")
        if model:
            return model
        return "roberta" if "roberta" in self.bert_model else "bert"

    @property
    def is_dual_stream(self) -> bool:
        return self.image_embeddings in DUAL_STREAM_EMBEDDINGS

    @property
    def source(self) -> str:
        return self._source

    def to_dict(self) -> dict[str, Any]:
        return {k: copy.deepcopy(v) for k, v in sorted(self.__dict__.items()) if not k.startswith("_")}

    def to_json_string(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=True) + "\n"

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self._source})"


class M3PConfig(VLConfig):
    """VOLTA's M3PConfig: the BERT defaults plus the XLM-style transformer's own defaults."""

    is_m3p = True

    def validate(self) -> None:
        super().validate()
        if self.pooler_size != self.emb_dim:
            raise ConfigError(f"{self._source}: pooler_size ({self.pooler_size}) must equal emb_dim "
                              f"({self.emb_dim}) for M3P")
        if self.emb_dim % self.n_heads:
            raise ConfigError(f"{self._source}: emb_dim {self.emb_dim} is not divisible by n_heads {self.n_heads}")


SHIPPED_DIR = Path(__file__).resolve().parents[1] / "resources" / "config_models"


def config_dirs() -> list[Path]:
    """Where named configs are looked up: $VOLTA_ML_CONFIG_DIR, then the configs shipped inside the package
    (`volta_ml/resources/config_models/`; the repository's top-level `config_models/` holds the same files)."""
    dirs = [Path(p) for p in os.environ.get("VOLTA_ML_CONFIG_DIR", "").split(os.pathsep) if p]
    dirs.append(SHIPPED_DIR)
    return dirs


def available_configs() -> list[str]:
    names = set()
    for d in config_dirs():
        if d.is_dir():
            names.update(p.stem for p in d.glob("*.json") if not p.stem.endswith("_weight_name"))
    return sorted(names)


def resolve_config_path(path_or_name: str | os.PathLike) -> Path:
    p = Path(path_or_name)
    if p.is_file():
        return p
    name = p.name[:-5] if p.name.endswith(".json") else p.name
    for d in config_dirs():
        cand = d / f"{name}.json"
        if cand.is_file():
            return cand
    raise ConfigError(f"model config {str(path_or_name)!r} not found (not a file, and not one of the named "
                      f"configs: {', '.join(available_configs())})")


def load_config(path_or_name: str | os.PathLike | dict, is_m3p: bool | None = None) -> VLConfig:
    """Read a VOLTA model config from a JSON file, a name in config_models/, or a dict.

    `is_m3p` selects VOLTA's M3P config class (the `--is_m3p` flag); by default it is chosen when
    `image_embeddings` is "m3p", which is what picks the M3P model class in VOLTA.
    """
    if isinstance(path_or_name, dict):
        values, source = dict(path_or_name), "<dict>"
    else:
        path = resolve_config_path(path_or_name)
        values, source = read_config_json(path), str(path)
    if is_m3p is None:
        is_m3p = values.get("image_embeddings") == "m3p"
    cls = M3PConfig if is_m3p else VLConfig
    return cls.from_dict(values, source=source)


def read_config_json(path: str | os.PathLike) -> dict[str, Any]:
    """Parse a config JSON file; errors name the file and the line:column of the problem."""
    path = str(path)
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except OSError as e:
        raise ConfigError(f"cannot read model config {path}: {e.strerror}") from e
    try:
        values = json.loads(text)
    except json.JSONDecodeError as e:
        raise ConfigError(f"{path}:{e.lineno}:{e.colno}: model config is not valid JSON ({e.msg})") from e
    if not isinstance(values, dict):
        raise ConfigError(f"{path}: model config must be a JSON object, got {type(values).__name__}")
    return values
