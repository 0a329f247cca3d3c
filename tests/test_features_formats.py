"""Every legacy layout, written the way VOLTA's scripts write it, reads back identically;
every converter round-trips."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from volta_ml.features import detect_format, open_store, open_writer
from volta_ml.features.convert import convert_store
from volta_ml.testing import legacy_layouts as L

ROOT = Path(__file__).resolve().parents[1]
DIM = 64  # small feature width keeps the suite fast; readers never assume 2048


@pytest.fixture(scope="module")
def images():
    imgs = L.random_images(6, boxes=(10, 36), dim=DIM, seed=1)
    return imgs


def assert_same(store, images, check_scores=False):
    assert sorted(store.keys()) == sorted(images)
    assert len(store) == len(images)
    for image_id, img in images.items():
        rec = store[image_id]
        assert rec.features.dtype == np.float32 and rec.boxes.dtype == np.float32
        np.testing.assert_array_equal(rec.features, img["features"])
        np.testing.assert_array_equal(rec.boxes, img["boxes"])
        assert (rec.image_w, rec.image_h) == (img["img_w"], img["img_h"])
        assert rec.num_boxes == img["features"].shape[0]
        if check_scores:
            np.testing.assert_array_equal(rec.extra["obj_id"], img["obj_id"])
            np.testing.assert_array_equal(rec.extra["attr_conf"], img["attr_conf"])


def test_boxes36_h5(tmp_path, images):
    path = L.write_boxes36_h5(tmp_path / "x_boxes36.h5", images)
    assert detect_format(path) == "h5"
    assert_same(open_store(path), images, check_scores=True)


def test_npy_directory(tmp_path, images):
    path = L.write_npy_dir(tmp_path / "x_X101.npy", images)
    assert detect_format(path) == "npy"
    store = open_store(path)
    assert_same(store, images)
    rec = store[next(iter(images))]
    assert rec.extra["cls_prob"].shape == (rec.num_boxes, 1600)
    assert rec.extra["objects"].dtype == np.int64


@pytest.mark.parametrize("base64_fields", [False, True], ids=["h5-origin-raw", "npy-origin-base64"])
def test_volta_keyed_lmdb(tmp_path, images, base64_fields):
    path = L.write_volta_lmdb(tmp_path / "x.lmdb", images, base64_fields=base64_fields)
    assert detect_format(path) == "volta-lmdb"
    store = open_store(path)
    assert_same(store, images, check_scores=not base64_fields)
    assert store.encoding == ("base64" if base64_fields else "raw")
    assert list(store) == list(images)  # b"keys" order is kept


def test_raw_array_that_is_valid_base64_is_still_read_raw(tmp_path):
    # VOLTA tries base64 first; raw bytes that happen to be base64 alphabet would decode to
    # garbage. Field type decides here: an ndarray is raw whatever its bytes look like.
    boxes = np.frombuffer(b"QUFB" * 16, dtype=np.float32).reshape(4, 4).copy()
    feats = np.frombuffer(b"QkJC" * 4 * 8, dtype=np.float32).reshape(4, 8).copy()
    path = L.write_volta_lmdb(tmp_path / "x.lmdb", {"a": {"features": feats, "boxes": boxes,
                                                          "img_w": 10, "img_h": 10}})
    rec = open_store(path)["a"]
    np.testing.assert_array_equal(rec.boxes, boxes)
    np.testing.assert_array_equal(rec.features, feats)


@pytest.mark.parametrize("serializer", ["msgpack", "pickle"])
def test_td_lmdb_per_image(tmp_path, images, serializer):
    path = L.write_td_lmdb(tmp_path / "td.lmdb", L.h5_style_td_records(images), serializer)
    assert detect_format(path) == "td-lmdb"
    store = open_store(path)
    assert_same(store, images, check_scores=True)
    assert store.describe()["serializer"] == serializer
    keys = [k for k, _ in store.iter_records()]
    assert keys == [f"{i:08d}" for i in range(len(images))]


def test_td_lmdb_gqa_nlvr2_and_cc_records(tmp_path, images):
    ids = list(images)
    a, b = images[ids[0]], images[ids[1]]
    gqa = [{**L.h5_style_td_records({ids[0]: a})[0], "entry": {"question": "q?", "answer": "yes"}},
           {**L.h5_style_td_records({ids[0]: a})[0], "entry": {"question": "q2?"}}]
    nlvr2 = {"features_0": a["features"], "boxes_0": a["boxes"], "img_w_0": a["img_w"],
             "img_h_0": a["img_h"], "img_id_0": ids[0], "features_1": b["features"],
             "boxes_1": b["boxes"], "img_w_1": b["img_w"], "img_h_1": b["img_h"],
             "img_id_1": ids[1], "sentence": "two dogs", "labels": [1], "question_id": 7}
    import base64
    cc = [base64.b64encode(a["features"]).decode(), "", "", "", "", "", "",
          base64.b64encode(a["boxes"]).decode(), str(len(a["boxes"])), str(a["img_h"]),
          str(a["img_w"]), "cc_1", "a caption"]
    store = open_store(L.write_td_lmdb(tmp_path / "gqa.lmdb", gqa))
    assert list(store) == [ids[0]]
    np.testing.assert_array_equal(store[ids[0]].features, a["features"])
    assert store[ids[0]].extra["entry"]["question"] == "q?"  # first record of an image wins
    pair = open_store(L.write_td_lmdb(tmp_path / "nlvr2.lmdb", [nlvr2]))
    assert sorted(pair) == sorted(ids[:2])
    np.testing.assert_array_equal(pair[ids[1]].boxes, b["boxes"])
    ccs = open_store(L.write_td_lmdb(tmp_path / "cc.lmdb", [cc]))
    rec = ccs["cc_1"]
    np.testing.assert_array_equal(rec.features, a["features"])
    assert (rec.image_w, rec.image_h) == (a["img_w"], a["img_h"])


@pytest.mark.parametrize("caffe", [False, True], ids=["lxmert", "caffe"])
def test_tsv(tmp_path, images, caffe):
    path = L.write_lxmert_tsv(tmp_path / "x.tsv", images, caffe=caffe)
    assert detect_format(path) == "tsv"
    store = open_store(path)
    assert_same(store, images)
    if not caffe:
        rec = store[next(iter(images))]
        np.testing.assert_array_equal(rec.extra["objects_id"], images[next(iter(images))]["obj_id"])


def test_native_round_trip_float32_and_float16(tmp_path, images):
    path = tmp_path / "x.vmlf"
    with open_writer(path, "native", extractor="butd-r101-c4") as w:
        for image_id, img in images.items():
            w.put(image_id, img["features"], img["boxes"], img["img_w"], img["img_h"],
                  objects=img["obj_id"], objects_conf=img["obj_conf"], attrs=img["attr_id"],
                  attrs_conf=img["attr_conf"], cls_prob=img["features"][:, :5], caption="a cat")
            assert image_id in w
    store = open_store(path)
    assert detect_format(path) == "native"
    assert_same(store, images)
    rec = store[next(iter(images))]
    assert set(rec.extra) == {"objects", "objects_conf", "attrs", "attrs_conf", "cls_prob", "caption"}
    assert rec.extra["caption"] == "a cat"
    info = store.describe()
    assert info["feature_dim"] == DIM and info["num_images"] == len(images)
    counts = [img["features"].shape[0] for img in images.values()]
    assert info["extractor"] == "butd-r101-c4"
    assert info["box_rule"] == f"{min(counts)}-{max(counts)}"
    # compact: data.mdb holds the data, not a sparse terabyte
    payload = sum(i["features"].nbytes + i["boxes"].nbytes for i in images.values())
    mdb = tmp_path / "x.vmlf" / "data.mdb"
    assert os.stat(mdb).st_blocks * 512 < 4 * payload + (1 << 20)

    half = tmp_path / "half.vmlf"
    with open_writer(half, "native", feature_dtype="float16") as w:
        for image_id, img in images.items():
            w.put(image_id, img["features"], img["boxes"], img["img_w"], img["img_h"])
    h = open_store(half)
    for image_id, img in images.items():
        assert h[image_id].features.dtype == np.float32
        np.testing.assert_allclose(h[image_id].features, img["features"], rtol=1e-3, atol=1e-3)


CONVERSIONS = [  # (source writer, destination format, writer options)
    ("h5", "native", {}), ("h5", "volta-lmdb", {"encoding": "raw"}), ("npy", "volta-lmdb",
    {"encoding": "base64"}), ("tsv", "native", {}), ("volta-lmdb", "native", {}),
    ("h5", "td-lmdb", {}), ("native", "h5", {}), ("native", "npy", {}),
    ("volta-lmdb-b64", "volta-lmdb", {"encoding": "raw"}), ("td-lmdb", "native", {}),
]


def _write_source(kind, tmp_path, images):
    if kind == "h5":
        return L.write_boxes36_h5(tmp_path / "src.h5", images)
    if kind == "npy":
        return L.write_npy_dir(tmp_path / "src.npy", images)
    if kind == "tsv":
        return L.write_lxmert_tsv(tmp_path / "src.tsv", images)
    if kind == "volta-lmdb":
        return L.write_volta_lmdb(tmp_path / "src.lmdb", images)
    if kind == "volta-lmdb-b64":
        return L.write_volta_lmdb(tmp_path / "src.lmdb", images, base64_fields=True)
    if kind == "td-lmdb":
        return L.write_td_lmdb(tmp_path / "src.lmdb", L.h5_style_td_records(images))
    path = tmp_path / "src.vmlf"
    with open_writer(path, "native") as w:
        for image_id, img in images.items():
            w.put(image_id, img["features"], img["boxes"], img["img_w"], img["img_h"])
    return str(path)


@pytest.mark.parametrize("src_kind,dst_fmt,options", CONVERSIONS,
                         ids=[f"{s}->{d}" for s, d, _ in CONVERSIONS])
def test_converter_round_trip(tmp_path, images, src_kind, dst_fmt, options):
    src = _write_source(src_kind, tmp_path, images)
    dst = tmp_path / f"dst.{dst_fmt}"
    assert convert_store(src, dst, to=dst_fmt, progress=False, **options) == len(images)
    assert detect_format(dst) == dst_fmt
    assert_same(open_store(dst), images)
    # and back into a native store, unchanged
    back = tmp_path / "back.vmlf"
    convert_store(dst, back, to="native", progress=False)
    assert_same(open_store(back), images)


def test_converted_h5_extras_survive(tmp_path, images):
    src = L.write_boxes36_h5(tmp_path / "src.h5", images)
    convert_store(src, tmp_path / "n", progress=False)
    convert_store(tmp_path / "n", tmp_path / "v.lmdb", to="volta-lmdb", progress=False)
    for store in (open_store(tmp_path / "n"), open_store(tmp_path / "v.lmdb")):
        assert_same(store, images, check_scores=True)


def _run_script(name, *args):
    return subprocess.run([sys.executable, str(ROOT / "features_extraction" / name), *args],
                          capture_output=True, text=True, cwd=ROOT, timeout=120)


def test_legacy_wrappers(tmp_path, images):
    h5 = L.write_boxes36_h5(tmp_path / "a_boxes36.h5", images)
    npy = L.write_npy_dir(tmp_path / "a_X101.npy", images)
    r = _run_script("h5_to_lmdb.py", "--h5", h5, "--lmdb", str(tmp_path / "a.lmdb"))
    assert r.returncode == 0, r.stderr
    store = open_store(tmp_path / "a.lmdb")
    assert store.format_name == "volta-lmdb" and store.describe()["encoding"].startswith("raw")
    assert_same(store, images, check_scores=True)

    r = _run_script("npy_to_lmdb.py", "--mode", "convert", "--features_folder", npy,
                    "--lmdb_path", str(tmp_path / "b.lmdb"))
    assert r.returncode == 0, r.stderr
    store = open_store(tmp_path / "b.lmdb")
    assert store.describe()["encoding"].startswith("base64")
    assert_same(store, images)
    first = next(iter(images))
    assert store[first].extra["feature_path"].endswith(f"{first}.npy")

    r = _run_script("h5_to_td-lmdb.py", "--h5", h5, "--lmdb", str(tmp_path / "c.lmdb"),
                    "--num_imgs", "4")
    assert r.returncode == 0, r.stderr
    td = open_store(tmp_path / "c.lmdb")
    assert td.format_name == "td-lmdb" and td.num_records == 4
    assert_same(td, dict(list(images.items())[:4]), check_scores=True)


def test_td_lmdb_sequential_pass_builds_the_index(tmp_path, images, monkeypatch):
    store = open_store(L.write_td_lmdb(tmp_path / "td.lmdb", L.h5_style_td_records(images)))
    assert [k for k, _ in store.iter_records()] == [f"{i:08d}" for i in range(len(images))]
    monkeypatch.setattr(store, "_build_index", lambda: pytest.fail("second scan"))
    assert_same(store, images)
