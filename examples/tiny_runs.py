#!/usr/bin/env python3
"""The inputs of the report / compare samples in docs/protocols.md and docs/cvqa.md: tiny random models and
small data, so that the documented commands run on a CPU in a few minutes and anyone can regenerate the samples.

    VOLTA_ML_SHARED=/path/to/shared python examples/tiny_runs.py DIR     # then, in DIR, the commands it prints
                                                                         # (IGLUE_COMMANDS, CVQA_COMMANDS below)

Without IGLUE's files (under $VOLTA_ML_SHARED, else shared/ beside the checkout) it writes the CVQA inputs only.

It writes into DIR (nothing in the repository):
  data/            IGLUE's datasets/ layout: XVNLI's real English, Arabic and French test files and the Arabic
                   1- and 5-shot files (links into <shared>/iglue/datasets), the English 10-shot file standing in
                   for the few-shot dev set (IGLUE's dev.jsonl is not public), and a feature store with random
                   16-d regions for their Flickr30K images
  models/          tiny_a, tiny_b: ctrl_uniter_base shrunk to 2 layers of width 32, random weights (seeds 0 and 1)
                   saved as English XVNLI checkpoints; bert-base-uncased's vocabulary
  tiny.yml         the grid: zero-shot on en/ar/fr, 1- and 5-shot Arabic (learning rate 5e-3, 3 epochs) with seeds 0
                   and 1, `baseline: tiny_b`, output in DIR/runs
  cvqa_data        the tests' 7-question CVQA-shaped release (tests/helpers_cvqa.py)
  tiny-clip, tiny-llava   a random 2-layer CLIP and a random tiny LLaVA (tests/helpers_hf.py)

The builders are the tests' (tests/helpers_*.py), so the samples use the same tiny models as the test suite.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "tests")]

from helpers_cvqa import write_release  # noqa: E402
from helpers_eval import FEATURE_DIM, build_checkpoint, link, tiny_config_file  # noqa: E402
from helpers_hf import build_clip, build_llava  # noqa: E402
from helpers_tasks import IGLUE, bert_uncased_dir, make_store, read_jsonl  # noqa: E402

IGLUE_COMMANDS = """\
volta-ml sweep tiny.yml --local
volta-ml report --grid tiny.yml --no_plots
volta-ml compare runs/zero_shot/tiny_a runs/zero_shot/tiny_b"""
CVQA_COMMANDS = """\
flags="--data cvqa_data --conditions en-aware loc-aware --device cpu --no-progress"
volta-ml cvqa score --backend clip --model tiny-clip --output_dir cvqa_runs/clip $flags
volta-ml cvqa score --backend mllm --model tiny-llava --rule letter --output_dir cvqa_runs/llava-letter $flags
volta-ml cvqa score --backend mllm --model tiny-llava --rule generate --output_dir cvqa_runs/llava-generate $flags
volta-ml cvqa score --backend mllm --model tiny-llava --rule open --output_dir cvqa_runs/llava-open $flags
volta-ml cvqa report cvqa_runs --out cvqa_report --no-plots --baseline tiny-clip
volta-ml compare cvqa_runs/llava-letter cvqa_runs/clip"""
LANGS = ("ar", "fr")
XVNLI_FILES = ["XVNLI/annotations/en/test.jsonl", "XVNLI/annotations/ar/test.jsonl",
               "XVNLI/annotations/fr/test.jsonl", "XVNLI/annotations/ar/train_1.jsonl",
               "XVNLI/annotations/ar/train_5.jsonl"]
DEV = "XVNLI/annotations/en/train_10.jsonl"      # stands in for IGLUE's (unpublished) en/dev.jsonl


def iglue_inputs(out: Path) -> None:
    """data/ (annotations linked, random features), the two tiny models and the grid tiny.yml."""
    data = out / "data"
    for name in (*XVNLI_FILES, DEV):
        link(IGLUE / name, data / name)
    ids = sorted({int(r["Flikr30kID"]) for name in (*XVNLI_FILES, DEV) for r in read_jsonl(IGLUE / name)})
    make_store(data / "flickr30k/features/flickr30k_boxes36.lmdb", ids, FEATURE_DIM)

    from volta_ml.tasks.config import load_task_config
    tasks = load_task_config(str(REPO / "config_tasks/iglue_test_tasks_boxes36.yml"))
    config = tiny_config_file(out / "models/ctrl_uniter_tiny.json")
    bert = bert_uncased_dir(out / "models")
    models = {}
    for seed, name in enumerate(("tiny_a", "tiny_b")):
        ckpt = build_checkpoint(config, tasks, "TASK19", out / f"models/{name}/pytorch_model_best.bin", seed=seed)
        models[name] = {"config": str(config), "bert_model": str(bert), "do_lower_case": True,
                        "finetuned": {"xvnli": str(ckpt)}}
    flags = ["--num_val_workers", "0", "--no_cache", "--device", "cpu"]
    grid = {"name": "tiny", "data_root": "data", "output_dir": "runs", "tasks": ["xvnli"],
            "protocols": ["zero_shot", "few_shot"], "languages": {"xvnli": list(LANGS)},
            "few_shot_languages": {"xvnli": ["ar"]}, "shots": {"xvnli": ["1", "5"]},
            "learning_rates": ["5e-3"], "num_epoch": 3, "seeds": [0, 1],
            "paths": {"xvnli": {"few_shot_val_file": DEV}},
            "baseline": "tiny_b", "models": models,
            "extra_flags": {"eval": flags, "train": list(flags)}, "env": {"OMP_NUM_THREADS": "2"}}
    (out / "tiny.yml").write_text(yaml.safe_dump(grid, sort_keys=False))


def cvqa_inputs(out: Path) -> None:
    """cvqa_data (the data folder of the release, written in the HF cache layout under cvqa/) and the two tiny
    Hugging Face models."""
    release = write_release(out / "cvqa")
    link(release, out / "cvqa_data")
    build_clip(out / "tiny-clip")
    build_llava(out / "tiny-llava")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("dir", type=Path, help="a new scratch folder (outside the repository)")
    out = parser.parse_args().dir.resolve()
    if out == REPO or REPO in out.parents:
        sys.exit(f"tiny_runs.py: {out} is inside the repository; give a scratch folder outside it")
    if out.exists() and any(out.iterdir()):
        sys.exit(f"tiny_runs.py: {out} is not empty; give a new folder")
    out.mkdir(parents=True, exist_ok=True)
    commands = [CVQA_COMMANDS]
    if (IGLUE / XVNLI_FILES[0]).is_file():
        iglue_inputs(out)
        commands.insert(0, IGLUE_COMMANDS)
    else:
        print(f"tiny_runs.py: IGLUE's XVNLI files not found under {IGLUE} (set VOLTA_ML_SHARED to the shared "
              f"folder); CVQA inputs only", file=sys.stderr)
    cvqa_inputs(out)
    print(f"cd {out}\n" + "\n\n".join(commands))


if __name__ == "__main__":
    main()
