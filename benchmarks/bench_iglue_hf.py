#!/usr/bin/env python3
"""IGLUE with Hugging Face backends: retrieval pairs/s (dual encoder vs the zoo's cross-encoder) and generative
examples/s per task and rule, at real architecture widths with random weights (meta init, then filled).

Retrieval: CLIP ViT-B/32 (CLIPConfig defaults, 151M parameters) through `volta_ml.hf` ClipBackend embeds every
caption and image once, then one matrix product scores all pairs; the zoo's ctrl_uniter_base (a BERT-base
single-stream cross-encoder, 114M parameters: equal size class) runs one forward per (caption, image) pair through
`compute_score_matrix`. pairs/s = captions x images / seconds. Texts are real xFlickr&CO German captions,
tokenised by a stand-in tokenizer (no downloads; truncated at CLIP's 77 tokens).

Generative: LLaVA-1.5-7B's architecture (CLIP ViT-L/14-336 tower, Llama-2-7B widths, 576 image tokens) through
the mllm backend, on real IGLUE rows with 640x480 images; `--text_layers` / `--vision_layers` cut the depth
(widths unchanged) so it fits a CPU; the full model's time per example is then about
the time at the shallowest depths plus per-layer slopes x the missing layers (24 vision, 32 text); the script
prints the measured numbers and that estimate when two depths of each were timed.

    python benchmarks/bench_iglue_hf.py --part retrieval --captions 64 --images 32 --pairs_zoo 64
    python benchmarks/bench_iglue_hf.py --part generative --text_layers 1,2 --vision_layers 2,4 --examples 2
    python benchmarks/bench_iglue_hf.py --part generative --device cuda --dtype bf16 --text_layers 32 --vision_layers 24
"""
from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "tests")]
from volta_ml.testing.reference import shared_path  # noqa: E402

SHARED = shared_path("iglue", "datasets")  # VOLTA_ML_SHARED, else ../shared
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def random_model(build):
    """Build on the meta device (no init cost), allocate on the CPU, fill with N(0, 0.02)."""
    with torch.device("meta"):
        model = build()
    model = model.to_empty(device="cpu")
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.02)
        for name, b in model.named_buffers():
            if "position_ids" in name:
                b.copy_(torch.arange(b.shape[-1]).expand_as(b))
    return model.eval()


def images(n: int, size=(640, 480)):
    from PIL import Image
    rng = np.random.default_rng(0)
    return [Image.fromarray(rng.integers(0, 255, (size[1], size[0], 3), dtype=np.uint8)) for _ in range(n)]


def timed(fn, repeat: int = 1) -> float:
    fn()                                      # warm-up (allocator, kernel choice)
    started = time.perf_counter()
    for _ in range(repeat):
        fn()
    return (time.perf_counter() - started) / repeat


# --- retrieval ---------------------------------------------------------------------------------------------
def bench_retrieval(args) -> None:
    from transformers import CLIPConfig, CLIPImageProcessor, CLIPModel, CLIPProcessor

    from helpers_hf import build_clip
    from volta_ml.hf.base import ModelSpec
    from volta_ml.hf.dual import ClipBackend
    from volta_ml.iglue_hf.data import read_retrieval

    data = read_retrieval(str(SHARED / "xFlickrCO/annotations/de/test.jsonl"), "de")
    captions = data.captions[:args.captions]
    with tempfile.TemporaryDirectory() as tmp:
        tok = CLIPProcessor.from_pretrained(build_clip(Path(tmp) / "clip")).tokenizer
    processor = CLIPProcessor(image_processor=CLIPImageProcessor(), tokenizer=tok)
    clip = random_model(lambda: CLIPModel(CLIPConfig())).to(args.device, DTYPES[args.dtype])
    backend = ClipBackend(ModelSpec("clip-vit-b32-random"), model=clip, processor=processor)
    pics = images(args.images)
    n_tokens = np.mean([min(77, len(tok(c)["input_ids"])) for c in captions])

    with torch.inference_mode():
        text_s = timed(lambda: backend.embed_texts(captions)) / len(captions)
        image_s = timed(lambda: backend.embed_images(pics)) / len(pics)
    params = sum(p.numel() for p in clip.parameters()) / 1e6

    def dual_seconds(n_cap: int, n_img: int) -> float:
        return n_cap * text_s + n_img * image_s        # the n_cap x n_img matrix product is negligible
    dual_pps = len(captions) * len(pics) / dual_seconds(len(captions), len(pics))
    print(f"dual encoder  CLIP ViT-B/32 ({params:.0f}M): {1 / text_s:.1f} captions/s (mean {n_tokens:.0f} tokens), "
          f"{1 / image_s:.1f} images/s; {len(captions)} x {len(pics)} = {dual_pps:,.0f} pairs/s")

    from bench_retrieval import build, make_config, make_inputs, warm_up
    from volta_ml.engine.retrieval import compute_score_matrix
    config = make_config("ctrl_uniter_base", "base")
    zoo = build(config, "cpu")
    zoo_params = sum(p.numel() for p in zoo.parameters()) / 1e6
    n_cap, n_img = 2, max(1, args.pairs_zoo // 2)
    cap_t, gal_t = make_inputs(config, n_cap, n_img)
    warm_up(zoo, cap_t, gal_t)
    started = time.perf_counter()
    compute_score_matrix(zoo, cap_t, gal_t, task_id="TASK8", pair_batch=64, progress=False)
    zoo_s = time.perf_counter() - started
    zoo_pps = n_cap * n_img / zoo_s
    print(f"cross-encoder ctrl_uniter_base ({zoo_params:.0f}M): {n_cap * n_img} pairs in {zoo_s:.2f}s = "
          f"{zoo_pps:,.1f} pairs/s")
    full = 2000 * 2000     # xFlickr&CO test: 2000 captions x 2000 images per language
    print(f"pairs/s ratio at {len(captions)} x {len(pics)}: {dual_pps / zoo_pps:,.0f}x; one xFlickr&CO language "
          f"(2000 x 2000 = {full:,} pairs): dual encoder {dual_seconds(2000, 2000) / 60:.1f} min "
          f"({full / dual_seconds(2000, 2000):,.0f} pairs/s) vs cross-encoder {full / zoo_pps / 3600:,.0f} h "
          f"on this machine")


# --- generative --------------------------------------------------------------------------------------------
def llava_processor():
    from transformers import CLIPImageProcessor, LlavaProcessor

    from helpers_hf import LLAVA_TEMPLATE, _llama_tok
    return LlavaProcessor(image_processor=CLIPImageProcessor(size={"shortest_edge": 336},
                                                             crop_size={"height": 336, "width": 336}),
                          tokenizer=_llama_tok(), patch_size=14, vision_feature_select_strategy="default",
                          num_additional_image_tokens=1, chat_template=LLAVA_TEMPLATE)


def llava_7b(text_layers: int, vision_layers: int, vocab: int):
    from transformers import LlavaConfig, LlavaForConditionalGeneration
    vision = dict(model_type="clip_vision_model", hidden_size=1024, intermediate_size=4096, num_attention_heads=16,
                  num_hidden_layers=vision_layers, image_size=336, patch_size=14, projection_dim=768)
    text = dict(model_type="llama", vocab_size=vocab, hidden_size=4096, intermediate_size=11008,
                num_attention_heads=32, num_key_value_heads=32, num_hidden_layers=text_layers,
                max_position_embeddings=4096)
    cfg = LlavaConfig(vision_config=vision, text_config=text, image_token_index=4,
                      vision_feature_select_strategy="default", vision_feature_layer=-2)
    return random_model(lambda: LlavaForConditionalGeneration(cfg))


def generative_cases(n: int):
    from volta_ml.iglue_hf.data import read_marvl, read_xgqa, read_xvnli
    from volta_ml.iglue_hf.images import side_by_side
    from volta_ml.iglue_hf.prompts import user_turn
    pics = images(2 * n)
    xvnli = read_xvnli(str(SHARED / "XVNLI/annotations/en/test.jsonl"), "en")[:n]
    xgqa = read_xgqa(str(SHARED / "xGQA/annotations/few_shot/de/train_5.json"), "de")[:n]
    marvl = read_marvl(str(SHARED / "marvl/zero_shot/annotations/marvl-id.jsonl"), "id")[:n]
    one = [[p] for p in pics[:n]]
    canvas = [[side_by_side(pics[i], pics[n + i])] for i in range(n)]
    return [("xvnli", "letter", one, [user_turn("xvnli", "letter", e) for e in xvnli]),
            ("xvnli", "likelihood", one, [user_turn("xvnli", "likelihood", e) for e in xvnli]),
            ("xgqa", "generate", one, [user_turn("xgqa", "generate", e) for e in xgqa]),
            ("xgqa", "closed", one, [user_turn("xgqa", "closed", e) for e in xgqa]),
            ("marvl", "letter", canvas, [user_turn("marvl", "letter", e, "canvas") for e in marvl])]


def bench_generative(args) -> None:
    from volta_ml.hf.base import ModelSpec
    from volta_ml.hf.mllm import GenerativeBackend
    from volta_ml.iglue_hf.scoring import get_rule

    processor = llava_processor()
    vocabulary = list(__import__("json").load(open(SHARED / "gqa/annotations/trainval_label2ans.json")))
    context = {"max_new_tokens": args.max_new_tokens, "vocabulary": vocabulary[:args.closed_vocab]}
    cases = generative_cases(args.examples)
    seconds: dict[tuple, dict[tuple, float]] = {}
    for vision_layers in map(int, args.vision_layers.split(",")):
        for text_layers in map(int, args.text_layers.split(",")):
            model = llava_7b(text_layers, vision_layers, vocab=32064).to(args.device, DTYPES[args.dtype])
            params = sum(p.numel() for p in model.parameters()) / 1e9
            backend = GenerativeBackend(ModelSpec("llava-1.5-7b-random"), model=model, processor=processor)
            for task, rule_name, imgs, prompts in cases:
                rule = get_rule(task, rule_name)
                with torch.inference_mode():
                    s = timed(lambda: rule.score(backend, imgs, prompts, context)) / len(prompts)
                seconds.setdefault((task, rule_name), {})[(vision_layers, text_layers)] = s
                print(f"llava-1.5-7b widths, {vision_layers} vision / {text_layers} text layers ({params:.2f}B): "
                      f"{task:<6} {rule_name:<10} {1 / s:7.3f} examples/s ({s:.2f} s/example, batch "
                      f"{len(prompts)})", flush=True)
            del backend, model
    for (task, rule_name), points in seconds.items():
        estimate = full_depth_estimate(points)
        if estimate:
            print(f"estimate for the full depth (24 vision, 32 text layers): {task} {rule_name}: "
                  f"{estimate:.1f} s/example = {1 / estimate:.3f} examples/s on this machine")


def full_depth_estimate(points: dict[tuple, float], vision: int = 24, text: int = 32) -> float | None:
    """Linear in each depth: time at the shallowest point plus per-layer slopes from the neighbouring depths."""
    (v0, t0), s0 = min(points.items())
    t_more = [(t, s) for (v, t), s in points.items() if v == v0 and t > t0]
    v_more = [(v, s) for (v, t), s in points.items() if t == t0 and v > v0]
    if not (t_more and v_more):
        return None
    t1, st = min(t_more)
    v1, sv = min(v_more)
    return s0 + (st - s0) / (t1 - t0) * (text - t0) + (sv - s0) / (v1 - v0) * (vision - v0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--part", choices=["retrieval", "generative", "all"], default="all")
    parser.add_argument("--captions", type=int, default=64)
    parser.add_argument("--images", type=int, default=32)
    parser.add_argument("--pairs_zoo", type=int, default=32, help="pairs the cross-encoder scores")
    parser.add_argument("--examples", type=int, default=4, help="examples per generative task (one batch)")
    parser.add_argument("--text_layers", default="1,2", help="LM depths to time (two give a per-layer slope)")
    parser.add_argument("--vision_layers", default="2,4", help="vision tower depths (24 = CLIP ViT-L); two "
                                                                "give a per-layer slope")
    parser.add_argument("--max_new_tokens", type=int, default=10)
    parser.add_argument("--closed_vocab", type=int, default=64, help="GQA answers ranked in the closed rule "
                                                                     "(1842 is the full vocabulary)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--device", default="cpu", help="HF models (the zoo cross-encoder runs on the CPU)")
    parser.add_argument("--dtype", default="fp32", choices=sorted(DTYPES))
    args = parser.parse_args()
    if not SHARED.is_dir():
        sys.exit(f"bench_iglue_hf: needs IGLUE's annotation files at {SHARED} (set VOLTA_ML_SHARED to the reference folder)")
    torch.set_num_threads(args.threads)
    if args.part in ("retrieval", "all"):
        bench_retrieval(args)
    if args.part in ("generative", "all"):
        bench_generative(args)


if __name__ == "__main__":
    main()
