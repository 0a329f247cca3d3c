"""gpu_check.py's `cvqa_vllm` check: `--backend vllm` (vLLM's offline engine behind the Generative contract) at
real architecture size with random weights: LLaVA-1.5-7B's shapes (CLIP ViT-L/14 336 px: 576 image tokens, a
32-layer 4096-wide Llama, vocabulary 32064) written as a config + processor folder and loaded by vLLM with
`load_format="dummy"` (random weights, nothing read or downloaded), bf16 on the GPU. Timed through the backend as
the pipelines call it: CVQA's letter rule (one decoding step per question, exactly the 4 letters' log-probabilities)
and a MaXM-style short generation (greedy, 8 tokens), on `QUESTIONS` items after a warm-up batch; the goal is at
least 30 CVQA questions/s on one H200. `--quick` runs the tests' tiny fp32 LLaVA on the CPU (tests/helpers_vllm.py).
Without vLLM installed the check records one skipped row saying so.
"""
from __future__ import annotations

import sys
import tempfile
import time
from importlib.util import find_spec
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))     # the tests' model builders

QUESTIONS, BATCH = 256, 64
QUICK_QUESTIONS, QUICK_BATCH = 8, 4
GOAL_QPS = 30.0          # CVQA questions/s, letter rule, one H200
ITEMS = {"cvqa letter": "llava-1.5-7b letter (vllm)", "maxm generate 8": "llava-1.5-7b generate 8 (vllm)"}


def real_shape_folder(out: Path) -> Path:
    """LLaVA-1.5-7B's config (benchmarks/gpu_check_hf.llava_7b) with a processor of 336 px / patch 14 and the
    tests' trained tokenizer (its image token id in the config); no weights (vLLM's dummy load format)."""
    from helpers_hf import LLAVA_TEMPLATE, _llama_tok
    from transformers import CLIPImageProcessor, LlavaProcessor

    from gpu_check_hf import llava_7b
    _, config = llava_7b(False)
    tok = _llama_tok()
    tok.chat_template = LLAVA_TEMPLATE
    config.image_token_index = tok.convert_tokens_to_ids("<image>")
    config.text_config.bos_token_id, config.text_config.eos_token_id = tok.bos_token_id, tok.eos_token_id
    config.text_config.pad_token_id = tok.pad_token_id
    config.vision_feature_select_strategy = "default"
    config.architectures = ["LlavaForConditionalGeneration"]
    out.mkdir(parents=True, exist_ok=True)
    config.save_pretrained(out)
    LlavaProcessor(image_processor=CLIPImageProcessor(size={"shortest_edge": 336},
                                                      crop_size={"height": 336, "width": 336}),
                   tokenizer=tok, patch_size=14, vision_feature_select_strategy="default",
                   num_additional_image_tokens=1, chat_template=LLAVA_TEMPLATE).save_pretrained(out)
    return out


def check_cvqa_vllm(ctx) -> None:
    if find_spec("vllm") is None:
        ctx.row(item=ITEMS["cvqa letter"], status="skipped",
                reason="vllm is not installed here (scripts/install_vllm_env.sh on a CPU; pip install vllm on a GPU)")
        return
    import os

    from bench_engines import measure, photos
    from volta_ml.hf import ModelSpec, load_backend
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    questions, batch = (QUICK_QUESTIONS, QUICK_BATCH) if ctx.quick else (QUESTIONS, BATCH)
    with tempfile.TemporaryDirectory() as tmp:
        if ctx.quick:
            from helpers_vllm import build_llava_vllm
            folder, dtype = build_llava_vllm(Path(tmp) / "llava"), "fp32"
            extra = {"enforce_eager": True, "max_model_len": 512}          # its context: 512 positions
        else:
            folder, dtype = real_shape_folder(Path(tmp) / "llava-7b-shape"), "bf16"
            extra = {"load_format": "dummy", "max_model_len": 1024}        # 576 image tokens + the prompt
        start = time.perf_counter()
        backend = load_backend("vllm", ModelSpec(str(folder), dtype=dtype, device=ctx.device, extra=extra))
        load_s = time.perf_counter() - start
        items = photos(questions, size=64 if ctx.quick else 400)
        for workload, item in ITEMS.items():
            if ctx.skip_if_late(item, 5 if ctx.quick else 30):
                continue
            qps = measure(backend, workload, items, batch)
            ctx.row(item=item, workload=workload, dtype=dtype, questions=questions, batch=batch,
                    questions_per_s=qps, load_s=load_s, engine=backend.engine,
                    goal=f">= {GOAL_QPS:g} questions/s on one H200" if workload == "cvqa letter" else None)
        backend.close()
