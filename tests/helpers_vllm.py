"""A tiny random LLaVA that both transformers and vLLM load (the `vllm` tests, benchmarks/bench_engines.py).

Built like `helpers_hf.build_llava` (same trained tokenizer, chat template and processor pieces) with what vLLM
needs of it: float32 weights drawn with `initializer_range` 0.3 (0.02 makes a tiny model repeat the prompt's last
token: greedy answers would compare nothing), head size 64 (vLLM's CPU attention kernels take the usual head
sizes, not helpers_hf's 8), a context of 512, and the vision tower's keys under `vision_tower.vision_model.*` as
vLLM's LLaVA loader reads them (transformers 5.19 saves `vision_tower.*`; it reads either).
"""
from __future__ import annotations

from pathlib import Path

import torch

from tests.helpers_hf import IMAGE, LLAVA_TEMPLATE, _clip_image_processor, _llama_tok, _save

HIDDEN = 128
INIT = 0.3


def build_llava_vllm(out: Path) -> Path:
    """Build (once) the model under `out` and return the folder."""
    out = Path(out)
    if (out / "config.json").exists():
        return out
    from safetensors.torch import load_file, save_file
    from transformers import LlavaConfig, LlavaForConditionalGeneration, LlavaProcessor

    tok = _llama_tok()
    tok.chat_template = LLAVA_TEMPLATE
    text = dict(model_type="llama", vocab_size=len(tok), hidden_size=HIDDEN, intermediate_size=256,
                num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=512,
                bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id,
                initializer_range=INIT)
    vision = dict(model_type="clip_vision_model", hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                  num_attention_heads=1, image_size=IMAGE, patch_size=8, projection_dim=HIDDEN, initializer_range=INIT)
    cfg = LlavaConfig(vision_config=vision, text_config=text, image_token_index=tok.convert_tokens_to_ids("<image>"),
                      vision_feature_select_strategy="default", vision_feature_layer=-2, initializer_range=INIT,
                      dtype="float32")
    torch.manual_seed(5)
    proc = LlavaProcessor(image_processor=_clip_image_processor(), tokenizer=tok, patch_size=8,
                          vision_feature_select_strategy="default", num_additional_image_tokens=1,
                          chat_template=LLAVA_TEMPLATE)
    model = LlavaForConditionalGeneration(cfg).eval()
    with torch.no_grad():          # LLaVA's own init leaves some weights at 0.02 / zero: all drawn at INIT
        for name, p in model.named_parameters():
            if p.dim() > 1:
                p.normal_(0.0, INIT)
    _save(model, proc, out)
    weights = out / "model.safetensors"
    tensors = load_file(weights)
    renamed = {k.replace("vision_tower.", "vision_tower.vision_model.", 1)
               if "vision_tower." in k and "vision_tower.vision_model." not in k else k: v for k, v in tensors.items()}
    save_file(renamed, weights, metadata={"format": "pt"})
    return out
