#!/usr/bin/env python
"""Questions/s of the generative engines on the same model and items: the HF backend (`mllm`) and vLLM's offline
engine (`vllm`), CVQA's letter rule and a MaXM-style short generation. Run it in the environment that has vLLM
(scripts/install_vllm_env.sh); a row whose engine is not installed is reported as skipped.

    python benchmarks/bench_engines.py [--questions 64] [--batch 16] [--engines mllm vllm] [--json out.json]

The model is the tests' tiny fp32 LLaVA (tests/helpers_vllm.py: CLIP 32 px + a 2-layer Llama, 17 image tokens)
unless `--model DIR` names another folder both engines load. Each engine scores the same `--questions` items
(random photos, CVQA-shaped prompts) in batches of `--batch` after one warm-up batch; the table gives
questions/s and the ratio to the first engine. Engines are the rows of `ENGINES` (name -> loader(model folder):
a `Generative` backend); an `openai` row (a client against a local `vllm serve`) is one more entry.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests"))

LETTERS = ["A", "B", "C", "D"]
CVQA_PROMPT = ("Question: {i}. what is shown in the picture? Options: A. a red car B. a blue bird C. a green tree "
               "D. a dog\nAnswer with the option's letter from the given choices directly.")
MAXM_PROMPT = "Question: {i}. which food is this? Short Answer:"
GENERATE_TOKENS = 8       # MaXM-style short answer


def _mllm(model: str, options: dict):
    from volta_ml.hf import ModelSpec, load_backend
    return load_backend("mllm", ModelSpec(model, dtype=options.get("dtype", "fp32"), device=options.get("device", "cpu")))


def _vllm(model: str, options: dict):
    from volta_ml.hf import ModelSpec, load_backend
    extra = {"max_model_len": options.get("max_model_len", 512), **options.get("engine", {})}
    return load_backend("vllm", ModelSpec(model, dtype=options.get("dtype", "fp32"),
                                          device=options.get("device", "cpu"), extra=extra))


ENGINES = {      # name -> (loader(model folder, options) -> Generative backend, the package it needs)
    "mllm": (_mllm, "transformers"),
    "vllm": (_vllm, "vllm"),
}
WORKLOADS = {    # name -> scoring call of one batch (images, prompts)
    "cvqa letter": lambda b, ims, n: b.choice_logits(ims, [CVQA_PROMPT.format(i=i) for i in n], LETTERS),
    f"maxm generate {GENERATE_TOKENS}": lambda b, ims, n: b.generate(ims, [MAXM_PROMPT.format(i=i) for i in n],
                                                                     GENERATE_TOKENS),
}


def photos(n: int, size: int = 48):
    import numpy as np
    from PIL import Image
    rng = np.random.default_rng(0)
    return [[Image.fromarray(rng.integers(0, 256, (size, size + 8, 3), dtype=np.uint8))] for _ in range(n)]


def measure(backend, workload, items: list, batch: int) -> float:
    """Questions/s of `workload` over `items` in batches of `batch`, after one warm-up batch."""
    fn = WORKLOADS[workload]
    fn(backend, items[:batch], range(batch))
    start = time.perf_counter()
    for s in range(0, len(items), batch):
        fn(backend, items[s:s + batch], range(s, min(s + batch, len(items))))
    return len(items) / (time.perf_counter() - start)


def run(model: str, engines, questions: int, batch: int, options: dict | None = None) -> list[dict]:
    from importlib.util import find_spec
    items = photos(questions)
    rows = []
    for name in engines:
        loader, package = ENGINES[name]
        if find_spec(package) is None:
            rows.append({"engine": name, "status": "skipped", "reason": f"{package} is not installed"})
            continue
        start = time.perf_counter()
        backend = loader(model, options or {})
        load_s = time.perf_counter() - start
        for workload in WORKLOADS:
            rows.append({"engine": name, "workload": workload, "questions": questions, "batch": batch,
                         "questions_per_s": measure(backend, workload, items, batch), "load_s": load_s,
                         "engine_record": getattr(backend, "engine", None)})
        if hasattr(backend, "close"):
            backend.close()
    base = {r["workload"]: r["questions_per_s"] for r in rows if r.get("engine") == engines[0] and "workload" in r}
    for r in rows:
        if "workload" in r and base.get(r["workload"]):
            r["ratio"] = r["questions_per_s"] / base[r["workload"]]
    return rows


def table(rows: list[dict]) -> str:
    lines = ["| engine | workload | questions/s | ratio | load s |", "|---|---|---|---|---|"]
    for r in rows:
        if r.get("status") == "skipped":
            lines.append(f"| {r['engine']} | skipped: {r['reason']} | - | - | - |")
        else:
            lines.append(f"| {r['engine']} | {r['workload']} | {r['questions_per_s']:.1f} | {r.get('ratio', 1):.2f}x "
                         f"| {r['load_s']:.0f} |")
    return "\n".join(lines)


def main(argv=None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default=None, help="a model folder both engines load (default: the tiny LLaVA)")
    parser.add_argument("--engines", nargs="+", default=list(ENGINES), choices=list(ENGINES))
    parser.add_argument("--questions", type=int, default=64)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--json", default=None, help="also write the rows here")
    args = parser.parse_args(argv)
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    with tempfile.TemporaryDirectory() as tmp:
        model = args.model
        if model is None:
            from helpers_vllm import build_llava_vllm
            model = str(build_llava_vllm(Path(tmp) / "llava"))
        rows = run(model, args.engines, args.questions, args.batch)
    print(table(rows))
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1, default=str))
    return rows


if __name__ == "__main__":
    main()
