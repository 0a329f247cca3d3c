"""CVQA feature extraction from the parquet bytes with a tiny random-weight detector."""
from __future__ import annotations

import io
import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from helpers_cvqa import ROWS, write_release
from helpers_extract import SMALL_BUTD, synthetic_image, tiny_model

from volta_ml.features import open_store
from volta_ml.features.detectors.select_butd import butd_extract
from volta_ml.features.images import decode_image_bytes
from volta_ml.cvqa.data import load_cvqa
from volta_ml.cvqa.features import extract_cvqa_features, shrink_to


def _png(img_bgr) -> bytes:
    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(np.ascontiguousarray(img_bgr[:, :, ::-1])).save(buf, format="PNG")
    return buf.getvalue()


@pytest.fixture(scope="module")
def release(tmp_path_factory):
    """The fixture release with detector-sized synthetic photos; photo 1002 is corrupt. (The tests read only the
    first questions: a detector pass costs seconds on a loaded CPU.)"""
    folder = write_release(tmp_path_factory.mktemp("cvqa_feat"), "hidden")
    path = folder / "test-00000-of-00001.parquet"
    table = pq.read_table(path)
    sizes = {"1001": (120, 160), "2001": (130, 110), "2002": (100, 150), "3001": (110, 170)}
    images = [{"bytes": _png(synthetic_image(*sizes[r[0][:4]], seed=int(r[0][:4]))) if r[0][:4] in sizes
               else b"not an image", "path": None} for r in ROWS]
    column = pa.array(images, type=table.schema.field("image").type)
    pq.write_table(table.set_column(0, table.schema.field("image"), column), path)
    return folder


def test_each_photo_is_extracted_once_and_reruns_resume(release, tmp_path):
    dataset = load_cvqa(release, limit=3)           # 1001 (two questions) and the corrupt 1002
    assert dataset.image_ids == ["1001", "1002"]
    detector = tiny_model("butd")
    out = tmp_path / "cvqa_feats"
    summary = extract_cvqa_features(dataset, detector, SMALL_BUTD, out, progress=False)
    assert (summary.total, summary.extracted, summary.failed) == (2, 1, 1) and summary.failed_ids == ["1002"]
    failure = json.loads((tmp_path / "cvqa_feats.failures.jsonl").read_text().splitlines()[0])
    assert failure["image_id"] == "1002" and failure["stage"] == "decode"
    store = open_store(out)
    assert list(store.keys()) == ["1001"]
    # Same numbers as the extractor run on the decoded bytes directly.
    data = dict(dataset.iter_images(["1001"]))["1001"]
    ref = butd_extract(detector, decode_image_bytes(data), SMALL_BUTD)
    np.testing.assert_array_equal(np.asarray(store["1001"].features), ref["features"])
    assert (store["1001"].image_w, store["1001"].image_h) == (160, 120) and store["1001"].num_boxes == 36
    again = extract_cvqa_features(dataset, detector, SMALL_BUTD, out, progress=False)
    assert (again.already_present, again.extracted, again.failed) == (1, 0, 1)


def test_oversized_photos_are_refused_or_shrunk(release, tmp_path):
    detector = tiny_model("butd")
    refused = extract_cvqa_features(load_cvqa(release, limit=3), detector, SMALL_BUTD, tmp_path / "small",
                                    max_pixels=19_199, progress=False)     # 1001 is 160x120 = 19200 pixels
    assert refused.failed_ids == ["1001", "1002"] and refused.extracted == 0
    assert "decompression bomb" in (tmp_path / "small.failures.jsonl").read_text()
    shrunk = extract_cvqa_features(load_cvqa(release, limit=1), detector, SMALL_BUTD, tmp_path / "shrunk",
                                   max_side=100, progress=False)
    assert shrunk.extracted == 1
    record = open_store(tmp_path / "shrunk")["1001"]
    assert (record.image_w, record.image_h) == (100, 75)
    boxes = np.asarray(record.boxes)
    assert boxes[:, 2].max() <= 100 and boxes[:, 3].max() <= 75


def test_shrink_keeps_aspect_and_leaves_small_images_alone():
    img = np.zeros((4000, 6016, 3), dtype=np.uint8)
    assert shrink_to(img, 1333).shape == (886, 1333, 3)
    small = np.zeros((10, 20, 3), dtype=np.uint8)
    assert shrink_to(small, 1333) is small and shrink_to(small, None) is small


def test_one_call_extracts_then_scores(release, tmp_path, monkeypatch):
    """`run_cvqa` with a detector: the missing photos are extracted into the store, then scored."""
    import torch
    from helpers_cvqa import tiny_tokenizer
    from helpers_tiny import tiny_config

    from volta_ml.models import build_model, save_checkpoint
    from volta_ml.cvqa import run as cvqa_run

    calls = []

    def tiny_detector(preset_name, weights, device):
        calls.append((preset_name, weights))
        return tiny_model("butd"), SMALL_BUTD

    monkeypatch.setattr(cvqa_run, "load_detector", tiny_detector)
    torch.manual_seed(0)
    config = tiny_config("ctrl_uniter_base", feature_size=2048)
    (tmp_path / "config.json").write_text(json.dumps(config.to_dict()))
    save_checkpoint(build_model(config, kind="pretraining"), tmp_path / "m.bin")
    tiny_tokenizer(tmp_path / "tok")
    path = cvqa_run.run_cvqa({
        "data": str(release), "features": str(tmp_path / "feats"), "config": str(tmp_path / "config.json"),
        "checkpoint": str(tmp_path / "m.bin"), "bert_model": str(tmp_path / "tok"), "output_dir": str(tmp_path / "o"),
        "limit": 2, "conditions": ["en-agnostic"], "text_only": False, "preset": "volta-butd36",
        "detector_weights": "tiny.safetensors", "device": "cpu", "progress": False, "max_seq_length": 24})
    assert calls == [("volta-butd36", "tiny.safetensors")]
    assert list(open_store(tmp_path / "feats").keys()) == ["1001"]
    results = json.loads(open(path).read())
    assert results["missing_images"] == [] and results["settings"]["preset"] == "volta-butd36"
    assert len((tmp_path / "o" / "submission_en-agnostic.csv").read_text().splitlines()) == 3
