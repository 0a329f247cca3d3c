"""Loading original detector checkpoints (tiny synthetic files in the original layouts)."""
from __future__ import annotations

import json
import os
import pickle
import re
from pathlib import Path

import numpy as np
import pytest
import torch

from helpers_extract import SMALL_BUTD, SMALL_X101, TINY_BUTD, TINY_X101, tiny_model
from volta_ml.digest import file_digest
from volta_ml.features.detectors.butd import BUTDDetector
from volta_ml.features.detectors.checkpoints import (UnsafeCheckpoint, convert_checkpoint, load_converted,
                                                     load_original)
from volta_ml.features.detectors.keymap import CheckpointMismatch
from volta_ml.features.detectors.x101_fpn import X101Detector
from volta_ml.testing.reference import shared_root

SHARED = shared_root()  # VOLTA_ML_SHARED, else ../shared


# Original names, written from the layout described in the features spec (section 2.3/2.4 and 3.1),
# independently of the package's key map.
def detectron2_name(name: str) -> str:
    name = re.sub(r"^backbone\.conv1\.", "backbone.stem.conv1.", name)
    name = re.sub(r"^backbone\.bn1\.", "backbone.stem.conv1.norm.", name)
    name = re.sub(r"^backbone\.layer(\d)\.", lambda m: f"backbone.res{int(m.group(1)) + 1}.", name)
    name = re.sub(r"^res5\.", "roi_heads.res5.", name)
    name = re.sub(r"\.bn(\d)\.", r".conv\1.norm.", name)
    name = name.replace(".downsample.0.", ".shortcut.").replace(".downsample.1.", ".shortcut.norm.")
    name = re.sub(r"^rpn_head\.", "proposal_generator.rpn_head.", name)
    return re.sub(r"^box_predictor\.", "roi_heads.box_predictor.", name)


def maskrcnn_name(name: str) -> str:
    name = re.sub(r"^body\.(conv1|bn1)\.", r"backbone.body.stem.\1.", name)
    name = re.sub(r"^body\.", "backbone.body.", name)
    name = re.sub(r"^fpn\.", "backbone.fpn.", name)
    name = re.sub(r"^rpn_head\.", "rpn.head.", name)
    name = re.sub(r"^(fc6|fc7)\.", r"roi_heads.box.feature_extractor.\1.", name)
    return re.sub(r"^(cls_score|bbox_pred)\.", r"roi_heads.box.predictor.\1.", name)


def _original_state(model, namer):
    return {namer(k): v.detach().clone() for k, v in model.state_dict().items()}


def _write_d2_pickle(path, state):
    payload = {"model": {k: v.numpy() for k, v in state.items()}, "__author__": "test"}
    with open(path, "wb") as f:
        pickle.dump(payload, f, protocol=2)


def _assert_same_state(model, ref):
    got, exp = model.state_dict(), ref.state_dict()
    assert got.keys() == exp.keys()
    for k in exp:
        assert torch.equal(got[k], exp[k]), k


@pytest.mark.skipif(not (SHARED / "specs").is_dir(), reason=f"{SHARED}/specs not available (fresh clone)")
@pytest.mark.parametrize("cls,namer,table,n_anchor", [
    (BUTDDetector, detectron2_name, "d2_vg_attr_state_dict_keys.tsv", 1),
    (X101Detector, maskrcnn_name, "x101_mrcnn_state_dict_keys.tsv", 5)])
def test_full_models_cover_the_real_key_tables(cls, namer, table, n_anchor):
    with torch.device("meta"):
        model = cls()
    ours = {namer(k): tuple(v.shape) for k, v in model.state_dict().items()}
    rows = [line.split("\t") for line in (SHARED / "specs" / table).read_text().splitlines() if line]
    real = {k: tuple(int(d) for d in s.strip("()").split(",") if d.strip()) for k, s, _ in rows}
    anchors = [k for k in real if "cell_anchors" in k]
    assert len(anchors) == n_anchor
    assert ours == {k: v for k, v in real.items() if k not in anchors}


@pytest.mark.parametrize("with_attributes", [True, False])
def test_detectron2_pickle_roundtrip(tmp_path, with_attributes):
    ref = tiny_model("butd", seed=1, with_attributes=with_attributes)
    state = _original_state(ref, detectron2_name)
    state["proposal_generator.anchor_generator.cell_anchors.0"] = torch.zeros(12, 4)  # ignored buffer
    _write_d2_pickle(tmp_path / "m.pkl", state)
    model = load_original(tmp_path / "m.pkl", SMALL_BUTD, **TINY_BUTD)
    assert model.with_attributes is with_attributes
    _assert_same_state(model, ref)


def test_detectron2_pickle_without_bn_statistics_gets_zero_mean_unit_var(tmp_path):
    ref = tiny_model("butd", seed=2)
    state = {k: v for k, v in _original_state(ref, detectron2_name).items() if "running_" not in k}
    _write_d2_pickle(tmp_path / "m.pkl", state)
    model = load_original(tmp_path / "m.pkl", SMALL_BUTD, **TINY_BUTD)
    sd = model.state_dict()
    assert torch.equal(sd["backbone.bn1.running_mean"], torch.zeros(64))
    assert torch.equal(sd["res5.0.bn3.running_var"], torch.ones(2048))
    assert torch.equal(sd["backbone.bn1.weight"], ref.state_dict()["backbone.bn1.weight"])


class _Evil:
    def __reduce__(self):
        return (os.system, ("echo owned > owned.txt",))


def test_restricted_unpickler_refuses_code(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with open("evil.pkl", "wb") as f:
        pickle.dump({"model": {"backbone.stem.conv1.weight": _Evil()}, "__author__": "x"}, f)
    with pytest.raises(UnsafeCheckpoint, match="evil.pkl: refusing to load global"):
        load_original(tmp_path / "evil.pkl", SMALL_BUTD, **TINY_BUTD)
    assert not (tmp_path / "owned.txt").exists()


def test_strict_key_map_names_the_problem(tmp_path):
    ref = tiny_model("butd", seed=3)
    base = _original_state(ref, detectron2_name)
    bad_shape = dict(base)
    bad_shape["roi_heads.box_predictor.bbox_pred.weight"] = torch.zeros(6404, 2048)  # Caffe layout
    _write_d2_pickle(tmp_path / "a.pkl", bad_shape)
    with pytest.raises(CheckpointMismatch, match=r"(?s)a\.pkl.*shape mismatch for 'roi_heads.box_predictor"
                       r"\.bbox_pred\.weight': file \(6404, 2048\)"):
        load_original(tmp_path / "a.pkl", SMALL_BUTD, **TINY_BUTD)
    extra = dict(base)
    extra["roi_heads.box_head.fc1.weight"] = torch.zeros(3, 3)
    _write_d2_pickle(tmp_path / "b.pkl", extra)
    with pytest.raises(CheckpointMismatch, match="unexpected key 'roi_heads.box_head.fc1.weight'"):
        load_original(tmp_path / "b.pkl", SMALL_BUTD, **TINY_BUTD)
    missing = {k: v for k, v in base.items() if k != "backbone.res3.0.conv2.weight"}
    _write_d2_pickle(tmp_path / "c.pkl", missing)
    with pytest.raises(CheckpointMismatch, match="missing key for model entry 'backbone.layer2.0.conv2.weight'"):
        load_original(tmp_path / "c.pkl", SMALL_BUTD, **TINY_BUTD)


@pytest.mark.parametrize("prefix", ["", "module."])
def test_maskrcnn_pth_roundtrip(tmp_path, prefix):
    ref = tiny_model("x101", seed=4)
    state = {prefix + k: v for k, v in _original_state(ref, maskrcnn_name).items()}
    state[prefix + "rpn.anchor_generator.cell_anchors.0"] = torch.zeros(3, 4)
    torch.save({"model": state, "iteration": 90000}, tmp_path / "m.pth")
    model = load_original(tmp_path / "m.pth", SMALL_X101, **TINY_X101)
    _assert_same_state(model, ref)


def test_maskrcnn_pth_with_objects_is_refused(tmp_path):
    torch.save({"model": {"rpn.head.conv.bias": torch.zeros(2)}, "cfg": _Evil()}, tmp_path / "m.pth")
    with pytest.raises(UnsafeCheckpoint, match="m.pth"):
        load_original(tmp_path / "m.pth", SMALL_X101, **TINY_X101)


def test_conversion_to_safetensors_with_manifest(tmp_path):
    ref = tiny_model("butd", seed=5)
    _write_d2_pickle(tmp_path / "m.pkl", _original_state(ref, detectron2_name))
    weights, manifest_path = convert_checkpoint(tmp_path / "m.pkl", tmp_path / "conv" / "butd", "volta-butd36",
                                                **TINY_BUTD)
    assert weights.name == "butd.safetensors" and manifest_path.name == "butd.json"
    manifest = json.loads(manifest_path.read_text())
    assert manifest["source_sha256"] == file_digest(tmp_path / "m.pkl")
    assert manifest["preset"] == "volta-butd36" and manifest["detector"] == "butd"
    assert manifest["with_attributes"] is True and manifest["safetensors_sha256"] == file_digest(weights)
    _assert_same_state(load_converted(weights), ref)
    data = bytearray(weights.read_bytes())
    data[-1] ^= 0xFF
    weights.write_bytes(bytes(data))
    with pytest.raises(ValueError, match="sha256 does not match"):
        load_converted(weights)


def test_converted_weights_refuse_the_other_detector(tmp_path):
    ref = tiny_model("butd", seed=6)
    _write_d2_pickle(tmp_path / "m.pkl", _original_state(ref, detectron2_name))
    weights, _ = convert_checkpoint(tmp_path / "m.pkl", tmp_path / "butd", "volta-butd36", **TINY_BUTD)
    with pytest.raises(ValueError, match="holds a butd detector"):
        load_converted(weights, "volta-x101")
    assert np.isfinite(sum(float(v.float().sum()) for v in load_converted(weights).state_dict().values()))
