"""Checks of a built model against the task before any work: a mismatch is a usage error (exit code 2) with
the file and key to fix, instead of an IndexError deep in the first forward (issue #14)."""
from __future__ import annotations

from torch import nn

from volta_ml.engine.failures import UsageError


def check_text_fits(model: nn.Module, max_seq_length: int, config_file: str, task: str) -> None:
    """Every text position of `max_seq_length` tokens must have a row in the position-embedding tables.

    RoBERTa-style positions start at padding_idx + 1 (`roberta_position_ids`), so they need pad + 1 more rows.
    """
    if max_seq_length is None:
        return
    for module in model.modules():
        table = getattr(module, "position_embeddings", None)
        if not isinstance(table, nn.Embedding) or not hasattr(module, "word_embeddings"):
            continue
        roberta = bool(getattr(module, "roberta_positions", False) or getattr(module, "roberta", False))
        needed = int(max_seq_length) + (int(getattr(module, "pad", 1)) + 1 if roberta else 0)
        if needed > table.num_embeddings:
            raise UsageError(f"{config_file}: max_position_embeddings {table.num_embeddings} is too small for "
                             f"{task}'s max_seq_length {max_seq_length} (needs {needed}"
                             f"{', RoBERTa-style positions' if roberta else ''}); lower max_seq_length in the "
                             f"task config or use a model config with more positions")
