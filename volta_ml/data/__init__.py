"""Text side of the data path: annotation readers, tokenisation as VOLTA does it, token caches."""
from volta_ml.data.annotations import AnnotationError, read_json, read_jsonl, read_pickle
from volta_ml.data.text import TokenizerLoadError, encode_texts, load_tokenizer, tokenizer_fingerprint
from volta_ml.data.cache import TokenCache, default_cache_dir

__all__ = [
    "AnnotationError", "read_json", "read_jsonl", "read_pickle",
    "TokenizerLoadError", "encode_texts", "load_tokenizer", "tokenizer_fingerprint",
    "TokenCache", "default_cache_dir",
]
