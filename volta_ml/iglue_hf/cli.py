"""`volta-ml iglue-hf`: one IGLUE task, language and protocol with a Hugging Face backend (docs/hf_models.md)."""
from __future__ import annotations

import argparse
import sys

from volta_ml.hf.base import ExtraFlag, add_server_flags, backend_options
from volta_ml.options import int_at_least

from .images import DEFAULT_TEMPLATES
from .run import PROTOCOLS


def add_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--task", required=True, choices=sorted(DEFAULT_TEMPLATES))
    parser.add_argument("--backend", required=True,
                        help="backend kind, a key of volta_ml.hf.BACKENDS (clip, mclip, mllm, vllm, openai)")
    parser.add_argument("--model", required=True, help="hub id or local folder")
    parser.add_argument("--revision", default=None, help="pinned model commit (recorded)")
    parser.add_argument("--adapter", default=None,
                        help="mllm, vllm: a LoRA adapter folder applied on top of --model (volta-ml train's <run dir>/hf_best)")
    parser.add_argument("--dtype", default="fp32", choices=["fp32", "bf16", "fp16"])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--device_map", default=None, help="'auto': accelerate spreads a large model")
    parser.add_argument("--extra", type=backend_options, action=ExtraFlag, default=None, metavar="JSON",
                        help='backend options (ModelSpec.extra), e.g. \'{"max_images": 2}\' for a multi-image model '
                             'of a type trained on one image (LLaVA-Interleave) or \'{"image_model": "..."}\' '
                             'for M-CLIP')
    parser.add_argument("--text_base", default=None,
                        help="mclip: the XLM-R config its text tower is built from (default: modelBase of the "
                             "M-CLIP config), a hub id in the local HF cache or a local folder (= extra text_base)")
    parser.add_argument("--rule", default=None,
                        help="xvnli/marvl: letter (default) | likelihood | generate (greedy answer parsed to an option); "
                             "xgqa: generate (default) | closed")
    parser.add_argument("--lang", required=True)
    parser.add_argument("--protocol", default="zero-shot", choices=sorted(PROTOCOLS))
    parser.add_argument("--data_root", default=None, help="IGLUE's datasets/ folder (finds the test / _mt file)")
    parser.add_argument("--annotations", default=None, help="explicit annotation file (overrides --data_root), or "
                        "a hub copy with embedded images (floschne/xvnli, xgqa, marvl: its parquet folder or file)")
    parser.add_argument("--images", default=None, help="image root folder (not for a hub copy: its images are "
                                                       "embedded)")
    parser.add_argument("--image_template", default=None,
                        help="path of an image under --images with {id} {file} {concept} {lang} "
                             "(default per task: " + ", ".join(f"{k}: {v}" for k, v in DEFAULT_TEMPLATES.items()) + ")")
    parser.add_argument("--marvl_layout", default="auto", choices=["auto", "canvas", "multi"],
                        help="MaRVL: both images in the prompt (multi) or side by side in one canvas")
    parser.add_argument("--max_new_tokens", type=int_at_least(1), default=10, help="xgqa generate: answer length limit")
    add_run_flags(parser, "iglue_hf_results.json")


def add_run_flags(parser: argparse.ArgumentParser, results_file: str) -> None:
    """The flags of a run of HF tasks (`volta-ml iglue-hf`, `volta-ml suite`): batches, chunks, output, resume."""
    parser.add_argument("--batch_size", type=int_at_least(1), default=8)
    parser.add_argument("--chunk_size", type=int_at_least(1), default=64, help="items per saved chunk (unit of resume/shard)")
    parser.add_argument("--tensor_parallel_size", type=int_at_least(1), default=None,
                        help="vllm: GPUs one engine spans (= extra tensor_parallel_size; recorded)")
    parser.add_argument("--allow_adapter_base_mismatch", action="store_true",
                        help="mllm: apply an --adapter that records another base model than --model (refused "
                             f"otherwise); the mismatch is recorded in {results_file} (loading_report)")
    parser.add_argument("--allow_missing_keys", action="store_true",
                        help="score weights that miss (or add) tensors of the architecture instead of refusing "
                             f"them; the keys are recorded in {results_file}")
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
    add_server_flags(parser)


def run_one_line(run, args, prog: str) -> int:
    """`run(options)`; what a user's flags, files or model can cause ends in one line, exit 2; anything else is a
    bug (a traceback)."""
    from volta_ml.data.annotations import AnnotationError
    from volta_ml.engine.distributed import finish_process
    from volta_ml.engine.failures import UsageError
    from volta_ml.hf import BackendInputError, ChoiceTokenError, EngineError, ModelLoadError, UnknownBackendError

    from .images import MissingImagesError
    from .tasks import BackendTaskError

    options = {k: v for k, v in vars(args).items() if k not in ("func", "command")}
    user_errors = (UsageError, FileNotFoundError, MissingImagesError, AnnotationError, BackendTaskError,
                   BackendInputError, ChoiceTokenError, EngineError, ModelLoadError, UnknownBackendError)
    try:
        run(options)
    except user_errors as err:
        print(f"{prog}: error: {' '.join(str(err).split())}", file=sys.stderr)
        return finish_process(2)
    return finish_process(0)


def run_command(args) -> int:
    from . import run

    return run_one_line(lambda options: run.run_iglue_hf(options), args, "volta-ml iglue-hf")


def register(subparsers) -> None:
    parser = subparsers.add_parser("iglue-hf", help="IGLUE tasks with Hugging Face models (CLIP, M-CLIP, MLLMs)",
                                   description=__doc__.split("\n")[0])
    add_flags(parser)
    parser.set_defaults(func=run_command)
