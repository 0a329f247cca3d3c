#!/usr/bin/env python
"""Region-feature extraction throughput: images/s and peak memory per preset and input size.

Each (preset, size, device) runs in its own process so peak memory is its own. Weights are the
deterministic golden recipe when `../shared/golden_extract` exists (realistic proposal/selection
behaviour), else seeded random weights; speed does not depend on the values otherwise.

    python benchmarks/bench_extract.py                       # small + default size, CPU (+ CUDA if present)
    python benchmarks/bench_extract.py --sizes small --images 3 --presets volta-butd36
Sizes: `small` = min/max side 224/400, `tiny` = 96/128 (smoke runs), `default` = the preset's own (VOLTA: 800/1333). Images are
synthetic 480x640 (a typical Flickr30k/COCO size). Reference: the original detectron2 BUTD pipeline
takes 12-17 s per image on this project's 2-core CPU at its default size (features_plan.md section 5).
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from volta_ml.testing.reference import shared_path  # noqa: E402

_GOLDEN_DEFAULT = str(shared_path("golden_extract"))
SIZES = {"small": (224, 400), "tiny": (96, 128)}  # min/max image side; "default" keeps the preset's
GOLDEN = Path(os.environ.get("VOLTA_ML_GOLDEN_EXTRACT", _GOLDEN_DEFAULT).split(os.pathsep)[0])


def _model(preset, device):
    import torch

    from volta_ml.features.detectors.checkpoints import build_detector
    from volta_ml.features.detectors.keymap import butd_key, load_mapped, x101_key
    from volta_ml.features.detectors.recipe import read_key_table, recipe_weights

    model = build_detector(preset)
    table = {"butd": "d2_vg_attr_state_dict_keys.tsv", "x101": "x101_mrcnn_state_dict_keys.tsv"}[preset.detector]
    if (GOLDEN / "recipe" / table).is_file():
        weights = recipe_weights(read_key_table(GOLDEN / "recipe" / table), 1234)
        load_mapped(model, weights, butd_key if preset.detector == "butd" else x101_key)
        source = "recipe"
    else:
        torch.manual_seed(0)
        source = "random"
    return model.eval().to(device), source


def run_one(preset_name: str, size: str, device_name: str, n_images: int, threads: int) -> dict:
    import numpy as np
    import torch

    from volta_ml.features.detectors.presets import get_preset
    from volta_ml.features.detectors.select_butd import TooFewBoxes, butd_extract
    from volta_ml.features.detectors.x101_fpn import x101_extract_batch

    torch.set_num_threads(threads)
    preset = get_preset(preset_name)
    if size in SIZES:
        preset = preset.with_settings(min_size=SIZES[size][0], max_size=SIZES[size][1])
    device = torch.device(device_name)
    model, source = _model(preset, device)
    rng = np.random.default_rng(0)
    images = [rng.integers(0, 256, (480, 640, 3), dtype=np.uint8) for _ in range(n_images + 1)]
    for k, img in enumerate(images):  # some structure, so proposals are not all alike
        img[40 * k % 300: 40 * k % 300 + 120, 100:300] = (30 * k) % 256

    def one_pass(batch):
        if preset.detector == "butd":
            for img in batch:
                try:
                    butd_extract(model, img, preset, device=device)
                except TooFewBoxes:
                    pass
        else:
            for start in range(0, len(batch), preset.batch_size):
                x101_extract_batch(model, batch[start:start + preset.batch_size], preset, device=device)
        if device.type == "cuda":
            torch.cuda.synchronize()

    one_pass(images[:1])  # warm-up (allocator, kernels)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    start, cpu_start = time.perf_counter(), time.process_time()
    one_pass(images[1:])
    seconds = time.perf_counter() - start
    cpu_seconds = time.process_time() - cpu_start  # all threads: shows contention from other processes
    peak_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # MiB (Linux reports KiB)
    peak_gpu = torch.cuda.max_memory_allocated() / 2**20 if device.type == "cuda" else None
    return {"preset": preset_name, "size": size, "device": device_name, "threads": threads, "weights": source,
            "images": n_images, "seconds": seconds, "img_per_s": n_images / seconds,
            "s_per_img": seconds / n_images, "cpu_s_per_img": cpu_seconds / n_images,
            "peak_rss_mib": peak_rss, "peak_gpu_mib": peak_gpu,
            "input": f"{preset.min_size}/{preset.max_size}"}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--presets", default="volta-butd36,volta-x101")
    p.add_argument("--sizes", default="small,default")
    p.add_argument("--devices", default=None, help="default: cpu, plus cuda when available")
    p.add_argument("--images", type=int, default=4, help="timed images per configuration")
    p.add_argument("--threads", type=int, default=os.cpu_count())
    p.add_argument("--json", default=None, help="also write the rows to this file")
    p.add_argument("--_one", default=None, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args._one:
        preset, size, device = args._one.split(",")
        print(json.dumps(run_one(preset, size, device, args.images, args.threads)))
        return 0
    import torch

    devices = args.devices.split(",") if args.devices else ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
    rows = []
    for device in devices:
        for preset in args.presets.split(","):
            for size in args.sizes.split(","):
                cmd = [sys.executable, __file__, "--_one", f"{preset},{size},{device}", "--images", str(args.images),
                       "--threads", str(args.threads)]
                res = subprocess.run(cmd, capture_output=True, text=True)
                if res.returncode != 0:
                    print(f"{preset} {size} {device}: FAILED\n{res.stderr[-2000:]}", file=sys.stderr)
                    continue
                rows.append(json.loads(res.stdout.strip().splitlines()[-1]))
                r = rows[-1]
                print(f"done {preset} {size} {device}: {r['s_per_img']:.2f} s/img", file=sys.stderr, flush=True)
    header = f"{'preset':<14}{'size':<9}{'input':<10}{'device':<7}{'thr':>4}{'img/s':>9}{'s/img':>8}{'cpu s/img':>10}" \
             f"{'peak RSS MiB':>14}{'peak GPU MiB':>14}"
    print(header)
    print("-" * len(header))
    for r in rows:
        gpu = f"{r['peak_gpu_mib']:.0f}" if r["peak_gpu_mib"] is not None else "-"
        print(f"{r['preset']:<14}{r['size']:<9}{r['input']:<10}{r['device']:<7}{r['threads']:>4}"
              f"{r['img_per_s']:>9.3f}{r['s_per_img']:>8.2f}{r['cpu_s_per_img']:>10.2f}"
              f"{r['peak_rss_mib']:>14.0f}{gpu:>14}")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
