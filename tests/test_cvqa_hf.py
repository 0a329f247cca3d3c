"""`volta-ml cvqa score` with tiny random Hugging Face models (tests/helpers_hf.py), loaded back through the CLI.

Each backend's saved scores (batches of several questions, left/right padding, KV-cache reuse for the open rule)
equal a reference computed here one question at a time with a plain forward and a log-softmax.
"""
from __future__ import annotations

import functools
import io
import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from helpers_cvqa import image_png, write_release
from helpers_hf import build, spec_extra

from volta_ml.cli import main
from volta_ml.cvqa.data import load_cvqa
from volta_ml.cvqa.prompts import LETTERS, full_texts, generative_prompt, open_answers

REPO = Path(__file__).resolve().parents[1]
CONDITIONS = ["en-aware", "loc-agnostic"]
LIMIT = 5


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    return tmp_path_factory.mktemp("cvqa_hf")


@pytest.fixture(scope="module")
def release(root):
    return write_release(root, "latest")


def run_cli(release, out, backend, model, *extra, conditions=CONDITIONS) -> dict:
    """Questions 0-4 in chunks [0:3] [3:5], batches of 2 questions (padding exercised)."""
    code = main(["cvqa", "score", "--backend", backend, "--model", str(model), "--data", str(release),
                 "--output_dir", str(out), "--device", "cpu", "--no-progress", "--conditions", *conditions,
                 "--batch-size", "2", "--chunk-size", "3", "--limit", str(LIMIT), *extra])
    assert code == 0
    return json.loads((out / "cvqa_results.json").read_text())


def saved(out: Path, name: str) -> dict:
    parts = [dict(np.load(p)) for p in sorted((out / "chunks" / name).glob("*.npz"))]
    return {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}


def photo(image_id):
    from PIL import Image

    return Image.open(io.BytesIO(image_png(image_id))).convert("RGB")


def _features(out):
    return out if isinstance(out, torch.Tensor) else out.pooler_output


def _cosines(image: torch.Tensor, texts: torch.Tensor) -> np.ndarray:
    return (F.normalize(texts.float(), dim=-1) @ F.normalize(image.float(), dim=-1)).numpy()


@functools.lru_cache(maxsize=None)
def loaded(path, model_class: str, processor_class: str = "AutoProcessor"):
    import transformers

    return (getattr(transformers, model_class).from_pretrained(path).eval(),
            getattr(transformers, processor_class).from_pretrained(path))


@torch.inference_mode()
def clip_reference(path, question, condition):
    model, proc = loaded(path, "CLIPModel", "CLIPProcessor")
    image = _features(model.get_image_features(**proc(images=[photo(question.image_id)], return_tensors="pt")))[0]
    limit = model.config.text_config.max_position_embeddings   # CLIP texts are cut at the model's length
    texts = torch.cat([_features(model.get_text_features(**proc(text=[t], truncation=True, max_length=limit,
                                                                return_tensors="pt")))
                       for t in full_texts(question, condition, "plain")])
    return _cosines(image, texts)


@torch.inference_mode()
def mclip_reference(path, question, condition):
    """The multilingual-clip package's forward: XLM-R, mean over the attention mask, one linear layer."""
    from transformers import AutoTokenizer, XLMRobertaConfig, XLMRobertaModel

    state = torch.load(Path(path) / "pytorch_model.bin", weights_only=True)
    text = XLMRobertaModel(XLMRobertaConfig.from_pretrained(Path(path) / "xlmr-base")).eval()
    text.load_state_dict({k[12:]: v for k, v in state.items() if k.startswith("transformer.")}, strict=False)
    linear = torch.nn.Linear(*state["LinearTransformation.weight"].shape[::-1])
    linear.load_state_dict({k[21:]: v for k, v in state.items() if k.startswith("LinearTransformation.")})
    tok = AutoTokenizer.from_pretrained(path)
    rows = []
    for t in full_texts(question, condition, "plain"):
        enc = tok(t, truncation=True, max_length=text.config.max_position_embeddings - 2, return_tensors="pt")
        rows.append(linear(text(**enc).last_hidden_state.mean(1)))   # one text: no padding, mean = masked mean
    vision, proc = loaded(Path(path) / "clip-image", "CLIPModel", "CLIPProcessor")
    image = _features(vision.get_image_features(**proc(images=[photo(question.image_id)], return_tensors="pt")))[0]
    return _cosines(image, torch.cat(rows))


@pytest.mark.parametrize("name, reference", [("clip", clip_reference), ("mclip", mclip_reference)])
def test_dual_encoders_score_the_cosine_of_image_and_text(root, release, name, reference):
    path = build(name, root / "models")
    extra = ["--image-model", spec_extra(name, path)["image_model"]] if name == "mclip" else []
    results = run_cli(release, root / f"out-{name}", name, path, "--no-text-only", *extra)
    questions = load_cvqa(release, limit=LIMIT).questions
    for condition in CONDITIONS:
        got = saved(root / f"out-{name}", condition)["score"]
        for q, row in zip(questions, got):
            np.testing.assert_allclose(row, reference(path, q, condition), atol=1e-5)
    assert results["model"] == str(path) and results["backend"] == name


def _ids(tok, text):
    """`text` tokenised as processor.apply_chat_template(tokenize=True) does: no second BOS."""
    return tok(text, add_special_tokens=not (tok.bos_token and text.startswith(tok.bos_token)))["input_ids"]


def after(tok, head, text):
    """The tokens `text` adds after `head` (head's tokens checked to be a prefix)."""
    a, b = _ids(tok, head), _ids(tok, head + text)
    assert b[:len(a)] == a
    return b[len(a):]


def letter_id(proc, prompt, letter, enc_dec):
    """The paper's letter: the token the model writes as its answer (chat template: the first token after the
    generation prompt of the conversation answered with `letter`; no template: what " A" adds; T5: "A" alone)."""
    tok = proc.tokenizer
    if enc_dec:
        return tok(letter, add_special_tokens=False)["input_ids"][0]
    if getattr(proc, "chat_template", None):
        user = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": prompt}]}]
        head = proc.apply_chat_template(user, add_generation_prompt=True)
        full = proc.apply_chat_template(user + [{"role": "assistant", "content": [{"type": "text", "text": letter}]}])
        return after(tok, head, full[len(head):])[0]
    return after(tok, prompt, " " + letter)[0]


def test_mclip_text_base_flag(root, release, tmp_path, monkeypatch, capsys):
    """--text-base replaces the M-CLIP config's modelBase; a modelBase outside the local HF cache without it is one
    line (exit 2)."""
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)     # nothing is downloaded
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "empty-cache"))
    built = build("mclip", root / "models")
    model = tmp_path / "mclip-hub-base"
    shutil.copytree(built, model)
    config = json.loads((model / "config.json").read_text())
    (model / "config.json").write_text(json.dumps(dict(config, modelBase="FacebookAI/xlm-roberta-large")))
    args = ["cvqa", "score", "--backend", "mclip", "--model", str(model), "--data", str(release), "--device", "cpu",
            "--no-progress", "--no-text-only", "--conditions", "en-aware", "--limit", "2",
            "--image-model", spec_extra("mclip", built)["image_model"]]
    capsys.readouterr()                                       # the build's own output
    assert main(args + ["--output_dir", str(tmp_path / "a")]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"volta-ml cvqa: error: {model}: cannot read the config of its "
                                                   "XLM-R text base 'FacebookAI/xlm-roberta-large'")
    assert main(args + ["--output_dir", str(tmp_path / "b"), "--text-base", str(built / "xlmr-base")]) == 0


@torch.inference_mode()
def mllm_reference(path, question, condition, rule, blind=False):
    model, proc = loaded(path, "AutoModelForImageTextToText")
    tok = proc.tokenizer
    prompt = user_turn = generative_prompt(question, condition, rule)
    blip = "Blip" in type(model).__name__
    images = [photo(question.image_id)] if not blind else ([Image_blank()] if blip else None)
    if getattr(proc, "chat_template", None):
        content = ([{"type": "image"}] if images and not blip else []) + [{"type": "text", "text": prompt}]
        prompt = proc.apply_chat_template([{"role": "user", "content": content}], add_generation_prompt=True,
                                          tokenize=False)
    inputs = dict(proc(images=images, text=prompt, return_tensors="pt", add_special_tokens=not (
        proc.tokenizer.bos_token and prompt.startswith(proc.tokenizer.bos_token))))
    enc_dec = model.config.get_text_config().is_encoder_decoder
    start = torch.tensor([[model.config.get_text_config().decoder_start_token_id]]) if enc_dec else None
    if rule == "letter":
        logits = (model(**inputs, decoder_input_ids=start) if enc_dec else model(**inputs)).logits[0, -1]
        return np.array([logits[letter_id(proc, user_turn, c, enc_dec)].item() for c in LETTERS]), None
    sums, counts = [], []
    for answer in open_answers(question, condition):
        ids = tok(answer, add_special_tokens=False)["input_ids"] if enc_dec else after(tok, prompt, answer)
        cont = torch.tensor([ids])
        if enc_dec:
            logits = model(**inputs, decoder_input_ids=torch.cat([start, cont[:, :-1]], 1)).logits
        else:
            ids = torch.cat([inputs["input_ids"], cont], 1)
            logits = model(**{**inputs, "input_ids": ids, "attention_mask": torch.ones_like(ids)}).logits
            logits = logits[:, -cont.shape[1] - 1:-1]
        sums.append(F.log_softmax(logits.float(), -1).gather(-1, cont[..., None]).sum().item())
        counts.append(cont.shape[1])
    return np.array(sums), np.array(sums) / np.array(counts)


def Image_blank():
    from volta_ml.hf.loading import blank_image

    return blank_image()


@pytest.mark.parametrize("name, rule, conditions", [
    ("llava", "letter", CONDITIONS), ("llava", "open", ["en-aware"]),                  # decoder-only, chat template
    ("blip2-t5", "letter", ["en-aware"]), ("blip2-t5", "open", ["en-aware"]),        # encoder-decoder
    ("blip2-opt", "letter", ["loc-aware"]), ("blip2-opt", "open", ["en-agnostic"]),  # decoder-only, no template
    ("instructblip-t5", "letter", ["loc-agnostic"]), ("instructblip-t5", "open", ["en-aware"]),
])
def test_generative_rules_equal_one_question_at_a_time(root, release, name, rule, conditions):
    path = build(name, root / "models")
    out = root / f"out-{name}-{rule}"
    results = run_cli(release, out, "mllm", path, "--rule", rule, *(["--no-text-only"] if name != "llava" else []),
                      conditions=conditions)
    questions = load_cvqa(release, limit=LIMIT).questions
    for condition in conditions:
        got = saved(out, condition)
        for k, q in enumerate(questions):
            score, normalised = mllm_reference(path, q, condition, rule)
            np.testing.assert_allclose(got["score"][k], score, atol=1e-4)
            if rule == "open":
                np.testing.assert_allclose(got["length_normalised"][k], normalised, atol=1e-4)
    if name == "llava":   # the blind control: the same prompt without the image
        blind = saved(out, "en-aware.blind")["score"]
        np.testing.assert_allclose(blind[0], mllm_reference(path, questions[0], "en-aware", rule, blind=True)[0],
                                   atol=1e-4)
        assert results["rendered_prompts"]["en-aware"].startswith("USER: <image>\nLocation: India. Question: ")
        assert results["rendered_prompts"]["en-aware"].endswith("Short Answer: ASSISTANT:")
    assert results["rule"] == rule and set(results["variants"]) == ({"length_normalised"} if rule == "open" else set())


def test_two_gloo_ranks_equal_one_process_with_a_real_model(root, release, tmp_path):
    path = build("llava", root / "models")
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    args = ["-m", "volta_ml.cli", "cvqa", "score", "--backend", "mllm", "--model", str(path), "--rule", "open",
            "--data", str(release), "--conditions", "loc-aware", "--chunk-size", "2", "--batch-size", "2",
            "--device", "cpu", "--no-progress", "--no-text-only", "--output_dir", str(tmp_path / "two")]
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port",
                           str(port)] + args, cwd=tmp_path, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stderr[-3000:]
    threads = torch.get_num_threads()
    torch.set_num_threads(1)    # as each rank (OMP_NUM_THREADS=1): the same float reduction order
    try:
        assert main(args[2:-1] + [str(tmp_path / "one")]) == 0
    finally:
        torch.set_num_threads(threads)
    for key in ("score", "length_normalised"):
        np.testing.assert_array_equal(saved(tmp_path / "one", "loc-aware")[key],
                                      saved(tmp_path / "two", "loc-aware")[key])
    assert (tmp_path / "one" / "predictions_loc-aware.csv").read_bytes() == \
        (tmp_path / "two" / "predictions_loc-aware.csv").read_bytes()
