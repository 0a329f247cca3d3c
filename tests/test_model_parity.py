"""VOLTA checkpoint parity on every golden fixture folder named in VOLTA_ML_GOLDEN (default ../shared/golden).

Each fixture holds a VOLTA checkpoint, inputs and the outputs VOLTA computed; the model must reproduce
every output in float32 and float64 (tolerances of the fixture README). Any folder with the same layout works.
"""
import json

import pytest
import torch

from volta_ml.testing.parity import hf_init_for_parity, load_for_parity

from conftest import env_folders

TOL = {torch.float32: (1e-4, 1e-4), torch.float64: (1e-9, 1e-9)}
M3P_TOL64 = 1e-6   # M3P's softmax runs in float32 even in a float64 run


def fixtures():
    found = []
    for root in env_folders("VOLTA_ML_GOLDEN", "golden"):
        manifest = json.loads((root / "manifest.json").read_text())
        for fx in manifest["fixtures"]:
            found.append(pytest.param(root / fx["name"], id=f"{root.name}/{fx['name']}"))
    return found or [pytest.param(None, marks=pytest.mark.skip(
        reason="no golden fixtures: set VOLTA_ML_GOLDEN or place ../shared/golden beside the checkout"))]


def load(path):
    return torch.load(path, map_location="cpu", weights_only=True)


def assert_close(name, got, exp, atol, rtol):
    assert got is not None, f"{name}: not computed"
    assert tuple(got.shape) == tuple(exp.shape), f"{name}: shape {tuple(got.shape)} != {tuple(exp.shape)}"
    g, e = got.detach().double(), exp.double()
    assert torch.isfinite(g).all(), f"{name}: non-finite values"
    diff = (g - e).abs()
    assert bool((diff <= atol + rtol * e.abs()).all()), f"{name}: max abs diff {diff.max():.3e}"


def check_outputs(fdir, meta, model_kind, expected_file, dtype):
    path = fdir / expected_file
    if not path.exists():
        return 0
    expected, inputs = load(path), load(fdir / "inputs.pt")
    atol, rtol = TOL[dtype]
    if meta.get("is_m3p") and dtype == torch.float64:
        atol = rtol = M3P_TOL64
    run = load_for_parity(str(fdir), kind=model_kind, dtype=dtype)
    n = 0
    for batch_name, outputs in expected.items():
        batch = {k: (v.to(dtype) if v.is_floating_point() else v).clone() for k, v in inputs[batch_name].items()}
        tids = meta.get("single_batch_tasks" if batch_name == "single" else "pair_batch_tasks", []) \
            if model_kind == "tasks" else []
        got = run(batch, tids)
        for key, exp in outputs.items():
            if key.startswith("logits/") or key in got:
                assert_close(f"{fdir.name}/{model_kind}/{batch_name}/{key}/{dtype}", got.get(key), exp, atol, rtol)
                n += 1
    return n


@pytest.mark.parametrize("fdir", fixtures())
def test_golden_fixture(fdir):
    meta = json.loads((fdir / "meta.json").read_text())
    kind = meta.get("kind", "tasks")
    if kind == "hf_init":
        expected = json.loads((fdir / "expected_loading.json").read_text())
        hf = load(fdir / "hf_text_checkpoint.bin")
        result = hf_init_for_parity(str(fdir))
        sd = result["state_dict"]
        for key, sources in expected["loaded_from"].items():
            assert torch.equal(sd[key], hf[sources[0]].to(sd[key].dtype)), f"{key} not initialised from {sources[0]}"
        for key in expected["not_loaded_keys"]:
            assert not any(t.shape == sd[key].shape and torch.equal(t.to(sd[key].dtype), sd[key])
                           for t in hf.values()), f"{key} received an HF tensor; VOLTA leaves it random"
        assert set(result["missing_keys"]) == set(expected["missing_keys"])
        assert set(result["unexpected_keys"]) == set(expected["unexpected_keys"])
        return
    jobs = [("tasks", "expected.pt", "expected_fp64.pt")]
    if kind == "pretrained_to_tasks":
        jobs.append(("pretraining", "expected_pretraining.pt", "expected_pretraining_fp64.pt"))
    compared = 0
    for model_kind, f32, f64 in jobs:
        compared += check_outputs(fdir, meta, model_kind, f32, torch.float32)
        compared += check_outputs(fdir, meta, model_kind, f64, torch.float64)
    assert compared > 0, f"{fdir}: no expected outputs found"
