"""VOLTA's `npy_to_lmdb.py --mode convert --features_folder DIR.npy --lmdb_path DIR.lmdb`.

`convert` writes VOLTA's keyed LMDB the way VOLTA's script does for X101 npy
directories: base64 `features`/`boxes`, int `img_w`/`img_h`/`num_boxes`, raw
`objects`/`cls_prob`, and `feature_path`.  VOLTA's `--mode extract` read keys
that `convert` never writes; here `extract` does what it was meant
to: LMDB -> npy directory (`--lmdb_path` in, `--features_folder` out).
"""
from __future__ import annotations

import argparse
import os

import _legacy  # noqa: F401


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--mode", choices=("convert", "extract"), default="convert")
    parser.add_argument("--features_folder", required=True, help="directory of <stem>.npy + <stem>_info.npy")
    parser.add_argument("--lmdb_path", required=True, help="VOLTA keyed LMDB directory")
    args = parser.parse_args(argv)
    from volta_ml.features.convert import convert_store
    if args.mode == "convert":
        folder = args.features_folder
        n = convert_store(folder, args.lmdb_path, to="volta-lmdb", encoding="base64",
                          extra_fn=lambda image_id, _: {
                              "feature_path": os.path.join(folder, image_id + ".npy")})
        print(f"wrote {n} images to {args.lmdb_path}")
    else:
        n = convert_store(args.lmdb_path, args.features_folder, to="npy")
        print(f"wrote {n} images to {args.features_folder}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
