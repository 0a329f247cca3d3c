"""`volta-ml features convert|inspect|verify` (and `extract` when that module is installed)."""
from __future__ import annotations

import json
import sys

from volta_ml.options import int_at_least

from .extract_cli import register_extract
from .formats import WRITABLE_FORMATS


def _convert(args) -> int:
    from .convert import convert_store
    options = {}
    if args.to == "native":
        options["feature_dtype"] = "float16" if args.float16 else "float32"
        if args.extractor:
            options["extractor"] = args.extractor
    elif args.float16:
        print("--float16 applies to the native format only", file=sys.stderr)
        return 2
    if args.to == "volta-lmdb":
        options["encoding"] = args.encoding
    if args.overwrite:
        options["overwrite"] = True
    n = convert_store(args.src, args.dst, to=args.to, num_imgs=args.num_imgs,
                      feature_dim=args.feature_dim, **options)
    print(f"wrote {n} images to {args.dst} ({args.to})")
    return 0


def _inspect(args) -> int:
    from .convert import inspect_store
    info = inspect_store(args.store)
    if args.json:
        print(json.dumps(info, indent=2, default=str))
    else:
        sample = info.pop("sample")
        for key, value in info.items():
            print(f"{key:>14}: {value}")
        print("        sample:")
        for key, value in sample.items():
            print(f"{key:>18}: {value}")
    return 0


def _verify(args) -> int:
    from .convert import verify_store
    report = verify_store(args.store, feature_dim=args.feature_dim)
    print(f"{report['path']} ({report['format']}): {report['records']}/{report['expected_records']} "
          f"records decode; feature dims {report['feature_dims']}; boxes per image "
          f"{report['min_boxes']}..{report['max_boxes']}")
    for label in ("nonfinite", "bad_boxes"):
        if report[label]:
            print(f"{label}: {len(report[label])} images, e.g. {report[label][:5]}")
    for err in report["errors"]:
        print(f"error: {err}")
    print("OK" if report["ok"] else "FAILED")
    return 0 if report["ok"] else 1


def _guard(action):
    """Known failures print one clear line (the message names the store and key), no traceback."""
    def run(args) -> int:
        from .records import FeatureStoreError
        try:
            return action(args)
        except (FeatureStoreError, FileNotFoundError, FileExistsError, KeyError) as err:
            print(f"volta-ml features {args.features_command}: error: {err}", file=sys.stderr)
            return 2  # a usage error: a bad store, path or key
    return run


def register(subparsers) -> None:
    parser = subparsers.add_parser("features", help="convert, inspect and verify region-feature stores")
    sub = parser.add_subparsers(dest="features_command", metavar="ACTION")

    conv = sub.add_parser("convert", help="convert a store (H5, npy dir, TSV, LMDB) to another format")
    conv.add_argument("src", help="source store (format detected from the path)")
    conv.add_argument("dst", help="destination path")
    conv.add_argument("--to", choices=WRITABLE_FORMATS, default="native")
    conv.add_argument("--float16", action="store_true", help="native: store features as float16")
    conv.add_argument("--encoding", choices=("raw", "base64"), default="raw",
                      help="volta-lmdb: raw arrays (like h5_to_lmdb.py) or base64 (like npy_to_lmdb.py)")
    conv.add_argument("--num-imgs", type=int_at_least(1), default=None, help="convert only the first N images")
    conv.add_argument("--feature-dim", type=int_at_least(1), default=None, help="refuse other feature widths")
    conv.add_argument("--extractor", default=None, help="native: extractor preset for the metadata")
    conv.add_argument("--overwrite", action="store_true", help="replace an existing destination")
    conv.set_defaults(func=_guard(_convert))

    insp = sub.add_parser("inspect", help="format, count, dims and a sample record")
    insp.add_argument("store")
    insp.add_argument("--json", action="store_true")
    insp.set_defaults(func=_guard(_inspect))

    ver = sub.add_parser("verify", help="decode every record; counts; NaN/inf check")
    ver.add_argument("store")
    ver.add_argument("--feature-dim", type=int_at_least(1), default=None)
    ver.set_defaults(func=_guard(_verify))

    register_extract(sub)

    parser.set_defaults(func=lambda args: (parser.print_help(), 2)[1])
