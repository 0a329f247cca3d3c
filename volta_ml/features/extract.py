"""Running a detector over many images into a feature store (resumable, failures logged).

`extract_images` is the engine behind `volta-ml features extract` and the legacy
`features_extraction/detectron2_*_maxnms.py` wrappers.
"""
from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset
from tqdm import tqdm

from .detectors.presets import Preset
from .detectors.select_butd import DegenerateImage, TooFewBoxes, butd_extract
from .detectors.x101_fpn import x101_extract_batch
from .images import DEFAULT_MAX_PIXELS, ImageError, read_image_bgr

# A systematic error (wrong weights, device trouble) stops the run instead of filling the manifest.
MAX_MODEL_FAILURES_IN_A_ROW = 20
IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".bmp", ".webp", ".tif", ".tiff")


def list_images(source: str | Path, recursive: bool = False) -> list[Path]:
    """A directory (image files, sorted) or a text file listing one image path per line."""
    source = Path(source)
    if source.is_dir():
        pattern = "**/*" if recursive else "*"
        return sorted(p for p in source.glob(pattern) if p.is_file() and p.suffix.lower() in IMAGE_SUFFIXES)
    if source.is_file():
        paths = []
        for lineno, line in enumerate(source.read_text(encoding="utf-8").splitlines(), 1):
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            p = Path(line)
            paths.append(p if p.is_absolute() else source.parent / p)
        return paths
    raise FileNotFoundError(f"--images {source}: no such directory or file list")


def image_id_for(path: Path, style: str) -> str:
    """`stem` (name without the last suffix), `first-dot` (up to the first dot, as the npy
    layout), or `name` (full file name, as xFlickrCO)."""
    if style == "stem":
        return path.stem
    if style == "first-dot":
        return path.name.split(".")[0]
    if style == "name":
        return path.name
    raise ValueError(f"unknown id style {style!r}")


def load_given_boxes(path: str | Path) -> dict[str, np.ndarray]:
    """Given boxes per image id: JSON {"id": [[x1, y1, x2, y2], ...]} or .npz (one array per id)."""
    path = Path(path)
    if path.suffix == ".npz":
        with np.load(path, allow_pickle=False) as data:
            boxes = {k: np.asarray(data[k]) for k in data.files}
    else:
        boxes = {k: np.asarray(v, dtype=np.float32) for k, v in json.loads(path.read_text()).items()}
    for key, value in boxes.items():
        if value.ndim != 2 or value.shape[1] != 4 or len(value) == 0:
            raise ValueError(f"{path}: boxes for {key!r} have shape {value.shape}, expected (N>0, 4)")
    return boxes


class FailureLog:
    """JSON-lines manifest of images that produced no features, written as they happen."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.count = 0

    def add(self, image_id: str, image_path, stage: str, reason: str) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        entry = {"image_id": image_id, "path": str(image_path), "stage": stage, "reason": reason,
                 "time": time.strftime("%Y-%m-%dT%H:%M:%S")}
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(json.dumps(entry) + "\n")
        self.count += 1


def _as_is(item):
    return item


class _Decoded(Dataset):
    def __init__(self, items, max_pixels):
        self.items, self.max_pixels = items, max_pixels

    def __len__(self):
        return len(self.items)

    def __getitem__(self, i):
        image_id, path = self.items[i]
        try:
            return image_id, path, read_image_bgr(path, self.max_pixels, min_side=2), None
        except ImageError as err:
            return image_id, path, None, str(err)


@dataclass
class ExtractSummary:
    total: int = 0
    extracted: int = 0
    already_present: int = 0
    failed: int = 0
    seconds: float = 0.0
    failures_path: str | None = None
    failed_ids: list[str] = field(default_factory=list)


def _names(ids, vocab):
    return [vocab[int(i)] if 0 <= int(i) < len(vocab) else "" for i in ids]


def _butd_record(out: dict, vocab) -> tuple[dict, dict]:
    extra = {k: out[k] for k in ("obj_id", "obj_conf", "attr_id", "attr_conf", "num_objects", "num_boxes")
             if k in out}
    if vocab is not None:
        extra["obj_name"] = _names(out["obj_id"], vocab[0])
        extra["attr_name"] = _names(out["attr_id"], vocab[1])
    return out, extra


def extract_images(model, preset: Preset, items: list[tuple[str, Path]], writer, failures: FailureLog,
                   given_boxes: dict | None = None, device: str | torch.device = "cpu", num_workers: int = 0,
                   max_pixels: int = DEFAULT_MAX_PIXELS, vocab=None, progress: bool = True) -> ExtractSummary:
    """Extract every (image_id, path) not yet in `writer`; failures go to `failures`."""
    start = time.time()
    summary = ExtractSummary(total=len(items), failures_path=str(failures.path))
    todo = []
    for image_id, path in items:
        if image_id in writer:
            summary.already_present += 1
        elif given_boxes is not None and image_id not in given_boxes:
            failures.add(image_id, path, "boxes", "no given boxes for this image id")
            summary.failed += 1
            summary.failed_ids.append(image_id)
        else:
            todo.append((image_id, path))
    batch_size = preset.batch_size if preset.detector == "x101" else 1
    loader = DataLoader(_Decoded(todo, max_pixels), batch_size=None, shuffle=False, num_workers=num_workers,
                        collate_fn=_as_is, prefetch_factor=4 if num_workers else None)
    bar = tqdm(total=len(todo), desc=f"extract {preset.name}", unit="img", disable=not progress)
    pending: list[tuple[str, Path, np.ndarray]] = []
    model_failures_in_a_row = 0

    def fail(image_id, path, stage, reason):
        failures.add(image_id, path, stage, reason)
        summary.failed += 1
        summary.failed_ids.append(image_id)

    def run_x101(batch):
        try:
            outs = x101_extract_batch(model, [img for _, _, img in batch], preset, device=device)
        except Exception as err:  # a batch-level failure: name every image in it
            for image_id, path, _ in batch:
                fail(image_id, path, "model", f"{type(err).__name__}: {err}")
            return
        for (image_id, _, _), out in zip(batch, outs):
            extra = {k: out[k] for k in ("num_boxes", "objects", "cls_prob")}
            if vocab is not None:
                extra["object_name"] = _names(out["objects"], vocab[0])
            writer.put(image_id, out["features"], out["bbox"], out["image_width"], out["image_height"], **extra)
            summary.extracted += 1

    for image_id, path, img, error in loader:
        if error is not None:
            fail(image_id, path, "decode", error)
        elif preset.detector == "x101":
            pending.append((image_id, path, img))
            if len(pending) == batch_size:
                run_x101(pending)
                pending = []
        else:
            try:
                out = butd_extract(model, img, preset, given_boxes=None if given_boxes is None
                                   else given_boxes[image_id], device=device)
            except TooFewBoxes as err:
                fail(image_id, path, "selection", str(err))
            except DegenerateImage as err:
                fail(image_id, path, "decode", str(err))
            except Exception as err:  # one odd image must not end a long run; it is listed
                fail(image_id, path, "model", f"{type(err).__name__}: {err}")
                model_failures_in_a_row += 1
                if model_failures_in_a_row >= MAX_MODEL_FAILURES_IN_A_ROW:
                    raise RuntimeError(f"{model_failures_in_a_row} images in a row failed inside the model; "
                                       f"last error: {err}") from err
            else:
                model_failures_in_a_row = 0
                out, extra = _butd_record(out, vocab)
                writer.put(image_id, out["features"], out["boxes"], int(out["img_w"]), int(out["img_h"]), **extra)
                summary.extracted += 1
        bar.update(1)
        bar.set_postfix(failed=summary.failed, refresh=False)
    if pending:
        run_x101(pending)
    bar.close()
    summary.seconds = time.time() - start
    return summary


def stage_path(out: str | Path) -> str:
    return os.fspath(out) + ".staging"


def check_run_settings(out: str | Path, settings: dict) -> None:
    """Refuse to resume an output made with another preset or mode (mixed features).

    The settings of the first run are kept next to the store in `<out>.extract.json`."""
    path = Path(os.fspath(out).rstrip("/") + ".extract.json")
    if path.is_file():
        previous = json.loads(path.read_text())
        changed = {k: (previous.get(k), v) for k, v in settings.items() if previous.get(k) != v}
        if changed:
            detail = ", ".join(f"{k}: {a!r} -> {b!r}" for k, (a, b) in changed.items())
            raise ValueError(f"{out} was extracted with other settings ({detail}); "
                             "use a new --out or remove the old store")
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(settings, indent=2) + "\n")
