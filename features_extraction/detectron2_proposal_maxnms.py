#!/usr/bin/env python
"""Drop-in for VOLTA's `detectron2_proposal_maxnms.py` runs (BUTD boxes36 H5), without detectron2.

Same arguments as VOLTA's per-dataset `*_boxes36_h5-proposal.py` scripts:
    python detectron2_proposal_maxnms.py --root IMAGE_DIR --outdir OUT_DIR [--split NAME] [--batchsize N]
writes OUT_DIR/<split>_boxes36.h5 (one group per image stem, VOLTA's datasets). Weights default to
VOLTA's location ~/.torch/fvcore_cache/models/faster_rcnn_from_caffe_attr.pkl; override with
--weights. Runs on CUDA when available, else CPU. Equivalent to
    volta-ml features extract --preset volta-butd36 --images IMAGE_DIR --out OUT_DIR/<split>_boxes36.h5 --format h5
"""
import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from volta_ml.cli import main  # noqa: E402


def parse(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--root", required=True, help="image directory")
    p.add_argument("--outdir", required=True, help="output directory")
    p.add_argument("--split", default="images", help="output file prefix: <split>_boxes36.h5")
    p.add_argument("--batchsize", type=int, default=1, help="accepted for compatibility (BUTD runs one image "
                   "at a time, as the original)")
    p.add_argument("--weights", default=None)
    p.add_argument("--device", default="auto")
    p.add_argument("--num_workers", type=int, default=4)
    return p.parse_args(argv)


def to_volta_ml_args(args, out_name: str, preset: str = "volta-butd36") -> list[str]:
    Path(args.outdir).mkdir(parents=True, exist_ok=True)
    argv = ["features", "extract", "--preset", preset, "--images", args.root, "--format", "h5",
            "--out", str(Path(args.outdir) / out_name), "--device", args.device,
            "--num-workers", str(args.num_workers)]
    if args.weights:
        argv += ["--weights", args.weights]
    return argv


if __name__ == "__main__":
    a = parse()
    sys.exit(main(to_volta_ml_args(a, f"{a.split}_boxes36.h5")))
