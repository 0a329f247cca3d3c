"""Extractor behaviour on CPU with tiny random-weight detectors (no fixtures needed)."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from helpers_extract import SMALL_BUTD, SMALL_X101, synthetic_image, tiny_model, write_png
from volta_ml.features import open_store, open_writer
from volta_ml.features.detectors.select_butd import TooFewBoxes, butd_extract
from volta_ml.features.detectors.x101_fpn import x101_extract_batch
from volta_ml.features.extract import FailureLog, extract_images, image_id_for, list_images
from volta_ml.features.images import ImageError, read_image_bgr


@pytest.fixture(scope="module")
def butd():
    torch.set_num_threads(2)
    return tiny_model("butd")


@pytest.fixture(scope="module")
def x101():
    torch.set_num_threads(2)
    return tiny_model("x101")


def test_butd_shapes_and_h5_fields(butd):
    img = synthetic_image(120, 180, seed=1)
    out = butd_extract(butd, img, SMALL_BUTD)
    assert out["features"].shape == (36, 2048) and out["features"].dtype == np.float32
    assert out["boxes"].shape == (36, 4) and out["boxes"].dtype == np.float32
    assert out["obj_id"].dtype == np.int64 and out["attr_id"].dtype == np.int64
    assert (0 <= out["obj_id"]).all() and (out["obj_id"] < 1600).all()
    assert (0 <= out["attr_id"]).all() and (out["attr_id"] < 400).all()
    assert (np.diff(out["obj_conf"]) <= 0).all(), "rows ordered by descending obj_conf"
    b = out["boxes"]
    assert (b[:, 0] >= 0).all() and (b[:, 2] <= 180).all() and (b[:, 1] >= 0).all() and (b[:, 3] <= 120).all()
    assert (b[:, 2] > b[:, 0]).all() and (b[:, 3] > b[:, 1]).all()
    assert (out["features"] >= 0).all(), "mean of ReLU outputs"
    assert int(out["img_w"]) == 180 and int(out["img_h"]) == 120


def test_butd_too_few_proposals_is_a_failure_not_a_short_record(butd):
    preset = SMALL_BUTD.with_settings(rpn_post_nms_topk=20)  # < 36 proposals
    with pytest.raises(TooFewBoxes, match="36 required"):
        butd_extract(butd, synthetic_image(120, 180, seed=1), preset)


def test_x101_shapes(x101):
    img = synthetic_image(130, 170, seed=2)
    (out,) = x101_extract_batch(x101, [img], SMALL_X101)
    assert out["features"].shape == (100, 2048) and out["features"].dtype == np.float32
    assert out["bbox"].shape == (100, 4) and out["cls_prob"].shape == (100, 1600)
    assert out["objects"].dtype == np.int64 and 0 <= out["num_boxes"] <= 100
    np.testing.assert_array_equal(out["objects"], out["cls_prob"].argmax(axis=1))
    assert (out["image_width"], out["image_height"]) == (170, 130)
    assert (out["features"] >= 0).all(), "fc6 is post-ReLU"


def test_x101_batch_padding_changes_features_only_through_the_partner(x101):
    a, b = synthetic_image(130, 170, seed=2), synthetic_image(200, 150, seed=3)
    (alone,) = x101_extract_batch(x101, [a], SMALL_X101)
    paired = x101_extract_batch(x101, [a, b], SMALL_X101)
    assert len(paired) == 2 and paired[1]["features"].shape == (100, 2048)
    assert (paired[0]["image_width"], paired[0]["image_height"]) == (170, 130)
    # The shared canvas is larger than image a's own: clipping and borders differ.
    assert not np.array_equal(alone["bbox"], paired[0]["bbox"]) or \
        not np.array_equal(alone["features"], paired[0]["features"])


def test_determinism_at_fixed_threads(butd, x101):
    img = synthetic_image(120, 180, seed=4)
    first, second = butd_extract(butd, img, SMALL_BUTD), butd_extract(butd, img, SMALL_BUTD)
    for key in first:
        np.testing.assert_array_equal(first[key], second[key], err_msg=key)
    (p,), (q,) = x101_extract_batch(x101, [img], SMALL_X101), x101_extract_batch(x101, [img], SMALL_X101)
    for key in ("features", "bbox", "objects", "cls_prob"):
        np.testing.assert_array_equal(p[key], q[key], err_msg=key)


def test_given_boxes_reproduce_proposal_features(butd):
    # 160x240 with min_size 160: resize scale exactly 1, so raw boxes == resized boxes.
    img = synthetic_image(160, 240, seed=5)
    full = butd_extract(butd, img, SMALL_BUTD, debug=True)
    assert tuple(full["x_resized_hw"]) == (160, 240)
    boxes = full["x_rpn_proposals"][full["x_keep"][:5]].astype(np.float32)
    given = butd_extract(butd, img, SMALL_BUTD, given_boxes=boxes)
    np.testing.assert_array_equal(given["boxes"], boxes)  # returned unchanged
    assert int(given["num_objects"]) == 5
    np.testing.assert_allclose(given["features"], full["features"][:5], rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(given["obj_id"], full["obj_id"][:5])
    np.testing.assert_allclose(given["obj_conf"], full["obj_conf"][:5], rtol=1e-5)


def test_given_boxes_keep_float64_dtype_and_are_not_clipped(butd):
    img = synthetic_image(120, 180, seed=6)
    boxes = np.array([[10.0, 12.0, 80.0, 90.0], [150.0, 100.0, 260.0, 170.0]])  # 2nd runs past the image
    out = butd_extract(butd, img, SMALL_BUTD, given_boxes=boxes)
    assert out["boxes"].dtype == np.float64
    np.testing.assert_array_equal(out["boxes"], boxes)
    assert out["features"].shape == (2, 2048)


def _make_images(folder, n=3):
    folder.mkdir()
    for i in range(n):
        write_png(folder / f"img{i}.png", synthetic_image(100 + 10 * i, 150, seed=10 + i))
    return folder


class _CrashAfter:
    """Wraps a writer; raises after `n` successful puts (a crash mid-run)."""

    def __init__(self, writer, n):
        self.writer, self.n = writer, n

    def put(self, *args, **kwargs):
        if self.n == 0:
            raise KeyboardInterrupt("simulated crash")
        self.writer.put(*args, **kwargs)
        self.n -= 1

    def __contains__(self, key):
        return key in self.writer


@pytest.mark.parametrize("fmt", ["native", "h5"])
def test_resume_after_interrupted_run(butd, tmp_path, fmt):
    images = _make_images(tmp_path / "imgs", 2)
    items = [(image_id_for(p, "stem"), p) for p in list_images(images)]
    out = str(tmp_path / ("store" if fmt == "native" else "store.h5"))
    log = FailureLog(tmp_path / "fail.jsonl")
    with pytest.raises(KeyboardInterrupt):
        with open_writer(out, fmt) as writer:
            extract_images(butd, SMALL_BUTD, items, _CrashAfter(writer, 1), log, progress=False)
    with open_writer(out, fmt) as writer:  # the rerun resumes the unfinished store
        summary = extract_images(butd, SMALL_BUTD, items, writer, log, progress=False)
    assert (summary.already_present, summary.extracted, summary.failed) == (1, 1, 0)
    store = open_store(out)
    assert sorted(store.keys_list()) == ["img0", "img1"]
    # The record written before the crash equals an uninterrupted run's.
    ref = butd_extract(butd, read_image_bgr(images / "img0.png"), SMALL_BUTD)
    np.testing.assert_array_equal(store["img0"].features, ref["features"])
    np.testing.assert_array_equal(store["img0"].boxes, ref["boxes"])


def test_failure_manifest_for_corrupt_degenerate_and_bomb_images(butd, tmp_path):
    folder = _make_images(tmp_path / "imgs", 1)
    (folder / "corrupt.jpg").write_bytes(b"\xff\xd8\xff\xe0 definitely not a jpeg" * 10)
    good = (folder / "img0.png").read_bytes()
    (folder / "truncated.png").write_bytes(good[: len(good) // 3])
    write_png(folder / "line.png", np.zeros((1, 50, 3), np.uint8))
    write_png(folder / "sliver.png", synthetic_image(20, 900, seed=8)[:3])  # decodes, too thin once resized
    write_png(folder / "huge.png", np.zeros((300, 400, 3), np.uint8))  # over the pixel limit below
    items = [(image_id_for(p, "stem"), p) for p in list_images(folder)]
    log = FailureLog(tmp_path / "failures.jsonl")
    with open_writer(str(tmp_path / "store"), "native") as writer:
        summary = extract_images(butd, SMALL_BUTD, items, writer, log, max_pixels=100_000, progress=False)
    entries = {e["image_id"]: e for e in map(json.loads, (tmp_path / "failures.jsonl").read_text().splitlines())}
    assert set(entries) == {"corrupt", "truncated", "line", "huge", "sliver"}
    assert summary.failed == 5 and summary.extracted == 1
    assert "exceeds the limit" in entries["huge"]["reason"]
    assert "degenerate" in entries["line"]["reason"]
    assert "too thin" in entries["sliver"]["reason"]
    assert all(e["stage"] == "decode" and e["path"].endswith(e["path"].split("/")[-1]) for e in entries.values())
    assert open_store(str(tmp_path / "store")).keys_list() == ["img0"]


def test_exif_orientation_is_applied(tmp_path):
    from PIL import Image

    img = synthetic_image(40, 90, seed=7)  # stored 90 wide, 40 high
    exif = Image.Exif()
    exif[0x0112] = 6  # rotate 90 degrees clockwise on display
    Image.fromarray(img[:, :, ::-1]).save(tmp_path / "r.jpg", exif=exif, quality=95)
    decoded = read_image_bgr(tmp_path / "r.jpg")
    assert decoded.shape == (90, 40, 3)
    from PIL import ImageOps

    with Image.open(tmp_path / "r.jpg") as im:  # Pillow with the orientation applied explicitly
        ref = np.asarray(ImageOps.exif_transpose(im).convert("RGB"))[:, :, ::-1].astype(int)
    assert np.abs(decoded.astype(int) - ref).max() <= 2  # libjpeg builds may differ by 1-2 levels
    wrong_way = np.rot90(np.rot90(ref))  # 180 degrees off: clearly different
    assert np.abs(decoded.astype(int) - wrong_way).mean() > 10


def test_unreadable_file_raises_image_error(tmp_path):
    (tmp_path / "empty.png").write_bytes(b"")
    with pytest.raises(ImageError, match="empty file"):
        read_image_bgr(tmp_path / "empty.png")
    with pytest.raises(ImageError, match="cannot read"):
        read_image_bgr(tmp_path / "missing.png")


def test_volta_lmdb_output_is_resumable_through_staging(butd, tmp_path):
    from volta_ml.features.extract_cli import finish_output, open_output

    images = _make_images(tmp_path / "imgs", 2)
    items = [(image_id_for(p, "stem"), p) for p in list_images(images)]
    out = str(tmp_path / "feat.lmdb")
    log = FailureLog(tmp_path / "fail.jsonl")
    for run_items, expected_new in ((items[:1], 1), (items, 1)):  # second run adds one image
        writer, staging = open_output(out, "volta-lmdb", "test")
        with writer:
            summary = extract_images(butd, SMALL_BUTD, run_items, writer, log, progress=False)
        finish_output(out, staging, progress=False)
        assert summary.extracted == expected_new
    store = open_store(out)
    assert type(store).__name__ == "VoltaLmdbStore" and sorted(store.keys_list()) == ["img0", "img1"]
    assert store["img1"].features.shape == (36, 2048)
