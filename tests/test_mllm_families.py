"""The `mllm` backend on tiny random models of every current family (tests/helpers_vlm_families.py), CPU, fp32.

For each family, a batch of 3 questions with photos of different sizes and prompts of different lengths must give
the numbers of one question at a time (letter, open-ended with and without the KV cache, generation, blind
control), and those must equal a reference made here the plain Hugging Face way: `processor.apply_chat_template(
conversation with the image, tokenize=True, return_dict=True)` (PaliGemma: `processor(text="<image>" + prompt,
images=...)`) and one forward of the model, reading the natural letter token (the first token after the
generation prompt when the assistant's reply is the letter). Models are built and loaded once per session.
"""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from helpers_hf import images
from helpers_vlm_families import FAMILIES, build_family, shared_root
from volta_ml.hf import BackendInputError, ModelSpec, load_backend
from volta_ml.hf.mllm import GenerativeBackend

NAMES = list(FAMILIES)
LETTERS = ["A", "B", "C", "D"]
PROMPTS = ["Location: Brazil. Question: what is shown in the picture? Options: A. a red car B. a blue bird "
           "C. a green tree D. a dog Short Answer:", "Question: which food is this? Short Answer:",
           "Question: is the statement true or false for the left image and the right image? Short Answer:"]
CONTS = [[" a red car", " bird", " a green tree near the river", " dog"], [" rice and beans", " Paris", " no", " yes"],
         [" true", " false", " neutral", " a small shop"]]
SIZES = [(40, 30), (64, 48), (30, 70)]
TOL = 1e-4
NO_TEMPLATE = ("paligemma",)   # PaliGemma has no chat template: "<image>" + prompt, the processor adds the rest
SINGLE_IMAGE = ("paligemma", "llava-next", "mllama")        # trained on one image per prompt: MaRVL's canvas
MULTI_IMAGE = [n for n in NAMES if n not in SINGLE_IMAGE]
# PaliGemma's processor builds its (unused) labels with np.array(..., copy=False) on a list: numpy 2 warns
pytestmark = [pytest.mark.usefixtures("one_thread"),
              pytest.mark.filterwarnings("ignore:__array__ implementation doesn't accept a copy:DeprecationWarning")]


@pytest.fixture(scope="session")
def family_root():
    return shared_root()


_loaded: dict = {}


def backend(name, root):
    if name not in _loaded:
        _loaded[name] = load_backend("mllm", ModelSpec(str(build_family(name, root))))
    return _loaded[name]


def photos(seed=0):
    return [[images(1, seed + i, size)[0]] for i, size in enumerate(SIZES)]


# ---- the plain Hugging Face way ------------------------------------------------------------------------------
def _user(prompt, image):
    """One user turn: `image` None (blind), one image or a list of images (before the text)."""
    imgs = [] if image is None else image if isinstance(image, list) else [image]
    content = [{"type": "image", "image": im} for im in imgs] + [{"type": "text", "text": prompt}]
    return [{"role": "user", "content": content}]


def _inputs(b, name, image, prompt):
    """The model inputs of one question, as the model card's example makes them."""
    if name in NO_TEMPLATE:
        from volta_ml.hf.loading import blank_image
        enc = b.processor(text="<image>" + prompt, images=[image or blank_image()], return_tensors="pt")
    else:
        enc = b.processor.apply_chat_template(_user(prompt, image), add_generation_prompt=True, tokenize=True,
                                              return_dict=True, return_tensors="pt")
    return {k: v for k, v in enc.items() if k in b.forward_keys and k != "labels"}


def _text_ids(b, text):
    bos = b.tokenizer.bos_token
    return b.tokenizer(text, add_special_tokens=not (bos and text.startswith(bos)))["input_ids"]


def natural_letter(b, name, prompt, letter):
    if name in NO_TEMPLATE:                                     # the answer follows the processor's "\n"
        head = _text_ids(b, "<image>" + prompt + "\n")
        full = _text_ids(b, "<image>" + prompt + "\n" + letter)
    else:
        user = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": prompt}]}]
        reply = [{"role": "assistant", "content": [{"type": "text", "text": letter}]}]
        head = _text_ids(b, b.processor.apply_chat_template(user, add_generation_prompt=True))
        full = _text_ids(b, b.processor.apply_chat_template(user + reply))
    assert full[:len(head)] == head
    return full[len(head)]


def ref_letters(b, name, image, prompt, letter_prompt):
    logits = b.model(**_inputs(b, name, image, prompt)).logits[0, -1]
    return torch.stack([logits[natural_letter(b, name, letter_prompt, c)] for c in LETTERS]).float()


def ref_logprob(b, name, image, prompt, cont):
    """log P(cont | prompt): the tokens that rendered prompt + cont add after the rendered prompt, one forward."""
    enc = _inputs(b, name, image, prompt)
    if name in NO_TEMPLATE:
        text, cont = "<image>" + prompt + "\n", cont.lstrip()
    else:
        text = b.processor.apply_chat_template(_user(prompt, image), add_generation_prompt=True)
    head, full = _text_ids(b, text), _text_ids(b, text + cont)
    ids = torch.tensor([full[len(head):]])
    n = ids.shape[1]
    enc["input_ids"] = torch.cat([enc["input_ids"], ids], 1)
    enc["attention_mask"] = torch.cat([enc["attention_mask"], torch.ones_like(ids)], 1)
    if "token_type_ids" in enc:                                 # answer tokens: the causal suffix / text
        fill = 1 if name in NO_TEMPLATE else 0
        enc["token_type_ids"] = torch.cat([enc["token_type_ids"], torch.full_like(ids, fill)], 1)
    if "mm_token_type_ids" in enc:
        enc["mm_token_type_ids"] = torch.cat([enc["mm_token_type_ids"], torch.zeros_like(ids)], 1)
    if "cross_attention_mask" in enc:
        cam = enc["cross_attention_mask"]
        enc["cross_attention_mask"] = torch.cat([cam, cam[:, -1:].expand(-1, n, -1, -1)], 1)
    logits = b.model(**enc).logits[0, -n - 1:-1]
    return F.log_softmax(logits.float(), -1).gather(-1, ids[0, :, None]).sum().item()


# ---- tests ---------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", NAMES)
@torch.inference_mode()
def test_letter_scores_batch_one_and_reference(name, family_root):
    b = backend(name, family_root)
    imgs = photos()
    got = b.choice_logits(imgs, PROMPTS, LETTERS)
    for i in range(3):
        one = b.choice_logits(imgs[i:i + 1], PROMPTS[i:i + 1], LETTERS)
        assert torch.allclose(got[i:i + 1], one, atol=TOL), (name, i)
        want = ref_letters(b, name, imgs[i][0], PROMPTS[i], PROMPTS[0])
        assert torch.allclose(got[i], want, atol=TOL), (name, i, got[i], want)
    other = b.choice_logits(photos(seed=10), PROMPTS, LETTERS)
    assert not torch.allclose(got, other, atol=1e-3), "the scores must depend on the image"


@pytest.mark.parametrize("name", NAMES)
@torch.inference_mode()
def test_open_ended_cache_plain_batch_one_and_reference(name, family_root):
    b = backend(name, family_root)
    imgs = photos(seed=3)
    sums, counts = b.continuation_logprobs(imgs, PROMPTS, CONTS)
    plain, plain_counts = b.continuation_logprobs(imgs, PROMPTS, CONTS, reuse_cache=False)
    assert torch.allclose(plain, sums, atol=TOL) and torch.equal(plain_counts, counts)
    for i in range(3):
        one, _ = b.continuation_logprobs(imgs[i:i + 1], PROMPTS[i:i + 1], CONTS[i:i + 1])
        assert torch.allclose(one[0], sums[i], atol=TOL), (name, i)
    for k, cont in enumerate(CONTS[2]):
        want = ref_logprob(b, name, imgs[2][0], PROMPTS[2], cont)
        assert abs(sums[2, k].item() - want) < TOL * max(1.0, abs(want)), (name, k, sums[2, k].item(), want)


@pytest.mark.parametrize("name", NAMES)
@torch.inference_mode()
def test_generation_and_blind_control_batch_equals_one(name, family_root):
    b = backend(name, family_root)
    imgs = photos(seed=5)
    batch = b.generate(imgs, PROMPTS, max_new_tokens=3)
    assert batch == [b.generate(imgs[i:i + 1], PROMPTS[i:i + 1], max_new_tokens=3)[0] for i in range(3)]
    blind = [[None]] * 3
    got = b.choice_logits(blind, PROMPTS, LETTERS)
    for i in range(3):
        assert torch.allclose(got[i:i + 1], b.choice_logits(blind[:1], PROMPTS[i:i + 1], LETTERS), atol=TOL)
    assert torch.allclose(got[1], ref_letters(b, name, None, PROMPTS[1], PROMPTS[0]), atol=TOL)
    mixed = b.choice_logits([imgs[0], [None], imgs[2]], PROMPTS, LETTERS)      # a photo that failed to decode
    assert torch.allclose(mixed[1], got[1], atol=TOL)
    assert torch.allclose(mixed[0], b.choice_logits(imgs[:1], PROMPTS[:1], LETTERS)[0], atol=TOL)


@pytest.mark.parametrize("name", NAMES)
def test_images_per_prompt_from_the_processor_and_the_training(name, family_root):
    """Every processor here places a second image of a prompt; the families trained on one image per prompt take
    one (MaRVL: the canvas), the others any number (MaRVL: two images); `max_images` overrides both ways."""
    from volta_ml.iglue_hf.tasks import marvl_layout
    b = backend(name, family_root)
    assert b._places_second_image()
    assert b.max_images == (1 if name in SINGLE_IMAGE else None)
    assert marvl_layout(b, "auto") == ("canvas" if name in SINGLE_IMAGE else "multi")
    if name in SINGLE_IMAGE:
        with pytest.raises(BackendInputError, match="2 images in one prompt, the model takes at most 1"):
            b.choice_logits([photos()[0] * 2], PROMPTS[:1], LETTERS)
    override = 1 if name in MULTI_IMAGE else 2
    assert GenerativeBackend(ModelSpec(b.spec.model, extra={"max_images": override}), b.model,
                             b.processor).max_images == override


@pytest.mark.parametrize("name", MULTI_IMAGE)
@torch.inference_mode()
def test_two_images_per_prompt_batch_one_and_reference(name, family_root):
    """MaRVL's layout for multi-image families: two photos (of different sizes) in one prompt; a batch of 3 = one
    at a time = the plain HF way with both images in the conversation; the second photo changes the scores."""
    b = backend(name, family_root)
    first, second = photos(seed=20), photos(seed=30)
    pairs = [first[i] + second[(i + 1) % 3] for i in range(3)]
    got = b.choice_logits(pairs, PROMPTS, LETTERS)
    for i in range(3):
        one = b.choice_logits(pairs[i:i + 1], PROMPTS[i:i + 1], LETTERS)
        assert torch.allclose(got[i:i + 1], one, atol=TOL), (name, i)
        want = ref_letters(b, name, pairs[i], PROMPTS[i], PROMPTS[0])
        assert torch.allclose(got[i], want, atol=TOL), (name, i, got[i], want)
    other = b.choice_logits([p[:1] + photos(seed=40)[0] for p in pairs], PROMPTS, LETTERS)
    assert not torch.allclose(got, other, atol=1e-3), "the scores must depend on the second image"


@pytest.mark.parametrize("name", [n for n in NAMES if n not in NO_TEMPLATE])
def test_one_bos_and_the_letter_is_the_templates_answer_token(name, family_root):
    b = backend(name, family_root)
    enc = b._encode(photos()[:1], PROMPTS[:1])
    bos = b.tokenizer.bos_token_id
    if bos is not None:
        assert (enc["input_ids"][0] == bos).sum().item() <= 1, "double BOS"
    ids = b.choice_ids(LETTERS, PROMPTS[0])
    assert [b.tokenizer.decode(i).strip() for i in ids] == LETTERS and all(len(i) == 1 for i in ids)


def test_missing_processor_package_is_one_line(family_root, monkeypatch):
    """SmolVLM2's processor needs num2words: without it, one line naming the package (not a traceback)."""
    import transformers.models.smolvlm.processing_smolvlm as smolvlm
    from volta_ml.hf import ModelLoadError
    path = build_family("smolvlm2", family_root)
    monkeypatch.setattr(smolvlm, "num2words", None)
    with pytest.raises(ModelLoadError, match=r"smolvlm2: its processor needs the Python package 'num2words'") as e:
        load_backend("mllm", ModelSpec(str(path)))
    assert "\n" not in str(e.value)


# ---- through the CLI, default batch size ----------------------------------------------------------------------
CLI_FAMILIES = NAMES                                   # every family through the CLI


@pytest.fixture(scope="module")
def release(tmp_path_factory):
    from helpers_cvqa import write_release
    return write_release(tmp_path_factory.mktemp("cvqa_release"), "latest")


@pytest.mark.parametrize("name", CLI_FAMILIES)
def test_cvqa_cli_default_batch_size_equals_one_question_at_a_time(name, family_root, release, tmp_path):
    import io
    import json

    import numpy as np
    from helpers_cvqa import image_png
    from PIL import Image

    from volta_ml.cli import main
    from volta_ml.cvqa.data import load_cvqa
    from volta_ml.cvqa.prompts import generative_prompt

    out = tmp_path / name
    assert main(["cvqa", "score", "--backend", "mllm", "--model", str(build_family(name, family_root)),
                 "--data", str(release), "--output_dir", str(out), "--device", "cpu", "--no-progress",
                 "--conditions", "en-aware", "--limit", "6"]) == 0          # default --batch_size (8): one batch
    results = json.loads((out / "cvqa_results.json").read_text())
    assert results["settings"]["batch_size"] == 8 and results["prompts_version"] == "cvqa-mllm-prompts-v2"
    chunks = {n: np.concatenate([np.load(p)["score"] for p in sorted((out / "chunks" / n).glob("*.npz"))])
              for n in ("en-aware", "en-aware.blind")}
    b = backend(name, family_root)
    for k, q in enumerate(load_cvqa(release, limit=6).questions):
        prompt = [generative_prompt(q, "en-aware", "letter")]
        image = Image.open(io.BytesIO(image_png(q.image_id))).convert("RGB")
        np.testing.assert_allclose(chunks["en-aware"][k], b.choice_logits([[image]], prompt, LETTERS)[0], atol=TOL)
        np.testing.assert_allclose(chunks["en-aware.blind"][k], b.choice_logits([[None]], prompt, LETTERS)[0],
                                   atol=TOL)


def test_parse_choice_letters_and_option_texts():
    from volta_ml.hf.mllm import parse_choice
    opts = ["rice", "beans", "red rice", "corn"]
    assert parse_choice("B", LETTERS, opts) == 1 and parse_choice("(C) because", LETTERS, opts) == 2
    assert parse_choice("D. corn", LETTERS, opts) == 3 and parse_choice(" a: yes", LETTERS, opts) is None
    assert parse_choice("Corn.", LETTERS, opts) == 3 and parse_choice("beans", LETTERS, opts) == 1
    assert parse_choice("it is red rice", LETTERS, opts) is None      # two options inside: ambiguous
    assert parse_choice("E", LETTERS, opts) is None and parse_choice("", LETTERS, opts) is None


def test_open_continuation_is_what_it_adds_after_the_prompt_with_a_legacy_sentencepiece_layout(family_root):
    """Llama-2's legacy layout (prepend "▁", spaces -> "▁", no pre-tokenizer): " rice" tokenised alone starts
    with an extra "▁" token; the continuation scored is what it adds after the prompt (#23 item 5)."""
    from tokenizers import normalizers
    b = load_backend("mllm", ModelSpec(str(build_family("llava-next", family_root))))
    tok = b.tokenizer.backend_tokenizer
    tok.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    tok.pre_tokenizer = None
    prompt, cont = PROMPTS[1], " rice and beans"
    alone = b.tokenizer(cont, add_special_tokens=False)["input_ids"]
    text = b.render(prompt, 1)
    head, full = b.tokenizer(text)["input_ids"], b.tokenizer(text + cont)["input_ids"]
    assert full[:len(head)] == head
    assert b.continuation_ids(prompt, cont) == full[len(head):] != alone
    assert b.tokenizer.convert_ids_to_tokens(alone[:1]) == ["▁"]
