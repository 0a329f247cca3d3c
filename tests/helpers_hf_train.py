"""Fixtures and an entry point for the dual-encoder fine-tuning tests (tests/test_hf_train.py).

`make_flickr_root(root, n_train, n_val)` lays out a tiny Flickr30k-style data root as the shipped task config
expects it (`flickr30k/annotations/train_ann.jsonl`, `valid_ann.jsonl`: rows with `sentences` and `img_path`)
plus an image folder: each picture is two coloured halves and its two captions name the colours, so a tiny
model learns to match them within a few dozen steps (30 pairs of distinct colours, then they repeat).

    python tests/helpers_hf_train.py <train_task.py flags>

runs `volta-ml train` unchanged, except that `HF_TRAIN_SLEEP` (seconds, env) slows each training forward,
so a kill test can hit the middle of a run, and the faults of the `hf_best/` export tests
(tests/test_hf_train_faults.py):
- `HF_TRAIN_RISING=1`: the validation of epoch e scores (e + 1) / (e + 2), so every epoch exports a new best;
- `HF_EXPORT_FAULT=<kind>:<n>`, at the n-th export of this process: `full` (the disk is full when the export
  starts: filled up to ENOSPC but `HF_FULL_DISK_LEAVE` bytes when `HF_FULL_DISK=tmpfs`, the output folder being a
  tiny tmpfs, else a file size limit of 0, EFBIG), `kill_swap` (a file system without an atomic exchange, as
  NFS: SIGKILL between the two renames of the swap).
Nothing in volta-ml is changed: the job builder is wrapped here.
"""
from __future__ import annotations

import json
import os
import resource
import signal
import sys
import time
from pathlib import Path

import numpy as np
from PIL import Image

REPO = Path(__file__).resolve().parents[1]
COLOURS = {"red": (220, 30, 30), "green": (30, 200, 40), "blue": (30, 40, 220), "yellow": (230, 220, 40),
           "black": (10, 10, 10), "white": (245, 245, 245)}


def _picture(left: str, right: str, rng) -> Image.Image:
    """The left half in one colour, the right half in another, plus a little noise."""
    pixels = np.zeros((24, 32, 3), dtype=np.int64)
    pixels[:, :16], pixels[:, 16:] = COLOURS[left], COLOURS[right]
    return Image.fromarray(np.clip(pixels + rng.integers(-25, 26, pixels.shape), 0, 255).astype(np.uint8))


def make_flickr_root(root: Path, n_train: int, n_val: int) -> tuple[Path, Path]:
    """(data root, image root). Image i shows two colours, its captions name them: learnable by a tiny model."""
    data, images = root / "data", root / "images"
    annotations = data / "flickr30k" / "annotations"
    annotations.mkdir(parents=True, exist_ok=True)
    images.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    names = list(COLOURS)
    pairs = [(a, b) for a in names for b in names if a != b]
    for name, first, count in (("train_ann.jsonl", 0, n_train), ("valid_ann.jsonl", n_train, n_val)):
        rows = []
        for i in range(first, first + count):
            left, right = pairs[i % len(pairs)]
            file = f"{1000 + i}.png"
            _picture(left, right, rng).save(images / file)
            rows.append({"sentences": [f"{left} on the left and {right} on the right", f"a {left} and {right} picture"],
                         "id": str(1000 + i), "img_path": file})
        (annotations / name).write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return data, images


def make_xvnli_root(root: Path, n_train: int, n_val: int) -> tuple[Path, Path]:
    """(data root, image root) of a tiny XVNLI/SNLI-VE task as the shipped config expects it
    (`XVNLI/annotations/en/train.jsonl`, `dev.jsonl`; images `<Flickr30k id>.jpg`): each picture is one colour
    and the hypothesis names a colour, entailment when it is the picture's, contradiction otherwise."""
    data, images = root / "data", root / "images"
    annotations = data / "XVNLI" / "annotations" / "en"
    annotations.mkdir(parents=True, exist_ok=True)
    images.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(1)
    names = list(COLOURS)
    for name, first, count in (("train.jsonl", 0, n_train), ("dev.jsonl", n_train, n_val)):
        rows = []
        for i in range(first, first + count):
            colour, said = names[i % len(names)], names[(i // 2) % len(names)]
            _picture(colour, colour, rng).save(images / f"{2000 + i}.jpg")
            rows.append({"gold_label": "entailment" if said == colour else "contradiction",
                         "sentence1": "a picture", "sentence2": f"the picture is {said}",
                         "Flikr30kID": f"{2000 + i}.jpg", "pairID": f"{2000 + i}.jpg#0r{i}"})
        (annotations / name).write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return data, images


def train_env(**extra) -> dict:
    env = dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore")
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "SLURM_NTASKS", "SLURM_PROCID"):
        env.pop(key, None)
    env.update(extra)
    return env


def in_process(argv) -> int:
    """`volta-ml train` in this process with one thread, like the subprocesses (OMP_NUM_THREADS=1), so that their
    weights can be compared bit for bit; the exit code."""
    import torch
    from volta_ml.cli.train_flags import parse_train_args
    from volta_ml.cli.train_task import build_task_job, run
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return run(parse_train_args(argv), build_task_job)
    finally:
        torch.set_num_threads(threads)


def _fill_disk(folder) -> None:
    """No space left where `folder` is (but `HF_FULL_DISK_LEAVE` bytes): a tmpfs filled up, or no file may grow."""
    if os.environ.get("HF_FULL_DISK") == "tmpfs":
        with open(os.path.join(folder, "filler"), "wb", buffering=0) as handle:
            try:
                while True:
                    handle.write(b"\0" * 4096)
            except OSError:
                pass
            handle.truncate(max(0, handle.tell() - int(os.environ.get("HF_FULL_DISK_LEAVE", "0"))))
    else:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (0, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))


def _kill_between_renames() -> None:
    import volta_ml.atomic as atomic
    rename = os.rename

    def rename_then_die(src, dst, *args, **kwargs):
        rename(src, dst, *args, **kwargs)
        if str(dst).endswith(".old"):
            os.kill(os.getpid(), signal.SIGKILL)
    atomic._exchange = lambda a, b: False
    atomic.os.rename = rename_then_die


def _faulty_export(export, run_dir):
    kind, at = os.environ["HF_EXPORT_FAULT"].split(":")
    calls = [0]

    def wrapped(model, best):
        calls[0] += 1
        if calls[0] == int(at):
            if kind == "full":
                _fill_disk(run_dir)
            elif kind == "kill_swap":
                _kill_between_renames()
        return export(model, best)
    return wrapped


def _slow(build):
    def wrapped(args, info):
        job = build(args, info)
        delay, forward = float(os.environ.get("HF_TRAIN_SLEEP", "0")), job.forward_and_loss
        rising, epoch = os.environ.get("HF_TRAIN_RISING") == "1", [0]

        def slow_forward(model, batch, task_id):
            if model.training:
                time.sleep(delay)
            loss, score, n, logits = forward(model, batch, task_id)
            if rising and not model.training:      # epoch e validates at (e + 1) / (e + 2), resumed or not
                score = n * (epoch[0] + 1) / (epoch[0] + 2)
            return loss, score, n, logits
        job.forward_and_loss = slow_forward
        set_epoch = getattr(job.train_dataset, "set_epoch", None)

        def record_epoch(e):
            epoch[0] = e
            if set_epoch is not None:
                set_epoch(e)
        job.train_dataset.set_epoch = record_epoch
        if os.environ.get("HF_EXPORT_FAULT"):
            job.on_best_saved = _faulty_export(job.on_best_saved, job.run_dir)
        return job
    return wrapped


def main(argv=None) -> int:
    sys.path.insert(0, str(REPO))
    from volta_ml.cli.train_flags import parse_train_args
    from volta_ml.cli.train_task import build_task_job, run
    return run(parse_train_args(argv), _slow(build_task_job))


if __name__ == "__main__":
    sys.exit(main())
