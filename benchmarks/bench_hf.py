"""HF backends throughput: CVQA-shaped examples/s per backend with random weights at the paper models' sizes.

No download: every model is built from its config class with random weights directly on the target device
(weights do not change the speed), with an in-memory word-level stand-in tokenizer (about one token per word,
like the real tokenizers on English) and the family's real image resolution / image-token count. One example is a
CVQA question: one photo, a location-aware prompt of ~40 words and 4 options of 1-6 words.

Rows:
- dual encoders (clip-b32, clip-l14-336, mclip): questions/s = 1 image + the 4 "question + option" texts.
- generative (llava-1.5-7b, instructblip-flan-t5-xl, mblip-mt0-xl, mblip-bloomz-7b): letter rule (one forward per
  question, options in the prompt); open-ended with KV reuse (prompt once, the 4 options on its cache / encoder
  output) vs without (4 full forwards, one per option = per-option scoring); "prompt fwd/batch" counts the
  image-tower runs per batch (= full prompt forwards: 1 for the letter rule, 4 for per-option scoring).
`--scale full` is the real architecture (CUDA; a 7B model does not fit a small CPU box); `--scale reduced` keeps
the real image resolution, image/query-token counts, vocabularies and widths of the vision towers but cuts every
tower to 2 layers and the LM to width 1024 (so the sequence shapes, and thus the reuse ratio, are the real ones).
The sides are timed alternately in one process, median of `--repeats`.
- current families (`--families [NAME ...]`, none named = all): the letter rule's questions/s at batch 1 vs 8 for
  each family of tests/helpers_vlm_families.py at its real checkpoint's widths with 2 text + 2 vision layers
  (benchmarks/bench_mllm_families.py, which gets the other flags: `--questions`, `--quick`, ...).

    python benchmarks/bench_hf.py                                   # CPU: dual encoders full, generative reduced
    python benchmarks/bench_hf.py --device cuda --dtype bf16 --scale full --batch 8
    python benchmarks/bench_hf.py --families --threads 2 --questions 8 --repeats 1    # every current family
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from volta_ml.hf.base import ModelSpec  # noqa: E402

WORDS = ("what which who where why how is are the a of in on this that picture photo shown food dish market "
         "temple river city country festival dance dress vehicle brand animal plant sport building person famous "
         "traditional local called name made used during typically seen here people wearing holding").split()
SPECIALS = ["<pad>", "<unk>", "<s>", "</s>", "<image>", "A", "B", "C", "D", "Location:", "Question:", "Options:",
            "Short", "Answer:", "USER:", "ASSISTANT:", ".", "?"]
CHAT = ("{% for m in messages %}USER: {% for c in m['content'] %}{% if c['type'] == 'image' %}<image>\n{% endif %}"
        "{% endfor %}{% for c in m['content'] %}{% if c['type'] == 'text' %}{{ c['text'] }}{% endif %}{% endfor %}"
        "{% endfor %}{% if add_generation_prompt %} ASSISTANT:{% endif %}")


def tokenizer(image_attr: bool = False):
    """Word-level stand-in; `image_attr`: the tokenizer names its image token (LLaVA; BLIP processors add it)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast
    vocab = {w: i for i, w in enumerate(dict.fromkeys(SPECIALS + WORDS))}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", unk_token="<unk>", bos_token="<s>",
                                   eos_token="</s>", **({"extra_special_tokens": {"image_token": "<image>"}} if image_attr else {}))


def workload(n: int, seed: int = 0):
    from PIL import Image
    rng = np.random.default_rng(seed)
    words = lambda k: " ".join(rng.choice(WORDS, k))                                    # noqa: E731
    imgs = [[Image.fromarray(rng.integers(0, 256, (480, 640, 3), dtype=np.uint8))] for _ in range(n)]
    options = [[words(int(rng.integers(1, 7))) for _ in range(4)] for _ in range(n)]
    letter = [f"Location: country . Question: {words(30)} ? Options: " + " ".join(
        f"{c} . {o}" for c, o in zip("ABCD", opts)) + " Short Answer:" for opts in options]
    open_ = [f"Location: country . Question: {words(30)} ? Short Answer:" for _ in range(n)]
    return imgs, letter, open_, [[" " + o for o in opts] for opts in options]


def _build(cls, cfg, device, dtype):
    with torch.device(device):
        return cls._from_config(cfg, dtype=dtype).eval()


# ---- architectures -------------------------------------------------------------------------------------------
def clip_config(large: bool):
    from transformers import CLIPConfig
    if not large:
        return CLIPConfig()                       # the defaults are openai/clip-vit-base-patch32
    return CLIPConfig(text_config=dict(hidden_size=768, intermediate_size=3072, num_attention_heads=12),
                      vision_config=dict(hidden_size=1024, intermediate_size=4096, num_attention_heads=16,
                                         num_hidden_layers=24, image_size=336, patch_size=14), projection_dim=768)


def clip_processor(size: int):
    from transformers import CLIPImageProcessor, CLIPProcessor
    return CLIPProcessor(image_processor=CLIPImageProcessor(size={"shortest_edge": size},
                                                            crop_size={"height": size, "width": size}),
                         tokenizer=tokenizer())


def dual(name: str, device, dtype, scale):
    from transformers import CLIPModel, XLMRobertaConfig, XLMRobertaModel
    from volta_ml.hf.dual import ClipBackend, MClipBackend
    spec = ModelSpec(name, device=str(device))
    if name.startswith("clip"):
        large = name == "clip-l14-336"
        return ClipBackend(spec, _build(CLIPModel, clip_config(large), device, dtype), clip_processor(336 if large else 224))
    xcfg = XLMRobertaConfig(vocab_size=250002, hidden_size=1024, num_hidden_layers=24, num_attention_heads=16,
                            intermediate_size=4096, max_position_embeddings=514, type_vocab_size=1, pad_token_id=0)
    with torch.device(device):
        linear = torch.nn.Linear(1024, 512).to(dtype)
    proc = clip_processor(224)
    return MClipBackend(spec, {"text": _build(XLMRobertaModel, xcfg, device, dtype), "linear": linear,
                               "tokenizer": proc.tokenizer, "image_processor": proc.image_processor,
                               "vision": _build(CLIPModel, clip_config(False), device, dtype)})


def _lm(kind: str, reduced: bool) -> dict:
    width = 1024 if reduced else None
    if kind == "llama":        # Vicuna-7B
        return dict(model_type="llama", hidden_size=width or 4096, intermediate_size=(width or 4096) * 11008 // 4096,
                    num_hidden_layers=2 if reduced else 32, num_attention_heads=(width or 4096) // 128,
                    vocab_size=32064, max_position_embeddings=4096)
    if kind == "bloom":        # BLOOMZ-7B1
        return dict(model_type="bloom", hidden_size=width or 4096, n_layer=2 if reduced else 30,
                    n_head=(width or 4096) // 128, vocab_size=250880)
    return dict(model_type=kind, vocab_size=250112 if kind == "mt5" else 32128, d_model=width or 2048, d_kv=64,
                d_ff=(width or 2048) * 5120 // 2048, num_layers=2 if reduced else 24,
                num_heads=(width or 2048) // 64, feed_forward_proj="gated-gelu", tie_word_embeddings=False,
                decoder_start_token_id=0)


def generative(name: str, device, dtype, scale):
    from transformers import (BlipImageProcessor, Blip2Config, Blip2ForConditionalGeneration, Blip2Processor,
                              CLIPImageProcessor, InstructBlipConfig, InstructBlipForConditionalGeneration,
                              InstructBlipProcessor, LlavaConfig, LlavaForConditionalGeneration, LlavaProcessor)
    from volta_ml.hf.generative import generative_backend
    reduced = scale == "reduced"
    tok = tokenizer(image_attr=name.startswith("llava"))
    if name == "llava-1.5-7b":
        vision = dict(model_type="clip_vision_model", hidden_size=1024, intermediate_size=4096, num_attention_heads=16,
                      num_hidden_layers=2 if reduced else 24, image_size=336, patch_size=14, projection_dim=768)
        cfg = LlavaConfig(vision_config=vision, text_config=_lm("llama", reduced),
                          image_token_index=tok.convert_tokens_to_ids("<image>"))
        proc = LlavaProcessor(image_processor=CLIPImageProcessor(size={"shortest_edge": 336},
                                                                 crop_size={"height": 336, "width": 336}),
                              tokenizer=tok, patch_size=14, vision_feature_select_strategy="default",
                              num_additional_image_tokens=1, chat_template=CHAT)
        model = _build(LlavaForConditionalGeneration, cfg, device, dtype)
    else:
        instruct = name.startswith("instructblip")
        lm = {"instructblip-flan-t5-xl": "t5", "mblip-mt0-xl": "mt5", "mblip-bloomz-7b": "bloom"}[name]
        ip = BlipImageProcessor(size={"height": 224, "width": 224})
        proc = InstructBlipProcessor(image_processor=ip, tokenizer=tok, qformer_tokenizer=tokenizer(),
                                     num_query_tokens=32) if instruct else \
            Blip2Processor(image_processor=ip, tokenizer=tok, num_query_tokens=32)
        vision = dict(hidden_size=1408, intermediate_size=6144, num_attention_heads=16,
                      num_hidden_layers=2 if reduced else 39, image_size=224, patch_size=14)
        qformer = dict(encoder_hidden_size=1408, num_hidden_layers=2 if reduced else 12)
        ccls, mcls = (InstructBlipConfig, InstructBlipForConditionalGeneration) if instruct else \
            (Blip2Config, Blip2ForConditionalGeneration)
        cfg = ccls(vision_config=vision, qformer_config=qformer, text_config=_lm(lm, reduced), num_query_tokens=32,
                   image_token_index=tok.convert_tokens_to_ids("<image>"))
        model = _build(mcls, cfg, device, dtype)
    return generative_backend(ModelSpec(name, device=str(device)), model, proc)


# ---- timing --------------------------------------------------------------------------------------------------
def sync(device):
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


def timed(fn, device) -> float:
    sync(device)
    t = time.perf_counter()
    fn()
    sync(device)
    return time.perf_counter() - t


def image_tower(model):
    for name, module in model.named_modules():
        if name.endswith(("vision_tower", "vision_model")):
            return module
    raise LookupError("no vision tower")


def bench_dual(b, data, batch, repeats, device):
    imgs, letter, _, options = data
    texts = [letter[i].split(" Options:")[0] + o for i in range(batch) for o in options[i]]
    run = lambda: (b.embed_images([im[0] for im in imgs[:batch]]), b.embed_texts(texts))   # noqa: E731
    run()
    return {"questions/s": batch / statistics.median(timed(run, device) for _ in range(repeats))}


def bench_generative(b, data, batch, repeats, device):
    imgs, letter, open_, options = data
    imgs, letter, open_, options = imgs[:batch], letter[:batch], open_[:batch], options[:batch]
    calls = [0]
    image_tower(b.model).register_forward_hook(lambda *a: calls.__setitem__(0, calls[0] + 1))
    sides = {"letter": lambda: b.choice_logits(imgs, letter, list("ABCD")),
             "open+reuse": lambda: b.continuation_logprobs(imgs, open_, options),
             "open no reuse": lambda: b.continuation_logprobs(imgs, open_, options, reuse_cache=False)}
    times, fwd = {k: [] for k in sides}, {}
    for k, fn in sides.items():          # warm-up + prompt forwards per question
        calls[0] = 0
        fn()
        fwd[k] = calls[0]
    for _ in range(repeats):
        for k, fn in sides.items():
            times[k].append(timed(fn, device))
    out = {f"{k} q/s": batch / statistics.median(v) for k, v in times.items()}
    out["reuse speedup"] = statistics.median(times["open no reuse"]) / statistics.median(times["open+reuse"])
    out["prompt fwd/batch letter"] = fwd["letter"]
    out["prompt fwd/batch per-option"] = fwd["open no reuse"]
    out["prompt fwd/batch open+reuse"] = fwd["open+reuse"]
    return out


DUAL = ("clip-b32", "clip-l14-336", "mclip")
GENERATIVE = ("llava-1.5-7b", "instructblip-flan-t5-xl", "mblip-mt0-xl", "mblip-bloomz-7b")


def families(args, rest: list[str]) -> int:
    """The per-family rows (benchmarks/bench_mllm_families.py) with this command's device, dtype, threads, repeats."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import bench_mllm_families
    argv = ["--device", args.device, "--repeats", str(args.repeats), *rest]
    if args.families:
        argv += ["--families", *args.families]
    if args.dtype:
        argv += ["--dtype", args.dtype]
    if args.threads:
        argv += ["--threads", str(args.threads)]
    bench_mllm_families.main(argv)
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", nargs="+", default=list(DUAL + GENERATIVE), choices=DUAL + GENERATIVE)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--dtype", default=None, choices=["fp32", "fp16", "bf16"], help="default: bf16 on CUDA, fp32 CPU")
    ap.add_argument("--scale", default=None, choices=["full", "reduced"],
                    help="generative models: default full on CUDA, reduced on CPU (dual encoders are always full)")
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--families", nargs="*", default=None,
                    help="current mllm families instead (bench_mllm_families.py; no names: all)")
    args, rest = ap.parse_known_args(argv)
    if args.families is not None:
        return families(args, rest)
    if rest:
        ap.error(f"unrecognized arguments: {' '.join(rest)}")
    cuda = torch.device(args.device).type == "cuda"
    dtype = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}[args.dtype or ("bf16" if cuda else "fp32")]
    scale = args.scale or ("full" if cuda else "reduced")
    if args.threads:
        torch.set_num_threads(args.threads)
    data, failed = workload(args.batch), 0
    print(f"device={args.device} dtype={dtype} generative scale={scale} batch={args.batch} threads={torch.get_num_threads()}")
    for name in args.models:
        torch.manual_seed(0)
        try:
            with torch.inference_mode():
                if name in DUAL:
                    row = bench_dual(dual(name, args.device, dtype, scale), data, args.batch, args.repeats, args.device)
                else:
                    row = bench_generative(generative(name, args.device, dtype, scale), data, args.batch,
                                           args.repeats, args.device)
        except (RuntimeError, ValueError, MemoryError) as e:     # e.g. out of memory: report, go on with the rest
            failed += 1
            print(f"{name:24s} FAILED: {str(e).splitlines()[0]}", flush=True)
            continue
        print(f"{name:24s} " + "  ".join(f"{k}={v:.3g}" for k, v in row.items()), flush=True)
        if torch.device(args.device).type == "cuda":
            torch.cuda.empty_cache()
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
