"""Questions/s of the `mllm` backend for each current family (tests/helpers_vlm_families.py), batch 1 vs 8.

Each family's tiny test folder gives the processor (and so the image-token counts of the test's small image
sizes: tens of image tokens per photo, not the real checkpoints' hundreds) and the config, which is widened to the
real checkpoint's text and vision widths and vocabulary (`REAL`), with 2 text (Gemma 4: 3) and 2 vision layers and
random weights. One question = one photo + the CVQA letter prompt (~30 words); the letter rule (one forward per
question) is timed at batch 1 (one question per call) and batch 8, median of `--repeats`, after one warm-up
question, in one process, one family at a time. "tokens / question" is the sequence one question gives the LM:
the test's byte-level stand-in tokenizers (a few hundred tokens) cut the prompt into more tokens than the real
ones (~45), and the tiny processors give fewer image tokens, so it is not the real checkpoint's length.

    python benchmarks/bench_mllm_families.py                       # every family, real widths (CPU: minutes)
    python benchmarks/bench_mllm_families.py --threads 2 --questions 8 --batch1_questions 2 --repeats 1  # the
        # run of docs/hf_backends.md (its first 13 families: 18 minutes on a loaded 2-core box, peak 10.6 GiB;
        # Cohere2 Vision at Command A's widths needs more memory than that box has, even in bf16)
    python benchmarks/bench_mllm_families.py --quick               # the tiny test widths (a smoke run)
    python benchmarks/bench_mllm_families.py --families qwen2-vl internvl --device cuda
"""
from __future__ import annotations

import argparse
import gc
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from volta_ml.hf.base import ModelSpec  # noqa: E402

# text: hidden, intermediate, heads, kv heads, head dim, vocabulary; vision: hidden, intermediate, heads
REAL = {
    "qwen2-vl": ((1536, 8960, 12, 2, 128, 151936), (1280, 5120, 16)),           # Qwen2-VL-2B
    "qwen2.5-vl": ((2048, 11008, 16, 2, 128, 151936), (1280, 3420, 16)),        # Qwen2.5-VL-3B
    "qwen3-vl": ((2048, 6144, 16, 8, 128, 151936), (1024, 4096, 16)),           # Qwen3-VL-2B
    "gemma3": ((2560, 10240, 8, 4, 256, 262208), (1152, 4304, 16)),             # gemma-3-4b
    "paligemma": ((2048, 16384, 8, 1, 256, 257216), (1152, 4304, 16)),          # paligemma-3b
    "idefics3": ((2048, 8192, 32, 32, 64, 49155), (1152, 4304, 16)),            # SmolVLM-Instruct
    "smolvlm2": ((2048, 8192, 32, 32, 64, 49280), (1152, 4304, 16)),            # SmolVLM2-2.2B
    "llava-next": ((4096, 14336, 32, 8, 128, 32064), (1024, 4096, 16)),         # llava-v1.6-mistral-7b
    "llava-onevision": ((896, 4864, 14, 2, 64, 151647), (1152, 4304, 16)),      # llava-onevision-qwen2-0.5b
    "mistral3": ((5120, 32768, 32, 8, 128, 131072), (1024, 4096, 16)),          # Mistral-Small-3.1-24B
    "mllama": ((4096, 14336, 32, 8, 128, 128256), (1280, 5120, 16)),            # Llama-3.2-11B-Vision
    "aya-vision": ((4096, 14336, 32, 8, 128, 256000), (1152, 4304, 16)),        # aya-vision-8b
    "internvl": ((896, 4864, 14, 2, 64, 151674), (1024, 4096, 16)),             # InternVL3-1B
    # the newest families: the widths of transformers' default config of the type (its documented checkpoint)
    "qwen3.5": ((4096, 12288, 16, 4, 256, 248320), (1152, 4304, 16)),           # Qwen3_5Config
    "gemma4": ((2304, 9216, 8, 4, 256, 262144), (768, 3072, 12)),              # Gemma4Config (gemma-4-e2b)
    "gemma4-31b": ((2304, 9216, 8, 4, 256, 262144), (768, 3072, 12)),          # the same, 31B template shape
    "glm-4.6v": ((4096, 13696, 32, 2, 128, 151552), (1536, 13696, 12)),        # Glm4vConfig (GLM-4.1V-9B)
    "lfm2-vl": ((2560, 12288, 32, 8, 80, 65536), (768, 3072, 12)),             # Lfm2VlConfig
    "cohere2-vision": ((8192, 22528, 64, 64, 128, 256000), (1152, 3072, 12)),  # Cohere2VisionConfig
    "molmo2": ((4096, 12288, 32, 8, 128, 151936), (1152, 4304, 16)),           # Molmo2Config (Molmo2-8B)
    "qwen3-vl-moe": ((2048, 5632, 16, 16, 128, 151936), (1152, 4304, 16)),     # Qwen3VLMoeConfig
    "fuyu": ((4096, 16384, 64, 64, 64, 262144), None),   # FuyuConfig (Fuyu-8B): patches projected into the LM
    "llama4": ((5120, 8192, 40, 8, 128, 202048), (1408, 5632, 16)),          # Llama4Config (Scout-17B-16E; from 5.25)
}
PROMPT = ("Location: Brazil. Question: which traditional food is shown in this picture of the market? Options: "
          "A. rice and beans B. a fish stew C. cheese bread D. grilled meat Short Answer:")


def widen(cfg, family: str) -> None:
    """The config at the real widths of `family` (the test model's layers kept: 2, Gemma 4 3 with its last sharing
    the KV of another; derived sizes follow)."""
    (hidden, inter, heads, kv, head_dim, vocab), vision_widths = REAL[family]
    text, vision = cfg.get_text_config(), getattr(cfg, "vision_config", None)
    text.hidden_size, text.intermediate_size, text.num_attention_heads = hidden, inter, heads
    text.num_key_value_heads, text.head_dim, text.vocab_size = kv, head_dim, vocab
    text.num_hidden_layers = len(getattr(text, "layer_types", None) or [0, 0])   # the test model's (2; Gemma 4: 3)
    if hasattr(text, "intermediate_size_mlp"):   # Llama 4: its dense layers' MLP, twice the experts' (Scout: 16384)
        text.intermediate_size_mlp = 2 * inter
    if getattr(text, "query_pre_attn_scalar", None):
        text.query_pre_attn_scalar = head_dim
    rope = getattr(text, "rope_parameters", None) or {}
    if "mrope_section" in rope:           # the sections split the rotary half-dimension (partial rotary: a part)
        half = int(head_dim * rope.get("partial_rotary_factor", 1.0)) // 2
        rope["mrope_section"] = [half - 2 * (3 * half // 8), 3 * half // 8, 3 * half // 8]
    if vision_widths is None:                 # no vision tower (Fuyu: a linear patch projection to `hidden`)
        return
    v_hidden, v_inter, v_heads = vision_widths
    if family == "qwen2-vl":                  # vision width is embed_dim; hidden_size is the merger's output
        vision.embed_dim, vision.hidden_size, vision.num_heads = v_hidden, hidden, v_heads
    else:
        vision.hidden_size, vision.intermediate_size = v_hidden, v_inter
        for key in ("num_attention_heads", "num_heads", "attention_heads"):
            if hasattr(vision, key):
                setattr(vision, key, v_heads)
        if hasattr(vision, "out_hidden_size"):
            vision.out_hidden_size = hidden
        if hasattr(vision, "head_dim"):
            vision.head_dim = v_hidden // v_heads
        if hasattr(vision, "intermediate_layers_indices"):   # Mllama: the last and the intermediate layers' outputs
            vision.vision_output_dim = v_hidden * (len(vision.intermediate_layers_indices) + 1)
        if hasattr(vision, "projector_output_dim"):          # Llama 4: its pixel-shuffle MLP's widths (Scout's 4096)
            vision.vision_output_dim = vision.projector_input_dim = vision.projector_output_dim = 4096
        if hasattr(vision, "projection_dim"):
            vision.projection_dim = hidden
    if family == "paligemma":                 # its projector maps to the top-level projection_dim
        cfg.projection_dim = cfg.hidden_size = hidden
    adapter = getattr(cfg, "adapter_config", None)
    if adapter is not None:                   # Molmo2: the pooling attention on vision features, then to the LM
        adapter.hidden_size, adapter.text_hidden_size = v_hidden, hidden
        adapter.num_attention_heads = adapter.num_key_value_heads = v_heads
        adapter.head_dim = v_hidden // v_heads
    if hasattr(vision, "num_hidden_layers"):
        vision.num_hidden_layers = 2
    elif hasattr(vision, "depth"):
        vision.depth = 2


def backend(family: str, root: Path, quick: bool, device: str, dtype: str):
    from transformers import AutoConfig, AutoModelForImageTextToText, AutoProcessor

    from helpers_vlm_families import build_family
    from volta_ml.hf.loading import DTYPES
    from volta_ml.hf.generative import generative_backend
    path = build_family(family, root)
    cfg = AutoConfig.from_pretrained(path)
    if not quick:
        widen(cfg, family)
    torch.manual_seed(0)
    model = AutoModelForImageTextToText.from_config(cfg).to(device, DTYPES[dtype]).eval()
    return generative_backend(ModelSpec(str(path), device=device, dtype=dtype), model,
                              AutoProcessor.from_pretrained(path))


def questions(n: int):
    from helpers_hf import images
    return [[im] for im in images(n, seed=1, size=(64, 48))], [PROMPT] * n


def tokens_per_question(b) -> int:
    """The sequence one question gives the LM (text + image tokens; stand-in tokenizer, tiny processor)."""
    photos, prompts = questions(1)
    return int(b._batch(photos, prompts)["attention_mask"].sum())


def questions_per_second(b, batch: int, n: int, repeats: int) -> float:
    photos, prompts = questions(n)

    def run():
        for i in range(0, n, batch):
            b.choice_logits(photos[i:i + batch], prompts[i:i + batch], list("ABCD"))
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        run()
        times.append(time.perf_counter() - t)
    return n / statistics.median(times)


def main(argv=None) -> list[dict]:
    from helpers_vlm_families import FAMILIES
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--families", nargs="+", default=list(FAMILIES), choices=list(FAMILIES))
    ap.add_argument("--quick", action="store_true", help="the tiny test widths (a smoke run)")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="fp32", choices=["fp32", "fp16", "bf16"])
    ap.add_argument("--questions", type=int, default=8)
    ap.add_argument("--batch1_questions", type=int, default=None,
                    help="questions timed at batch 1 (default --questions; every question has the same shape)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=None)
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    rows = []
    with tempfile.TemporaryDirectory() as tmp, torch.inference_mode():
        print(f"device={args.device} dtype={args.dtype} threads={torch.get_num_threads()} questions={args.questions} "
              f"repeats={args.repeats}")
        print("| family | widths (params) | vocabulary | tokens / question | batch 1 q/s | batch 8 q/s | speedup "
              "| setup s | timed s |")
        print("|---|---|---|---|---|---|---|---|---|")
        for family in args.families:
            start = time.perf_counter()
            b = backend(family, Path(tmp), args.quick, args.device, args.dtype)
            b.choice_logits(*questions(1), list("ABCD"))                        # warm-up: one question
            setup = time.perf_counter() - start
            one = questions_per_second(b, 1, args.batch1_questions or args.questions, args.repeats)
            eight = questions_per_second(b, 8, args.questions, args.repeats)
            params = sum(p.numel() for p in b.model.parameters())
            rows.append({"family": family, "batch1": one, "batch8": eight, "params": params,
                         "tokens": tokens_per_question(b), "seconds": time.perf_counter() - start})
            widths = "tiny" if args.quick else f"real, {b.model.config.get_text_config().num_hidden_layers} layers"
            vocab = b.model.config.get_text_config().vocab_size
            print(f"| {family} | {widths} ({params / 1e6:.0f}M) | {vocab} | {rows[-1]['tokens']} | {one:.2f} | "
                  f"{eight:.2f} | {eight / one:.2f}x | {setup:.0f} | {rows[-1]['seconds'] - setup:.0f} |", flush=True)
            del b
            gc.collect()
    return rows


if __name__ == "__main__":
    main()
