"""The `mllm` backend on tiny random models of every current family (tests/helpers_vlm_families.py), CPU, fp32.

For each family, a batch of 3 questions with photos of different sizes and prompts of different lengths must give
the numbers of one question at a time (letter, open-ended with and without the KV cache, generation, blind
control), and those must equal a reference made here the plain Hugging Face way: `processor.apply_chat_template(
conversation with the image, tokenize=True, return_dict=True)` (PaliGemma: `processor(text="<image>" + prompt,
images=...)`) and one forward of the model, reading the letter typed right after the generation prompt (after the
space the family's template writes before its reply, `REPLY_SPACE`). Photo and blind batches give the same
numbers in either order and on a fresh backend (positions come from each batch alone). Models are built and
loaded once per session.
"""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from helpers_hf import images
from helpers_vlm_families import FAMILIES, VARIANTS, build_family, shared_root, spec_extra
from volta_ml.hf import BackendInputError, ModelSpec, load_backend
from volta_ml.hf.mllm import GenerativeBackend

NAMES = list(FAMILIES) + list(VARIANTS)
LETTERS = ["A", "B", "C", "D"]
PROMPTS = ["Location: Brazil. Question: what is shown in the picture? Options: A. a red car B. a blue bird "
           "C. a green tree D. a dog Short Answer:", "Question: which food is this? Short Answer:",
           "Question: is the statement true or false for the left image and the right image? Short Answer:"]
CONTS = [[" a red car", " bird", " a green tree near the river", " dog"], [" rice and beans", " Paris", " no", " yes"],
         [" true", " false", " neutral", " a small shop"]]
SIZES = [(40, 30), (64, 48), (30, 70)]
TOL = 1e-4
# no chat template: the model card's `processor(text=..., images=...)`: (what precedes the prompt in that text, what
# the processor writes after it, whether the answer follows it without a space). PaliGemma: "<image>" + prompt, the
# processor adds BOS and "\n"; Fuyu: the prompt alone, the processor writes the image, BOS and "<0x04>" itself
NO_TEMPLATE = {"paligemma": ("<image>", "\n", True), "fuyu": ("", "<0x04>", False)}
# the frames that put a space between the generation prompt and the reply ("Assistant: A", "[/INST] A", "<0x04> A")
REPLY_SPACE = ("idefics3", "smolvlm2", "llava-next", "fuyu")
HYBRID = ("qwen3.5", "qwen3.5-nothink", "lfm2-vl")   # linear-attention / convolution states: no KV-cache reuse
SINGLE_IMAGE = ("paligemma", "llava-next", "mllama", "fuyu")   # one image per prompt: MaRVL's canvas
ONE_IMAGE_PROCESSOR = ("fuyu",)                                # its processor refuses a second image
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
        _loaded[name] = load_backend("mllm", ModelSpec(str(build_family(name, root)), extra=spec_extra(name)))
    return _loaded[name]


def fresh(name, root) -> GenerativeBackend:
    """A new backend around the session's model and processor (whatever the model kept from earlier calls)."""
    b = backend(name, root)
    return GenerativeBackend(b.spec, b.model, b.processor)


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
        enc = b.processor(text=NO_TEMPLATE[name][0] + prompt, images=[image or blank_image()], return_tensors="pt")
    else:
        enc = b.processor.apply_chat_template(_user(prompt, image), add_generation_prompt=True, tokenize=True,
                                              return_dict=True, return_tensors="pt", **spec_extra(name))
    # floating inputs in the model's dtype, as the model cards' `.to(model.device, model.dtype)` (Llama 4's
    # processor returns bf16 pixels)
    return {k: v.to(b.model.dtype) if v.is_floating_point() else v for k, v in enc.items()
            if k in b.forward_keys and k != "labels"}


def _text_ids(b, text):
    bos = b.tokenizer.bos_token
    return b.tokenizer(text, add_special_tokens=not (bos and text.startswith(bos)))["input_ids"]


def natural_letter(b, name, prompt, letter):
    """The letter typed right after the generation prompt (after the family's reply space): one token."""
    if name in NO_TEMPLATE:                            # the answer follows what the processor writes after it
        before, after, _ = NO_TEMPLATE[name]
        text = before + prompt + after
    else:
        user = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": prompt}]}]
        text = b.processor.apply_chat_template(user, add_generation_prompt=True, **spec_extra(name))
    head = _text_ids(b, text)
    full = _text_ids(b, text + (" " if name in REPLY_SPACE else "") + letter)
    assert full[:len(head)] == head and len(full) == len(head) + 1
    return full[-1]


def ref_letters(b, name, image, prompt, letter_prompt):
    logits = b.model(**_inputs(b, name, image, prompt)).logits[0, -1]
    return torch.stack([logits[natural_letter(b, name, letter_prompt, c)] for c in LETTERS]).float()


def ref_logprob(b, name, image, prompt, cont):
    """log P(cont | prompt): the tokens that rendered prompt + cont add after the rendered prompt, one forward."""
    enc = _inputs(b, name, image, prompt)
    if name in NO_TEMPLATE:
        before, after, no_space = NO_TEMPLATE[name]
        text, cont = before + prompt + after, cont.lstrip() if no_space else cont
    else:
        text = b.processor.apply_chat_template(_user(prompt, image), add_generation_prompt=True, **spec_extra(name))
    head, full = _text_ids(b, text), _text_ids(b, text + cont)
    ids = torch.tensor([full[len(head):]])
    n = ids.shape[1]
    enc["input_ids"] = torch.cat([enc["input_ids"], ids], 1)
    enc["attention_mask"] = torch.cat([enc["attention_mask"], torch.ones_like(ids)], 1)
    if "token_type_ids" in enc:                                 # answer tokens: the causal suffix / text
        fill = 1 if name == "paligemma" else 0
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
    assert b.cache_reuse == (name not in HYBRID), "a cache that cannot be repeated takes the no-cache path"


@pytest.mark.parametrize("name", NAMES)
@torch.inference_mode()
def test_photo_and_blind_batches_in_either_order_equal_the_reference(name, family_root):
    """Positions come from each batch alone, never from what the model kept from the previous call (Qwen-VL and
    GLM's `rope_deltas`): a blind batch on a fresh backend, then photos, then blind again (another batch size),
    each equal to the plain one-question computation, for the open rule (KV cache) and the letter rule."""
    b, imgs, blind = fresh(name, family_root), photos(seed=7), [[None]] * 3
    first, _ = b.continuation_logprobs(blind, PROMPTS, CONTS)           # fresh backend: nothing kept yet
    photo, _ = b.continuation_logprobs(imgs, PROMPTS, CONTS)
    again, _ = b.continuation_logprobs(blind[:2], PROMPTS[:2], CONTS[:2])
    letters = b.choice_logits(blind, PROMPTS, LETTERS)                   # after photos
    for k, cont in enumerate(CONTS[1]):
        for got, image in ((first, None), (photo, imgs[1][0])):
            want = ref_logprob(b, name, image, PROMPTS[1], cont)
            assert abs(got[1, k].item() - want) < TOL * max(1.0, abs(want)), (name, image, k, got[1, k].item(), want)
    assert torch.allclose(again, first[:2], atol=TOL)
    assert torch.allclose(letters[1], ref_letters(b, name, None, PROMPTS[1], PROMPTS[0]), atol=TOL)
    photo_after, _ = b.continuation_logprobs(imgs[:1], PROMPTS[:1], CONTS[:1])   # photo after a blind batch
    assert torch.allclose(photo_after[0], photo[0], atol=TOL)


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
    """Every processor here but Fuyu's places a second image of a prompt; the families trained on one image per
    prompt take one (MaRVL: the canvas), the others any number (MaRVL: two images); `max_images` overrides both
    ways, except 2 where the processor places one image."""
    from volta_ml.iglue_hf.tasks import marvl_layout
    b = backend(name, family_root)
    assert b._places_second_image() == (name not in ONE_IMAGE_PROCESSOR)
    assert b.max_images == (1 if name in SINGLE_IMAGE else None)
    assert marvl_layout(b, "auto") == ("canvas" if name in SINGLE_IMAGE else "multi")
    if name in SINGLE_IMAGE:
        with pytest.raises(BackendInputError, match="2 images in one prompt, the model takes at most 1"):
            b.choice_logits([photos()[0] * 2], PROMPTS[:1], LETTERS)
    override = 1 if name in MULTI_IMAGE else 2
    if name in ONE_IMAGE_PROCESSOR:
        with pytest.raises(BackendInputError, match="places one image per prompt"):
            GenerativeBackend(ModelSpec(b.spec.model, extra={"max_images": 2}), b.model, b.processor)
        return
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
    enc = b.encode(photos()[:1], PROMPTS[:1])
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
    switches = [f for key, value in spec_extra(name).items() for f in (f"--{key}", str(value).lower())]
    assert main(["cvqa", "score", "--backend", "mllm", "--model", str(build_family(name, family_root)),
                 "--data", str(release), "--output_dir", str(out), "--device", "cpu", "--no-progress",
                 "--conditions", "en-aware", "--limit", "6", *switches]) == 0   # default --batch_size (8): one batch
    results = json.loads((out / "cvqa_results.json").read_text())
    assert results["settings"]["batch_size"] == 8 and results["prompts_version"] == "cvqa-mllm-prompts-v2"
    assert results["template_options"] == spec_extra(name)          # the template's switches are recorded
    chunks = {n: np.concatenate([np.load(p)["score"] for p in sorted((out / "chunks" / n).glob("*.npz"))])
              for n in ("en-aware", "en-aware.blind")}
    b = backend(name, family_root)
    for k, q in enumerate(load_cvqa(release, limit=6).questions):
        prompt = [generative_prompt(q, "en-aware", "letter")]
        image = Image.open(io.BytesIO(image_png(q.image_id))).convert("RGB")
        np.testing.assert_allclose(chunks["en-aware"][k], b.choice_logits([[image]], prompt, LETTERS)[0], atol=TOL)
        np.testing.assert_allclose(chunks["en-aware.blind"][k], b.choice_logits([[None]], prompt, LETTERS)[0],
                                   atol=TOL)


@pytest.mark.parametrize("name, batch_size", [("qwen2-vl", 8), ("qwen2-vl", 1), ("glm-4.6v", 8)])
def test_cvqa_cli_open_rule_photo_and_text_only_equal_the_plain_computation(name, batch_size, family_root, release,
                                                                           tmp_path):
    """`volta-ml cvqa score --rule open`: the text-only pass runs after each batch's photo pass, on a model that
    kept M-RoPE deltas from it; both passes equal log P(option | prompt) computed one question at a time (#30:
    the blind scores were off by the previous batch's deltas, or failed on a fresh backend)."""
    import numpy as np

    from volta_ml.cli import main
    from volta_ml.cvqa.data import load_cvqa
    from volta_ml.cvqa.prompts import generative_prompt, open_answers
    from helpers_cvqa import image_png
    from PIL import Image
    import io

    out = tmp_path / name
    assert main(["cvqa", "score", "--backend", "mllm", "--model", str(build_family(name, family_root)), "--rule",
                 "open", "--data", str(release), "--output_dir", str(out), "--device", "cpu", "--no-progress",
                 "--conditions", "en-aware", "--limit", "5", "--batch-size", str(batch_size)]) == 0
    chunks = {n: np.concatenate([np.load(p)["score"] for p in sorted((out / "chunks" / n).glob("*.npz"))])
              for n in ("en-aware", "en-aware.blind")}
    b = backend(name, family_root)
    with torch.inference_mode():
        for k, q in enumerate(load_cvqa(release, limit=5).questions):
            prompt = generative_prompt(q, "en-aware", "open")
            photo = Image.open(io.BytesIO(image_png(q.image_id))).convert("RGB")
            for pass_name, image in (("en-aware", photo), ("en-aware.blind", None)):
                want = [ref_logprob(b, name, image, prompt, answer) for answer in open_answers(q, "en-aware")]
                np.testing.assert_allclose(chunks[pass_name][k], want, atol=TOL, rtol=0, err_msg=f"{pass_name} {k}")


def test_a_model_type_whose_own_forward_fails_is_one_line(family_root, release, tmp_path, capsys):
    """Llama 4 fails inside transformers 5.24's own forward (its output class lacks a field the forward reads):
    loading it is one `ModelLoadError` line naming the model type; `volta-ml cvqa score` exits 2 with that line."""
    import transformers

    from volta_ml.cli import main
    from volta_ml.hf import ModelLoadError
    path = build_family("llama4", family_root)
    try:
        load_backend("mllm", ModelSpec(str(path)))
    except ModelLoadError as e:
        assert "\n" not in str(e) and f"model type 'llama4' fails in the forward of the installed transformers " \
            f"{transformers.__version__}" in str(e)
    else:
        pytest.skip(f"transformers {transformers.__version__} runs Llama 4's forward")
    capsys.readouterr()
    assert main(["cvqa", "score", "--backend", "mllm", "--model", str(path), "--data", str(release), "--output_dir",
                 str(tmp_path / "out"), "--device", "cpu", "--no-progress", "--conditions", "en-aware", "--limit",
                 "2"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert "Traceback" not in "\n".join(err) and "model type 'llama4' fails in the forward" in err[-1]


def test_a_load_time_probe_that_fails_in_the_models_own_code_is_one_line(family_root, monkeypatch):
    """A processor that fails on the blank image of the load-time probe (an Aria checkpoint whose processor ignores its
    saved image size raised a raw KeyError): one `ModelLoadError` line naming the model type, whichever probe."""
    import transformers

    from volta_ml.hf import ModelLoadError
    b = backend("qwen2-vl", family_root)

    def broken(*args, **kwargs):
        raise KeyError("height")
    monkeypatch.setattr(type(b.processor.image_processor), "__call__", broken)
    with pytest.raises(ModelLoadError) as e:
        GenerativeBackend(b.spec, b.model, b.processor)
    assert str(e.value) == (f"{b.spec.model}: model type 'qwen2_vl' fails in its processor (a prompt with one blank "
                            f"image) of the installed transformers {transformers.__version__} (KeyError: 'height'); "
                            "run it with a transformers version that supports it")


def test_a_template_switch_is_refused_where_the_template_has_none(family_root):
    b = backend("gemma3", family_root)
    with pytest.raises(BackendInputError, match="gemma3's chat template has no such switch"):
        GenerativeBackend(ModelSpec(b.spec.model, extra={"enable_thinking": False}), b.model, b.processor)
    q = backend("qwen3.5", family_root)
    with pytest.raises(BackendInputError, match="enable_thinking 'no'"):
        GenerativeBackend(ModelSpec(q.spec.model, extra={"enable_thinking": "no"}), q.model, q.processor)
    assert q.template_options == {} and backend("qwen3.5-nothink", family_root).template_options == \
        {"enable_thinking": False}
    assert q.render("Hi?", 1).endswith("<|im_start|>assistant\n<think>\n")        # the template's own: thinking
    assert backend("qwen3.5-nothink", family_root).render("Hi?", 1).endswith("<think>\n\n</think>\n\n")


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
