#!/usr/bin/env python
"""Drop-in for VOLTA's `detectron2_given_box_maxnms.py` runs (BUTD features for given boxes).

    python detectron2_given_box_maxnms.py --root IMAGE_DIR --boxes BOXES --outdir OUT_DIR [--split NAME]
BOXES: JSON {image_id: [[x1, y1, x2, y2], ...]} (raw-image pixels) or an .npz with one (N, 4) array
per image id. Writes OUT_DIR/<split>_given_boxes.h5: per image `features`, `boxes` (the input boxes,
unchanged), `obj_id`, `obj_conf`, `attr_id`, `attr_conf`, `img_w`, `img_h`, `num_objects`.
"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from detectron2_proposal_maxnms import parse, to_volta_ml_args  # noqa: E402

from volta_ml.cli import main  # noqa: E402

if __name__ == "__main__":
    argv = sys.argv[1:]
    if "--boxes" not in argv:
        sys.exit("error: --boxes FILE is required (JSON or .npz of raw-image xyxy boxes per image id)")
    i = argv.index("--boxes")
    boxes = argv[i + 1]
    a = parse(argv[:i] + argv[i + 2:])
    sys.exit(main(to_volta_ml_args(a, f"{a.split}_given_boxes.h5") + ["--boxes", boxes]))
