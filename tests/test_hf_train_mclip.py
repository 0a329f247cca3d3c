"""Dual-encoder fine-tuning beyond CLIP / SigLIP (volta_ml/iglue_hf/mclip_train.py, train.py), with the tiny random
models of tests/helpers_hf.py and the tiny Flickr30k-style data root of tests/helpers_hf_train.py:

- M-CLIP: training lowers the loss; 2 gloo ranks = 1 rank; `hf_best/` is the best checkpoint in M-CLIP's
  layout, loads in `volta-ml iglue-hf --backend mclip` with no options and scores differently from the
  zero-shot model; with `--hf_train_image_tower` it carries a copy of the image tower that loads the same way;
- few-shot: a target-language few-shot file (IGLUE's real ones, and a few-shot-shaped one) read with
  `--hf_lang`, training started from an English run's `hf_best/`;
- `--gradient_checkpointing`: the same loss and gradients, with each checkpointed layer really run twice;
- bad input is one line with exit code 2.
"""
import json
import re
import subprocess
import sys

import pytest
import torch

from helpers_hf import build, spec_extra
from helpers_hf_train import REPO, make_flickr_root, train_env
from helpers_train import free_port

ENTRY = str(REPO / "tests" / "helpers_hf_train.py")
RUN = "RetrievalFlickr30k_mclip"
FLAGS = ["--task", "8", "--batch_size", "8", "--num_epoch", "4", "--lr", "3e-3", "--warmup_proportion", "0",
         "--adam_correct_bias", "--adam_epsilon", "1e-4", "--num_workers", "0", "--num_val_workers", "0",
         "--hf_val_gallery", "8"]
GERMAN = ["rot", "grün", "blau", "gelb", "schwarz", "weiß"]


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("hf")
    return {name: build(name, root) for name in ("clip", "mclip")}


@pytest.fixture(scope="module")
def no_dropout(models):
    """`--hf_extra` for the tiny M-CLIP with its XLM-R tower built without dropout (`text_base`: only the
    architecture is read from it), so that 1 and 2 ranks draw no different masks."""
    folder = models["mclip"] / "xlmr-no-dropout"
    config = json.loads((models["mclip"] / "xlmr-base" / "config.json").read_text())
    folder.mkdir(exist_ok=True)
    (folder / "config.json").write_text(json.dumps(dict(config, hidden_dropout_prob=0.0,
                                                        attention_probs_dropout_prob=0.0)))
    return dict(spec_extra("mclip", models["mclip"]), text_base=str(folder))


@pytest.fixture(scope="module")
def flickr(tmp_path_factory):
    return make_flickr_root(tmp_path_factory.mktemp("flickr"), n_train=32, n_val=8)


def _argv(out, model, flickr, *extra, hf_extra=None):
    data, images = flickr
    hf_extra = ["--hf_extra", json.dumps(hf_extra)] if hf_extra else []
    return ["--hf_model", str(model), *hf_extra, "--data_root", str(data), "--images", str(images),
            "--val_annotations_jsonpath", str(data / "flickr30k/annotations/train_ann.jsonl"),
            "--output_dir", str(out / "save"), "--logdir", str(out / "logs"), *FLAGS, *extra]


def _train(argv) -> None:
    """One process, one thread, as the torchrun subprocesses run (OMP_NUM_THREADS=1)."""
    from volta_ml.cli.train_flags import parse_train_args
    from volta_ml.cli.train_task import build_task_job, run
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        assert run(parse_train_args(argv), build_task_job) == 0
    finally:
        torch.set_num_threads(threads)


def _validation(run_dir):
    return [(float(loss), float(score)) for loss, score in re.findall(
        r"Validation \[RetrievalFlickr30k\]: loss ([\d.]+) score ([\d.]+)", (run_dir / "out.txt").read_text())]


def _weights(run_dir, name="pytorch_model_3.bin"):
    return torch.load(run_dir / name, map_location="cpu", weights_only=True)


@pytest.fixture(scope="module")
def english(tmp_path_factory, models, flickr, no_dropout):
    """The English fine-tuning run of the tiny M-CLIP (4 epochs of 4 steps)."""
    out = tmp_path_factory.mktemp("english")
    _train(_argv(out, models["mclip"], flickr, hf_extra=no_dropout))
    return out / "save" / RUN


# --- M-CLIP ---------------------------------------------------------------------------------------------------
def test_mclip_training_lowers_the_loss_and_keeps_the_image_tower(english, models):
    validation = _validation(english)
    assert len(validation) == 4
    (first_loss, first_score), (last_loss, last_score) = validation[0], validation[-1]
    assert last_loss < first_loss and last_score > first_score, validation
    before, after = _weights(english, "pytorch_model_-1.bin"), _weights(english)
    assert all(torch.equal(before[k], after[k]) for k in before if k.startswith("vision."))   # frozen by default
    assert any(not torch.equal(before[k], after[k]) for k in before if k.startswith("text."))


def test_mclip_two_ranks_match_one_rank(tmp_path, models, flickr, no_dropout, english):
    for _attempt in range(3):
        torchrun = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port",
                    str(free_port()), ENTRY, *_argv(tmp_path, models["mclip"], flickr, hf_extra=no_dropout)]
        proc = subprocess.run(torchrun, cwd=tmp_path, env=train_env(), capture_output=True, text=True, timeout=240)
        if "Address already in use" not in proc.stderr:
            break
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "4 per step x 1 accumulation x 2 processes" in proc.stderr and "(M-CLIP, infonce loss)" in proc.stderr
    two, one = _weights(tmp_path / "save" / RUN), _weights(english)
    worst = max((two[k] - one[k]).abs().max().item() for k in one)
    assert worst < 1e-5, worst
    assert [s for _, s in _validation(tmp_path / "save" / RUN)] == [s for _, s in _validation(english)]


def test_mclip_export_is_the_best_checkpoint_and_evaluates_in_iglue_hf(tmp_path, models, flickr, english):
    import numpy as np
    from safetensors.torch import load_file
    from volta_ml.iglue_hf.run import run_iglue_hf
    exported = english / "hf_best"
    saved, best = load_file(exported / "model.safetensors"), _weights(english, "pytorch_model_best.bin")
    renamed = {k.replace("transformer.", "text.", 1).replace("LinearTransformation.", "linear.", 1): v
               for k, v in saved.items()}
    assert renamed.keys() == {k for k in best if k.startswith(("text.", "linear."))}
    assert all(torch.equal(v, best[k]) for k, v in renamed.items())
    config = json.loads((exported / "config.json").read_text())
    assert config["model_type"] == "M-CLIP" and config["text_base"] == "text_base"
    assert config["image_model"] == str((models["mclip"] / "clip-image").resolve())   # frozen: a reference
    data, images = flickr
    scores = {}
    for name, model, extra in (("zero_shot", models["mclip"], spec_extra("mclip", models["mclip"])),
                               ("fine_tuned", exported, None)):   # the export needs no options
        run_iglue_hf({"task": "xflickrco", "backend": "mclip", "model": str(model), "lang": "en", "extra": extra,
                      "protocol": "zero-shot", "annotations": str(data / "flickr30k/annotations/valid_ann.jsonl"),
                      "images": str(images), "output_dir": str(tmp_path / name), "progress": False})
        scores[name] = np.load(tmp_path / name / "test_en_scores.npy")
    assert scores["zero_shot"].shape == scores["fine_tuned"].shape == (16, 8)
    assert not np.allclose(scores["zero_shot"], scores["fine_tuned"], atol=1e-3)


def test_mclip_trained_image_tower_is_copied_into_the_export(tmp_path, models):
    """--hf_train_image_tower: the CLIP vision transformer and projection train (not CLIP's unused text tower),
    and the export holds a copy of the tower that the mclip backend loads from the folder alone."""
    from helpers_hf import images
    from volta_ml.hf import ModelSpec, load_backend
    from volta_ml.iglue_hf.mclip_train import load_mclip
    model = load_mclip(ModelSpec(str(models["mclip"]), extra=spec_extra("mclip", models["mclip"])), None, True)
    trainable = {n.split(".")[1] for n, p in model.module.named_parameters()
                 if p.requires_grad and n.startswith("vision.")}
    assert trainable == {"vision_model", "visual_projection"}
    with torch.no_grad():
        model.module.vision.visual_projection.weight.mul_(-1.0)     # as if trained: differs from the reference
    model.save(tmp_path / "export", model.module.state_dict())
    assert json.loads((tmp_path / "export" / "config.json").read_text())["image_model"] == "image_model"
    backend = load_backend("mclip", ModelSpec(str(tmp_path / "export")))
    pixels = model.image_processor(images=images(3), return_tensors="pt")
    with torch.no_grad():
        expected = torch.nn.functional.normalize(model.module.vision.get_image_features(**pixels).pooler_output, dim=-1)
    torch.testing.assert_close(backend.embed_images(images(3)), expected, rtol=1e-5, atol=1e-6)


# --- few-shot -------------------------------------------------------------------------------------------------
def test_reads_iglue_few_shot_files():
    """IGLUE's few-shot xFlickr&CO files: one row and one target-language caption per Flickr30k image."""
    from conftest import shared_path
    from volta_ml.iglue_hf.data import read_retrieval
    from volta_ml.iglue_hf.images import DEFAULT_TEMPLATES, ImageSource
    from volta_ml.iglue_hf.train import PairDataset
    data = read_retrieval(str(shared_path("iglue", "datasets", "xFlickrCO/annotations/de/train_10.jsonl")), "de")
    pairs = PairDataset(data, ImageSource("/images", DEFAULT_TEMPLATES["xflickrco"]), None, seed=0)
    assert len(pairs) == 10 and {len(c) for c in pairs.captions} == {1} and {r.lang for r in data.images} == {"de"}
    assert "Basketballspieler in schwarzer Sportkleidung." in data.captions
    assert all(re.fullmatch(r"\d+\.jpg", ref.file) for ref in data.images)


def test_few_shot_run_starts_from_the_english_export(tmp_path, models, flickr, english, capfd):
    """A German few-shot file (IGLUE's row shape: one caption, img_path) with `--hf_lang de`: the training
    images come from the template's {lang} folder (de/), the English validation images from en/; the run starts
    from the English run's hf_best/, trains it (with gradient checkpointing), and exports its own."""
    data, images = flickr
    rows = [json.loads(line) for line in (data / "flickr30k/annotations/train_ann.jsonl").read_text().splitlines()]
    few = tmp_path / "xFlickrCO/annotations/de/train_5.jsonl"
    few.parent.mkdir(parents=True)
    english_words = ["red", "green", "blue", "yellow", "black", "white"]
    with open(few, "w", encoding="utf-8") as handle:
        for row in rows[:5]:
            words = row["sentences"][0].split()      # "<left> on the left and <right> on the right"
            left, right = GERMAN[english_words.index(words[0])], GERMAN[english_words.index(words[5])]
            handle.write(json.dumps({"sentences": [f"{left} links und {right} rechts"], "id": row["id"],
                                     "img_path": row["img_path"]}, ensure_ascii=False) + "\n")
    per_lang = tmp_path / "images"
    for lang, chosen in (("de", rows[:5]), ("en", rows)):
        (per_lang / lang).mkdir(parents=True)
        for row in chosen:
            (per_lang / lang / row["img_path"]).write_bytes((images / row["img_path"]).read_bytes())
    argv = [*_argv(tmp_path, english / "hf_best", (data, per_lang)), "--image_template",
            "{lang}/{file}", "--train_annotations_jsonpath", str(few), "--hf_lang", "de", "--batch_size", "5",
            "--num_epoch", "2", "--lr", "1e-3", "--gradient_checkpointing", "--save_name", "de_5"]
    _train(argv)
    err = capfd.readouterr().err
    assert "(de, 5 images" in err and "gradient checkpointing in XLMRobertaModel" in err
    run = tmp_path / "save" / "RetrievalFlickr30k_hf_best-de_5"
    start, end = _weights(run, "pytorch_model_-1.bin"), _weights(run, "pytorch_model_1.bin")
    english_best = _weights(english, "pytorch_model_best.bin")
    assert all(torch.equal(start[k], english_best[k]) for k in english_best)     # started from the English model
    assert any(not torch.equal(start[k], end[k]) for k in start if k.startswith("text."))
    assert (run / "hf_best" / "model.safetensors").is_file()


# --- gradient checkpointing -----------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["clip", "mclip"])
def test_gradient_checkpointing_gives_the_same_loss_and_gradients(models, name):
    from types import SimpleNamespace
    from helpers_hf import images
    from volta_ml.hf import ModelSpec
    from volta_ml.iglue_hf.contrastive import enable_gradient_checkpointing, infonce_loss
    from volta_ml.iglue_hf.train import Collate, _pixels, load_trainable
    args = SimpleNamespace(hf_temperature=None, hf_train_image_tower=False)
    spec = ModelSpec(str(models[name]), extra=spec_extra(name, models[name]))
    model = load_trainable(spec, "infonce", args)
    texts = ["a red car", "a blue bird", "the green tree", "a dog in the street"]
    batch = Collate(model.tokenizer, model.max_length, model.padding)(
        [{"text": t, "image": _pixels(model.image_processor, im)} for t, im in zip(texts, images(4))])
    # a Linear inside the first text layer (hooks on the layer itself stay outside transformers' checkpoint)
    inner = (model.module.hf.text_model.encoder.layers[0].mlp.fc1 if name == "clip"
             else model.module.text.encoder.layer[0].intermediate.dense)
    calls = []
    inner.register_forward_hook(lambda *_: calls.append(1))

    def loss_and_grads():
        torch.manual_seed(0)                  # XLM-R's dropout: the same masks in both runs
        model.module.zero_grad()
        calls.clear()
        text, image, scale, _ = model.module(batch["text_inputs"], batch["image_inputs"])
        loss = infonce_loss(text, image, text, image, scale)
        loss.backward()
        grads = {n: p.grad.clone() for n, p in model.module.named_parameters() if p.grad is not None}
        return loss.item(), grads, len(calls)

    model.module.train()
    plain_loss, plain, plain_calls = loss_and_grads()
    assert enable_gradient_checkpointing(model.module) == (["CLIPModel"] if name == "clip" else ["XLMRobertaModel"])
    model.module.train()
    loss, grads, checkpointed_calls = loss_and_grads()
    assert (plain_calls, checkpointed_calls) == (1, 2)      # the layer ran again in the backward pass
    assert loss == pytest.approx(plain_loss, abs=1e-5)
    assert grads.keys() == plain.keys() and len(grads) > 10
    for key in plain:
        torch.testing.assert_close(grads[key], plain[key], rtol=1e-5, atol=1e-5, msg=key)


# --- bad input ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("case, expected", [
    ("temperature_for_clip", "--hf_temperature: M-CLIP only"),
    ("image_tower_for_clip", "--hf_train_image_tower: M-CLIP only"),
    ("zero_temperature", "--hf_temperature 0.0: must be > 0"),
    ("backend_clip_for_mclip", "--hf_backend clip: "),
])
def test_bad_input_is_one_line_with_exit_2(tmp_path, models, flickr, capsys, case, expected):
    from volta_ml.cli import main
    clip = _argv(tmp_path, models["clip"], flickr)
    mclip = _argv(tmp_path, models["mclip"], flickr, hf_extra=spec_extra("mclip", models["mclip"]))
    argv = {"temperature_for_clip": clip + ["--hf_temperature", "0.05"],
            "image_tower_for_clip": clip + ["--hf_train_image_tower"],
            "zero_temperature": mclip + ["--hf_temperature", "0"],
            "backend_clip_for_mclip": mclip + ["--hf_backend", "clip"]}[case]
    code = main(["train", *argv])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2, err[-3:]
    assert err[-1].startswith("volta-ml train: error: ") and expected in err[-1], err[-1]
    assert not list(tmp_path.glob("save/*/out.txt"))


def test_hf_extra_must_be_a_json_object(tmp_path, models, flickr, capsys):
    from volta_ml.cli import main
    with pytest.raises(SystemExit) as exit_info:
        main(["train", *_argv(tmp_path, models["mclip"], flickr), "--hf_extra", "[1]"])
    assert exit_info.value.code == 2
    assert "--hf_extra: expected a JSON object" in capsys.readouterr().err
