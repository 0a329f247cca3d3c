"""VOLTA's generic `h5_to_td-lmdb.py --h5 FILE.h5 --lmdb DIR.lmdb [--num_imgs N]`.

Writes a tensorpack-0.9.4-compatible serialized LMDB (msgpack-numpy records,
keys 00000000..., `__keys__` last): one record per image with the H5 fields
plus `img_id`, readable by VOLTA's td-lmdb loaders and by volta-ml.
"""
from __future__ import annotations

import argparse

import _legacy  # noqa: F401


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--h5", required=True)
    parser.add_argument("--lmdb", required=True)
    parser.add_argument("--num_imgs", type=int, default=None, help="keep only the first N images")
    args = parser.parse_args(argv)
    from volta_ml.features.convert import convert_store
    n = convert_store(args.h5, args.lmdb, to="td-lmdb", num_imgs=args.num_imgs)
    print(f"wrote {n} images to {args.lmdb}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
