"""Training-step throughput of the model zoo: forward + backward + AdamW step on the real base configs.

Text length 40, 36 regions + 1 global slot, fp32 and bf16 autocast; CPU by default, CUDA when present.
Each (config, precision) runs in its own process so peak memory is that run's alone. Prints one table.

    python benchmarks/bench_model.py                    # all five configs, CPU (or CUDA if available)
    python benchmarks/bench_model.py --configs uc2_base --batch 8 --steps 5
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time

CONFIGS = ["uc2_base", "ctrl_xuniter_base", "m3p_base", "ctrl_vilbert_base", "ctrl_lxmert"]
TASK = {"TASK15": {"type": "VL-classifier-GQA", "num_labels": 1842}}


def one_run(config_name: str, precision: str, device: str, batch: int, steps: int, warmup: int) -> dict:
    import torch
    from volta_ml.models import build_model, load_config

    torch.manual_seed(0)
    config = load_config(config_name)
    model = build_model(config, TASK).to(device).train()
    fused = device == "cuda" or hasattr(torch.optim.AdamW, "fused")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-5, weight_decay=0.01, fused=True if fused else None)
    L, R = 40, 37
    vocab = config.n_words if config.is_m3p else config.vocab_size
    feat = 2048 if config.is_m3p else config.v_feature_size
    locs = 5 if config.is_m3p else config.num_locs
    g = torch.Generator().manual_seed(0)
    b = dict(input_txt=torch.randint(5, vocab, (batch, L), generator=g),
             input_imgs=torch.rand(batch, R, feat, generator=g), image_loc=torch.rand(batch, R, locs, generator=g),
             attention_mask=torch.ones(batch, L, dtype=torch.long),
             image_attention_mask=torch.ones(batch, R, dtype=torch.long))
    b = {k: v.to(device) for k, v in b.items()}
    target = torch.randint(0, 1842, (batch,), generator=g).to(device)
    amp = torch.autocast(device, dtype=torch.bfloat16, enabled=precision == "bf16")

    def step():
        with amp:
            logits = model(**b, task_id="TASK15")
        loss = torch.nn.functional.cross_entropy(logits.float(), target)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    for _ in range(warmup):
        step()
    if device == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    for _ in range(steps):
        step()
    if device == "cuda":
        torch.cuda.synchronize()
    dt = (time.perf_counter() - t0) / steps
    peak = torch.cuda.max_memory_allocated() / 2**30 if device == "cuda" else \
        resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
    return {"config": config_name, "precision": precision, "device": device, "batch": batch,
            "step_s": dt, "samples_per_s": batch / dt, "peak_gib": peak,
            "params_m": sum(p.numel() for p in model.parameters()) / 1e6}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--configs", nargs="+", default=CONFIGS)
    ap.add_argument("--precisions", nargs="+", default=["fp32", "bf16"], choices=["fp32", "bf16"])
    ap.add_argument("--device", default=None, help="cpu or cuda (default: cuda if available)")
    ap.add_argument("--batch", type=int, default=None, help="default 8 on CPU, 64 on CUDA")
    ap.add_argument("--steps", type=int, default=None, help="timed steps (default 3 on CPU, 20 on CUDA)")
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--json", help="also write the rows to this JSON file")
    ap.add_argument("--_one", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args._one:
        cfg, prec, dev = args._one.split(",")
        print(json.dumps(one_run(cfg, prec, dev, args.batch, args.steps, args.warmup)))
        return 0
    import torch
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    batch = args.batch or (64 if device == "cuda" else 8)
    steps = args.steps or (20 if device == "cuda" else 3)
    rows = []
    for cfg in args.configs:
        for prec in args.precisions:
            cmd = [sys.executable, __file__, "--_one", f"{cfg},{prec},{device}", "--batch", str(batch),
                   "--steps", str(steps), "--warmup", str(args.warmup)]
            out = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "PYTHONWARNINGS": "ignore"})
            if out.returncode:
                print(f"{cfg} {prec}: failed\n{out.stderr[-2000:]}", file=sys.stderr)
                continue
            rows.append(json.loads(out.stdout.strip().splitlines()[-1]))
            r = rows[-1]
            print(f"  {cfg:18s} {prec:5s} {r['samples_per_s']:8.2f} samples/s", file=sys.stderr, flush=True)
    print(f"\nforward+backward+AdamW, text 40, 36+1 regions, batch {batch}, device {device}, "
          f"torch threads {torch.get_num_threads()}")
    print(f"{'config':20s} {'prec':5s} {'params':>8s} {'step s':>8s} {'samples/s':>10s} {'peak GiB':>9s}")
    for r in rows:
        print(f"{r['config']:20s} {r['precision']:5s} {r['params_m']:7.1f}M {r['step_s']:8.3f} "
              f"{r['samples_per_s']:10.2f} {r['peak_gib']:9.2f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
