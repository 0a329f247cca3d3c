#!/usr/bin/env python3
"""The suite grid (examples/grids/suite.yml) end to end on tiny random models, on this machine's CPU, with nothing
downloaded: the report of docs/suite.md ("A sweep on tiny models") is what it produces.

Writes into SCRATCH (a folder outside the repository; generated data is never committed):
  data/     tiny releases of every suite benchmark in its released schema (tests/helpers_suite.py's writers:
            MaXM's maxm_v1_<lang>.json, XM3600's captions.jsonl with <key>.jpg images, MTVQA's and xMMMU's
            parquet, M3Exam's multimodal-questions/, Kaleidoscope's parquet with its data.zip, MMMB's
            mmmb/mmmb_<lang>.tsv), and two hub copies (tests/helpers_suite_copies.py): PangeaBench's
            neulab/PangeaBench-xm100, which xm100 reads, and floschne/xm3600 (images embedded), which
            xm3600_retrieval reads; each gives the same items as the original release (tests/test_suite_copies.py)
  models/   tiny random models (tests/helpers_hf.py, tests/helpers_vlm_families.py): LLaVA and Qwen2-VL
            (generative), CLIP (a dual encoder, for xm3600_retrieval)
  suite_tiny.yml  a grid of the same shape as examples/grids/suite.yml pointing at them, over the languages the
            tiny releases have, with `baseline: llava`
then prints the commands that run it (COMMANDS below, in SCRATCH). Random models give meaningless scores: this
shows the flow and the report's layout, not any model's quality.

    python examples/suite_tiny.py /tmp/suite_tiny     # then, in /tmp/suite_tiny, the commands it prints

Needs a checkout of the repository (the writers and builders live in tests/) and `pip install "volta-ml[suite]"`;
the default `cider` rule of xm3600 / xm100 runs Java (`--rule cider-pyptb`: `--no_java` here does without).
"""
from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "tests")]

COMMANDS = """\
volta-ml sweep suite_tiny.yml --local
volta-ml report --grid suite_tiny.yml --no_plots
volta-ml compare runs/suite/qwen2-vl/xmmmu/letter runs/suite/llava/xmmmu/letter"""

# the languages each tiny release has (the grid's `languages:`; its default, every language of the benchmark,
# would ask for files these releases do not have)
LANGUAGES = {"maxm": ["en", "zh"], "xm3600": ["en", "de", "ja", "th", "zh"], "xm100": ["en", "de", "ja", "th", "zh"],
             "xm3600_retrieval": ["en", "de", "ja", "th", "zh"], "mtvqa": ["de", "ja"], "xmmmu": ["en", "ja"],
             "m3exam": ["th"], "kaleidoscope": ["en", "uk"], "kaleidoscope_multimodal": ["en", "uk"],
             "mmmb": ["en", "zh"]}


def build(scratch: Path, java: bool = True) -> Path:
    """Write the tiny releases and models into scratch, and the grid pointing at them."""
    from helpers_hf import build as build_hf
    from helpers_suite import build_suite
    from helpers_vlm_families import build_family

    scratch = scratch.resolve()
    if scratch == REPO or REPO in scratch.parents:
        raise SystemExit(f"suite_tiny.py: error: {scratch} is inside the repository; give a scratch folder outside it")
    data, models = scratch / "data", scratch / "models"
    if data.exists():
        shutil.rmtree(data)
    paths = {"llava": build_hf("llava", models), "qwen2-vl": build_family("qwen2-vl", models),
             "clip": build_hf("clip", models)}
    files = build_suite(data)
    return write_grid(scratch, dict(files, copies=build_copies(data, files)), paths, java)


def build_copies(data: Path, files: dict) -> dict:
    """The hub copies the grid reads, written from the same items as the releases `files` (build_suite's)."""
    from helpers_suite_copies import write_xm100_copy, write_xm3600_copy

    images, langs = files["xm3600"]["images"], tuple(LANGUAGES["xm100"])
    return {"xm100": write_xm100_copy(data, images, langs=langs),
            "xm3600_retrieval": write_xm3600_copy(data, images, langs=tuple(LANGUAGES["xm3600_retrieval"]))}


def write_grid(scratch: Path, files: dict, paths: dict, java: bool = True) -> Path:
    """scratch/suite_tiny.yml over the releases `files` (helpers_suite.build_suite's, with `copies`: the hub
    copies of build_copies, read instead of the release for their tasks) and the models `paths`."""
    import yaml

    def generative(name: str) -> dict:
        """Both exam rules (the letter rule; generation, with its format-error rate); without Java, cider-pyptb."""
        rules = {**{task: ["generate", "letter"] for task in ("xmmmu", "m3exam", "kaleidoscope")},
                 "mmmb": ["vlmevalkit", "letter"]}
        return {"backend": "mllm", "model": str(paths[name]),
                "rules": rules if java else {**rules, "xm3600": ["cider-pyptb"], "xm100": ["cider-pyptb"]}}

    xm, copies = files["xm3600"], files["copies"]
    grid = {
        "name": "suite",
        "output_dir": str(scratch / "runs"),
        "baseline": "llava",
        "suite": {
            "tasks": list(LANGUAGES),
            "data": {"maxm": str(files["maxm"]), "xm3600": str(xm["captions"]), "xm100": str(copies["xm100"]),
                     "xm3600_retrieval": str(copies["xm3600_retrieval"]), "mtvqa": str(files["mtvqa"]),
                     "xmmmu": str(files["xmmmu"]), "m3exam": str(files["m3exam"]),
                     "kaleidoscope": str(files["kaleidoscope"]), "kaleidoscope_multimodal": str(files["kaleidoscope"]),
                     "mmmb": str(files["mmmb"])},
            "images": {t: str(xm["images"]) for t in ("maxm", "xm3600")},     # the copies embed theirs
            "languages": LANGUAGES,
            "flags": ["--batch_size", "4"],
            "models": {"llava": generative("llava"), "qwen2-vl": generative("qwen2-vl"),
                       "clip": {"backend": "clip", "model": str(paths["clip"])}},
        },
    }
    path = scratch / "suite_tiny.yml"
    text = yaml.safe_dump(grid, sort_keys=False, allow_unicode=True, default_flow_style=None)
    path.write_text(text, encoding="utf-8")
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("scratch", type=Path, help="a folder outside the repository (created)")
    parser.add_argument("--no_java", action="store_true", help="caption cells with --rule cider-pyptb (no Java)")
    args = parser.parse_args(argv)
    build(args.scratch, java=not args.no_java)
    print(f"cd {args.scratch.resolve()}\n{COMMANDS}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
