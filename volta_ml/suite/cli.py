"""`volta-ml suite`: one task of the multilingual suite (MaXM, XM3600 / XM100 captioning and retrieval, MTVQA,
xMMMU, M3Exam, Kaleidoscope, MMMB, any VLMEvalKit multiple-choice TSV), one language, one Hugging Face backend
(docs/suite.md)."""
from __future__ import annotations

import argparse

from volta_ml.hf.base import ExtraFlag, backend_options
from volta_ml.options import int_at_least
from volta_ml.iglue_hf.cli import add_run_flags, run_one_line


def _bool(text: str) -> bool:
    if text.lower() not in ("true", "false"):
        raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")
    return text.lower() == "true"


def add_flags(parser: argparse.ArgumentParser) -> None:
    from volta_ml.protocols.suite import SUITE

    parser.add_argument("--task", required=True, choices=sorted(SUITE))
    parser.add_argument("--lang", required=True, help="a language code of the benchmark (docs/suite.md; "
                                                      "vlmevalkit_mcq: any code, the label of the --data TSV)")
    parser.add_argument("--data", required=True,
                        help="the released file or folder, a parquet copy of it (PangeaBench's maxm / xm100 / m3exam, "
                             "floschne/xm3600), or a hub dataset id in the local Hugging Face cache (nothing is "
                             "downloaded); vlmevalkit_mcq: the TSV, or a folder of <name>_<lang>.tsv")
    parser.add_argument("--data_revision", default=None, help="the cached snapshot of a hub dataset id")
    parser.add_argument("--split", default=None, help="parquet releases: the split, from the dataset card's configs "
                                                      "where it has them (MTVQA: test, xMMMU and the copies: the "
                                                      "language, Kaleidoscope: train, MaXM's copy: <lang>_yesno too)")
    parser.add_argument("--images", default=None,
                        help="image folder (MaXM / XM3600: XM3600's images; M3Exam: images-<language>/; "
                             "Kaleidoscope: final_data/ or data.zip); parquet releases carry their images")
    parser.add_argument("--subset", default=None, help="xm100: the file of XM3600 image keys to keep (one per line)")
    parser.add_argument("--backend", required=True, help="mllm | vllm (generative tasks) | clip | mclip (xm3600_retrieval) | "
                                                         "openai (a server: --base_url) | import (score --predictions with a "
                                                         "generation rule)")
    parser.add_argument("--predictions", default=None, help="--backend import: JSON lines {\"id\": item id, "
                                                            "\"prediction\": generated text}, one per item")
    parser.add_argument("--model", required=True, help="hub id or local folder")
    parser.add_argument("--revision", default=None, help="pinned model commit (recorded)")
    parser.add_argument("--adapter", default=None, help="mllm, vllm: a LoRA adapter folder applied on top of --model")
    parser.add_argument("--rule", default=None, help="the task's scoring rule (default: the benchmark's own; "
                                                     "docs/suite.md lists every rule of every task)")
    parser.add_argument("--dtype", default="fp32", choices=["fp32", "bf16", "fp16"])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--device_map", default=None, help="'auto': accelerate spreads a large model")
    parser.add_argument("--extra", type=backend_options, action=ExtraFlag, default=None, metavar="JSON", help="backend options "
                        "(ModelSpec.extra), e.g. '{\"max_images\": 2}' or '{\"letter_spellings\": \"all\"}'")
    parser.add_argument("--enable_thinking", type=_bool, default=None, metavar="true|false",
                        help="the chat template's thinking switch (= extra enable_thinking)")
    parser.add_argument("--text_base", default=None, help="mclip: the XLM-R config of its text tower")
    parser.add_argument("--max_new_tokens", type=int_at_least(1), default=None, help="generation rules: the answer length limit "
                                                                         "(default per task)")
    add_run_flags(parser, "suite_results.json")


def run_command(args) -> int:
    from . import run

    return run_one_line(lambda options: run.run_suite(options), args, "volta-ml suite")


def register(subparsers) -> None:
    parser = subparsers.add_parser("suite", help="the multilingual suite (MaXM, XM3600, MTVQA, xMMMU, M3Exam, "
                                                 "Kaleidoscope, MMMB, VLMEvalKit TSVs) with Hugging Face models",
                                   description=__doc__.split("\n")[0])
    add_flags(parser)
    parser.set_defaults(func=run_command)
