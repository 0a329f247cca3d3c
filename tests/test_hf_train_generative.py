"""LoRA fine-tuning of generative HF models on the engine (volta_ml/iglue_hf/train_generative.py), with tiny random
Qwen2-VL and Idefics3 models (tests/helpers_vlm_families.py) and a tiny XVNLI-style data root
(tests/helpers_hf_train.py: one-colour pictures, hypotheses naming a colour).

- training input = the iglue-hf scoring input + the answer's tokens (letter rule: the letter's token; generate
  rule: the answer and the end-of-turn token), for XVNLI, MaRVL on NLVR2 rows (two photos as two images: Qwen2-VL takes several) and xGQA;
- training lowers the loss; the xGQA run validates with the generate rule;
- 2 gloo ranks (torchrun) = 1 rank with the same global batch;
- SIGKILL mid-run + --resume_file = the uninterrupted run, bit for bit;
- hf_best/ (the adapter) reloaded by `iglue-hf --adapter` gives the in-memory model's logits and the training's
  best validation score, and differs from the zero-shot model;
- bad input is one line with exit code 2.
"""
import json
import random
import re
import subprocess
import sys
import time

import pytest
import torch

from helpers_hf_train import REPO, in_process, make_xvnli_root, train_env
from helpers_train import free_port
from helpers_vlm_families import build_family, shared_root

ENTRY = str(REPO / "tests" / "helpers_hf_train.py")
RUN_NAME = "XVNLI_qwen2-vl"
# 24 training examples at 8 per step: 3 optimizer steps per epoch, 3 epochs; no LoRA dropout, so that 2 ranks
# (4 examples each) compute what 1 rank computes
FLAGS = ["--task", "xvnli", "--batch_size", "8", "--num_epoch", "3", "--lr", "2e-2", "--warmup_proportion", "0",
         "--adam_correct_bias", "--adam_epsilon", "1e-4", "--num_workers", "0", "--num_val_workers", "0",
         "--checkpoint_every_steps", "1", "--lora_r", "4", "--lora_alpha", "32", "--lora_dropout", "0"]


@pytest.fixture(scope="module")
def models():
    return {name: build_family(name, shared_root()) for name in ("qwen2-vl", "idefics3")}


@pytest.fixture(scope="module")
def xvnli(tmp_path_factory):
    return make_xvnli_root(tmp_path_factory.mktemp("xvnli"), n_train=24, n_val=8)


def _argv(out, models, xvnli, *extra, model="qwen2-vl"):
    data, images = xvnli
    return ["--hf_model", str(models[model]), "--data_root", str(data), "--images", str(images),
            "--output_dir", str(out / "save"), "--logdir", str(out / "logs"), *FLAGS, *extra]


def _weights(out, name="pytorch_model_2.bin", run=RUN_NAME):
    return torch.load(out / "save" / run / name, map_location="cpu", weights_only=True)


def _validation(out, run=RUN_NAME, task="XVNLI"):
    text = (out / "save" / run / "out.txt").read_text()
    return [(float(loss), float(score)) for loss, score in
            re.findall(rf"Validation \[{task}\]: loss ([\d.]+) score ([\d.]+)", text)]


@pytest.fixture(scope="module")
def single(tmp_path_factory, models, xvnli):
    out = tmp_path_factory.mktemp("single")
    assert in_process(_argv(out, models, xvnli)) == 0
    return out


def _backend(path, adapter=None):
    from volta_ml.hf.base import ModelSpec
    from volta_ml.hf.mllm import GenerativeBackend
    return GenerativeBackend(ModelSpec(model=str(path), adapter=str(adapter) if adapter else None))


# --- what the model is trained on ----------------------------------------------------------------------------------
def _real(batch, i):
    return batch["input_ids"][i][batch["attention_mask"][i] == 1].tolist()


@pytest.mark.parametrize("name, task", [("qwen2-vl", "xvnli"), ("qwen2-vl", "marvl"), ("idefics3", "xgqa")])
def test_training_input_is_the_scoring_input_plus_the_answer(tmp_path, models, xvnli, name, task):
    from volta_ml.iglue_hf.data import read_task
    from volta_ml.iglue_hf.images import ImageSource
    from volta_ml.iglue_hf.prompts import OPTIONS, letter_choices, user_turn
    from volta_ml.iglue_hf.scoring import DEFAULT_RULES
    from volta_ml.iglue_hf.tasks import marvl_layout
    from volta_ml.iglue_hf.train_generative import AnswerDataset, Collate
    data, images = xvnli
    files = {"xvnli": data / "XVNLI/annotations/en/dev.jsonl", "marvl": tmp_path / "nlvr2.jsonl",
             "xgqa": tmp_path / "gqa.json"}
    # NLVR2 rows (images <identifier stem>-img0/1.png) and GQA questions over the XVNLI pictures
    for k, stem in enumerate(("dev-1-0", "dev-2-1")):
        for side in (0, 1):
            (images / f"{stem}-img{side}.png").write_bytes((images / f"{2000 + k + side}.jpg").read_bytes())
    files["marvl"].write_text("".join(json.dumps({"identifier": f"{stem}-{k}", "sentence": "both are red",
                                                  "label": label}) + "\n"
                                      for k, (stem, label) in enumerate((("dev-1-0", "False"), ("dev-2-1", "True")))))
    files["xgqa"].write_text(json.dumps({"7": {"question": "What colour is it?", "imageId": "2000", "answer": "red"},
                                         "8": {"question": "Is it dark?", "imageId": "2004", "answer": "yes"}}))
    backend = _backend(models[name])
    examples = read_task(task, str(files[task]), "en")[:2]
    rule = DEFAULT_RULES[task]
    layout = marvl_layout(backend, "auto") if task == "marvl" else None
    prompts = [user_turn(task, rule, e, layout, backend.vqa_frame) for e in examples]
    source = ImageSource(images, "{file}" if task == "marvl" else "{id}.jpg")
    dataset = AnswerDataset(examples, prompts, source, layout, backend, task, rule)
    items = [dataset[0], dataset[1]]
    batch = Collate(backend)(items)
    scored = backend.encode([it["images"] for it in items], prompts)
    # MaRVL: the two photos as two images for a model that takes several (Qwen2-VL), side by side otherwise
    assert [len(it["images"]) for it in items] == [2 if layout == "multi" else 1] * 2
    for i, (example, item) in enumerate(zip(examples, items)):
        answer = item["answer"].tolist()
        assert _real(batch["inputs"], i) == _real(scored, i) + answer
        assert batch["answer"][i][batch["answer_mask"][i] == 1].tolist() == answer
        if rule == "letter":   # the token the letter rule reads
            assert answer == backend.choice_ids(letter_choices(task), prompts[i])[OPTIONS[task].index(example.label)]
        else:                  # the answer, then the end of the turn, where generate stops
            assert backend.tokenizer.decode(answer) == f" {example.label}<end_of_utterance>"
    for key in ("pixel_values", "pixel_attention_mask"):
        if key in scored:
            assert torch.equal(batch["inputs"][key], scored[key])


# --- training on the engine -------------------------------------------------------------------------------------
def test_training_lowers_the_loss(single):
    validation = _validation(single)
    assert len(validation) == 3
    losses = [loss for loss, _ in validation]
    assert losses[-1] < losses[0], validation
    run = single / "save" / RUN_NAME
    assert (run / "hf_best" / "adapter_config.json").is_file() and (run / "hf_best" / "adapter_model.safetensors").is_file()
    saved = _weights(single)
    assert saved and all("lora_" in key for key in saved), sorted(saved)[:4]   # checkpoints: the LoRA tensors only


def test_gqa_trains_in_bf16_and_validates_with_the_generate_rule(tmp_path, models, xvnli):
    data, images = xvnli
    questions = {str(i): {"question": "What colour is the picture?", "imageId": str(2000 + i),
                          "answer": ["red", "green", "blue", "yellow", "black", "white"][i % 6]} for i in range(8)}
    (tmp_path / "gqa.json").write_text(json.dumps(questions))
    argv = ["--hf_model", str(models["idefics3"]), "--task", "15", "--data_root", str(data), "--images", str(images),
            "--train_annotations_jsonpath", str(tmp_path / "gqa.json"),
            "--val_annotations_jsonpath", str(tmp_path / "gqa.json"), "--output_dir", str(tmp_path / "save"),
            "--logdir", str(tmp_path / "logs"), "--batch_size", "4", "--num_epoch", "2", "--lr", "3e-2",
            "--warmup_proportion", "0", "--num_workers", "0", "--num_val_workers", "0", "--train_projector",
            "--gradient_checkpointing", "--hf_dtype", "bf16", "--amp", "bf16"]
    assert in_process(argv) == 0
    validation = _validation(tmp_path, "GQA_idefics3", "GQA")
    assert len(validation) == 2 and validation[1][0] < validation[0][0], validation
    adapter = json.loads((tmp_path / "save/GQA_idefics3/hf_best/adapter_config.json").read_text())
    assert adapter["modules_to_save"] == ["model.connector"]


def test_two_ranks_match_one_rank(tmp_path, models, xvnli, single):
    for _attempt in range(3):
        torchrun = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port",
                    str(free_port()), ENTRY, *_argv(tmp_path, models, xvnli)]
        proc = subprocess.run(torchrun, cwd=tmp_path, env=train_env(), capture_output=True, text=True, timeout=300)
        if "Address already in use" not in proc.stderr:
            break
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "world size 2" in proc.stderr and "4 per step x 1 accumulation x 2 processes" in proc.stderr
    two, one = _weights(tmp_path), _weights(single)
    assert two.keys() == one.keys()
    worst = max((two[k] - one[k]).abs().max().item() for k in one)
    assert worst < 1e-5, worst
    initial = _weights(single, "pytorch_model_-1.bin")
    assert any(not torch.equal(initial[k], one[k]) for k in one)   # it trained
    assert [s for _, s in _validation(tmp_path)] == [s for _, s in _validation(single)]


def test_sigkill_then_resume_matches_the_uninterrupted_run(tmp_path, models, xvnli, single):
    proc = subprocess.Popen([sys.executable, ENTRY, *_argv(tmp_path, models, xvnli)], cwd=tmp_path,
                            env=train_env(HF_TRAIN_SLEEP="0.3"), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    run = tmp_path / "save" / RUN_NAME
    deadline = time.time() + 180
    while not (run / "pytorch_ckpt_latest.tar").exists() and time.time() < deadline:   # the initial save comes
        time.sleep(0.05)                                                                  # right before step 1
    assert (run / "pytorch_ckpt_latest.tar").exists(), "training never started"
    time.sleep(random.uniform(0.4, 2.0))
    proc.kill()
    proc.communicate()
    assert not (run / "pytorch_model_2.bin").exists(), "the run finished before the kill"
    step = torch.load(run / "pytorch_ckpt_latest.tar", weights_only=True)["global_step"]
    assert in_process(_argv(tmp_path, models, xvnli, "--resume_file", str(run / "pytorch_ckpt_latest.tar"))) == 0
    reference, again = _weights(single), _weights(tmp_path)
    assert all(torch.equal(reference[k], again[k]) for k in reference), f"killed at step {step}"


# --- the adapter through the iglue-hf evaluation -------------------------------------------------------------------
def test_adapter_reloads_in_iglue_hf_as_the_trained_model(tmp_path, models, xvnli, single, capsys):
    from peft import PeftConfig, get_peft_model
    from volta_ml.cli import main
    from volta_ml.iglue_hf.data import read_xvnli
    from volta_ml.iglue_hf.images import ImageSource
    from volta_ml.iglue_hf.prompts import user_turn
    from volta_ml.iglue_hf.train_generative import GenerativeForTraining
    data, images = xvnli
    dev = data / "XVNLI/annotations/en/dev.jsonl"
    exported = single / "save" / RUN_NAME / "hf_best"
    examples = read_xvnli(str(dev), "en")
    source = ImageSource(images, "{id}.jpg")
    batch = [[source.load(e.images[0])] for e in examples], [user_turn("xvnli", "letter", e) for e in examples]

    in_memory = _backend(models["qwen2-vl"])       # base + LoRA with the best checkpoint's tensors
    config = PeftConfig.from_pretrained(exported)
    config.inference_mode = False                   # trainable LoRA tensors: what the checkpoint holds
    trained = GenerativeForTraining(get_peft_model(in_memory.model, config), in_memory)
    trained.load_state_dict(_weights(single, "pytorch_model_best.bin"))
    trained.eval()
    logits = {name: backend.choice_logits(*batch, ["A", "B", "C"]) for name, backend in (
        ("in_memory", in_memory), ("reloaded", _backend(models["qwen2-vl"], exported)),
        ("zero_shot", _backend(models["qwen2-vl"])))}
    assert torch.equal(logits["in_memory"], logits["reloaded"])
    assert not torch.allclose(logits["zero_shot"], logits["reloaded"], atol=1e-3)

    capsys.readouterr()
    out = tmp_path / "eval"
    assert main(["iglue-hf", "--backend", "mllm", "--model", str(models["qwen2-vl"]), "--adapter", str(exported),
                 "--task", "xvnli", "--lang", "en", "--annotations", str(dev), "--images", str(images),
                 "--output_dir", str(out), "--no_progress"]) == 0
    results = json.loads((out / "iglue_hf_results.json").read_text())
    assert results["metrics"]["score"] == pytest.approx(max(s for _, s in _validation(single)), abs=1e-3)
    assert results["model"] == f"qwen2-vl+{RUN_NAME}" and results["spec"]["adapter"] == str(exported)


def test_the_adapter_content_keys_the_resume_chunks(tmp_path, single):
    from volta_ml.iglue_hf.run import model_contents
    exported = single / "save" / RUN_NAME / "hf_best"
    other = tmp_path / "other"
    other.mkdir()
    for file in exported.iterdir():
        (other / file.name).write_bytes(file.read_bytes())
    opts = {"model": str(exported), "revision": None, "extra": None}
    same = model_contents(dict(opts, adapter=str(other)))
    assert same == model_contents(dict(opts, adapter=str(other))) and "adapter_content" in same
    weights = other / "adapter_model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-1] + b" ")
    assert model_contents(dict(opts, adapter=str(other)))["adapter_content"] != same["adapter_content"]


# --- bad input ----------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("case, expected", [
    ("unknown_family", "is not a generative family volta-ml can fine-tune"),
    ("retrieval", "is not a task a generative model fine-tunes on"),
    ("lora_target", "--lora_target nope_proj: no linear layer of that name in the language model"),
    ("adapter_missing", "--hf_adapter: adapter folder"),
    ("no_val_file", "dev file"),
])
def test_bad_input_is_one_line_with_exit_2(tmp_path, models, xvnli, capsys, case, expected):
    from volta_ml.cli import main
    argv = _argv(tmp_path, models, xvnli)
    if case == "unknown_family":
        (tmp_path / "bert").mkdir()
        (tmp_path / "bert" / "config.json").write_text(json.dumps({"model_type": "bert"}))
        argv[argv.index("--hf_model") + 1] = str(tmp_path / "bert")
        argv += ["--hf_backend", "mllm"]
    elif case == "retrieval":
        argv[argv.index("--task") + 1] = "8"
    elif case == "lora_target":
        argv += ["--lora_target", "q_proj,nope_proj"]
    elif case == "adapter_missing":
        argv += ["--hf_adapter", str(tmp_path / "nowhere")]
    elif case == "no_val_file":
        argv += ["--val_split", "nosuchsplit"]
        expected = f"XVNLI val file {xvnli[0]}/XVNLI/annotations/en/nosuchsplit.jsonl does not exist"
    code = main(["train", *argv])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2, err[-3:]
    assert err[-1].startswith("volta-ml train: error: ") and expected in err[-1], err[-1]
    assert not (tmp_path / "save" / RUN_NAME / "out.txt").exists()


def test_an_image_that_cannot_be_decoded_stops_training_in_one_line(tmp_path, models, xvnli, capsys):
    """Training does not skip an undecodable photo (that would change what is trained on; iglue-hf and cvqa score
    score such an example without its image instead): one line naming the file, exit code 2."""
    import shutil

    from volta_ml.cli import main
    data, images = xvnli
    shutil.copytree(images, tmp_path / "images")
    bad = tmp_path / "images" / "2005.jpg"            # a training photo, cut short
    bad.write_bytes(bad.read_bytes()[:100])
    argv = _argv(tmp_path, models, (data, tmp_path / "images"))
    code = main(["train", *argv])
    err = capsys.readouterr().err
    line = err.strip().splitlines()[-1]
    assert code == 2 and "Traceback" not in err, err[-2000:]
    assert line.startswith(f"volta-ml train: error: {bad}: cannot decode the image (") and "replace the file" in line


def test_iglue_hf_adapter_missing_is_one_line_with_exit_2(tmp_path, models, xvnli, capsys):
    from volta_ml.cli import main
    data, images = xvnli
    code = main(["iglue-hf", "--backend", "mllm", "--model", str(models["qwen2-vl"]), "--adapter",
                 str(tmp_path / "nowhere"), "--task", "xvnli", "--lang", "en", "--annotations",
                 str(data / "XVNLI/annotations/en/dev.jsonl"), "--images", str(images), "--output_dir",
                 str(tmp_path / "eval"), "--no_progress"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and err[-1] == f"volta-ml iglue-hf: error: adapter folder {tmp_path / 'nowhere'} does not exist"
