"""`volta-ml features extract` end to end (subprocess), with tiny converted weights."""
from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
from pathlib import Path

import h5py
import numpy as np
import pytest

from helpers_extract import TINY_BUTD, TINY_X101, synthetic_image, tiny_model, write_png
from test_extract_checkpoints import _original_state, detectron2_name, maskrcnn_name
from volta_ml.features import open_store
from volta_ml.features.detectors.checkpoints import convert_checkpoint

ROOT = Path(__file__).resolve().parents[1]


def _run(args, cwd=ROOT):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=600)


@pytest.fixture(scope="module")
def weights(tmp_path_factory):
    d = tmp_path_factory.mktemp("weights")
    import torch

    butd = tiny_model("butd", seed=11)
    with open(d / "butd.pkl", "wb") as f:
        pickle.dump({"model": {k: v.numpy() for k, v in _original_state(butd, detectron2_name).items()},
                     "__author__": "test"}, f)
    torch.save({"model": _original_state(tiny_model("x101", seed=12), maskrcnn_name)}, d / "x101.pth")
    butd_st, _ = convert_checkpoint(d / "butd.pkl", d / "butd", "volta-butd36", **TINY_BUTD)
    x101_st, _ = convert_checkpoint(d / "x101.pth", d / "x101", "volta-x101", **TINY_X101)
    return {"butd": butd_st, "x101": x101_st}


@pytest.fixture()
def images(tmp_path):
    d = tmp_path / "imgs"
    d.mkdir()
    write_png(d / "a.png", synthetic_image(60, 80, seed=1))
    write_png(d / "b.jpg.png", synthetic_image(70, 50, seed=2))
    (d / "bad.jpg").write_bytes(b"not an image")
    return d


def test_cli_butd_h5_resume_and_failures(weights, images, tmp_path):
    out = tmp_path / "feat_boxes36.h5"
    args = ["-m", "volta_ml.cli", "features", "extract", "--preset", "volta-butd36", "--images", str(images),
            "--out", str(out), "--format", "h5", "--weights", str(weights["butd"]), "--num-workers", "0",
            "--threads", "2", "--with-names", "--no-progress"]
    res = _run(args)
    assert res.returncode == 0, res.stderr
    assert "2 extracted, 0 already present, 1 failed" in res.stderr
    with h5py.File(out, "r") as f:
        assert sorted(f.keys()) == ["a", "b.jpg"]
        g = f["a"]
        for name, shape, dtype in [("features", (36, 2048), np.float32), ("boxes", (36, 4), np.float32),
                                   ("obj_id", (36,), np.int64), ("obj_conf", (36,), np.float32),
                                   ("attr_id", (36,), np.int64), ("attr_conf", (36,), np.float32),
                                   ("img_w", (), np.int64), ("img_h", (), np.int64)]:
            assert g[name].shape == shape and g[name].dtype == dtype, name
        assert int(g["img_w"][()]) == 80 and int(g["img_h"][()]) == 60
        assert len(g["obj_name"]) == 36
    failures = [json.loads(line) for line in Path(str(out) + ".failures.jsonl").read_text().splitlines()]
    assert [f["image_id"] for f in failures] == ["bad"]
    res = _run(args)  # rerun: finished store reopened, nothing recomputed
    assert res.returncode == 0, res.stderr
    assert "0 extracted, 2 already present, 1 failed" in res.stderr
    assert sorted(open_store(str(out)).keys_list()) == ["a", "b.jpg"]
    other = [a if a != "volta-butd36" else "butd-10-100" for a in args]
    res = _run(other)  # resuming with another preset would mix feature sets
    assert res.returncode != 0 and "was extracted with other settings (preset" in res.stderr


def test_cli_x101_npy_batches_of_two(weights, images, tmp_path):
    out = tmp_path / "feat_X101.npy"
    res = _run(["-m", "volta_ml.cli", "features", "extract", "--preset", "volta-x101", "--images", str(images),
                "--out", str(out), "--format", "npy", "--weights", str(weights["x101"]), "--num-workers", "1",
                "--threads", "2", "--no-progress"])
    assert res.returncode == 0, res.stderr
    # X101 ids are the name up to the first dot, like VOLTA's npy layout.
    assert sorted(p.name for p in out.iterdir()) == ["a.npy", "a_info.npy", "b.npy", "b_info.npy"]
    info = np.load(out / "b_info.npy", allow_pickle=True)[()]
    assert info["cls_prob"].shape == (100, 1600) and info["bbox"].shape == (100, 4)
    assert (info["image_width"], info["image_height"]) == (50, 70)
    assert np.load(out / "a.npy").shape == (100, 2048)


def test_legacy_given_box_wrapper(weights, images, tmp_path):
    boxes = {"a": [[1.5, 2.0, 40.0, 50.0], [10.0, 10.0, 79.0, 59.0]], "b.jpg": [[0.0, 0.0, 20.0, 30.0]]}
    (tmp_path / "boxes.json").write_text(json.dumps(boxes))
    res = _run([str(ROOT / "features_extraction" / "detectron2_given_box_maxnms.py"), "--root", str(images),
                "--outdir", str(tmp_path / "out"), "--split", "test", "--boxes", str(tmp_path / "boxes.json"),
                "--weights", str(weights["butd"]), "--num_workers", "0"], cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    with h5py.File(tmp_path / "out" / "test_given_boxes.h5", "r") as f:
        assert sorted(f.keys()) == ["a", "b.jpg"]
        np.testing.assert_array_equal(f["a"]["boxes"][()], np.array(boxes["a"], dtype=np.float32))
        assert int(f["a"]["num_objects"][()]) == 2 and f["a"]["features"].shape == (2, 2048)


def test_legacy_proposal_wrapper_help():
    res = _run([str(ROOT / "features_extraction" / "detectron2_proposal_maxnms.py"), "--help"])
    assert res.returncode == 0 and "--root" in res.stdout and "--outdir" in res.stdout


def test_convert_detector_reports_a_mismatched_file(tmp_path):
    # A file in the detectron2 layout whose shapes do not fit the real R101-C4 model.
    state = {detectron2_name(k): v.numpy() for k, v in tiny_model("butd", seed=13).state_dict().items()}
    with open(tmp_path / "small.pkl", "wb") as f:
        pickle.dump({"model": state, "__author__": "test"}, f)
    res = _run(["-m", "volta_ml.cli", "features", "convert-detector", str(tmp_path / "small.pkl"),
                str(tmp_path / "out"), "--preset", "volta-butd36"])
    assert res.returncode == 2
    assert "small.pkl" in res.stderr and "shape mismatch for 'backbone.res2.0.conv1.weight'" in res.stderr
    assert not (tmp_path / "out.safetensors").exists()
