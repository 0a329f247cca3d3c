"""VOLTA's `h5_to_lmdb.py --h5 FILE.h5 --lmdb DIR.lmdb`, on volta-ml's converter.

Writes VOLTA's keyed LMDB with raw arrays (what VOLTA's reader and volta-ml read),
but without `writemap`, so data.mdb is not a sparse 1 TiB file.  For volta-ml
only, `volta-ml features convert FILE.h5 DIR --to native` is faster to read.
"""
from __future__ import annotations

import argparse

import _legacy  # noqa: F401


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--h5", required=True, help="boxes36 H5 file (one group per image)")
    parser.add_argument("--lmdb", required=True, help="output LMDB directory")
    args = parser.parse_args(argv)
    from volta_ml.features.convert import convert_store
    n = convert_store(args.h5, args.lmdb, to="volta-lmdb", encoding="raw")
    print(f"wrote {n} images to {args.lmdb}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
