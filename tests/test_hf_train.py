"""Contrastive fine-tuning of HF dual encoders on the engine (volta_ml/iglue_hf/train.py), with tiny random
CLIP / SigLIP models (tests/helpers_hf.py) and a tiny Flickr30k-style data root (tests/helpers_hf_train.py).

- the two losses against the obvious loops and against transformers' own `return_loss=True`;
- the local-rows-against-global-columns normalisation: N simulated ranks give the full batch's gradient;
- training lowers the loss (CLIP; SigLIP; SigLIP-2 with bf16 autocast);
- 2 gloo ranks (torchrun, the gather with gradients in the loss) = 1 rank with the same global batch, for
  both losses;
- SIGKILL mid-run + --resume_file = the uninterrupted run, bit for bit;
- hf_best/ reloads through `volta-ml iglue-hf`'s retrieval path and scores differently from the zero-shot model;
- bad input is one line with exit code 2.
"""
import json
import math
import random
import re
import signal
import subprocess
import sys
import time

import pytest
import torch
import torch.nn.functional as F

from helpers_hf import build
from helpers_hf_train import REPO, make_flickr_root, train_env
from helpers_train import free_port as _free_port
from volta_ml.iglue_hf.contrastive import DualEncoderForTraining, infonce_loss, sigmoid_loss

ENTRY = str(REPO / "tests" / "helpers_hf_train.py")
RUN_NAME = "RetrievalFlickr30k_clip"
# 32 training images at 8 per step: 4 optimizer steps per epoch, 4 epochs; validation on the training file
# (galleries of 8), so its loss shows the fit. Adam's eps is 1e-4, not 1e-6: the attention key biases have a
# gradient of zero up to rounding, and with eps 1e-6 Adam turns that rounding noise into steps of ~lr/1000, so
# 1 and 2 ranks drift apart by up to 8e-6 there after 16 steps (5e-7 everywhere with eps 1e-4)
FLAGS = ["--task", "8", "--batch_size", "8", "--num_epoch", "4", "--lr", "3e-3", "--warmup_proportion", "0",
         "--adam_correct_bias", "--adam_epsilon", "1e-4", "--num_workers", "0", "--num_val_workers", "0", "--hf_val_gallery", "8",
         "--checkpoint_every_steps", "1"]


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("hf")
    found = {name: build(name, root) for name in ("clip", "siglip", "siglip2")}
    found["llava"] = root / "llava"          # only its config.json is read before the run stops
    found["llava"].mkdir()
    (found["llava"] / "config.json").write_text(json.dumps({"model_type": "llava"}))
    return found


@pytest.fixture(scope="module")
def flickr(tmp_path_factory):
    return make_flickr_root(tmp_path_factory.mktemp("flickr"), n_train=32, n_val=8)


def _argv(out, models, flickr, *extra, model="clip"):
    data, images = flickr
    return ["--hf_model", str(models[model]), "--data_root", str(data), "--images", str(images),
            "--val_annotations_jsonpath", str(data / "flickr30k/annotations/train_ann.jsonl"),
            "--output_dir", str(out / "save"), "--logdir", str(out / "logs"), *FLAGS, *extra]


def _run(out, models, flickr, *extra, **env):
    return subprocess.run([sys.executable, ENTRY, *_argv(out, models, flickr, *extra)], cwd=out,
                          env=train_env(**env), capture_output=True, text=True, timeout=240)


def _weights(out, name="pytorch_model_3.bin", run=RUN_NAME):
    return torch.load(out / "save" / run / name, map_location="cpu", weights_only=True)


def _validation(out, run=RUN_NAME):
    text = (out / "save" / run / "out.txt").read_text()
    return [(float(loss), float(score)) for loss, score in
            re.findall(r"Validation \[RetrievalFlickr30k\]: loss ([\d.]+) score ([\d.]+)", text)]


def _run_in_process(out, models, flickr, model="clip"):
    """The uninterrupted one-process run, in this process with one thread like the subprocesses
    (OMP_NUM_THREADS=1), so a subprocess run can be compared with it bit for bit."""
    from volta_ml.cli.train_flags import parse_train_args
    from volta_ml.cli.train_task import build_task_job, run
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        assert run(parse_train_args(_argv(out, models, flickr, model=model)), build_task_job) == 0
    finally:
        torch.set_num_threads(threads)
    return out


@pytest.fixture(scope="module")
def single(tmp_path_factory, models, flickr):
    return _run_in_process(tmp_path_factory.mktemp("single"), models, flickr)


# --- the losses --------------------------------------------------------------------------------------------------
def _embeddings(n=6, d=5, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return [F.normalize(torch.randn(n, d, generator=gen, dtype=torch.float64), dim=-1) for _ in range(2)]


def test_infonce_loss_is_the_symmetric_cross_entropy():
    text, image = _embeddings()
    scale, n = 7.0, len(text)
    rows = []
    for i in range(n):  # the obvious way: -log softmax of the positive, both directions
        t2i = [scale * float(text[i] @ image[j]) for j in range(n)]
        i2t = [scale * float(image[i] @ text[j]) for j in range(n)]
        rows.append((-t2i[i] + math.log(sum(map(math.exp, t2i))) - i2t[i] + math.log(sum(map(math.exp, i2t)))) / 2)
    expected = sum(rows) / n
    assert infonce_loss(text, image, text, image, scale).item() == pytest.approx(expected, rel=1e-12)


def test_sigmoid_loss_sums_pairs_and_averages_rows():
    text, image = _embeddings(seed=1)
    scale, bias, n = 10.0, -3.0, len(text)
    total = 0.0
    for i in range(n):
        for j in range(n):
            z = 1.0 if i == j else -1.0
            total += math.log(1 + math.exp(-z * (scale * float(text[i] @ image[j]) + bias)))  # -log sigmoid
    assert sigmoid_loss(text, image, scale, bias).item() == pytest.approx(total / n, rel=1e-12)


@pytest.mark.parametrize("name", ["clip", "siglip"])
def test_losses_equal_transformers_return_loss(models, name):
    from transformers import AutoModel, AutoProcessor
    from helpers_hf import images
    model = AutoModel.from_pretrained(models[name]).eval()
    processor = AutoProcessor.from_pretrained(models[name])
    texts = ["a red car", "a blue bird", "the green tree", "a dog in the street"]
    padding = "max_length" if name == "siglip" else True
    text_inputs = dict(processor.tokenizer(texts, padding=padding, max_length=16, truncation=True, return_tensors="pt"))
    image_inputs = dict(processor.image_processor(images=images(4), return_tensors="pt"))
    ours = DualEncoderForTraining(model, "infonce" if name == "clip" else "sigmoid")
    with torch.no_grad():
        text, image, scale, bias = ours(text_inputs, image_inputs)
        loss = infonce_loss(text, image, text, image, scale) if name == "clip" else sigmoid_loss(text, image, scale, bias)
        reference = model(**text_inputs, **image_inputs, return_loss=True).loss
    assert loss.item() == pytest.approx(reference.item(), rel=1e-5)


@pytest.mark.parametrize("loss", ["infonce", "sigmoid"])
def test_local_rows_against_global_columns_give_the_full_batch_gradient(loss):
    """What DDP computes with gather_with_grad: the mean over ranks of each rank's loss over its rows against
    all columns, differentiated through all the rows, is the one-process loss of the whole batch."""
    from volta_ml.iglue_hf.contrastive import pair_loss
    text, image = (e.requires_grad_() for e in _embeddings(n=8, seed=2))
    scale, bias = torch.tensor(5.0, dtype=torch.float64), torch.tensor(-2.0, dtype=torch.float64)
    full = torch.autograd.grad(pair_loss(loss, text, image, text, image, scale, bias), (text, image))
    ranks, b = 4, 2
    per_rank = [pair_loss(loss, text[r * b:(r + 1) * b], image[r * b:(r + 1) * b], text, image, scale, bias, r * b)
                for r in range(ranks)]
    split = torch.autograd.grad(torch.stack(per_rank).mean(), (text, image))
    for a, c in zip(full, split):
        torch.testing.assert_close(a, c, rtol=1e-12, atol=1e-14)


def test_reads_iglue_retrieval_training_formats():
    """Flickr30k-style rows (5 captions per image) and WIT rows (one caption, images by wit_ix) as IGLUE ships
    them, into one training pair per image and validation galleries."""
    from conftest import shared_path
    from volta_ml.iglue_hf.data import read_retrieval
    from volta_ml.iglue_hf.images import DEFAULT_TEMPLATES, ImageSource
    from volta_ml.iglue_hf.train import GalleryDataset, PairDataset
    for task, rel, captions in (("xflickrco", "flickr30k/annotations/valid_ann.jsonl", 5),
                                ("wit", "wit/annotations/val_en.jsonl", 1)):
        data = read_retrieval(str(shared_path("iglue", "datasets", rel)), "en")
        source = ImageSource("/images", DEFAULT_TEMPLATES[task])
        pairs = PairDataset(data, source, None, seed=0)
        assert len(pairs) == len(data.images) and {len(c) for c in pairs.captions} == {captions}
        assert len(GalleryDataset(data, source, None, gallery=100)) == -(-len(data.images) // 100)
        first = source.path(data.images[0]).name
        assert first == ("1018148011.jpg" if task == "xflickrco" else "wit_545045.jpg"), first


# --- training on the engine ----------------------------------------------------------------------------------
def test_training_lowers_the_loss(single):
    validation = _validation(single)
    assert len(validation) == 4
    (first_loss, first_score), (last_loss, last_score) = validation[0], validation[-1]
    assert last_loss < first_loss and last_score > first_score, validation
    run = single / "save" / RUN_NAME
    assert (run / "hf_best" / "model.safetensors").is_file() and (run / "pytorch_ckpt_latest.tar").is_file()


@pytest.mark.parametrize("name, amp", [("siglip", "none"), ("siglip2", "bf16")])
def test_siglip_trains_in_process(tmp_path, models, flickr, name, amp):
    from volta_ml.cli.train_flags import parse_train_args
    from volta_ml.cli.train_task import build_task_job, run
    args = parse_train_args(_argv(tmp_path, models, flickr, "--num_epoch", "2", "--amp", amp, model=name))
    assert run(args, build_task_job) == 0
    text = (tmp_path / "save" / f"RetrievalFlickr30k_{name}" / "out.txt").read_text()
    losses = [float(x) for x in re.findall(r"Validation \[RetrievalFlickr30k\]: loss ([\d.]+)", text)]
    assert len(losses) == 2 and losses[1] < losses[0], losses
    assert (tmp_path / "save" / f"RetrievalFlickr30k_{name}" / "hf_best" / "model.safetensors").is_file()



@pytest.mark.parametrize("model", ["clip", "siglip"])
def test_two_ranks_match_one_rank(tmp_path, models, flickr, single, model):
    reference = single if model == "clip" else _run_in_process(tmp_path / "one", models, flickr, model)
    run = f"RetrievalFlickr30k_{model}"
    for _attempt in range(3):
        torchrun = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port",
                    str(_free_port()), ENTRY, *_argv(tmp_path, models, flickr, model=model)]
        proc = subprocess.run(torchrun, cwd=tmp_path, env=train_env(), capture_output=True, text=True, timeout=240)
        if "Address already in use" not in proc.stderr:
            break
    assert proc.returncode == 0, proc.stderr
    assert "world size 2" in proc.stderr and "4 per step x 1 accumulation x 2 processes" in proc.stderr
    two, one = _weights(tmp_path, run=run), _weights(reference, run=run)
    assert two.keys() == one.keys()
    worst = max((two[k] - one[k]).abs().max().item() for k in one)
    assert worst < 1e-5, worst
    initial = _weights(reference, "pytorch_model_-1.bin", run=run)
    assert any(not torch.equal(initial[k], one[k]) for k in one)  # it trained
    assert [s for _, s in _validation(tmp_path, run)] == [s for _, s in _validation(reference, run)]


def test_sigkill_then_resume_matches_the_uninterrupted_run(tmp_path, models, flickr, single):
    proc = subprocess.Popen([sys.executable, ENTRY, *_argv(tmp_path, models, flickr)], cwd=tmp_path,
                            env=train_env(HF_TRAIN_SLEEP="0.25"), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    marker = tmp_path / "save" / RUN_NAME / "pytorch_ckpt_latest.tar"
    deadline = time.time() + 180
    while not marker.exists() and time.time() < deadline:   # the initial save comes right before the first step
        time.sleep(0.05)
    assert marker.exists(), "training never started"
    time.sleep(random.uniform(0.4, 2.0))
    proc.kill()
    proc.communicate()
    assert not (tmp_path / "save" / RUN_NAME / "pytorch_model_3.bin").exists(), "the run finished before the kill"
    latest = torch.load(tmp_path / "save" / RUN_NAME / "pytorch_ckpt_latest.tar", weights_only=True)
    resumed = _run(tmp_path, models, flickr, "--resume_file", str(tmp_path / "save" / RUN_NAME / "pytorch_ckpt_latest.tar"))
    assert resumed.returncode == 0, resumed.stderr
    assert "Resumed from" in resumed.stderr, f"killed at step {latest['global_step']}"
    reference, again = _weights(single), _weights(tmp_path)
    assert all(torch.equal(reference[k], again[k]) for k in reference), f"killed at step {latest['global_step']}"


# --- the fine-tuned model through the iglue-hf evaluation ---------------------------------------------------------
def test_exported_model_reloads_in_iglue_hf_and_scores_differently(tmp_path, models, flickr, single):
    import numpy as np
    from safetensors.torch import load_file
    from volta_ml.iglue_hf.run import run_iglue_hf
    data, images = flickr
    exported = single / "save" / RUN_NAME / "hf_best"
    best = _weights(single, "pytorch_model_best.bin")
    saved = load_file(exported / "model.safetensors")
    assert all(torch.equal(saved[k], best[f"hf.{k}"]) for k in saved)   # hf_best/ is the best checkpoint
    scores = {}
    for name, model in (("zero_shot", models["clip"]), ("fine_tuned", exported)):
        out = tmp_path / name
        run_iglue_hf({"task": "xflickrco", "backend": "clip", "model": str(model), "lang": "en",
                      "protocol": "zero-shot", "annotations": str(data / "flickr30k/annotations/valid_ann.jsonl"),
                      "images": str(images), "output_dir": str(out), "progress": False})
        scores[name] = np.load(out / "test_en_scores.npy")
        assert json.loads((out / "iglue_hf_results.json").read_text())["spec"]["model"] == str(model)
    assert scores["zero_shot"].shape == scores["fine_tuned"].shape == (16, 8)
    assert not np.allclose(scores["zero_shot"], scores["fine_tuned"], atol=1e-3)


# --- bad input ----------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("case, expected", [
    ("generative", "is not a dual encoder"),
    ("unknown_family", "is not a dual encoder"),
    ("backend", "unknown"),
    ("mclip", "--hf_backend mclip: "),
    ("no_config", "has no config.json"),
    ("xvnli", "is not a retrieval task"),
    ("no_images", "give --images"),
    ("image_root_missing", "no such folder"),
    ("image_missing", "of the images"),
])
def test_bad_input_is_one_line_with_exit_2(tmp_path, models, flickr, capsys, case, expected):
    from volta_ml.cli import main
    argv = _argv(tmp_path, models, flickr)
    data, images = flickr
    flag = argv.index

    if case == "generative":   # a generative model given to the dual-encoder job
        argv[flag("--hf_model") + 1] = str(models["llava"])
        argv += ["--hf_backend", "clip"]
    elif case == "unknown_family":
        (tmp_path / "bert").mkdir()
        (tmp_path / "bert" / "config.json").write_text(json.dumps({"model_type": "bert"}))
        argv[flag("--hf_model") + 1] = str(tmp_path / "bert")
    elif case == "backend":
        argv += ["--hf_backend", "openclip"]
    elif case == "mclip":
        argv += ["--hf_backend", "mclip"]
    elif case == "no_config":
        (tmp_path / "empty").mkdir()
        argv[flag("--hf_model") + 1] = str(tmp_path / "empty")
    elif case == "xvnli":
        argv[flag("--task") + 1] = "19"
    elif case == "no_images":
        argv[flag("--images") + 1] = ""
    elif case == "image_root_missing":
        argv[flag("--images") + 1] = str(tmp_path / "nowhere")
    elif case == "image_missing":
        partial = tmp_path / "partial"
        partial.mkdir()
        (partial / "1000.png").write_bytes((images / "1000.png").read_bytes())
        argv[flag("--images") + 1] = str(partial)
    code = main(["train", *argv])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2, err[-3:]
    assert err[-1].startswith("volta-ml train: error: ") and expected in err[-1], err[-1]
    assert not (tmp_path / "save" / RUN_NAME / "out.txt").exists()
