"""Wall and CPU seconds per stage of `volta-ml demo` (target: full size under 5 minutes on 2 CPU cores).

    python benchmarks/bench_demo.py [--size full|small] [--threads 2] [--out DIR]
"""
from __future__ import annotations

import argparse
import resource
import tempfile
import time


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size", default="full", choices=["small", "full"])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default=None, help="output directory (default: a temporary one)")
    args = parser.parse_args()

    from volta_ml.demo.pipeline import run_demo

    def cpu() -> float:
        usage = resource.getrusage(resource.RUSAGE_SELF)
        return usage.ru_utime + usage.ru_stime

    with tempfile.TemporaryDirectory() as tmp:
        start, cpu_start = time.time(), cpu()
        result = run_demo(args.out or tmp, size=args.size, seed=args.seed, threads=args.threads, progress=False)
        wall, cpu_total = time.time() - start, cpu() - cpu_start
    print(f"\nvolta-ml demo --size {args.size} --threads {args.threads}")
    print(f"{'stage':<10} {'wall s':>8}")
    for stage, seconds in result.seconds.items():
        print(f"{stage:<10} {seconds:>8.1f}")
    print(f"{'total':<10} {wall:>8.1f}   (process CPU {cpu_total:.0f} s; English accuracy {result.scores['en']:.1f}%)")


if __name__ == "__main__":
    main()
