"""`volta-ml cvqa extract` (region features from the parquet images) and `volta-ml cvqa score` (zero-shot run)."""
from __future__ import annotations

import json
import os
import sys

from volta_ml.options import int_at_least
from volta_ml.engine.failures import UsageError
from volta_ml.features.detectors.presets import PRESETS
from volta_ml.hf.base import LETTER_SPELLINGS, add_server_flags

from volta_ml.protocols.cli import add_stat_flags

from .backends import BACKENDS, RULES
from .prompts import CONDITIONS, LETTER_LAYOUTS, TEMPLATES


DATA_HELP = ("folder of CVQA parquet shards (a local copy of afaji/cvqa), or the hub id afaji/cvqa read from the "
             "local Hugging Face cache (HF_HUB_CACHE; nothing is downloaded)")


def register(subparsers) -> None:
    cvqa = subparsers.add_parser("cvqa", help="CVQA: culturally diverse multilingual multiple-choice VQA",
                                 description="Zero-shot CVQA with the VOLTA zoo's matching heads, CLIP-family "
                                 "dual encoders, M-CLIP, generative models or imported predictions. See docs/cvqa.md.")
    sub = cvqa.add_subparsers(dest="cvqa_command", metavar="STEP")

    ex = sub.add_parser("extract", help="region features for the CVQA images, read from the parquet shards")
    ex.add_argument("--data", required=True, help=DATA_HELP)
    ex.add_argument("--revision", default=None, help="HF commit of the data (recorded in the store; with a hub id: "
                    "the cached snapshot to read, default the cached main)")
    ex.add_argument("--preset", required=True, choices=sorted(PRESETS), help="detector preset")
    ex.add_argument("--weights", required=True, help="detector weights (.pkl / .pth / converted .safetensors)")
    ex.add_argument("--out", required=True, help="native feature store to create or resume")
    ex.add_argument("--device", default="auto")
    ex.add_argument("--max-pixels", type=int_at_least(1), default=None, help="refuse larger images (decompression bombs)")
    ex.add_argument("--max-side", type=int_at_least(1), default=None, help="shrink photos whose longer side is larger first")
    ex.add_argument("--failures", default=None, help="failure manifest (default <out>.failures.jsonl)")
    ex.add_argument("--limit", type=int_at_least(1), default=None, help="only the first N questions' images")
    ex.add_argument("--no-progress", action="store_true")
    ex.set_defaults(func=run_extract_command)

    sc = sub.add_parser("score", help="score a model on CVQA and write results, tables, plot, submissions",
                        description="Backends: " + "; ".join(f"{k}: {v}" for k, v in BACKENDS.items()))
    sc.add_argument("--backend", choices=list(BACKENDS), default="zoo", help="how the options are scored")
    sc.add_argument("--data", required=True, help=DATA_HELP)
    sc.add_argument("--revision", default=None, help="HF commit of the data (recorded in every result file; with "
                    "a hub id: the cached snapshot to read; the model's commit is --model-revision)")
    zoo = sc.add_argument_group("zoo backend (region features + a VOLTA checkpoint's matching head)")
    zoo.add_argument("--features", help="feature store from `volta-ml cvqa extract`")
    zoo.add_argument("--config", "--config_file", dest="config", help="model config name or JSON")
    zoo.add_argument("--checkpoint", "--from_pretrained", dest="checkpoint")
    zoo.add_argument("--bert_model", "--bert-model", dest="bert_model", help="local tokenizer folder")
    zoo.add_argument("--do_lower_case", action="store_true")
    zoo.add_argument("--kind", choices=("pretraining", "tasks"), default="pretraining",
                     help="pretraining: the ITM head; tasks: a fine-tuned VL-logit head (--task_id)")
    zoo.add_argument("--task_id", default=None, help="the VL-logit head of a tasks checkpoint, e.g. TASK8")
    hf = sc.add_argument_group("clip / mclip / mllm / vllm backends (Hugging Face models) and import")
    hf.add_argument("--model", help="local folder or hub id, e.g. llava-hf/llava-1.5-7b-hf")
    hf.add_argument("--model-revision", dest="model_revision", default=None,
                    help="pinned commit of --model (recorded in every result file)")
    hf.add_argument("--image-model", dest="image_model", default=None,
                    help="mclip: the CLIP image tower (default openai/clip-vit-base-patch32)")
    hf.add_argument("--text-base", dest="text_base", default=None,
                    help="mclip: the XLM-R config its text tower is built from (default: modelBase of the M-CLIP "
                    "config); a hub id in the local HF cache or a local folder")
    hf.add_argument("--adapter", default=None,
                    help="mllm, vllm: a LoRA adapter folder applied on top of --model (volta-ml train's <run dir>/hf_best)")
    hf.add_argument("--dtype", choices=("bf16", "fp16", "fp32"), default="fp32")
    hf.add_argument("--device-map", dest="device_map", choices=("auto",), default=None,
                    help="accelerate spreads a model larger than one GPU (then --device is ignored)")
    hf.add_argument("--allow-adapter-base-mismatch", "--allow_adapter_base_mismatch",
                    dest="allow_adapter_base_mismatch", action="store_true",
                    help="mllm: apply an --adapter that records another base model than --model (refused "
                    "otherwise); the mismatch is recorded in cvqa_results.json (loading_report)")
    hf.add_argument("--allow-missing-keys", "--allow_missing_keys", dest="allow_missing_keys", action="store_true",
                    help="score weights that miss (or add) tensors of the architecture instead of refusing them; "
                    "the keys are recorded in cvqa_results.json (loading_report)")
    hf.add_argument("--rule", choices=RULES, default="letter", help="mllm: letter = argmax of the next-token "
                    "logits of A-D with lettered options; open = log-probability of each option's full text; "
                    "generate = the greedy answer parsed to a letter or an option (parse-failure rate reported)")
    hf.add_argument("--letter_spellings", "--letter-spellings", dest="letter_spellings", choices=LETTER_SPELLINGS,
                    default="natural", help="mllm letter rule: natural = the letter token the model writes as its "
                    "answer (the paper's rule); all = logsumexp over the letter's single-token spellings")
    hf.add_argument("--enable_thinking", "--enable-thinking", dest="enable_thinking", choices=("true", "false"),
                    default=None, help="mllm: the chat template's thinking switch (Qwen3.5, Gemma 4, GLM-4.6V); "
                    "default: the template's own (recorded in cvqa_results.json as template_options)")
    hf.add_argument("--letter_layout", "--letter-layout", dest="letter_layout", choices=sorted(LETTER_LAYOUTS),
                    default="paper", help="mllm letter/generate: paper = the options on one line (the paper's "
                    "prompt); lines = one option per line (a named variant, recorded in the results)")
    hf.add_argument("--tensor_parallel_size", "--tensor-parallel-size", dest="tensor_parallel_size",
                    type=int_at_least(1), default=None, help="vllm: GPUs one engine spans (recorded)")
    hf.add_argument("--chunk-size", dest="chunk_size", type=int_at_least(1), default=256,
                    help="questions per resumable chunk (a rerun into --output_dir continues)")
    hf.add_argument("--predictions", nargs="+", default=None, metavar="[CONDITION=]CSV",
                    help="import: ID,Prediction CSV(s) made elsewhere, one per condition")
    add_server_flags(sc)
    sc.set_defaults(extra=None)
    sc.add_argument("--conditions", nargs="+", choices=CONDITIONS, default=list(CONDITIONS))
    sc.add_argument("--template", choices=sorted(TEMPLATES), default=None,
                    help="texts of the matching scorers (default: paper for zoo, plain for clip/mclip)")
    sc.add_argument("--max_seq_length", type=int_at_least(3), default=40)
    sc.add_argument("--max_region_num", type=int_at_least(1), default=36)
    sc.add_argument("--batch_size", "--batch-size", dest="batch_size", type=int_at_least(1), default=None,
                    help="zoo: (image, text) rows per forward (default 64); others: questions per forward (8)")
    sc.add_argument("--device", default="auto")
    sc.add_argument("--amp", action="store_true", help="autocast on CUDA")
    sc.add_argument("--no-text-only", dest="text_only", action="store_false", help="skip the blind baseline")
    sc.add_argument("--limit", type=int_at_least(1), default=None, help="only the first N questions")
    sc.add_argument("--output_dir", required=True)
    sc.add_argument("--preset", default=None, choices=sorted(PRESETS), help="with --detector_weights: extract missing images into "
                    "--features first (one command for the whole run)")
    sc.add_argument("--detector_weights", default=None, help="detector weights for --preset")
    sc.add_argument("--max-side", dest="max_side", type=int_at_least(1), default=None)
    sc.add_argument("--max-pixels", dest="max_pixels", type=int_at_least(1), default=None)
    sc.add_argument("--no-progress", dest="progress", action="store_false")
    sc.set_defaults(func=run_score_command)

    rp = sub.add_parser("report", help="the paper's tables (3, 5, 6, 7, Figure 3, question types) over several runs",
                        description="Tabulate CVQA result folders (cvqa_results.json + predictions_<condition>.csv, "
                        "searched below each DIR) beside the paper's numbers: CSV, Markdown, LaTeX and PNG.")
    rp.add_argument("dirs", nargs="+", metavar="DIR", help="result folders, or folders above them (a sweep's output)")
    rp.add_argument("--out", required=True, help="folder for the tables and figures")
    rp.add_argument("--digits", type=int_at_least(0), default=2, help="decimals in Markdown and LaTeX (CSV keeps 4)")
    rp.add_argument("--paper-row", dest="paper_rows", action="append", default=[], metavar="MODEL=ROW",
                    help="compare the runs of MODEL (as in cvqa_results.json) with the paper's ROW, e.g. "
                    "/models/my-llava=LLaVA-1.5-7B (hub ids of the paper's checkpoints match by themselves)")
    rp.add_argument("--no-plots", dest="plots", action="store_false")
    rp.add_argument("--baseline", default=None, metavar="LABEL",
                    help="compare every other run with this one (its label in the tables, e.g. 'LLaVA-1.5-7B (letter)'): "
                    "baseline_comparison.csv/md/tex")
    add_stat_flags(rp)
    rp.set_defaults(func=run_report_command)
    cvqa.set_defaults(func=lambda args: cvqa.print_help() or 2)


def _user_errors() -> tuple[type[BaseException], ...]:
    """What a bad input raises on the CVQA paths: the house's input errors (`engine.failures.user_errors`:
    missing files, `UsageError` for flags, tokenizers, devices, configs, checkpoints, feature stores) and
    CVQA's and the HF backends' own. A plain KeyError or ValueError is a bug and keeps its traceback."""
    from volta_ml.engine.chunks import ResumeMismatch
    from volta_ml.engine.failures import user_errors
    from volta_ml.hf import BackendInputError, ChoiceTokenError, EngineError, ModelLoadError

    from .collect import ReportInputError
    from .data import CVQAFormatError
    from .zoo import MatchingHeadError

    return user_errors() + (CVQAFormatError, MatchingHeadError, ReportInputError, ResumeMismatch, ModelLoadError,
                            ChoiceTokenError, BackendInputError, EngineError)


def _clear_errors(command):
    """Known bad inputs end the command with one line, `volta-ml cvqa: error: <cause>` naming the file, flag or
    key, and exit code 2; anything else goes on to `engine.failures.fail` (traceback, exit code 1)."""
    def wrapped(args) -> int:
        from volta_ml.engine.failures import EXIT_USAGE, report

        try:
            return command(args)
        except _user_errors() as err:
            report("volta-ml cvqa", " ".join(line.strip() for line in str(err).splitlines() if line.strip()))
            return EXIT_USAGE
    wrapped.__name__ = command.__name__
    return wrapped


@_clear_errors
def run_extract_command(args) -> int:
    from volta_ml.devices import pick_device
    from volta_ml.features.images import DEFAULT_MAX_PIXELS

    from .data import load_cvqa
    from .features import extract_cvqa_features
    from .run import load_detector

    device = pick_device(args.device)
    if not os.path.isfile(args.weights):
        raise FileNotFoundError(f"--weights {args.weights}: no such file (nothing is downloaded)")
    dataset = load_cvqa(args.data, revision=args.revision, limit=args.limit)
    detector, preset = load_detector(args.preset, args.weights, device)
    summary = extract_cvqa_features(dataset, detector, preset, args.out, device=device,
                                    max_pixels=args.max_pixels or DEFAULT_MAX_PIXELS, max_side=args.max_side,
                                    failures_path=args.failures, progress=not args.no_progress)
    print(f"{args.out}: {summary.extracted} extracted, {summary.already_present} already present, "
          f"{summary.failed} failed of {summary.total} images ({summary.seconds:.1f} s)", file=sys.stderr)
    return 0


ZOO_REQUIRED = ("features", "config", "checkpoint", "bert_model")


def _run_zoo(args) -> str:
    from .run import run_cvqa

    missing = [f"--{k}" for k in ZOO_REQUIRED if not getattr(args, k)]
    if missing:
        raise UsageError(f"--backend zoo needs {', '.join(missing)}")
    keys = ("data", "features", "config", "checkpoint", "bert_model", "do_lower_case", "kind", "task_id",
            "revision", "conditions", "max_seq_length", "max_region_num", "device", "amp", "text_only", "limit",
            "output_dir", "progress", "preset", "detector_weights", "max_side", "max_pixels")
    return run_cvqa({**{k: getattr(args, k) for k in keys}, "template": args.template or "paper",
                     "batch_size": args.batch_size or 64})


def _run_backend(args) -> str | None:
    from .backend_run import run_backend

    keys = ("data", "backend", "revision", "conditions", "template", "rule", "model", "model_revision",
            "image_model", "text_base", "dtype", "device", "device_map", "chunk_size", "text_only", "limit",
            "output_dir", "progress", "predictions", "max_side", "max_pixels", "allow_missing_keys", "letter_layout",
            "letter_spellings", "adapter", "allow_adapter_base_mismatch", "tensor_parallel_size", "extra")
    thinking = None if args.enable_thinking is None else args.enable_thinking == "true"
    return run_backend({**{k: getattr(args, k) for k in keys}, "batch_size": args.batch_size or 8,
                        "enable_thinking": thinking})


RUNNERS = {"zoo": _run_zoo}   # every other backend: backend_run.run_backend


@_clear_errors
def run_score_command(args) -> int:
    from volta_ml.engine.distributed import finish_process

    path = RUNNERS.get(args.backend, _run_backend)(args)
    if path is None:   # a rank other than 0 of a sharded run
        return finish_process(0)
    results = json.loads(open(path, encoding="utf-8").read())
    print(f"CVQA revision {results['revision']}, {results['questions']} questions"
          f"{' (labels hidden: submission mode)' if results['hidden_labels'] else ''}"
          + (f"; {results['backend']} {results['model']}" if "backend" in results else ""))
    for condition, summary in results["runs"].items():
        blind = results["text_only"].get(condition)
        if results["hidden_labels"]:
            print(f"  {condition:13s} submission_{condition}.csv")
        else:
            variants = "".join(f"  | {name} {v[condition]['micro']:6.2f}"
                               for name, v in results.get("variants", {}).items())
            print(f"  {condition:13s} micro {summary['micro']:6.2f}  macro {summary['macro']:6.2f}" + variants
                  + (f"  | text-only {blind['micro']:6.2f}" if blind else "") + "  | random 25.00")
    print(f"results: {path}")
    return finish_process(0)


@_clear_errors
def run_report_command(args) -> int:
    from volta_ml.protocols.cli import stat_options

    from .collect import data_revisions, load_runs
    from .paper import MODELS
    from .paper_report import write_paper_report

    aliases = {}
    for item in args.paper_rows:
        model, sep, row = item.rpartition("=")
        if not sep or row not in MODELS:
            raise UsageError(f"--paper-row {item!r}: expected MODEL=ROW with ROW one of {', '.join(MODELS)}")
        aliases[model] = row
    runs = load_runs(args.dirs, aliases)
    files = write_paper_report(runs, args.out, digits=args.digits, plots=args.plots,
                               data_revisions=data_revisions(runs), options=stat_options(args),
                               baseline=args.baseline)
    print(f"{len(runs)} run(s) -> {len(files)} files in {args.out}")
    for run in runs:
        print(f"  {run.label:32s} {run.backend:7s} {', '.join(run.conditions)}"
              + (f"  (paper row {run.paper})" if run.paper else ""))
    return 0
