"""A checkpoint that misses tensors is refused, not scored with random layers (issue 23, item 3).

A valid model.safetensors with the 9 tensors of one LM layer removed: `iglue-hf` and `cvqa score` exit 2 with one
line naming the keys (first few + count); with `--allow_missing_keys` they run and the result file records the
keys. The same check covers every HF backend (`hf/loading.load_model`, and M-CLIP's own text-tower loading).
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from conftest import shared_path
from helpers_cvqa import write_release
from helpers_hf import build, spec_extra
from helpers_iglue_hf import build_data_root, make_images
from volta_ml.cli import main
from volta_ml.hf import ModelLoadError, ModelSpec, load_backend
from volta_ml.iglue_hf.run import annotation_path

LAYER = "language_model.model.layers.1."


def without_tensors(model: Path, out: Path, prefix: str, extra: dict | None = None) -> tuple[Path, list[str]]:
    """A copy of `model` whose weights file lacks every tensor starting with `prefix` (plus `extra`)."""
    from safetensors.torch import load_file, save_file

    shutil.copytree(model, out)
    file = out / "model.safetensors"
    state = load_file(file) if file.is_file() else torch.load(out / "pytorch_model.bin", weights_only=True)
    dropped = sorted(k for k in state if k.startswith(prefix))
    kept = {k: v for k, v in state.items() if k not in dropped}
    if file.is_file():
        save_file({**kept, **(extra or {})}, file, metadata={"format": "pt"})
    else:
        torch.save({**kept, **(extra or {})}, out / "pytorch_model.bin")
    return out, dropped


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("loading_report")
    llava = build("llava", root / "models")
    cut, dropped = without_tensors(llava, root / "llava-cut", LAYER)
    assert len(dropped) == 9
    return {"root": root, "llava": llava, "cut": cut}


def error_lines(err: str) -> list[str]:
    return [line for line in err.splitlines() if "error" in line]


def test_iglue_hf_refuses_missing_tensors_unless_allowed(models, tmp_path, capsys):
    root = build_data_root(shared_path("iglue", "datasets"), tmp_path / "datasets", cap=4)
    make_images("xvnli", Path(annotation_path("xvnli", "ar", "zero-shot", str(root), None)), "ar", tmp_path / "img")
    argv = ["iglue-hf", "--task", "xvnli", "--backend", "mllm", "--model", str(models["cut"]), "--lang", "ar",
            "--data_root", str(root), "--images", str(tmp_path / "img"), "--output_dir", str(tmp_path / "out"),
            "--no_progress"]
    assert main(argv) == 2
    lines = error_lines(capsys.readouterr().err)
    assert len(lines) == 1 and "the weights do not match a generative image-text model: 9 missing (" in lines[0]
    assert "model.language_model.layers.1.input_layernorm.weight" in lines[0] and "6 more" in lines[0]
    assert not (tmp_path / "out" / "iglue_hf_results.json").exists()
    assert main(argv + ["--allow_missing_keys"]) == 0
    results = json.loads((tmp_path / "out" / "iglue_hf_results.json").read_text())
    missing = results["loading_report"]["model"]["missing_keys"]
    assert len(missing) == 9 and all(k.startswith("model.language_model.layers.1.") for k in missing)


def test_cvqa_refuses_missing_tensors_unless_allowed(models, tmp_path, capsys):
    release = write_release(tmp_path / "cvqa", "latest")
    argv = ["cvqa", "score", "--backend", "mllm", "--model", str(models["cut"]), "--data", str(release),
            "--output_dir", str(tmp_path / "out"), "--device", "cpu", "--no-progress", "--conditions", "en-aware",
            "--no-text-only", "--limit", "2"]
    assert main(argv) == 2
    lines = error_lines(capsys.readouterr().err)
    assert len(lines) == 1 and "9 missing (model.language_model.layers.1." in lines[0]
    assert main(argv + ["--allow_missing_keys"]) == 0
    results = json.loads((tmp_path / "out" / "cvqa_results.json").read_text())
    assert len(results["loading_report"]["model"]["missing_keys"]) == 9
    assert main([a if a != str(models["cut"]) else str(models["llava"]) for a in argv]
                + ["--output_dir", str(tmp_path / "whole")]) == 0
    assert json.loads((tmp_path / "whole" / "cvqa_results.json").read_text())["loading_report"] == {}


def test_every_backend_checks_its_weights(models, tmp_path):
    """Unexpected tensors too, for a dual encoder; and M-CLIP's text tower, which is not loaded by transformers."""
    clip, _ = without_tensors(build("clip", models["root"] / "models"), tmp_path / "clip", "none",
                              extra={"stray.weight": torch.zeros(2)})
    with pytest.raises(ModelLoadError, match=r"1 unexpected \(stray.weight\)"):
        load_backend("clip", ModelSpec(str(clip)))
    backend = load_backend("clip", ModelSpec(str(clip), allow_missing_keys=True))
    from volta_ml.hf.loading import loading_report
    assert loading_report(backend) == {"model": {"unexpected_keys": ["stray.weight"]}}
    mclip = build("mclip", models["root"] / "models")
    cut, dropped = without_tensors(mclip, tmp_path / "mclip", "transformer.encoder.layer.0.")
    extra = spec_extra("mclip", mclip)
    with pytest.raises(ModelLoadError, match=rf"M-CLIP's text tower: {len(dropped)} missing \(transformer.encoder"):
        load_backend("mclip", ModelSpec(str(cut), extra=extra))
    backend = load_backend("mclip", ModelSpec(str(cut), extra=extra, allow_missing_keys=True))
    assert loading_report(backend)["text"]["missing_keys"] == dropped


def test_a_config_whose_sizes_differ_from_the_weights_is_one_line_naming_the_tensor(models, tmp_path, capsys):
    """#35: a config.json whose sizes are not the weights' (was: transformers' RuntimeError naming no tensor) is one
    line naming the first tensor and both shapes, refused even with --allow_missing_keys (the config does not
    describe the weights: a model built from it would run on reinitialised tensors)."""
    folder = tmp_path / "llava-config"
    shutil.copytree(models["llava"], folder)
    config = json.loads((folder / "config.json").read_text())
    config["text_config"]["intermediate_size"] = 48                       # the weights' MLPs are 64 wide
    (folder / "config.json").write_text(json.dumps(config))
    release = write_release(tmp_path / "cvqa", "latest")
    argv = ["cvqa", "score", "--backend", "mllm", "--model", str(folder), "--data", str(release), "--output_dir",
            str(tmp_path / "out"), "--device", "cpu", "--no-progress", "--conditions", "en-aware", "--no-text-only",
            "--limit", "2"]
    for extra in ([], ["--allow_missing_keys"]):
        assert main(argv + extra) == 2
        err = capsys.readouterr().err
        lines = error_lines(err)
        assert len(lines) == 1 and "Traceback" not in err and "LOAD REPORT" not in err
        assert lines[0] == (f"volta-ml cvqa: error: {folder}: tensor model.language_model.layers.0.mlp.down_proj.weight "
                            "has shape [32, 64] in the weights, [32, 48] in a generative image-text model built from "
                            "its config.json (and 5 more tensors): the config does not describe these weights")
