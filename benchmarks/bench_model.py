"""Training-step throughput of the model zoo, split into forward / backward / optimizer, on the real base configs.

Text length 40, 36 regions + 1 global slot, the GQA head (1,842 answers), fp32 and bf16 autocast; CPU by default,
CUDA when present. The optimizer is `VoltaAdamW` (the default `--adam_impl volta`) over `parameter_groups`; beside
it, on the same model and gradients, runs a "per-tensor reference AdamW": pytorch-transformers' in-place loop of the
same formula, one group per tensor as VOLTA's train_task.py builds them (`VoltaAdamW(fused=False)`, bit-identical to
that loop). Each (config, precision) runs in its own process so peak memory is that run's alone. Prints one table.

    python benchmarks/bench_model.py                    # all five configs, CPU (or CUDA if available)
    python benchmarks/bench_model.py --configs ctrl_lxmert --precisions fp32 --steps 5 --threads 2
    python benchmarks/bench_model.py --compile          # torch.compile the model (first steps compile; warmup 2+)
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time

CONFIGS = ["uc2_base", "ctrl_xuniter_base", "m3p_base", "ctrl_vilbert_base", "ctrl_lxmert"]
TASK = {"TASK15": {"type": "VL-classifier-GQA", "num_labels": 1842}}
NO_DECAY = ("bias", "LayerNorm.bias", "LayerNorm.weight")


def _batch(config, batch: int, device: str):
    import torch
    L, R = 40, 37
    vocab = config.n_words if config.is_m3p else config.vocab_size
    feat = 2048 if config.is_m3p else config.v_feature_size
    locs = 5 if config.is_m3p else config.num_locs
    g = torch.Generator().manual_seed(0)
    b = dict(input_txt=torch.randint(5, vocab, (batch, L), generator=g),
             input_imgs=torch.rand(batch, R, feat, generator=g), image_loc=torch.rand(batch, R, locs, generator=g),
             attention_mask=torch.ones(batch, L, dtype=torch.long),
             image_attention_mask=torch.ones(batch, R, dtype=torch.long))
    target = torch.zeros(batch, 1842)
    target[torch.arange(batch), torch.randint(0, 1842, (batch,), generator=g)] = 1.0
    return {k: v.to(device) for k, v in b.items()}, target.to(device)


def flops_per_sample(config_source) -> float:
    """Matmul/attention FLOPs of one sample's forward + backward (torch FlopCounterMode on the meta device, the
    _batch shapes: text 40, 36 + 1 regions, GQA head); elementwise ops and the optimizer not counted."""
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    from volta_ml.models import build_model, load_config
    config = load_config(config_source)
    with torch.device("meta"):
        model = build_model(config, TASK).train()
        text, regions = 40, 37  # _batch's shapes
        feat = 2048 if config.is_m3p else config.v_feature_size
        locs = 5 if config.is_m3p else config.num_locs
        batch = dict(input_txt=torch.zeros(1, text, dtype=torch.long), input_imgs=torch.zeros(1, regions, feat),
                     image_loc=torch.zeros(1, regions, locs), attention_mask=torch.ones(1, text, dtype=torch.long),
                     image_attention_mask=torch.ones(1, regions, dtype=torch.long))
        target = torch.zeros(1, 1842)
    with FlopCounterMode(display=False) as counter:
        logits = model(**batch, task_id="TASK15")
        torch.nn.functional.binary_cross_entropy_with_logits(logits.float(), target).backward()
    return float(counter.get_total_flops())


def matmul_peak_gflops(device: str, precision: str, size: int = 2048, seconds: float = 1.0) -> float:
    """GFLOP/s of one square matmul in `precision` (best of repeated runs): what the device's GEMMs reach."""
    import torch
    dtype = torch.bfloat16 if precision == "bf16" else torch.float32
    a = torch.randn(size, size, device=device, dtype=dtype)
    b = torch.randn(size, size, device=device, dtype=dtype)
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    best, deadline = float("inf"), time.perf_counter() + seconds
    while True:
        sync()
        t0 = time.perf_counter()
        a @ b
        sync()
        best = min(best, time.perf_counter() - t0)
        if time.perf_counter() > deadline:
            return 2 * size ** 3 / best / 1e9


def one_run(config_name: str, precision: str, device: str, batch: int, steps: int, warmup: int,
            compile_model: bool) -> dict:
    import torch
    from volta_ml.engine.optim import VoltaAdamW, parameter_groups
    from volta_ml.models import build_model, load_config

    torch.manual_seed(0)
    config = load_config(config_name)
    model = build_model(config, TASK).to(device).train()
    run = torch.compile(model) if compile_model else model
    lr, wd = 2e-5, 1e-4
    ours = VoltaAdamW(parameter_groups(model, wd), lr=lr, eps=1e-6, correct_bias=True)
    per_tensor = [{"params": [p], "weight_decay": 0.0 if any(m in n for m in NO_DECAY) else wd}
                  for n, p in model.named_parameters() if p.requires_grad]
    reference = VoltaAdamW(per_tensor, lr=lr, eps=1e-6, correct_bias=True, fused=False)
    b, target = _batch(config, batch, device)
    amp = torch.autocast(device, dtype=torch.bfloat16, enabled=precision == "bf16")
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)

    def step(opt) -> tuple[float, float, float]:
        sync()
        t0 = time.perf_counter()
        with amp:
            logits = run(**b, task_id="TASK15")
        loss = torch.nn.functional.binary_cross_entropy_with_logits(logits.float(), target) * target.size(1)
        sync()
        t1 = time.perf_counter()
        loss.backward()
        sync()
        t2 = time.perf_counter()
        opt.step()
        opt.zero_grad(set_to_none=True)
        sync()
        return t1 - t0, t2 - t1, time.perf_counter() - t2

    for _ in range(warmup):
        step(ours)
        step(reference)
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    times, ref_opt = [], []
    for _ in range(steps):   # alternate, so machine noise hits both optimizers alike
        times.append(step(ours))
        ref_opt.append(step(reference)[2])
    fwd, bwd, opt = (statistics.median(t[i] for t in times) for i in range(3))
    ref = statistics.median(ref_opt)
    peak = torch.cuda.max_memory_allocated() / 2**30 if device == "cuda" else \
        resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
    return {"config": config_name, "precision": precision, "device": device, "batch": batch,
            "compiled": compile_model, "threads": torch.get_num_threads(),
            "forward_s": fwd, "backward_s": bwd, "optimizer_s": opt, "reference_optimizer_s": ref,
            "step_s": fwd + bwd + opt, "reference_step_s": fwd + bwd + ref,
            "samples_per_s": batch / (fwd + bwd + opt), "peak_gib": peak,
            "params_m": sum(p.numel() for p in model.parameters()) / 1e6}


def print_table(rows: list[dict]) -> None:
    print(f"{'config':18s} {'prec':5s} {'params':>7s} {'forward':>8s} {'backward':>9s} {'AdamW':>7s} "
          f"{'ref AdamW':>10s} {'step s':>7s} {'samples/s':>10s} {'ref samples/s':>14s} {'peak GiB':>9s} "
          f"{'GFLOP':>7s} {'floor s':>8s}")
    for r in rows:
        print(f"{r['config']:18s} {r['precision']:5s} {r['params_m']:6.1f}M {r['forward_s']:8.3f} "
              f"{r['backward_s']:9.3f} {r['optimizer_s']:7.3f} {r['reference_optimizer_s']:10.3f} "
              f"{r['step_s']:7.3f} {r['samples_per_s']:10.2f} {r['batch'] / r['reference_step_s']:14.2f} "
              f"{r['peak_gib']:9.2f} {r.get('matmul_gflop_per_step', float('nan')):7.0f} "
              f"{r.get('matmul_floor_s', float('nan')):8.3f}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--configs", nargs="+", default=CONFIGS)
    ap.add_argument("--precisions", nargs="+", default=["fp32", "bf16"], choices=["fp32", "bf16"])
    ap.add_argument("--device", default=None, help="cpu or cuda (default: cuda if available)")
    ap.add_argument("--batch", type=int, default=None, help="default 8 on CPU, 64 on CUDA")
    ap.add_argument("--steps", type=int, default=None, help="timed steps per optimizer (default 3 on CPU, 20 on CUDA)")
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")
    ap.add_argument("--compile", action="store_true", help="torch.compile the model (use --warmup 2 or more)")
    ap.add_argument("--thp", action="store_true",
                    help="set THP_MEM_ALLOC_ENABLE=1: torch's CPU allocator uses transparent huge pages, so the "
                         "gradients allocated anew every step page-fault far less")
    ap.add_argument("--json", help="also write the rows to this JSON file")
    ap.add_argument("--_one", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    import torch
    if args.threads:
        torch.set_num_threads(args.threads)
    if args._one:
        cfg, prec, dev = args._one.split(",")
        print(json.dumps(one_run(cfg, prec, dev, args.batch, args.steps, args.warmup, args.compile)))
        return []
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    batch = args.batch or (64 if device == "cuda" else 8)
    steps = args.steps or (20 if device == "cuda" else 3)
    rows = []
    for cfg in args.configs:
        for prec in args.precisions:
            cmd = [sys.executable, __file__, "--_one", f"{cfg},{prec},{device}", "--batch", str(batch),
                   "--steps", str(steps), "--warmup", str(args.warmup)] + \
                (["--threads", str(args.threads)] if args.threads else []) + (["--compile"] if args.compile else [])
            env = {**os.environ, "PYTHONWARNINGS": "ignore"} | ({"THP_MEM_ALLOC_ENABLE": "1"} if args.thp else {})
            out = subprocess.run(cmd, capture_output=True, text=True, env=env)
            if out.returncode:
                print(f"{cfg} {prec}: failed\n{out.stderr[-2000:]}", file=sys.stderr)
                continue
            rows.append(json.loads(out.stdout.strip().splitlines()[-1]))
            r = rows[-1]
            print(f"  {cfg:18s} {prec:5s} {r['samples_per_s']:8.2f} samples/s", file=sys.stderr, flush=True)
    # The matmul floor: the step's matmul FLOPs at the GEMM rate of one square matmul on this device. Any
    # implementation of the same model (VOLTA's included) does these FLOPs, so no step can be faster.
    peaks = {prec: matmul_peak_gflops(device, prec) for prec in {r["precision"] for r in rows}}
    flops = {cfg: flops_per_sample(cfg) for cfg in {r["config"] for r in rows}}
    for r in rows:
        r["matmul_gflop_per_step"] = flops[r["config"]] * r["batch"] / 1e9
        r["matmul_peak_gflops"] = peaks[r["precision"]]
        r["matmul_floor_s"] = r["matmul_gflop_per_step"] / peaks[r["precision"]]
    threads = rows[0]["threads"] if rows else torch.get_num_threads()
    print(f"\nforward / backward / AdamW step (seconds, median of {steps}), text 40, 36+1 regions, GQA head, "
          f"batch {batch}, device {device}, torch threads {threads}{', compiled' if args.compile else ''}"
          f"{', THP allocator' if args.thp else ''}\n"
          "AdamW = VoltaAdamW (fused); ref AdamW = per-tensor reference AdamW (pytorch-transformers' loop, "
          "VOLTA's per-tensor groups); ref samples/s = forward + backward + ref AdamW\n"
          "GFLOP = matmul FLOPs of forward + backward (torch FlopCounterMode); floor s = GFLOP at the rate of one "
          "square matmul here (" + ", ".join(f"{p} {g:.0f} GFLOP/s" for p, g in sorted(peaks.items())) + "): "
          "no implementation of the model computes the step faster")
    print_table(rows)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return rows


if __name__ == "__main__":
    main()
