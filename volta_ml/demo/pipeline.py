"""`volta-ml demo`: the whole pipeline, for real, on a laptop CPU, with nothing downloaded.

Stages (each with a progress bar):
1. data     draw synthetic scenes, write XVNLI-format annotations in en/de/fr/es + translations to English;
2. extract  region features of the drawn shapes' boxes (given-box mode) with the real BUTD extractor code
            and a small seeded random-weight trunk, into the native feature store;
3. train    a shrunk `ctrl_uniter_base` (text stream from MiniLM) on English with the real training loop;
4. evaluate English, zero-shot on de/fr/es, and translate-test (the same items translated to English);
5. report   an IGLUE-style table, `results.json`, `results.md` and `results.png`.

A demo stopped part-way (SIGTERM, Ctrl-C) resumes when run again into the same `--out` with the same `--size`
and `--seed`: `demo_state.json` records the stages that finished (their files are reused, not redone), and
training continues from the engine's resume file (`pytorch_ckpt_latest.tar`: written when SIGTERM stops it, and
at every epoch end), exactly as an uninterrupted run would have gone on. Any other earlier run in `--out` is
replaced.
"""
from __future__ import annotations

import json
import logging
import shutil
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
from tqdm import tqdm

from volta_ml.demo import data as demo_data, report as demo_report, stages as demo_stages

logger = logging.getLogger("volta_ml.demo")


@dataclass
class DemoResult:
    out_dir: Path
    scores: dict[str, float]                 # "en", "de", ..., "de_mt", ..., "en_shuffled": accuracy %
    chance: dict[str, float]                 # "uniform", "majority_or_text_only"
    seconds: dict[str, float] = field(default_factory=dict)
    artefacts: dict[str, str] = field(default_factory=dict)


def say(message: str = "") -> None:
    tqdm.write(message, file=sys.stdout)


def _train_args(entry: dict, seed: int, threads: int):
    from volta_ml.cli.train_flags import build_parser

    args = build_parser().parse_args([])
    args.seed = seed
    args.num_epoch = entry["num_epoch"]
    args.optim_train_epochs = entry["num_epoch"]  # schedule sized to the epochs actually run
    args.batch_size = entry["batch_size"]
    args.eval_batch_size = entry["eval_batch_size"]
    args.lr = entry["lr"]
    # IGLUE's fine-tuning settings (its scripts pass these flags): bias-corrected AdamW, clipped gradients.
    args.adam_correct_bias = True
    args.clip_grad_norm = 1.0
    args.num_workers = 0
    args.num_val_workers = 0
    args.save_best_only = True
    args.device = "cpu"
    return args


STATE_FILE = "demo_state.json"
OUTPUTS = ("data", "features", "train", "tables", "plots", "predictions", "results.json", "results.md",
           "results.png", "records.json", "demo_tasks.yml", "ctrl_uniter_demo.json")
REPORT_OUTPUTS = ("tables", "plots", "predictions", "results.json", "results.md", "results.png", "records.json")


def _remove(out: Path, names) -> None:
    for name in names:
        target = out / name
        if target.is_dir():
            shutil.rmtree(target)
        elif target.exists():
            target.unlink()


def _start_state(out: Path, size: str, seed: int) -> dict:
    """The stages an earlier, stopped run of the same size and seed in `out` finished (it is resumed), else a
    fresh start: the demo's previous files in `out` are removed (a finished run's too)."""
    try:
        state = json.loads((out / STATE_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        state = None
    if isinstance(state, dict) and state.get("size") == size and state.get("seed") == seed \
            and isinstance(state.get("finished"), dict) and "report" not in state["finished"]:
        _remove(out, REPORT_OUTPUTS)
        return state
    _remove(out, OUTPUTS + (STATE_FILE,))
    return {"size": size, "seed": seed, "finished": {}}


def _finished(out: Path, state: dict, stage: str, **facts) -> None:
    from volta_ml.atomic import atomic_write_json

    state["finished"][stage] = facts
    atomic_write_json(out / STATE_FILE, state, indent=1)


def _extract(data, detector, preset, raw_store: Path, store: Path, out: Path, seed: int, progress: bool) -> float:
    """Stage 2: region features of the drawn boxes, whitened into `store`; returns the time it ended."""
    from volta_ml.features import open_writer
    from volta_ml.features.extract import FailureLog, extract_images, load_given_boxes

    say(f"[extract] preset {preset.name} in given-box mode (boxes = the drawn shapes), input scaled to "
        f"{preset.min_size}/{preset.max_size}: the real BUTD R101-C4 code path with a small ResNet trunk "
        f"{demo_stages.BACKBONE_ARCH['blocks']} whose weights are RANDOM (seed {seed}); no detector weights "
        f"exist offline, so these features only carry colour and shape, not learnt semantics.")
    items = [(p.stem, p) for p in sorted(data.images_dir.glob("*.png"))]
    with torch.no_grad(), open_writer(raw_store, fmt="native", overwrite=True, extractor=preset.name,
                                      box_rule="given boxes (drawn shapes)", weights=f"random seed {seed}") as w:
        summary = extract_images(detector, preset, items, w, FailureLog(out / "features" / "failures.jsonl"),
                                 given_boxes=load_given_boxes(data.boxes_path), progress=progress)
    if summary.failed:
        raise RuntimeError(f"feature extraction failed for {summary.failed} image(s); see {summary.failures_path}")
    stats = demo_stages.whiten_store(raw_store, store, demo_stages.FEATURE_DIMS, progress)
    say(f"[extract] {raw_store.name}: the extractor's 2048-d output; {store.name}: PCA-whitened to "
        f"{demo_stages.FEATURE_DIMS} dimensions ({100 * stats['explained']:.0f}% of the variance of "
        f"{stats['regions']} regions), so that a small model learns in minutes from random-weight features.")
    return time.time()


def run_demo(out_dir: str | Path, size: str = "full", seed: int = 0, threads: int | None = None,
             progress: bool = True) -> DemoResult:
    from volta_ml.engine.distributed import DistInfo
    from volta_ml.engine.evaluate import evaluate
    from volta_ml.engine.train import TrainJob, train
    from volta_ml.engine.run_job import seed_everything
    from volta_ml.tasks import family_for
    from volta_ml.tasks.config import load_task_config
    from volta_ml.tasks.regions import open_region_view

    if threads:
        torch.set_num_threads(threads)
    out = Path(out_dir).resolve()
    out.mkdir(parents=True, exist_ok=True)
    state = _start_state(out, size, seed)
    done = state["finished"]
    sizes = demo_data.SIZES[size]
    seconds: dict[str, float] = {k: v["seconds"] for k, v in done.items()}
    say(f"volta-ml demo: size {size}, seed {seed}, output {out}"
        + (f"; resuming the stopped run there (finished: {', '.join(done)})" if done else ""))

    # 1. data -------------------------------------------------------------------------------------------
    start = time.time()
    if "data" in done:
        data = demo_data.generated(out / "data")
    else:
        with tqdm(total=demo_data.total_images(sizes), desc="1/5 data: draw scenes", unit="img",
                  disable=not progress, file=sys.stderr) as bar:
            data = demo_data.generate(out / "data", sizes, seed, progress=bar)
        seconds["data"] = time.time() - start
        _finished(out, state, "data", seconds=seconds["data"])

    # 2. extract ----------------------------------------------------------------------------------------
    start = time.time()
    preset = demo_stages.extractor_preset()
    raw_store = out / "features" / "demo_shapes_raw.native"
    store = out / "features" / "demo_shapes.native"
    if "extract" in done:
        say(f"[extract] reusing {store} (preset {preset.name}, given boxes, RANDOM weights, seed {seed})")
    else:
        detector, _ = demo_stages.extractor(seed)
        seconds["extract"] = _extract(data, detector, preset, raw_store, store, out, seed, progress) - start
        del detector
        _finished(out, state, "extract", seconds=seconds["extract"])

    # 3. train ------------------------------------------------------------------------------------------
    start = time.time()
    entry = demo_stages.task_entry(out / "data", store, size)
    task_yaml = demo_stages.write_task_config(out / "demo_tasks.yml", entry)
    task_cfg = load_task_config(task_yaml)
    entry = task_cfg[demo_stages.TASK_KEY]
    seed_everything(seed)
    model, tokenizer, config, load_report = demo_stages.build_demo_model(
        seed, task_cfg, out / "ctrl_uniter_demo.json")
    say(f"[train] model: {demo_stages.MODEL_FAMILY} shrunk to {demo_stages.TEXT_LAYERS} layers x 384 "
        f"({sum(p.numel() for p in model.parameters()):,} parameters); text stream initialised from MiniLM "
        f"(English-only BERT, {load_report.summary().split(';')[0]}); vision side random.")
    family = family_for(entry)
    view = open_region_view(str(store), config, entry)

    def dataset(split, path):
        return family.build_dataset(entry, split, tokenizer, view, annotation_path=str(path))

    train_set, dev_set = dataset("train", data.annotations["train"]), dataset("dev", data.annotations["dev"])
    args = _train_args(entry, seed, threads or torch.get_num_threads())
    run_dir = out / "train" / f"XVNLI_{demo_stages.MODEL_FAMILY}_demo"
    job = TrainJob(model=model, train_dataset=train_set, val_dataset=dev_set, forward_and_loss=family.forward_and_loss,
                   task_id=demo_stages.TASK_KEY, task_name="XVNLI", run_dir=run_dir, tb_dir=None,
                   collate_fn=train_set.collate_fn)
    if "train" in done:
        best_dev = done["train"]["best_dev"]
    else:
        resume_file = run_dir / "pytorch_ckpt_latest.tar"   # what SIGTERM, Ctrl-C or an epoch end left
        args.resume_file = str(resume_file) if resume_file.is_file() else ""
        best_dev = train(job, args, DistInfo(device=torch.device("cpu")))
        seconds["train"] = time.time() - start
        _finished(out, state, "train", seconds=seconds["train"], best_dev=best_dev)

    # 4. evaluate ---------------------------------------------------------------------------------------
    start = time.time()
    from volta_ml.models import load_checkpoint
    load_checkpoint(model, run_dir / "pytorch_model_best.bin")
    test_sets = {"en": data.annotations["test/en"]}
    for lang in data.test_languages():
        if lang != "en":
            test_sets[lang] = data.annotations[f"test/{lang}"]
            test_sets[f"{lang}_mt"] = data.annotations[f"test_mt/{lang}"]
    test_sets["en_shuffled"] = demo_data.shuffled_images_copy(data.annotations["test/en"], seed)
    scores, predictions = {}, {}
    for name, path in tqdm(test_sets.items(), desc="4/5 evaluate", unit="set", disable=not progress,
                           file=sys.stderr):
        result = evaluate(model, dataset("test", path), family, demo_stages.TASK_KEY,
                          batch_size=entry["eval_batch_size"], progress=False)
        scores[name], predictions[name] = result.score_percent, result.predictions
    seconds["evaluate"] = time.time() - start

    # 5. report -----------------------------------------------------------------------------------------
    chance = demo_data.chance_levels(data.annotations["test/en"])
    result = DemoResult(out, scores, chance, seconds)
    result.artefacts = demo_report.write_report(out, result, best_dev=best_dev * 100, size=size, seed=seed,
                                                predictions=predictions, extract_preset=preset.name,
                                                store=str(store), task_yaml=str(task_yaml),
                                                checkpoint=str(run_dir / "pytorch_model_best.bin"))
    _finished(out, state, "report", seconds=0.0)
    say(demo_report.render_text(result))
    return result
