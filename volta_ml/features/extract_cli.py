"""`volta-ml features extract` and `volta-ml features convert-detector`.

Registered by `volta_ml/features/cli.py` through `register_extract(features_subparsers)`.
"""
from __future__ import annotations

import os
import pickle
import shutil
import sys
from collections import Counter
from pathlib import Path

import torch

from volta_ml.devices import pick_device
from volta_ml.options import int_at_least

from .detectors.presets import PRESETS, get_preset
from .images import DEFAULT_MAX_PIXELS

FORMATS = {"native": "native", "h5": "h5", "npy": "npy", "lmdb": "volta-lmdb"}
# Where VOLTA's scripts left the BUTD weights (detectron2's fvcore cache).
LEGACY_BUTD_WEIGHTS = Path("~/.torch/fvcore_cache/models/faster_rcnn_from_caffe_attr.pkl").expanduser()


def register_extract(subparsers) -> None:
    p = subparsers.add_parser("extract", help="extract region features with a BUTD or X101 detector",
                              description="Run a detector preset over images into a feature store. "
                              "Resumable: ids already in the output are skipped. Images that yield no "
                              "features are listed in a JSON-lines failure manifest.")
    p.add_argument("--preset", required=True, choices=sorted(PRESETS), help="detector + selection preset")
    p.add_argument("--images", required=True, help="image directory, or a text file with one path per line")
    p.add_argument("--out", required=True, help="output store path")
    p.add_argument("--format", default="native", choices=sorted(FORMATS),
                   help="native store (default), VOLTA H5 (boxes36 layout), npy directory (X101 layout) "
                   "or VOLTA keyed LMDB")
    p.add_argument("--weights", default=None, help="detectron2 .pkl, maskrcnn-benchmark .pth or converted "
                   f".safetensors (BUTD default: {LEGACY_BUTD_WEIGHTS} if present)")
    p.add_argument("--boxes", default=None, help="given-box mode (BUTD): JSON {id: [[x1,y1,x2,y2],...]} "
                   "or .npz with one (N,4) array per image id, raw-image pixels")
    p.add_argument("--device", default="auto", help="auto (CUDA when available), cpu, cuda, cuda:1 ...")
    p.add_argument("--batch-size", type=int_at_least(1), default=None,
                   help="X101 images padded together (preset default; VOLTA used 2; changes features)")
    p.add_argument("--num-workers", type=int_at_least(0), default=2, help="image decoding worker processes")
    p.add_argument("--threads", type=int_at_least(1), default=None, help="CPU threads for torch")
    p.add_argument("--recursive", action="store_true", help="also list images in subdirectories")
    p.add_argument("--id-style", choices=("stem", "first-dot", "name"), default=None,
                   help="image id from the file name (default: stem for BUTD, first-dot for X101)")
    p.add_argument("--failures", default=None, help="failure manifest (default: <out>.failures.jsonl)")
    p.add_argument("--max-pixels", type=int_at_least(1), default=DEFAULT_MAX_PIXELS,
                   help="refuse images with more pixels (decompression-bomb guard)")
    p.add_argument("--with-names", action="store_true", help="also store Visual Genome class/attribute names")
    p.add_argument("--limit", type=int_at_least(1), default=None, help="only the first N images (after sorting)")
    p.add_argument("--no-progress", action="store_true")
    p.set_defaults(func=run_extract)

    c = subparsers.add_parser("convert-detector", help="convert an original detector checkpoint to "
                              "safetensors + manifest (one-time, restricted unpickling)")
    c.add_argument("src", help="faster_rcnn_from_caffe[_attr].pkl or detectron_model.pth")
    c.add_argument("out", help="output path without suffix (writes .safetensors and .json)")
    c.add_argument("--preset", required=True, choices=sorted(PRESETS))
    c.set_defaults(func=run_convert_detector)


def run_convert_detector(args) -> int:
    from .detectors.checkpoints import convert_checkpoint

    try:
        weights, manifest = convert_checkpoint(args.src, args.out, args.preset)
    except (ValueError, OSError, pickle.UnpicklingError) as err:  # mismatch, unsafe or unreadable file
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(f"wrote {weights} and {manifest}")
    return 0


def _resolve_weights(args, preset) -> Path:
    if args.weights:
        path = Path(args.weights).expanduser()
    elif preset.detector == "butd" and LEGACY_BUTD_WEIGHTS.is_file():
        path = LEGACY_BUTD_WEIGHTS
    else:
        raise SystemExit("error: --weights is required (no weights are downloaded; get "
                         "faster_rcnn_from_caffe_attr.pkl for BUTD presets or detectron_model.pth for X101)")
    if not path.is_file():
        raise SystemExit(f"error: weights file {path} does not exist")
    return path


def open_output(out: str, fmt: str, preset_name: str):
    """A writer that resumes whatever `out` already holds, for every format."""
    from . import open_writer
    from .convert import convert_store
    from .extract import stage_path

    meta = {"extractor": preset_name}
    if fmt == "native":
        return open_writer(out, "native", append=True, **meta), None
    if fmt in ("h5", "npy"):
        # Writers resume from `<out>.partial`; a finished store is reopened the same way.
        partial = out + ".partial"
        if os.path.exists(out) and not os.path.exists(partial):
            os.replace(out, partial)
        return open_writer(out, fmt), None
    # VOLTA LMDB has no resumable writer: stage in a native store, convert on success.
    staging = stage_path(out)
    if os.path.exists(os.path.join(out, "data.mdb")) and not os.path.exists(staging):
        convert_store(out, staging, to="native", progress=False)
    return open_writer(staging, "native", append=True, **meta), staging


def finish_output(out: str, staging: str | None, progress: bool = True) -> None:
    """VOLTA LMDB: convert the finished staging store, then drop it."""
    if staging is None:
        return
    from .convert import convert_store

    convert_store(staging, out, to="volta-lmdb", progress=progress, overwrite=True)
    shutil.rmtree(staging)


def run_extract(args) -> int:
    from .detectors.checkpoints import load_weights
    from .extract import (FailureLog, check_run_settings, extract_images, image_id_for, list_images,
                          load_given_boxes)
    from .vocab import load_vg_vocab

    preset = get_preset(args.preset)
    if args.batch_size:
        preset = preset.with_settings(batch_size=args.batch_size)
    if args.boxes and preset.detector != "butd":
        raise SystemExit("error: --boxes (given-box mode) needs a BUTD preset")
    if args.threads:
        torch.set_num_threads(args.threads)
    fmt = FORMATS[args.format]
    paths = list_images(args.images, recursive=args.recursive)
    if args.limit is not None:
        paths = paths[: args.limit]
    style = args.id_style or ("first-dot" if preset.detector == "x101" else "stem")
    items = [(image_id_for(p, style), p) for p in paths]
    dupes = [k for k, n in Counter(i for i, _ in items).items() if n > 1]
    if dupes:
        raise SystemExit(f"error: {len(dupes)} image ids occur more than once with --id-style {style} "
                         f"(e.g. {dupes[:3]}); use --id-style name")
    given = load_given_boxes(args.boxes) if args.boxes else None
    weights = _resolve_weights(args, preset)
    try:
        check_run_settings(args.out, {"preset": preset.name, "batch_size": preset.batch_size,
                                      "given_boxes": bool(args.boxes), "id_style": style})
    except ValueError as err:
        raise SystemExit(f"error: {err}") from None
    device = pick_device(args.device)
    try:
        model = load_weights(weights, preset).to(device)
    except (ValueError, pickle.UnpicklingError) as err:
        raise SystemExit(f"error: {err}") from None
    vocab = load_vg_vocab() if args.with_names else None
    failures = FailureLog(args.failures or args.out.rstrip("/") + ".failures.jsonl")

    writer, staging = open_output(args.out, fmt, preset.name)
    with writer:
        summary = extract_images(model, preset, items, writer, failures, given_boxes=given, device=device,
                                 num_workers=args.num_workers, max_pixels=args.max_pixels, vocab=vocab,
                                 progress=not args.no_progress)
    finish_output(args.out, staging, progress=not args.no_progress)
    rate = summary.extracted / summary.seconds if summary.seconds else 0.0
    print(f"{args.out}: {summary.extracted} extracted, {summary.already_present} already present, "
          f"{summary.failed} failed ({rate:.2f} img/s on {device})", file=sys.stderr)
    if summary.failed:
        print(f"failures listed in {summary.failures_path}", file=sys.stderr)
    return 0
