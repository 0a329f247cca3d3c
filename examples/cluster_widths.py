#!/usr/bin/env python3
"""The interval widths with and without clustering in docs/protocols.md ("Questions that share an image"): a random
tiny LLaVA (tests/helpers_hf.py) scored by `iglue-hf`'s letter rule on XVNLI's real Arabic and French test files
(1,164 hypotheses each on 357 Flickr30K photos; generated images stand in for the photos), then each language's
95% interval resampling hypotheses one by one and resampling photos. CPU, a few minutes.

    VOLTA_ML_SHARED=/path/to/shared python examples/cluster_widths.py DIR
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "tests")]

from helpers_hf import build, spec_extra  # noqa: E402
from helpers_iglue_hf import make_images  # noqa: E402

from volta_ml import stats  # noqa: E402
from volta_ml.hf import ModelSpec, load_backend  # noqa: E402
from volta_ml.iglue_hf.run import annotation_path, run_iglue_hf  # noqa: E402


def main(out: Path) -> None:
    root = Path(os.environ.get("VOLTA_ML_SHARED", REPO.parent / "shared")) / "iglue" / "datasets"
    path = build("llava", out / "models")
    backend = load_backend("mllm", ModelSpec(str(path), extra=spec_extra("llava", path)))
    print("| language | items | photos | per item | per photo (cluster) |")
    print("|---|---:|---:|---:|---:|")
    for lang in ("ar", "fr"):
        annotations = Path(annotation_path("xvnli", lang, "zero-shot", str(root), None))
        make_images("xvnli", annotations, lang, out / "images")
        run = out / "runs" / f"xvnli_{lang}"
        run_iglue_hf({"task": "xvnli", "backend": "mllm", "model": str(path), "lang": lang, "protocol": "zero-shot",
                      "images": str(out / "images"), "output_dir": str(run), "data_root": str(root),
                      "progress": False, "batch_size": 16, "chunk_size": 2000, "rule": "letter"}, backend=backend)
        items = stats.read_items(run / f"test_{lang}_items.jsonl")
        values = [v["score"] for v in items.values()]
        clusters = [v["cluster"] for v in items.values()]
        plain, clustered = stats.interval(values), stats.interval(values, clusters=clusters)
        print(f"| {lang} | {plain.n} | {clustered.clusters} | {plain.text()} | {clustered.text()} |")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
