#!/usr/bin/env python
"""One-call GPU check: every GPU figure volta-ml claims, measured in one run, written to one report.

    python benchmarks/gpu_check.py [--out gpu_check_report] [--only train_step parity ...]
    python benchmarks/gpu_check.py --quick --device cpu          # tiny sizes, seconds: the test suite runs this

Checks (the `CHECKS` table; one more check is one entry): device facts, model parity on the device (fp32 against
the golden fixtures through `shared/tools/check_parity.py`, bf16-autocast drift), training-step samples/s and MFU
for the real base configs at batch 64 in bf16 and fp32 against the VOLTA-scheme fp32 step, retrieval pairs/s,
extraction images/s, CVQA questions/s (model-zoo matching scorer, and each HF backend family at real architecture
size with random weights built on the meta device), a `--sharding fsdp` training step with its sharded checkpoint, DDP
scaling when more than one GPU is visible.

Each check runs in its own process with its own time budget (a hang, an out-of-memory or a crash costs that check
only, and what it measured before is kept: rows are streamed to disk as they are measured); the whole run stops
starting checks at --total-budget seconds (default 480 = 8 minutes on one H200). The report (`report.json`,
`report.md`) is rewritten after every check, so an interrupted run still leaves one.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(REPO))

from volta_ml.atomic import atomic_open, atomic_write_json  # noqa: E402

GOALS_TEXT = ("bf16 training step >= 3x the VOLTA-scheme fp32 step (samples/s); bf16 MFU >= 35% "
              "for the base models at batch 64")


@dataclass
class Context:
    """What a check function gets: sizes, device, its deadline, and `row()` to record one measurement."""
    name: str
    quick: bool
    device: str
    deadline: float  # time.monotonic() after which the check should stop starting new work
    rows_file: Path
    peak_tflops: dict | None = None  # {"bf16": x, "fp32": y} override of the peak table

    def row(self, **values) -> None:
        with open(self.rows_file, "a") as handle:
            handle.write(json.dumps(values, default=str) + "\n")
        shown = ", ".join(f"{k}={_short(v)}" for k, v in values.items())
        print(f"[{self.name}] {shown}", file=sys.stderr, flush=True)

    def left(self) -> float:
        return self.deadline - time.monotonic()

    def skip_if_late(self, what: str, needs_s: float) -> bool:
        """True (and a row saying so) when fewer than `needs_s` seconds of the budget are left."""
        if self.left() < needs_s:
            self.row(item=what, status="skipped", reason=f"time budget: {self.left():.0f} s left, needs ~{needs_s:.0f}")
            return True
        return False


def _short(value):
    return f"{value:.4g}" if isinstance(value, float) else value


def _checks():
    import gpu_check_hf as hf
    import gpu_check_vllm as vllm_engine
    import gpu_check_zoo as zoo
    # name: (function(ctx), budget seconds on one H200, what it measures)
    return {
        "device": (zoo.check_device, 10, "device, torch/CUDA versions, the peak FLOP/s MFU divides by"),
        "parity": (zoo.check_parity, 40, "golden fixtures on the device: fp32 parity, bf16-autocast drift"),
        "train_step": (zoo.check_train_step, 165, "forward+backward+AdamW samples/s and MFU, batch 64, fp32/bf16"),
        "pretrain": (zoo.check_pretrain, 60, "pretraining step (train_concap.py: MLM + masked regions + ITM, "
                                             "AdamW) samples/s, batch 64, fp32/bf16"),
        "retrieval": (zoo.check_retrieval, 60, "retrieval pairs/s, VOLTA scheme vs compute_score_matrix"),
        "extraction": (zoo.check_extraction, 45, "region-feature extraction images/s per detector preset"),
        "cvqa_zoo": (zoo.check_cvqa_zoo, 30, "CVQA questions/s, model-zoo matching scorer"),
        "cvqa_hf": (hf.check_cvqa_hf, 130, "CVQA questions/s per HF backend family, real size, random weights"),
        "cvqa_vllm": (vllm_engine.check_cvqa_vllm, 150, "CVQA letter rule and a MaXM-style 8-token generation, "
                                                         "questions/s, --backend vllm, LLaVA-1.5-7B shapes, dummy "
                                                         "weights, bf16"),
        "hf_train": (hf.check_hf_train, 100, "HF fine-tuning step samples/s and peak memory: LoRA LLaVA-1.5-7B, "
                                              "contrastive CLIP ViT-B/32 with and without gradient checkpointing, "
                                              "real size, random weights"),
        "hf_fsdp": (hf.check_hf_fsdp, 150, "one --sharding fsdp training step through the engine (LoRA, full, "
                                            "full + CPU offload; Qwen2.5-VL-7B widths, 8 layers) and its sharded "
                                            "checkpoint written and read back"),
        "ddp": (zoo.check_ddp, 120, "retrieval and training scaling over 2 GPUs (skipped with one)"),
    }


CHECK_NAMES = ("device", "parity", "train_step", "pretrain", "retrieval", "extraction", "cvqa_zoo", "cvqa_hf",
               "cvqa_vllm", "hf_train",               "hf_fsdp", "ddp")


def run_inline(name: str, args, budget: float, rows_file: Path) -> tuple[str, str]:
    fn = _checks()[name][0]
    ctx = Context(name, args.quick, args.device, time.monotonic() + budget, rows_file, _peaks(args))
    try:
        fn(ctx)
        return "ok", ""
    except (Exception, SystemExit) as err:  # one failing check must not stop the others (benchmarks exit on errors)
        import traceback
        return "failed", "".join(traceback.format_exception_only(type(err), err)).strip() + "\n" + \
            traceback.format_exc()[-3000:]


def run_subprocess(name: str, args, budget: float, rows_file: Path) -> tuple[str, str]:
    cmd = [sys.executable, str(Path(__file__).resolve()), "--_one", name, "--_rows", str(rows_file),
           "--_budget", str(budget), "--device", args.device]
    if args.quick:
        cmd.append("--quick")
    if args.peak_tflops:
        cmd += ["--peak-tflops", *map(str, args.peak_tflops)]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))
    try:  # a little slack over the check's own deadline for start-up and clean-up
        proc = subprocess.run(cmd, env=env, timeout=budget + 30, stdout=subprocess.PIPE, stderr=None, text=True)
    except subprocess.TimeoutExpired:
        return "timeout", f"killed after {budget + 30:.0f} s (budget {budget:.0f} s); rows measured before are kept"
    if proc.returncode != 0:
        return "failed", f"exit code {proc.returncode}: {proc.stdout[-3000:]}"
    for line in reversed(proc.stdout.strip().splitlines()):  # the status line is the last JSON list printed
        if line.startswith('["'):
            status, detail = json.loads(line)
            return status, detail
    return "failed", f"no status line from the check process: {proc.stdout[-2000:]}"


def _peaks(args) -> dict | None:
    return {"bf16": args.peak_tflops[0], "fp32": args.peak_tflops[1]} if args.peak_tflops else None


def read_rows(rows_file: Path) -> list[dict]:
    if not rows_file.exists():
        return []
    return [json.loads(line) for line in rows_file.read_text().splitlines() if line.strip()]


def write_report(out: Path, report: dict) -> None:
    import gpu_check_report
    atomic_write_json(out / "report.json", report, indent=1, default=str)
    with atomic_open(out / "report.md", "w", encoding="utf-8") as handle:
        handle.write(gpu_check_report.markdown(report))


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="gpu_check_report", help="folder for report.json and report.md")
    parser.add_argument("--only", nargs="+", choices=CHECK_NAMES, help="run these checks only")
    parser.add_argument("--quick", action="store_true", help="tiny sizes (seconds, runs on CPU): the test suite")
    parser.add_argument("--device", default=None, help="cuda (default when available) or cpu")
    parser.add_argument("--total-budget", type=float, default=480.0, help="seconds for the whole run")
    parser.add_argument("--in-process", action="store_true",
                        help="run the checks in this process (no per-check isolation or hard timeout)")
    parser.add_argument("--peak-tflops", type=float, nargs=2, metavar=("BF16", "FP32"),
                        help="dense peak TFLOP/s MFU divides by, when the device is not in the built-in table")
    parser.add_argument("--_one", help=argparse.SUPPRESS)
    parser.add_argument("--_rows", help=argparse.SUPPRESS)
    parser.add_argument("--_budget", type=float, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.device is None:
        import torch
        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    if args._one:  # child process: one check, its status on the last stdout line
        print(json.dumps(run_inline(args._one, args, args._budget, Path(args._rows))))
        return {}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    table = _checks()
    started = time.monotonic()
    report = {"goals": GOALS_TEXT, "quick": args.quick, "device": args.device,
              "total_budget_s": args.total_budget, "checks": {}}
    for name in args.only or CHECK_NAMES:
        _, budget, what = table[name]
        budget = 120.0 if args.quick else budget  # --quick: a cap against hangs (a loaded CPU is slow)
        left = args.total_budget - (time.monotonic() - started)
        rows_file = out / f"rows_{name}.jsonl"
        rows_file.unlink(missing_ok=True)
        entry = {"what": what, "budget_s": budget}
        if left < min(budget, 10):
            entry.update(status="skipped", detail=f"total budget spent ({left:.0f} s left)", rows=[], seconds=0.0)
        else:
            print(f"== {name}: {what} (budget {min(budget, left):.0f} s)", file=sys.stderr, flush=True)
            t0 = time.monotonic()
            runner = run_inline if args.in_process else run_subprocess
            status, detail = runner(name, args, min(budget, left), rows_file)
            entry.update(status=status, detail=detail, rows=read_rows(rows_file),
                         seconds=round(time.monotonic() - t0, 1))
            print(f"== {name}: {status} in {entry['seconds']} s" + (f": {detail.splitlines()[0]}" if detail else ""),
                  file=sys.stderr, flush=True)
        report["checks"][name] = entry
        report["elapsed_s"] = round(time.monotonic() - started, 1)
        write_report(out, report)
    import gpu_check_report
    report["goal_results"] = gpu_check_report.goal_results(report)
    write_report(out, report)
    print(gpu_check_report.markdown(report))
    return report


if __name__ == "__main__":
    main()
