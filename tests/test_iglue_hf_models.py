"""IGLUE tasks through the real HF backends (volta_ml/hf) on tiny random models of each architecture
(tests/helpers_hf.py), loaded by `run_iglue_hf` from their folders like hub checkpoints: every score equals a
direct computation with the same backend, one example at a time."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from conftest import shared_path
from helpers_hf import build, spec_extra
from helpers_vlm_families import build_family, shared_root
from helpers_iglue_hf import build_data_root, make_images
from test_iglue_hf import brute_force_recalls, reference_accuracy
from volta_ml.hf import ModelSpec, load_backend
from volta_ml.iglue_hf.data import read_task
from volta_ml.iglue_hf.images import DEFAULT_TEMPLATES, ImageSource
from volta_ml.iglue_hf.prompts import user_turn
from volta_ml.iglue_hf.run import annotation_path, run_iglue_hf
from volta_ml.iglue_hf.tasks import BackendTaskError

KINDS = {"clip": "clip", "siglip": "clip", "mclip": "mclip", "llava": "mllm", "blip2-bloom": "mllm",
         "blip2-t5": "mllm"}
# Not here: tiny BLIP-2 OPT (128 learned positions) and InstructBLIP's tiny Q-Former (64): the task prompts
# take 100-270 tokens with their 300-word stand-in tokenizers. BLOOM (ALiBi) and T5 (relative) have no limit.
CASES = {"xvnli": ("ar", "zero-shot"), "xflickrco": ("de", "translate-test"), "wit": ("ar", "zero-shot"),
         "marvl": ("id", "zero-shot"), "xgqa": ("de", "zero-shot")}


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("iglue_hf_models")
    root = build_data_root(shared_path("iglue", "datasets"), tmp / "datasets", cap=4)
    for task, (lang, protocol) in CASES.items():
        ann = root / "xGQA/annotations/few_shot/de/train_5.json" if task == "xgqa" else \
            Path(annotation_path(task, lang, protocol, str(root), None))
        make_images(task, ann, lang, tmp / "images" / task)
    return {"root": root, "images": tmp / "images", "models": tmp / "models", "tmp": tmp}


def model(world, name: str, **extra):
    path = build(name, world["models"])
    return str(path), {**spec_extra(name, path), **extra}


def run(world, task, name, out, **opts):
    lang, protocol = CASES[task]
    path, extra = model(world, name, **opts.pop("extra", {}))
    options = {"task": task, "backend": KINDS[name], "model": path, "lang": lang, "protocol": protocol,
               "images": str(world["images"] / task), "output_dir": str(out), "data_root": str(world["root"]),
               "progress": False, "batch_size": 4, "chunk_size": 4, "extra": extra, **opts}
    if task == "xgqa":
        options["annotations"] = str(world["root"] / "xGQA/annotations/few_shot/de/train_5.json")
    return run_iglue_hf(options), options


def data_of(task, options):
    ann = options.get("annotations") or annotation_path(task, options["lang"], options["protocol"],
                                                         options["data_root"], None)
    return read_task(task, ann, options["lang"]), ImageSource(options["images"], DEFAULT_TEMPLATES[task])


@pytest.mark.parametrize("name,task", [("clip", "xflickrco"), ("siglip", "wit"), ("mclip", "xflickrco")])
def test_dual_encoder_retrieval_equals_brute_force(world, tmp_path, name, task):
    result, options = run(world, task, name, tmp_path)
    data, source = data_of(task, options)
    backend = load_backend(KINDS[name], ModelSpec(options["model"], extra=options["extra"]))
    texts = np.concatenate([backend.embed_texts([c]).numpy() for c in data.captions])
    images = np.concatenate([backend.embed_images([source.load(r)]).numpy() for r in data.images])
    # batched embeddings equal one-at-a-time ones up to float rounding; near-ties of a random model could swap
    # under that rounding, so the recalls are checked by brute force on the matrix the run saved
    scores = np.load(Path(options["output_dir"]) / f"{result['split']}_scores.npy")
    np.testing.assert_allclose(scores, texts @ images.T, atol=1e-5)
    expected = brute_force_recalls(scores, data.caption_image)
    for key, value in expected.items():
        assert result["metrics"][key] == pytest.approx(value), key


@pytest.mark.parametrize("name,task,rule,extra", [
    ("llava", "xvnli", "letter", {}), ("blip2-bloom", "xvnli", "likelihood", {}), ("blip2-t5", "xgqa", "generate", {}),
    ("llava", "xgqa", "closed", {}), ("blip2-t5", "marvl", "letter", {}),
    ("llava", "marvl", "likelihood", {"max_images": 2}),
])
def test_generative_scores_equal_direct_computation(world, tmp_path, name, task, rule, extra):
    """Also: a model without a chat template (the BLIP family here) gets the backend's documented fallback
    prompt, and the result records it (prompt_format) with the exact text the model saw."""
    vocabulary = ["yes", "no", "table", "red", "left"] if rule == "closed" else None
    result, options = run(world, task, name, tmp_path, rule=rule, extra=extra, vocabulary=vocabulary,
                          max_new_tokens=4)
    examples, source = data_of(task, options)
    backend = load_backend("mllm", ModelSpec(options["model"], extra=options["extra"]))
    layout = result["marvl_layout"]
    assert layout == (("multi" if extra.get("max_images") == 2 else "canvas") if task == "marvl" else None)
    expected = reference_accuracy(backend, task, rule, examples, source, layout, vocabulary, max_new_tokens=4)
    assert result["metrics"]["score"] == pytest.approx(expected)
    turn = user_turn(task, rule, examples[0], layout, backend.vqa_frame)
    if task == "xgqa" and name.startswith("blip2"):       # BLIP-2's VQA frame (T5 LM: "Short answer:")
        assert turn == f"Question: {examples[0].text} Short answer:"
    assert result["first_prompt_rendered"] == backend.render(turn, 2 if layout == "multi" else 1)
    if name == "llava":
        assert result["prompt_format"] == "chat_template"
        assert result["first_prompt_rendered"].startswith("USER: <image>\n") and turn in result["first_prompt_rendered"]
    else:
        assert result["prompt_format"].startswith("fallback") and result["first_prompt_rendered"] == turn


def test_dual_encoder_cannot_do_xvnli(world, tmp_path):
    with pytest.raises(BackendTaskError, match=r"backend 'clip' \(ClipBackend\) is a dual encoder model and cannot "
                                               r"do xvnli, which needs a generative backend; 'clip' can do: xflickrco, wit"):
        run(world, "xvnli", "clip", tmp_path)


# ---- current families (tests/helpers_vlm_families.py): one per task --------------------------------------------
@pytest.mark.parametrize("family,task,rule,extra", [
    ("qwen2-vl", "xvnli", "letter", {}), ("idefics3", "marvl", "letter", {}),       # multi-image: two images
    ("llava-next", "marvl", "likelihood", {}),                                       # one image: the canvas
    ("gemma3", "xgqa", "generate", {}), ("qwen2-vl", "xvnli", "generate", {}),
])
def test_current_families_equal_direct_computation(world, tmp_path, family, task, rule, extra):
    lang, protocol = CASES[task]
    path = str(build_family(family, shared_root()))
    options = {"task": task, "backend": "mllm", "model": path, "lang": lang, "protocol": protocol, "rule": rule,
               "images": str(world["images"] / task), "output_dir": str(tmp_path), "data_root": str(world["root"]),
               "progress": False, "batch_size": 4, "chunk_size": 4, "extra": extra, "max_new_tokens": 4}
    if task == "xgqa":
        options["annotations"] = str(world["root"] / "xGQA/annotations/few_shot/de/train_5.json")
    result = run_iglue_hf(options)
    examples, source = data_of(task, options)
    backend = load_backend("mllm", ModelSpec(path, extra=extra))
    layout = result["marvl_layout"]
    assert layout == (("multi" if family == "idefics3" else "canvas") if task == "marvl" else None)
    expected = reference_accuracy(backend, task, rule, examples, source, layout, max_new_tokens=4)
    assert result["metrics"]["score"] == pytest.approx(expected)
    assert result["prompt_format"] == "chat_template"
    assert ("parse_failure_rate" in result["metrics"]) == (rule == "generate" and task != "xgqa")
    assert result["first_prompt_rendered"] == backend.render(user_turn(task, rule, examples[0], layout),
                                                             2 if layout == "multi" else 1)


def test_instructblip_qformer_text_truncated_as_lavis(world):
    """A Q-Former instruction longer than LAVIS's max_txt_len (128) is cut to 128 tokens ([SEP] kept), counted."""
    import torch
    from helpers_hf import images
    backend = load_backend("mllm", ModelSpec(str(build("instructblip-t5", world["models"]))))
    long = "Statement: " + " ".join(["the left image shows two dogs and the right image one cat"] * 12) + " Answer:"
    qtok = backend.processor.qformer_tokenizer
    assert len(qtok(long)["input_ids"]) > 128
    img = images(1)
    before = backend.qformer_truncated
    got = backend.choice_logits([img], [long], ["A", "B"])
    assert backend.qformer_truncated == before + 1
    enc = backend.processor(images=img, text=long, return_tensors="pt")
    enc["qformer_input_ids"] = qtok(long, truncation=True, max_length=128, return_tensors="pt")["input_ids"]
    enc["qformer_attention_mask"] = torch.ones_like(enc["qformer_input_ids"])
    start = torch.tensor([[backend.model.config.get_text_config().decoder_start_token_id]])
    with torch.inference_mode():
        logits = backend.model(**enc, decoder_input_ids=start).logits[0, -1]
    ids = [i[0] for i in backend.choice_ids(["A", "B"])]
    assert torch.allclose(got[0], logits[ids].float(), atol=1e-4)
