"""benchmarks/gpu_check.py: every check runs with --quick on the CPU (so the GPU check cannot rot), a failing
check is reported while the others still run, the goals are judged from the rows, and the HF architectures built
on the meta device are really initialised."""
from __future__ import annotations

import json
import sys
import time
from importlib.util import find_spec
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import gpu_check  # noqa: E402
import gpu_check_hf  # noqa: E402
import gpu_check_report  # noqa: E402
import gpu_check_vllm  # noqa: E402
import gpu_check_zoo  # noqa: E402

EXPECTED = {  # check -> a field every measured row of it carries
    "device": "torch", "parity": "item", "train_step": "samples_per_s", "retrieval": "pairs_per_s",
    "extraction": "images_per_s", "cvqa_zoo": "questions_per_s", "cvqa_hf": "questions_per_s", "ddp": "speedup",
    "cvqa_vllm": "questions_per_s",
    "hf_train": "samples_per_s", "pretrain": "samples_per_s", "hf_fsdp": "states_gib"}


@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.vllm) if n == "cvqa_vllm" else n
                                  for n in gpu_check.CHECK_NAMES])     # cvqa_vllm: also in CI's vLLM stage
def test_every_check_runs_quick_on_cpu(tmp_path, name):
    report = gpu_check.main(["--quick", "--device", "cpu", "--in-process", "--only", name, "--out", str(tmp_path)])
    entry = report["checks"][name]
    assert entry["status"] == "ok", entry["detail"]
    if name == "parity" and gpu_check_zoo.golden_folder() is None:  # a fresh clone: nothing to compare
        assert [r["status"] for r in entry["rows"]] == ["skipped"] and "no golden fixtures" in entry["rows"][0]["reason"]
        pytest.skip(f"parity: {entry['rows'][0]['reason']}")
    if name == "cvqa_vllm" and find_spec("vllm") is None:  # the main environment: one row saying why
        assert [r["status"] for r in entry["rows"]] == ["skipped"] and "not installed" in entry["rows"][0]["reason"]
        pytest.skip(f"cvqa_vllm: {entry['rows'][0]['reason']} (CI's vLLM stage, pytest -m vllm, runs it)")
    measured = [r for r in entry["rows"] if r.get("status") != "skipped"]
    assert measured and all(EXPECTED[name] in r for r in measured), entry["rows"]
    if name == "train_step":
        assert {r["precision"] for r in measured} == {"fp32", "bf16"}
        assert all(r["samples_per_s"] > 0 and r["flops_per_sample"] > 0 and r["mfu"] is None for r in measured)
        # on the CPU no peak is known, so MFU is not measured; the step ratio is judged from the rows
        goals = {(g["config"], g["goal"].split()[1]): g for g in report["goal_results"]}
        assert {c for c, _ in goals} == set(gpu_check_zoo.QUICK_CONFIGS)
        assert all(g["status"] == "not measured" and g["value"] is None for (_, kind), g in goals.items() if kind == "MFU")
        assert all(g["status"] in ("pass", "FAIL") and g["value"] > 0 for (_, kind), g in goals.items() if kind == "step")
    if name == "pretrain":
        assert {r["precision"] for r in measured} == {"fp32", "bf16"} and all(r["finite"] for r in measured)
    if name == "cvqa_vllm":
        assert [r["item"] for r in measured] == list(gpu_check_vllm.ITEMS.values())
        assert all(r["engine"]["engine"] == "vllm" and r["questions_per_s"] > 0 for r in measured)
        assert [g["status"] for g in report["goal_results"] if "vllm" in g["config"]] == ["not measured"]  # quick
    if name == "cvqa_hf":
        assert [r["item"] for r in measured] == list(gpu_check_hf.BACKENDS)
        assert all(r["finite"] for r in measured)
    if name == "hf_train":
        assert [r["item"] for r in measured] == list(gpu_check_hf.TRAIN_JOBS)
        assert all(r["finite"] and r["samples_per_s"] > 0 for r in measured)
        lora = [r for r in measured if r["kind"] == "lora"]    # LoRA trains a small share of the weights
        assert lora and all(0 < r["trainable_m"] < r["params_b"] * 1e3 / 10 for r in lora), lora
    if name == "hf_fsdp":   # one sharded step through the engine; its checkpoint read back equal
        assert [r["item"] for r in measured] == list(gpu_check_hf.FSDP_JOBS)
        assert all(r["finite"] and r["checkpoint_restored"] and r["units"] == 3 for r in measured), measured
    if name == "parity":  # fixtures present: something must have been compared, and it must agree
        assert measured[0]["status"] == "ok" and measured[0]["failed"] == 0 and measured[0]["compared"] > 0
    saved = json.loads((tmp_path / "report.json").read_text())
    assert saved["checks"][name]["status"] == "ok"
    assert f"### {name}: ok" in (tmp_path / "report.md").read_text()


def test_checks_run_in_their_own_process_and_a_failure_does_not_stop_the_rest(tmp_path, monkeypatch):
    report = gpu_check.main(["--quick", "--device", "cpu", "--only", "device", "--out", str(tmp_path / "a")])
    assert report["checks"]["device"]["status"] == "ok" and report["checks"]["device"]["rows"][0]["torch"]

    def broken(ctx):
        ctx.row(item="first half", value=1.0)
        raise RuntimeError("CUDA error: out of memory")

    def fine(ctx):
        ctx.row(item="measured", value=2.0)

    monkeypatch.setattr(gpu_check, "_checks", lambda: {"device": (broken, 5, "breaks"), "ddp": (fine, 5, "works")})
    report = gpu_check.main(["--quick", "--device", "cpu", "--in-process", "--only", "device", "ddp",
                             "--out", str(tmp_path / "b")])
    failed, ok = report["checks"]["device"], report["checks"]["ddp"]
    assert failed["status"] == "failed" and "out of memory" in failed["detail"]
    assert failed["rows"] == [{"item": "first half", "value": 1.0}]  # what it measured before failing is kept
    assert ok["status"] == "ok" and ok["rows"][0]["value"] == 2.0
    text = (tmp_path / "b" / "report.md").read_text()
    assert "### device: failed" in text and "out of memory" in text and "### ddp: ok" in text


def test_a_spent_total_budget_skips_the_remaining_checks(tmp_path):
    report = gpu_check.main(["--quick", "--device", "cpu", "--in-process", "--only", "device", "ddp",
                             "--total-budget", "5", "--out", str(tmp_path)])
    assert report["checks"]["device"]["status"] == "skipped"
    assert "total budget" in report["checks"]["ddp"]["detail"]


def test_context_skips_work_that_does_not_fit_its_budget(tmp_path):
    ctx = gpu_check.Context("x", True, "cpu", time.monotonic() + 3, tmp_path / "rows.jsonl")
    assert not ctx.skip_if_late("small", 1) and ctx.skip_if_late("big", 60)
    assert gpu_check.read_rows(tmp_path / "rows.jsonl")[0]["item"] == "big"


def test_goals_are_judged_from_the_train_step_rows():
    rows = [{"config": "a", "precision": "fp32", "samples_per_s": 100.0, "volta_scheme_samples_per_s": 50.0},
            {"config": "a", "precision": "bf16", "samples_per_s": 200.0, "mfu": 0.40},
            {"config": "b", "precision": "fp32", "samples_per_s": 100.0, "volta_scheme_samples_per_s": None},
            {"config": "b", "precision": "bf16", "samples_per_s": 120.0, "mfu": 0.20}]
    goals = gpu_check_report.goal_results({"checks": {"train_step": {"rows": rows}}})
    got = {(g["config"], g["goal"].split()[1]): (g["status"], g["shown"]) for g in goals}
    assert got[("a", "step")] == ("pass", "4.00x") and got[("a", "MFU")] == ("pass", "40.0%")
    assert got[("b", "step")] == ("not measured", None) and got[("b", "MFU")] == ("FAIL", "20.0%")


def test_meta_device_build_is_initialised_like_a_real_model():
    model_cls, config = gpu_check_hf.clip_b32(quick=True)
    model = gpu_check_hf.materialise(model_cls, config, torch.device("cpu"), torch.float32)
    ids = model.text_model.embeddings.position_ids
    assert torch.equal(ids, torch.arange(ids.shape[-1]).expand_as(ids))
    weight = model.vision_model.encoder.layers[0].mlp.fc1.weight
    assert torch.isfinite(weight).all() and 0.01 < weight.std().item() < 0.5  # CLIP: std = (2 * width) ** -0.5
    assert torch.equal(model.text_model.final_layer_norm.weight, torch.ones(32))
    assert all(torch.isfinite(p).all() for p in model.parameters())  # also what init_weights leaves (logit_scale)


def _golden_copy(tmp_path, names_kinds):
    """A golden folder holding only some of the shared fixtures (copied), with its own manifest."""
    import shutil
    from conftest import shared_path
    src = shared_path("golden")
    dst = tmp_path / "golden"
    dst.mkdir()
    for name, kind in names_kinds:
        shutil.copytree(src / name, dst / name)
    (dst / "manifest.json").write_text(json.dumps({"fixtures": [{"name": n, "kind": k} for n, k in names_kinds]}))
    return dst


def test_quick_parity_picks_a_fixture_the_folder_holds(tmp_path, monkeypatch):
    """A golden folder without uc2_base__A: --quick compares one of its own fixtures (it used to pass `--only
    uc2_base__A`, compare nothing and say ok)."""
    golden = _golden_copy(tmp_path, [("ctrl_uniter_base__A", "tasks"), ("hf_init__ctrl_uniter_base__A", "hf_init")])
    monkeypatch.setenv("VOLTA_ML_GOLDEN", str(golden))
    report = gpu_check.main(["--quick", "--device", "cpu", "--in-process", "--only", "parity", "--out", str(tmp_path / "o")])
    rows = report["checks"]["parity"]["rows"]
    assert rows[0]["status"] == "ok" and rows[0]["compared"] > 0 and rows[0]["failed"] == 0, rows
    assert [r["item"] for r in rows[1:]] == ["bf16 drift ctrl_uniter_base__A"]


def test_parity_that_compares_nothing_is_skipped_not_ok(tmp_path, monkeypatch):
    golden = _golden_copy(tmp_path, [("hf_init__ctrl_uniter_base__A", "hf_init")])
    monkeypatch.setenv("VOLTA_ML_GOLDEN", str(golden))
    report = gpu_check.main(["--quick", "--device", "cpu", "--in-process", "--only", "parity", "--out", str(tmp_path / "o")])
    rows = report["checks"]["parity"]["rows"]
    assert [r["status"] for r in rows] == ["skipped"] and "no tasks fixture" in rows[0]["reason"], rows


def test_quick_fixture_choice():
    names = ["pretrained__ctrl_uniter_base__A", "ctrl_uniter_base__A", "hf_init__x", "uc2_base__A"]
    kinds = {"pretrained__ctrl_uniter_base__A": "pretrained_to_tasks", "hf_init__x": "hf_init"}
    assert gpu_check_zoo.quick_fixture(names, kinds) == "uc2_base__A"
    # ctrl_uniter_base__A is a substring of the pretrained fixture's name: --only would run both
    assert gpu_check_zoo.quick_fixture(names[:3] + ["ctrl_lxmert__A"], kinds) == "ctrl_lxmert__A"
    assert gpu_check_zoo.quick_fixture(["hf_init__x"], kinds) is None


def test_cvqa_vllm_real_shape_folder(tmp_path):
    """The GPU row's model folder: LLaVA-1.5-7B's shapes (7.06 B parameters on the meta device), 576 image tokens
    per photo through its processor, the renderer of --backend vllm built from it (no weights anywhere)."""
    from transformers import AutoModelForImageTextToText, AutoProcessor
    from volta_ml.hf import ModelSpec
    from volta_ml.hf.vllm_engine import _meta_model

    folder = gpu_check_vllm.real_shape_folder(tmp_path / "llava")
    model = _meta_model(ModelSpec(str(folder)))
    assert 7.0e9 < sum(p.numel() for p in model.parameters()) < 7.1e9
    proc = AutoProcessor.from_pretrained(folder)
    from PIL import Image
    ids = proc(text=["<image>\nwhat?"], images=[Image.new("RGB", (400, 300))], return_tensors="pt")["input_ids"][0]
    assert int((ids == model.config.image_token_index).sum()) == 576
    assert not list(folder.glob("*.safetensors"))
