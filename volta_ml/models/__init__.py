"""The model zoo: VOLTA's config format, unified encoder, embeddings, heads and checkpoint I/O."""
from .checkpoint import CheckpointError, LoadReport, load_checkpoint, read_state_dict, save_checkpoint
from .config import ConfigError, M3PConfig, VLConfig, available_configs, load_config
from .factory import build_model, from_pretrained
from .heads import itm_match_score
from .m3p import M3PTasksModel
from .modeling import EncoderOutput, VLBertModel, VLPreTrainingModel, VLTasksModel

__all__ = [
    "CheckpointError", "ConfigError", "EncoderOutput", "LoadReport", "M3PConfig", "M3PTasksModel", "VLBertModel",
    "VLConfig", "VLPreTrainingModel", "VLTasksModel", "available_configs", "build_model", "from_pretrained",
    "itm_match_score", "load_checkpoint", "load_config", "read_state_dict", "save_checkpoint",
]
