"""`volta-ml suite`: one task of the multilingual suite (MaXM, XM3600 / XM100 captioning and retrieval, MTVQA,
xMMMU, M3Exam, Kaleidoscope), one language, one Hugging Face backend (docs/suite.md)."""
from __future__ import annotations

import argparse
import sys

from volta_ml.cli.flags import json_object


def _bool(text: str) -> bool:
    if text.lower() not in ("true", "false"):
        raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")
    return text.lower() == "true"


def add_flags(parser: argparse.ArgumentParser) -> None:
    from volta_ml.protocols.suite import SUITE

    parser.add_argument("--task", required=True, choices=sorted(SUITE))
    parser.add_argument("--lang", required=True, help="a language code of the benchmark (docs/suite.md)")
    parser.add_argument("--data", required=True,
                        help="the released file or folder, or a hub dataset id in the local Hugging Face cache "
                             "(nothing is downloaded)")
    parser.add_argument("--data_revision", default=None, help="the cached snapshot of a hub dataset id")
    parser.add_argument("--split", default=None, help="parquet releases: the split (MTVQA: test, xMMMU: the "
                                                      "language, Kaleidoscope: train)")
    parser.add_argument("--images", default=None,
                        help="image folder (MaXM / XM3600: XM3600's images; M3Exam: images-<language>/; "
                             "Kaleidoscope: final_data/ or data.zip); parquet releases carry their images")
    parser.add_argument("--subset", default=None, help="xm100: the file of XM3600 image keys to keep (one per line)")
    parser.add_argument("--backend", required=True, help="mllm (generative tasks) | clip | mclip (xm3600_retrieval) | "
                                                         "import (score --predictions with a generation rule)")
    parser.add_argument("--predictions", default=None, help="--backend import: JSON lines {\"id\": item id, "
                                                            "\"prediction\": generated text}, one per item")
    parser.add_argument("--model", required=True, help="hub id or local folder")
    parser.add_argument("--revision", default=None, help="pinned model commit (recorded)")
    parser.add_argument("--adapter", default=None, help="mllm: a LoRA adapter folder applied on top of --model")
    parser.add_argument("--rule", default=None, help="the task's scoring rule (default: the benchmark's own; "
                                                     "docs/suite.md lists every rule of every task)")
    parser.add_argument("--dtype", default="fp32", choices=["fp32", "bf16", "fp16"])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--device_map", default=None, help="'auto': accelerate spreads a large model")
    parser.add_argument("--extra", type=json_object, default=None, metavar="JSON", help="backend options "
                        "(ModelSpec.extra), e.g. '{\"max_images\": 2}' or '{\"letter_spellings\": \"all\"}'")
    parser.add_argument("--enable_thinking", type=_bool, default=None, metavar="true|false",
                        help="the chat template's thinking switch (= extra enable_thinking)")
    parser.add_argument("--text_base", default=None, help="mclip: the XLM-R config of its text tower")
    parser.add_argument("--allow_missing_keys", action="store_true",
                        help="score weights that miss (or add) tensors of the architecture (recorded)")
    parser.add_argument("--batch_size", type=int, default=8)
    parser.add_argument("--chunk_size", type=int, default=64, help="items per saved chunk (unit of resume/shard)")
    parser.add_argument("--max_new_tokens", type=int, default=None, help="generation rules: the answer length limit "
                                                                         "(default per task)")
    parser.add_argument("--name", default=None, help="row name in the tables (default: the model folder name)")
    parser.add_argument("--output_dir", required=True)
    parser.add_argument("--work_dir", default=None)
    parser.add_argument("--no_resume", action="store_true")
    parser.add_argument("--keep_chunks", action="store_true")
    parser.add_argument("--no_result_json", dest="record", action="store_false",
                        help="do not write result.json (a sweep cell's record step writes it)")
    parser.add_argument("--no_progress", dest="progress", action="store_false")
    parser.add_argument("--local-rank", "--local_rank", dest="local_rank", type=int, default=-1,
                        help=argparse.SUPPRESS)


def run_command(args) -> int:
    from volta_ml.data.annotations import AnnotationError
    from volta_ml.engine.distributed import finish_process
    from volta_ml.engine.failures import UsageError
    from volta_ml.hf import BackendInputError, ChoiceTokenError, ModelLoadError, UnknownBackendError
    from volta_ml.iglue_hf.images import MissingImagesError
    from volta_ml.iglue_hf.tasks import BackendTaskError

    from .run import run_suite

    options = {k: v for k, v in vars(args).items() if k not in ("func", "command")}
    # what a user's flags, files or model can cause: one line, exit 2; anything else is a bug (a traceback)
    user_errors = (UsageError, FileNotFoundError, MissingImagesError, AnnotationError, BackendTaskError,
                   BackendInputError, ChoiceTokenError, ModelLoadError, UnknownBackendError)
    try:
        run_suite(options)
    except user_errors as err:
        print(f"volta-ml suite: error: {' '.join(str(err).split())}", file=sys.stderr)
        return finish_process(2)
    return finish_process(0)


def register(subparsers) -> None:
    parser = subparsers.add_parser("suite", help="the multilingual suite (MaXM, XM3600, MTVQA, xMMMU, M3Exam, "
                                                 "Kaleidoscope) with Hugging Face models",
                                   description=__doc__.split("\n")[0])
    add_flags(parser)
    parser.set_defaults(func=run_command)
