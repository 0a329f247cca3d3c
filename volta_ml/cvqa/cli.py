"""`volta-ml cvqa extract` (region features from the parquet images) and `volta-ml cvqa score` (zero-shot run)."""
from __future__ import annotations

import json
import os
import sys

from volta_ml.features.detectors.presets import PRESETS

from .prompts import CONDITIONS, TEMPLATES


def register(subparsers) -> None:
    cvqa = subparsers.add_parser("cvqa", help="CVQA: culturally diverse multilingual multiple-choice VQA",
                                 description="Zero-shot CVQA with the matching head of a V&L encoder. "
                                 "See docs/cvqa.md.")
    sub = cvqa.add_subparsers(dest="cvqa_command", metavar="STEP")

    ex = sub.add_parser("extract", help="region features for the CVQA images, read from the parquet shards")
    ex.add_argument("--data", required=True, help="folder of CVQA parquet shards (local copy of afaji/cvqa)")
    ex.add_argument("--revision", default=None, help="HF commit of the data (recorded in the store)")
    ex.add_argument("--preset", required=True, choices=sorted(PRESETS), help="detector preset")
    ex.add_argument("--weights", required=True, help="detector weights (.pkl / .pth / converted .safetensors)")
    ex.add_argument("--out", required=True, help="native feature store to create or resume")
    ex.add_argument("--device", default="auto")
    ex.add_argument("--max-pixels", type=int, default=None, help="refuse larger images (decompression bombs)")
    ex.add_argument("--max-side", type=int, default=None, help="shrink photos whose longer side is larger first")
    ex.add_argument("--failures", default=None, help="failure manifest (default <out>.failures.jsonl)")
    ex.add_argument("--limit", type=int, default=None, help="only the first N questions' images")
    ex.add_argument("--no-progress", action="store_true")
    ex.set_defaults(func=run_extract_command)

    sc = sub.add_parser("score", help="score a checkpoint on CVQA and write results, tables, plot, submissions")
    sc.add_argument("--data", required=True, help="folder of CVQA parquet shards")
    sc.add_argument("--features", required=True, help="feature store from `volta-ml cvqa extract`")
    sc.add_argument("--config", "--config_file", dest="config", required=True, help="model config name or JSON")
    sc.add_argument("--checkpoint", "--from_pretrained", dest="checkpoint", required=True)
    sc.add_argument("--bert_model", "--bert-model", dest="bert_model", required=True, help="local tokenizer folder")
    sc.add_argument("--do_lower_case", action="store_true")
    sc.add_argument("--kind", choices=("pretraining", "tasks"), default="pretraining",
                    help="pretraining: the ITM head; tasks: a fine-tuned VL-logit head (--task_id)")
    sc.add_argument("--task_id", default=None, help="the VL-logit head of a tasks checkpoint, e.g. TASK8")
    sc.add_argument("--revision", default=None, help="HF commit of the data (recorded in every result file)")
    sc.add_argument("--conditions", nargs="+", choices=CONDITIONS, default=list(CONDITIONS))
    sc.add_argument("--template", choices=sorted(TEMPLATES), default="paper")
    sc.add_argument("--max_seq_length", type=int, default=40)
    sc.add_argument("--max_region_num", type=int, default=36)
    sc.add_argument("--batch_size", type=int, default=64, help="(image, text) rows per forward pass")
    sc.add_argument("--device", default="auto")
    sc.add_argument("--amp", action="store_true", help="autocast on CUDA")
    sc.add_argument("--no-text-only", dest="text_only", action="store_false", help="skip the blind baseline")
    sc.add_argument("--limit", type=int, default=None, help="only the first N questions")
    sc.add_argument("--output_dir", required=True)
    sc.add_argument("--preset", default=None, choices=sorted(PRESETS), help="with --detector_weights: extract missing images into "
                    "--features first (one command for the whole run)")
    sc.add_argument("--detector_weights", default=None, help="detector weights for --preset")
    sc.add_argument("--max-side", dest="max_side", type=int, default=None)
    sc.add_argument("--max-pixels", dest="max_pixels", type=int, default=None)
    sc.add_argument("--no-progress", dest="progress", action="store_false")
    sc.set_defaults(func=run_score_command)
    cvqa.set_defaults(func=lambda args: cvqa.print_help() or 2)


def _clear_errors(command):
    """Known bad inputs end the command with one `error:` line naming the file or key, not a traceback."""
    def wrapped(args) -> int:
        from volta_ml.data.text import TokenizerLoadError

        from .zoo import MatchingHeadError
        from .data import CVQAFormatError

        try:
            return command(args)
        except (FileNotFoundError, CVQAFormatError, MatchingHeadError, TokenizerLoadError, KeyError,
                ValueError) as err:
            message = err.args[0] if isinstance(err, KeyError) and err.args else err
            print(f"error: volta-ml cvqa: {message}", file=sys.stderr)
            return 2
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


@_clear_errors
def run_score_command(args) -> int:
    from .run import run_cvqa

    keys = ("data", "features", "config", "checkpoint", "bert_model", "do_lower_case", "kind", "task_id",
            "revision", "conditions", "template", "max_seq_length", "max_region_num", "batch_size", "device",
            "amp", "text_only", "limit", "output_dir", "progress", "preset", "detector_weights", "max_side",
            "max_pixels")
    path = run_cvqa({k: getattr(args, k) for k in keys})
    results = json.loads(open(path, encoding="utf-8").read())
    print(f"CVQA revision {results['revision']}, {results['questions']} questions"
          f"{' (labels hidden: submission mode)' if results['hidden_labels'] else ''}")
    for condition, summary in results["runs"].items():
        blind = results["text_only"].get(condition)
        if results["hidden_labels"]:
            print(f"  {condition:13s} submission_{condition}.csv")
        else:
            print(f"  {condition:13s} micro {summary['micro']:6.2f}  macro {summary['macro']:6.2f}"
                  + (f"  | text-only {blind['micro']:6.2f}" if blind else "") + "  | random 25.00")
    print(f"results: {path}")
    return 0
