"""Region features for CVQA images, straight from the parquet bytes into a feature store.

Each photo is extracted once, keyed by its image id (the questions on one photo share it), and a rerun skips the
ids already in the store, so an interrupted extraction resumes. Decoding goes through the extractor's
`decode_image_bytes`: the header is checked before any pixel is decoded (decompression-bomb guard, `max_pixels`),
and the detector's own resize brings every photo to its input scale. `max_side` additionally shrinks huge photos
(some CVQA photos are 6016x4000) before the detector; box coordinates then refer to the shrunken image, whose
size is what the store records, so normalised box locations are unchanged.
"""
from __future__ import annotations

import time
from pathlib import Path

import numpy as np
from tqdm import tqdm

from volta_ml.features import open_writer
from volta_ml.features.detectors.presets import Preset
from volta_ml.features.extract import ExtractSummary
from volta_ml.features.images import DEFAULT_MAX_PIXELS, ImageError, decode_image_bytes

from .data import CVQADataset


def shrink_to(img: np.ndarray, max_side: int | None) -> np.ndarray:
    """`img` downscaled (area interpolation) so its longer side is at most `max_side`."""
    h, w = img.shape[:2]
    if not max_side or max(h, w) <= max_side:
        return img
    import cv2

    scale = max_side / max(h, w)
    return cv2.resize(img, (max(1, round(w * scale)), max(1, round(h * scale))), interpolation=cv2.INTER_AREA)


def extract_cvqa_features(dataset: CVQADataset, detector, preset: Preset, out: str | Path, *, device="cpu",
                          max_pixels: int = DEFAULT_MAX_PIXELS, max_side: int | None = None,
                          failures_path: str | Path | None = None, progress: bool = True) -> ExtractSummary:
    """Extract every CVQA image not yet in the native store at `out`; failures go to a JSON-lines manifest
    (default `<out>.failures.jsonl`) and the rest carries on."""
    from volta_ml.features.detectors.select_butd import TooFewBoxes, butd_extract
    from volta_ml.features.detectors.x101_fpn import x101_extract_batch
    from volta_ml.features.extract import FailureLog

    start = time.time()
    failures = FailureLog(failures_path or str(out).rstrip("/") + ".failures.jsonl")
    summary = ExtractSummary(total=len(dataset.image_ids))
    with open_writer(str(out), "native", append=True, extractor=preset.name, source="cvqa parquet",
                     cvqa_revision=dataset.revision) as writer:
        todo = [i for i in dataset.image_ids if i not in writer]
        summary.already_present = summary.total - len(todo)
        bar = tqdm(total=len(todo), desc=f"CVQA features {preset.name}", unit="img", disable=not progress)

        def fail(image_id, stage, reason):
            failures.add(image_id, f"{dataset.root} image {image_id}", stage, reason)
            summary.failed += 1
            summary.failed_ids.append(image_id)

        for image_id, data in dataset.iter_images(todo):
            try:
                img = shrink_to(decode_image_bytes(data, name=f"CVQA image {image_id}", max_pixels=max_pixels,
                                                   min_side=2), max_side)
                if preset.detector == "x101":
                    out_ = x101_extract_batch(detector, [img], preset, device=device)[0]
                    writer.put(image_id, out_["features"], out_["bbox"], out_["image_width"], out_["image_height"],
                               num_boxes=out_["num_boxes"], objects=out_["objects"], cls_prob=out_["cls_prob"])
                else:
                    out_ = butd_extract(detector, img, preset, device=device)
                    extra = {k: out_[k] for k in ("obj_id", "obj_conf", "attr_id", "attr_conf") if k in out_}
                    writer.put(image_id, out_["features"], out_["boxes"], int(out_["img_w"]), int(out_["img_h"]),
                               **extra)
                summary.extracted += 1
            except ImageError as err:
                fail(image_id, "decode", str(err))
            except TooFewBoxes as err:
                fail(image_id, "selection", str(err))
            except Exception as err:  # one bad photo must not end a 5k-image run; it is named in the manifest
                fail(image_id, "model", f"{type(err).__name__}: {err}")
            bar.update(1)
            bar.set_postfix(failed=summary.failed, refresh=False)
        bar.close()
    summary.seconds = time.time() - start
    return summary
