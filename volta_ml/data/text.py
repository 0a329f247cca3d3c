"""Tokenisation exactly as IGLUE-VOLTA's datasets do it.

VOLTA calls `tokenizer.encode(text)` (special tokens added, no truncation), then keeps the first token, the
first `max_seq_length - 2` content tokens and the last token, and pads at the end with the tokenizer's pad id.
The input mask is 1 on real tokens and segment ids are all 0.
"""
from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np

# `--bert_model` when neither the command line nor the model config names a tokenizer (VOLTA's default)
VOLTA_DEFAULT_TOKENIZER = "bert-base-uncased"

# Files whose bytes define a tokenizer; hashed to identify it in cache keys.
_TOKENIZER_FILES = (
    "tokenizer.json", "vocab.txt", "sentencepiece.bpe.model", "spiece.model", "vocab.json", "merges.txt",
    "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json",
)


class TokenizerLoadError(RuntimeError):
    pass


def load_tokenizer(bert_model: str, do_lower_case: bool = False):
    """`AutoTokenizer.from_pretrained(bert_model, do_lower_case=...)` from local files only.

    `do_lower_case` is passed explicitly, as IGLUE-VOLTA does: leaving it off turns lower-casing *off* even for
    an uncased vocabulary. `bert_model` is a directory, or a name already in the local Hugging Face cache;
    nothing is ever downloaded.
    """
    from transformers import AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(bert_model, do_lower_case=bool(do_lower_case), local_files_only=True)
    except (OSError, ValueError) as err:
        hint = "" if Path(bert_model).is_dir() else (
            " It is not a local directory; pass --bert_model /path/to/<tokenizer dir> (volta-ml never downloads).")
        raise TokenizerLoadError(f"cannot load the tokenizer from --bert_model {bert_model!r}: {err}.{hint}") from None
    tokenizer.volta_fingerprint = tokenizer_fingerprint(tokenizer, bert_model, do_lower_case)
    return tokenizer


def tokenizer_fingerprint(tokenizer, bert_model: str | None = None, do_lower_case: bool = False) -> str:
    """A short hash that changes whenever the tokenizer would produce different ids."""
    digest = hashlib.sha256()
    digest.update(f"{type(tokenizer).__name__}|lower={bool(do_lower_case)}".encode())
    folder = Path(bert_model) if bert_model else None
    hashed_files = False
    if folder is not None and folder.is_dir():
        for name in _TOKENIZER_FILES:
            file = folder / name
            if file.is_file():
                digest.update(name.encode())
                digest.update(file.read_bytes())
                hashed_files = True
    if not hashed_files:  # e.g. a tokenizer built in memory: fall back to its vocabulary
        for token, index in sorted(tokenizer.get_vocab().items()):
            digest.update(f"{token}\t{index}\n".encode())
    return digest.hexdigest()[:16]


def truncate_like_volta(ids: list[int], max_seq_length: int) -> list[int]:
    """Keep the first token, the first `max_seq_length - 2` content tokens and the final special token."""
    if len(ids) <= max_seq_length:
        return ids
    return ids[: max_seq_length - 1] + [ids[-1]]


def encode_texts(tokenizer, texts: list[str], max_seq_length: int) -> tuple[np.ndarray, np.ndarray]:
    """Token ids `[N, max_seq_length]` (int64, padded with the pad id) and the real lengths `[N]`."""
    if max_seq_length < 2:
        raise ValueError(f"max_seq_length must be at least 2, got {max_seq_length}")
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    ids = np.full((len(texts), max_seq_length), pad_id, dtype=np.int64)
    lengths = np.zeros(len(texts), dtype=np.int64)
    chunk = 4096  # batch calls to the fast tokenizer: one `encode` per text is ~10x slower
    for start in range(0, len(texts), chunk):
        encoded = tokenizer(list(texts[start:start + chunk]), add_special_tokens=True)["input_ids"]
        for offset, row in enumerate(encoded):
            row = truncate_like_volta(list(row), max_seq_length)
            ids[start + offset, : len(row)] = row
            lengths[start + offset] = len(row)
    return ids, lengths

