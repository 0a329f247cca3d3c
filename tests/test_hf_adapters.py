"""What is checked when a peft adapter is attached (`hf/loading.attach_adapter`, docs/hf_models.md), from the three
command lines that take one: `iglue-hf --adapter`, `cvqa score --adapter`, `train --hf_adapter` (#34, #35).

The adapter is a LoRA made here with peft's `get_peft_model` + `save_pretrained` on the tiny Qwen2-VL of
tests/helpers_vlm_families.py (random LoRA B, so that it changes the scores); its variants are written as a user's
mistakes would leave them. Tiny Qwen2-VL and Qwen2.5-VL (same module names and widths) are built once per session.
"""
from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
import torch
from PIL import Image

from helpers_cvqa import write_release
from helpers_hf_train import make_xvnli_root
from helpers_vlm_families import build_family, shared_root
from volta_ml.cli import main
from volta_ml.hf import ModelLoadError, ModelSpec, load_backend
from volta_ml.hf.loading import loading_report

pytestmark = pytest.mark.usefixtures("one_thread")
WEIGHTS = "adapter_model.safetensors"


@pytest.fixture(scope="module")
def models():
    return {name: build_family(name, shared_root()) for name in ("qwen2-vl", "qwen2.5-vl")}


@pytest.fixture(scope="module")
def adapter(models, tmp_path_factory):
    """A LoRA on the language model's q/v projections of the tiny Qwen2-VL, saved by peft as training saves it."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForImageTextToText

    from volta_ml.hf.loading import load_model
    model = load_model(AutoModelForImageTextToText, ModelSpec(str(models["qwen2-vl"])), "a generative model")
    torch.manual_seed(0)
    peft_model = get_peft_model(model, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"],
                                                  init_lora_weights=False))
    out = tmp_path_factory.mktemp("adapter") / "hf_best"
    peft_model.save_pretrained(out)
    return out


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    root = tmp_path_factory.mktemp("data")
    xvnli_root, images = make_xvnli_root(root, n_train=8, n_val=4)
    return {"root": xvnli_root, "images": images, "dev": xvnli_root / "XVNLI/annotations/en/dev.jsonl",
            "cvqa": write_release(root / "cvqa", "latest")}


def variant(adapter: Path, out: Path, change) -> Path:
    """A copy of the adapter folder changed by `change(folder)`."""
    shutil.copytree(adapter, out)
    change(out)
    return out


def edit_config(folder: Path, **values) -> None:
    config = json.loads((folder / "adapter_config.json").read_text())
    config.update(values)
    (folder / "adapter_config.json").write_text(json.dumps(config))


def edit_weights(folder: Path, rename) -> None:
    from safetensors.torch import load_file, save_file
    state = load_file(folder / WEIGHTS)
    save_file({rename(k): v for k, v in state.items() if rename(k)}, folder / WEIGHTS)


def iglue_hf(model, data, out, *extra) -> list[str]:
    return ["iglue-hf", "--backend", "mllm", "--model", str(model), "--task", "xvnli", "--lang", "en",
            "--annotations", str(data["dev"]), "--images", str(data["images"]), "--output_dir", str(out),
            "--no_progress", *extra]


def cvqa(model, data, out, *extra) -> list[str]:
    return ["cvqa", "score", "--backend", "mllm", "--model", str(model), "--data", str(data["cvqa"]), "--output_dir",
            str(out), "--device", "cpu", "--no-progress", "--conditions", "en-aware", "--no-text-only", "--limit", "2",
            *extra]


def train(model, data, out, *extra) -> list[str]:
    return ["train", "--hf_model", str(model), "--task", "xvnli", "--data_root", str(data["root"]), "--images",
            str(data["images"]), "--output_dir", str(out / "save"), "--logdir", str(out / "logs"), "--batch_size", "4",
            "--num_epoch", "1", "--num_workers", "0", "--num_val_workers", "0", *extra]


def refused(argv, capsys) -> str:
    """Run the command: exit 2, no traceback, exactly one error line; returns it."""
    capsys.readouterr()
    code = main(argv)
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if ": error: " in line]
    assert code == 2 and "Traceback" not in err and len(lines) == 1, (code, err[-2000:])
    return lines[0]


def test_an_adapter_whose_tensors_do_not_all_load_is_refused_by_each_command(models, adapter, data, tmp_path, capsys):
    """#34: an empty adapter, renamed keys, other target modules: peft only warns; here one line names what does not
    load, from `iglue-hf`, `cvqa score` and `train --hf_adapter` (which started from a fresh zero LoRA)."""
    empty = variant(adapter, tmp_path / "empty", lambda f: edit_weights(f, lambda k: None))
    renamed = variant(adapter, tmp_path / "renamed", lambda f: edit_weights(f, lambda k: k.replace("lora_A", "A")))
    targets = variant(adapter, tmp_path / "targets", lambda f: edit_config(f, target_modules=["k_proj"]))
    line = refused(iglue_hf(models["qwen2-vl"], data, tmp_path / "out", "--adapter", str(empty)), capsys)
    assert line.startswith(f"volta-ml iglue-hf: error: adapter {empty}: 8 of the 8 adapter tensors") and \
        f"are not in {WEIGHTS} (base_model.model.model.language_model.layers.0.self_attn.q_proj.lora_A.weight" in line
    assert not (tmp_path / "out" / "iglue_hf_results.json").exists()
    line = refused(cvqa(models["qwen2-vl"], data, tmp_path / "cvqa", "--adapter", str(renamed)), capsys)
    assert f"adapter {renamed}: 4 of its 8 tensors match no adapter module of this model (" \
           "base_model.model.model.language_model.layers.0.self_attn.q_proj.A.weight" in line
    assert "4 of the 8 adapter tensors" in line
    line = refused(train(models["qwen2-vl"], data, tmp_path / "train", "--hf_adapter", str(targets)), capsys)
    assert line.startswith(f"volta-ml train: error: --hf_adapter: adapter {targets}: 8 of its 8 tensors match no "
                           "adapter module") and "4 of the 4 adapter tensors" in line and "k_proj.lora_A" in line
    assert not list((tmp_path / "train").rglob("out.txt")), "training must not start"
    # a refused adapter leaves no LoRA layer in the model; the adapter itself loads, and changes the scores
    from transformers import AutoModelForImageTextToText

    from volta_ml.hf.loading import attach_adapter, load_model
    model = load_model(AutoModelForImageTextToText, ModelSpec(str(models["qwen2-vl"])), "a generative model")
    with pytest.raises(ModelLoadError, match="are not in adapter_model.safetensors"):
        attach_adapter(model, ModelSpec(str(models["qwen2-vl"]), adapter=str(empty)))
    assert not any("lora" in name for name, _ in model.named_modules())
    photo = [[Image.new("RGB", (40, 30), (200, 30, 30))]]
    scores = [load_backend("mllm", ModelSpec(str(models["qwen2-vl"]), adapter=a)).choice_logits(photo, ["Is it?"],
                                                                                               ["A", "B"])
              for a in (None, str(adapter))]
    assert not torch.allclose(*scores, atol=1e-4)


def test_an_adapter_of_another_base_model_is_refused_unless_allowed_then_recorded(models, adapter, data, tmp_path,
                                                                                  capsys):
    """#34: a Qwen2-VL adapter on Qwen2.5-VL (same module names and widths: every tensor loads) is refused in one line
    naming both bases; `--allow_adapter_base_mismatch` applies it and the results record the mismatch."""
    base = models["qwen2.5-vl"]
    line = refused(iglue_hf(base, data, tmp_path / "out", "--adapter", str(adapter)), capsys)
    assert line == (f"volta-ml iglue-hf: error: adapter {adapter} was trained on another model (base model class "
                    "Qwen2VLForConditionalGeneration, the model is a Qwen2_5_VLForConditionalGeneration; base model "
                    f"{models['qwen2-vl']}, the model is {base}); --allow_adapter_base_mismatch applies it anyway and "
                    "records that in the results")
    assert main(iglue_hf(base, data, tmp_path / "out", "--adapter", str(adapter), "--allow_adapter_base_mismatch")) == 0
    results = json.loads((tmp_path / "out" / "iglue_hf_results.json").read_text())
    recorded = results["loading_report"]["model"]["adapter_base_mismatch"]
    assert recorded.startswith(f"{adapter}: base model class Qwen2VLForConditionalGeneration")
    assert results["spec"]["allow_adapter_base_mismatch"] is True
    assert main(cvqa(base, data, tmp_path / "cvqa", "--adapter", str(adapter), "--allow_adapter_base_mismatch")) == 0
    results = json.loads((tmp_path / "cvqa" / "cvqa_results.json").read_text())
    assert results["loading_report"]["model"]["adapter_base_mismatch"] == recorded
    assert results["allow_adapter_base_mismatch"] is True
    line = refused(train(base, data, tmp_path / "train", "--hf_adapter", str(adapter)), capsys)
    assert line.startswith(f"volta-ml train: error: --hf_adapter: adapter {adapter} was trained on another model")
    # what training on it records: the base it is trained on from now on (model, class, revision)
    from types import SimpleNamespace

    from transformers import AutoModelForImageTextToText

    from volta_ml.hf.families import FAMILIES
    from volta_ml.hf.loading import load_model
    from volta_ml.iglue_hf.lora import add_lora
    sha = "c" * 40
    for start in (str(adapter), ""):
        model = load_model(AutoModelForImageTextToText, ModelSpec(str(base)), "a generative model")
        args = SimpleNamespace(hf_adapter=start, allow_adapter_base_mismatch=bool(start), lora_target=None, lora_r=2,
                               lora_alpha=4, lora_dropout=0.0, train_projector=False)
        add_lora(model, FAMILIES["qwen2_5_vl"], args, ModelSpec(str(base), revision=sha)).save_pretrained(
            tmp_path / "again")
        config = json.loads((tmp_path / "again" / "adapter_config.json").read_text())
        assert (config["base_model_name_or_path"], config["revision"], config["auto_mapping"]["base_model_class"]) \
            == (str(base), sha, "Qwen2_5_VLForConditionalGeneration")


def test_the_rule_for_the_same_base_model(models, adapter, tmp_path):
    """A local folder, a hub id and a folder of the Hugging Face cache name the same model when the rule says so
    (docs/hf_models.md); commits are compared where both are known; the recorded class is compared always."""
    from volta_ml.hf.loading import adapter_base_mismatch, model_identity, same_model
    sha, other = "a" * 40, "b" * 40

    def same(recorded, loaded, revision=None, recorded_revision=None):
        return same_model(model_identity(recorded, recorded_revision), model_identity(loaded, revision))
    cached = f"/home/u/.cache/huggingface/hub/models--Qwen--Qwen2-VL-2B-Instruct/snapshots/{sha}"
    assert same("/scratch/u/Qwen2-VL-2B-Instruct", "Qwen/Qwen2-VL-2B-Instruct")          # a copy named as the repo
    assert same("Qwen/Qwen2-VL-2B-Instruct", "/data/models/qwen2-vl-2b-instruct/")
    assert same(cached, "Qwen/Qwen2-VL-2B-Instruct") and same(cached, "qwen/qwen2-vl-2b-instruct", "main")
    assert same(cached, "Qwen/Qwen2-VL-2B-Instruct", sha) and not same(cached, "Qwen/Qwen2-VL-2B-Instruct", other)
    assert not same("Qwen/Qwen2-VL-2B-Instruct", "Qwen/Qwen2-VL-2B-Instruct", other, recorded_revision=sha)
    assert not same("Qwen/Qwen2-VL-2B-Instruct", "Qwen/Qwen2.5-VL-3B-Instruct")
    assert not same("someone/Qwen2-VL-2B-Instruct", "Qwen/Qwen2-VL-2B-Instruct")           # a fine-tune of it
    assert not same("/scratch/u/Qwen2-VL-2B", "/scratch/u/Qwen2-VL-2B-Instruct")

    class Qwen2VLForConditionalGeneration(torch.nn.Module):
        pass
    config = {"base_model_name_or_path": "Qwen/Qwen2-VL-2B-Instruct",
              "auto_mapping": {"base_model_class": "Qwen2_5_VLForConditionalGeneration"}}
    assert adapter_base_mismatch(config, Qwen2VLForConditionalGeneration(), ModelSpec(cached)) == \
        "base model class Qwen2_5_VLForConditionalGeneration, the model is a Qwen2VLForConditionalGeneration"
    # end to end: an adapter recording the hub id of the model loaded from a local folder of that name
    hub = variant(adapter, tmp_path / "hub", lambda f: edit_config(f, base_model_name_or_path="Qwen/qwen2-vl"))
    assert loading_report(load_backend("mllm", ModelSpec(str(models["qwen2-vl"]), adapter=str(hub)))) == {}


@pytest.mark.parametrize("case, expected", [
    ("rank", "adapter {}: tensor base_model.model.model.language_model.layers.0.self_attn.q_proj.lora_A.weight has "
             "shape [4, 64] in the weights, [8, 64] in the model built from its config: the config does not describe "
             "these weights"),
    ("no_weights", "adapter folder {} has no adapter_model.safetensors or adapter_model.bin (the weights peft's "
                   "save_pretrained writes beside adapter_config.json)"),
    ("peft_type", "adapter {}: adapter_config.json has peft_type 'NOT_A_TYPE', not an adapter type of the installed "
                  "peft"),
])
def test_a_broken_adapter_folder_is_one_line_naming_it_and_what_is_wrong(models, adapter, data, tmp_path, capsys,
                                                                         case, expected):
    """#35: a LoRA rank that is not the weights' (was: `Error(s) in loading state_dict for PeftModel:`), no weights
    file (was: peft's hub fallback, `Repo id must be in the form ...`), an unknown peft_type (was: `('NOT_A_TYPE')`)."""
    change = {"rank": lambda f: edit_config(f, r=8), "no_weights": lambda f: os.remove(f / WEIGHTS),
              "peft_type": lambda f: edit_config(f, peft_type="NOT_A_TYPE")}[case]
    broken = variant(adapter, tmp_path / case, change)
    line = refused(iglue_hf(models["qwen2-vl"], data, tmp_path / "out", "--adapter", str(broken)), capsys)
    assert line.startswith("volta-ml iglue-hf: error: " + expected.format(broken)), line


def _pickle_bomb(marker: Path):
    class Bomb:
        def __reduce__(self):
            return os.mkdir, (str(marker),)
    return Bomb()


def test_pickle_weights_holding_more_than_tensors_are_refused_and_nothing_runs(models, adapter, data, tmp_path,
                                                                                capsys):
    """#35: `pytorch_model.bin` in a model folder and `adapter_model.bin` in an adapter folder that hold an object
    (here one whose unpickling would create a folder): one line naming the file, never torch's advice to load it
    with `weights_only=False`, and nothing in it ran."""
    from safetensors.torch import load_file
    marker = tmp_path / "ran"
    model = tmp_path / "model"
    shutil.copytree(models["qwen2-vl"], model)
    state = load_file(model / "model.safetensors")
    (model / "model.safetensors").unlink()
    torch.save({**state, "x": _pickle_bomb(marker)}, model / "pytorch_model.bin")
    line = refused(cvqa(model, data, tmp_path / "cvqa"), capsys)
    assert line.startswith(f"volta-ml cvqa: error: {model}: pytorch_model.bin: a pickle that holds more than "
                           "tensors (") and "weights_only" not in line and "ran nothing from it" in line

    def to_pickle(folder):
        weights = load_file(folder / WEIGHTS)
        (folder / WEIGHTS).unlink()
        torch.save({**weights, "x": _pickle_bomb(marker)}, folder / "adapter_model.bin")
    bad = variant(adapter, tmp_path / "bad", to_pickle)
    line = refused(iglue_hf(models["qwen2-vl"], data, tmp_path / "out", "--adapter", str(bad)), capsys)
    assert line.startswith(f"volta-ml iglue-hf: error: adapter {bad}: adapter_model.bin: a pickle that holds more "
                           "than tensors (") and "weights_only" not in line
    assert not marker.exists(), "the pickle's payload ran"
    plain = variant(adapter, tmp_path / "plain", lambda f: torch.save(load_file(f / WEIGHTS), f / "adapter_model.bin")
                    or (f / WEIGHTS).unlink())
    assert load_backend("mllm", ModelSpec(str(models["qwen2-vl"]), adapter=str(plain)))   # tensors only: fine
