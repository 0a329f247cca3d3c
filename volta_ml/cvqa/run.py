"""One CVQA evaluation run: load data, model, tokenizer and features; score the prompt conditions; write results.

`run_cvqa(args_dict)` is what `volta-ml cvqa score` calls, and what a sweep cell can call.
"""
from __future__ import annotations

import sys
import time
from pathlib import Path

import numpy as np

from volta_ml.atomic import atomic_open, atomic_write_json
from volta_ml.engine.failures import UsageError
from volta_ml.options import complete_options

from .zoo import MatchingHeadError, MatchingScorer, score_condition
from .data import HIDDEN_LABEL, CVQADataset, load_cvqa
from .prompts import CONDITIONS, PROMPTS_VERSION, parse_condition
from .report import accuracy_summary, en_loc_gap, plot_pairs, write_predictions, write_submission, write_tables

DEFAULTS = {
    "kind": "pretraining", "task_id": None, "revision": None, "conditions": list(CONDITIONS),
    "template": "paper", "max_seq_length": 40, "max_region_num": 36, "batch_size": 64, "device": "auto",
    "text_only": True, "limit": None, "amp": False, "do_lower_case": False, "progress": True,
    "preset": None, "detector_weights": None, "max_side": None, "max_pixels": None,
}
REQUIRED = ("data", "features", "config", "checkpoint", "bert_model", "output_dir")


def run_cvqa(args_dict: dict) -> str:
    """Score a checkpoint on CVQA and write every result file; returns the path of `cvqa_results.json`.

    Required keys: `data` (folder of CVQA parquet shards), `features` (feature store made by
    `volta-ml cvqa extract`), `config` (model config name or JSON), `checkpoint` (VOLTA .bin or .safetensors),
    `bert_model` (local tokenizer folder), `output_dir`.
    Optional keys (defaults in `DEFAULTS`): `kind` ("pretraining": ITM head; "tasks": a fine-tuned VL-logit
    head named by `task_id`), `revision` (HF commit of the data, recorded in results), `conditions` (subset of
    en-aware, en-agnostic, loc-aware, loc-agnostic), `template` ("paper" | "plain"), `max_seq_length`,
    `max_region_num`, `batch_size` ((image, text) rows per forward), `device`, `text_only` (also run the blind
    baseline), `limit` (first N questions), `amp`, `do_lower_case`, `progress`; with `preset` and
    `detector_weights` the images missing from `features` are extracted into it first (`max_side`, `max_pixels`
    as in `volta-ml cvqa extract`), so one call runs the whole thing.

    Written to `output_dir`: `cvqa_results.json` (all numbers, the revision, prompt version, settings),
    `predictions_<condition>.csv` (scores per option), `submission_<condition>.csv` (EvalAI: ID, Prediction),
    `cvqa_<breakdown>.csv`, `cvqa_report.md` and, with labels, `cvqa_pairs.png`.
    """
    from volta_ml.devices import pick_device
    from volta_ml.engine.run_setup import load_model, model_setup
    from volta_ml.tasks.regions import open_region_view

    args = complete_options("run_cvqa", args_dict, DEFAULTS, REQUIRED)
    for condition in args["conditions"]:
        parse_condition(condition)
    out_dir = Path(args["output_dir"])
    out_dir.mkdir(parents=True, exist_ok=True)
    device = pick_device(args["device"])

    dataset = load_cvqa(args["data"], revision=args["revision"], limit=args["limit"])
    if args["detector_weights"] or args["preset"]:
        _extract_missing(args, dataset, device)
    setup = model_setup(args["config"], bert_model=args["bert_model"], do_lower_case=args["do_lower_case"])
    config, tokenizer = setup.config, setup.tokenizer
    task_cfg = task_ids = None
    if args["kind"] == "tasks":
        if not args["task_id"]:
            raise UsageError("kind 'tasks' needs --task_id (the VL-logit retrieval head, e.g. TASK8)")
        task_cfg, task_ids = {args["task_id"]: {"type": "VL-logit", "num_labels": 1}}, [args["task_id"]]
    model, load_report = load_model(config, args["checkpoint"], task_cfg, task_ids, kind=args["kind"])
    head_prefix = "cls.bi_seq_relationship." if args["kind"] == "pretraining" else f"clfs_dict.{args['task_id']}."
    if any(k.startswith(head_prefix) for k in load_report.missing_keys):
        raise MatchingHeadError(f"{args['checkpoint']}: the matching head ({head_prefix}*) is not in the checkpoint, so "
                         "its scores would be random; use a pretrained checkpoint (kind pretraining) or a "
                         "retrieval fine-tuned one with its task id (kind tasks)")
    model.to(device).eval()
    scorer = MatchingScorer(model, args["task_id"])
    view = open_region_view(args["features"], config, {"name": "CVQA", "max_region_num": args["max_region_num"]})
    missing_images = sorted({q.image_id for q in dataset.questions if q.image_id not in view})

    common = dict(max_seq_length=args["max_seq_length"], template=args["template"], batch_size=args["batch_size"],
                  device=device, amp=args["amp"], progress=args["progress"])
    results = _header(args, dataset, scorer, load_report, missing_images)
    started = time.time()
    for condition in args["conditions"]:
        condition_start = time.time()
        scored = score_condition(scorer, dataset.questions, condition, tokenizer, view, **common)
        seconds = time.time() - condition_start
        results["timing"][condition] = {"seconds": round(seconds, 3),
                                        "questions_per_second": round(len(dataset.questions) / max(seconds, 1e-9), 2)}
        per_question = {}
        if args["text_only"]:
            blind = score_condition(scorer, dataset.questions, condition, tokenizer, view, text_only=True, **common)
            results["text_only"][condition] = accuracy_summary(dataset.questions, blind.predictions)
            per_question["text_only"] = blind.scores
        write_predictions(out_dir / f"predictions_{condition}.csv", dataset.questions, scored.predictions,
                          scored.scores, scored.condition, dataset.revision, per_question)
        write_submission(out_dir / f"submission_{condition}.csv", dataset.questions, scored.predictions)
        results["runs"][condition] = accuracy_summary(dataset.questions, scored.predictions)
        results["text_stats"][condition] = _text_stats(dataset, scored.texts)
        _save_json(out_dir / "cvqa_results.json", results)   # after every condition: nothing lost on a crash
    results["seconds"] = round(time.time() - started, 3)   # all conditions, text-only passes included
    results["en_loc_gap"] = en_loc_gap(results["runs"])
    results["files"] = [p.name for p in write_tables(results, out_dir)]
    if not dataset.hidden_labels and results["runs"]:
        results["files"].append(plot_pairs(results, out_dir / "cvqa_pairs.png").name)
    results["files"] += [f"{kind}_{c}.csv" for c in args["conditions"] for kind in ("predictions", "submission")]
    path = out_dir / "cvqa_results.json"
    _save_json(path, results)
    return str(path)


def load_detector(preset_name: str, weights: str, device):
    """(detector, preset) for CVQA extraction; X101 presets run one photo at a time."""
    from volta_ml.features.detectors.checkpoints import load_weights
    from volta_ml.features.detectors.presets import get_preset

    if not Path(weights).is_file():
        raise FileNotFoundError(f"detector weights {weights}: no such file (nothing is downloaded)")
    preset = get_preset(preset_name)
    if preset.detector == "x101" and preset.batch_size != 1:
        preset = preset.with_settings(batch_size=1)
    return load_weights(weights, preset).to(device), preset


def _extract_missing(args: dict, dataset: CVQADataset, device) -> None:
    from volta_ml.features.images import DEFAULT_MAX_PIXELS

    from .features import extract_cvqa_features

    if not (args["preset"] and args["detector_weights"]):
        raise UsageError("extracting missing features needs both --preset and --detector_weights")
    detector, preset = load_detector(args["preset"], args["detector_weights"], device)
    summary = extract_cvqa_features(dataset, detector, preset, args["features"], device=device,
                                    max_pixels=args["max_pixels"] or DEFAULT_MAX_PIXELS, max_side=args["max_side"],
                                    progress=args["progress"])
    if summary.failed:
        print(f"CVQA extraction: {summary.failed} image(s) failed, listed in {args['features']}.failures.jsonl; "
              "their questions are scored text-only", file=sys.stderr)


def _header(args: dict, dataset: CVQADataset, scorer: MatchingScorer, load_report, missing_images) -> dict:
    labelled = sum(q.label != HIDDEN_LABEL for q in dataset.questions)
    return {
        "model": Path(str(args["checkpoint"])).name, "checkpoint": str(args["checkpoint"]),
        "config": str(args["config"]), "kind": args["kind"], "task_id": scorer.task_id,
        "score_convention": scorer.convention, "revision": dataset.revision, "data": str(dataset.root),
        "shards": [s.name for s in dataset.shards], "questions": len(dataset.questions), "labelled": labelled,
        "hidden_labels": dataset.hidden_labels, "images": len(dataset.image_ids),
        "missing_images": missing_images, "prompts_version": PROMPTS_VERSION, "template": args["template"],
        "settings": {k: args[k] for k in ("max_seq_length", "max_region_num", "batch_size", "limit", "amp",
                                           "do_lower_case", "text_only", "preset", "max_side")},
        "checkpoint_missing_keys": list(load_report.missing_keys),
        "random_baseline": 25.0, "runs": {}, "text_only": {}, "text_stats": {}, "timing": {},
    }


def _text_stats(dataset: CVQADataset, texts) -> dict:
    """Truncation and unknown-token rates per pair (scripts outside the vocabulary show up here)."""
    pairs = np.repeat(np.array([q.pair for q in dataset.questions]), 4)
    stats = {"question_truncated": round(float(texts.head_cut.mean()), 4),
             "option_truncated": round(float(texts.option_cut.mean()), 4), "unk_rate_per_pair": {}}
    for pair in sorted(set(pairs.tolist())):
        rows = pairs == pair
        stats["unk_rate_per_pair"][pair] = round(float(texts.unk[rows].sum() / max(texts.lengths[rows].sum(), 1)), 4)
    return stats


def _save_json(path: Path, payload: dict) -> None:
    atomic_write_json(path, payload, indent=2, ensure_ascii=False)
