"""volta_ml.hf backends on tiny random models of every architecture (tests/helpers_hf.py), CPU, no downloads.

Every score is checked against a direct reference computed here: one example at a time, the model's plain
forward (no cache, no padding), log_softmax. Batches must equal one-at-a-time, KV reuse must equal no reuse.
"""
from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from tests.helpers_hf import TINY, build, images, spec_extra
from volta_ml.hf import BACKENDS, BackendInputError, ChoiceTokenError, DualEncoder, Generative, ModelLoadError, ModelSpec, load_backend

pytestmark = pytest.mark.usefixtures("one_thread")

GENERATIVE = [n for n, (kind, _) in TINY.items() if kind == "mllm"]
DUAL = [n for n, (kind, _) in TINY.items() if kind != "mllm"]
LETTERS = ["A", "B", "C", "D"]
PROMPTS = ["Location: Brazil. Question: what is shown in the picture? Options: A. a red car B. a blue bird "
           "C. a green tree D. a dog Short Answer:", "Question: which food is this? Short Answer:",
           "the statement is true or false ?"]
CONTS = [[" a red car", " bird", " a green tree near the river", " dog"], [" rice and beans", " Paris", " no", " yes"],
         [" true", " false", " neutral", " a small shop"]]
TOL = 1e-4


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    return tmp_path_factory.mktemp("hf")


_loaded: dict = {}


def backend(name, root, **extra):
    key = (name, tuple(sorted(extra.items())))
    if key not in _loaded:
        path = build(name, root)
        _loaded[key] = load_backend(TINY[name][0], ModelSpec(str(path), extra={**spec_extra(name, path), **extra}))
    return _loaded[key]


def one_image_each(n=3, seed=0):
    return [[im] for im in images(n, seed)]


# ---- references ------------------------------------------------------------------------------------------
def _single(b, imgs, prompt):
    imgs = [im for im in imgs if im is not None]
    if b.blip and not imgs:
        from volta_ml.hf.loading import blank_image
        imgs = [blank_image()]
    text = b.render(prompt, len(imgs))
    return b.processor(images=imgs or None, text=text, return_tensors="pt")


def _start(b):
    return torch.tensor([[b.model.config.get_text_config().decoder_start_token_id]])


def ref_next_logits(b, imgs, prompt):
    enc = _single(b, imgs, prompt)
    if b.encoder_decoder:
        return b.model(**enc, decoder_input_ids=_start(b)).logits[0, -1]
    return b.model(**enc).logits[0, -1]


def ref_logprob(b, imgs, prompt, cont):
    enc = _single(b, imgs, prompt)
    ids = torch.tensor([b.tokenizer(cont, add_special_tokens=False)["input_ids"]])
    if b.encoder_decoder:
        logits = b.model(**enc, decoder_input_ids=torch.cat([_start(b), ids[:, :-1]], 1)).logits[0]
    else:
        full = torch.cat([enc["input_ids"], ids], 1)
        enc = dict(enc, input_ids=full, attention_mask=torch.ones_like(full))
        logits = b.model(**enc).logits[0, -ids.shape[1] - 1:-1]
    return F.log_softmax(logits.float(), -1).gather(-1, ids[0, :, None]).sum().item(), ids.shape[1]


def letter_ids(tok, letter):
    """Every single-token spelling of the letter ("A", " A"): what letter_spellings="all" combines."""
    out = set()
    for s in (letter, " " + letter):
        t = tok(s, add_special_tokens=False)["input_ids"]
        if len(t) == 1:
            out.add(t[0])
    return sorted(out)


def natural_letter(b, prompt, letter):
    """The paper's letter token, computed the plain way: the conversation with the assistant's reply `letter`
    rendered through the chat template, first token after the generation prompt; without a template the token
    that " A" adds after the prompt."""
    if b.encoder_decoder:          # the decoder writes the answer from its start token
        return b.tokenizer(letter, add_special_tokens=False)["input_ids"][0]
    if b.prompt_format == "chat_template":
        user = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": prompt}]}]
        texts = [b.processor.apply_chat_template(user, add_generation_prompt=True),
                 b.processor.apply_chat_template(user + [{"role": "assistant", "content": [
                     {"type": "text", "text": letter}]}])]
        bos = b.tokenizer.bos_token      # as processor.apply_chat_template(tokenize=True) tokenises a rendered text
        head, full = (b.tokenizer(t, add_special_tokens=not (bos and t.startswith(bos)))["input_ids"] for t in texts)
    else:
        text = b.render(prompt, 1)
        head, full = b.tokenizer(text)["input_ids"], b.tokenizer(text + " " + letter)["input_ids"]
    assert full[:len(head)] == head and len(full) > len(head)
    return full[len(head)]


def want_letters(b, logits, prompt):
    return torch.stack([logits[natural_letter(b, prompt, c)] for c in LETTERS]).float()


# ---- generative ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", GENERATIVE)
@torch.inference_mode()
def test_choice_logits_equal_reference_and_batch(name, root):
    b = backend(name, root)
    assert isinstance(b, Generative)
    imgs = one_image_each()
    got = b.choice_logits(imgs, PROMPTS, LETTERS)
    for i in range(len(PROMPTS)):
        logits = ref_next_logits(b, imgs[i], PROMPTS[i])
        assert torch.allclose(got[i], want_letters(b, logits, PROMPTS[0]), atol=TOL), (name, i)
        assert torch.allclose(got[i:i + 1], b.choice_logits(imgs[i:i + 1], PROMPTS[i:i + 1], LETTERS), atol=TOL)


@pytest.mark.parametrize("name", GENERATIVE)
@torch.inference_mode()
def test_continuation_logprobs_equal_reference_batch_and_no_reuse(name, root):
    b = backend(name, root)
    imgs = one_image_each(seed=1)
    sums, counts = b.continuation_logprobs(imgs, PROMPTS, CONTS)
    for i in range(len(PROMPTS)):
        for k, cont in enumerate(CONTS[i]):
            want, n = ref_logprob(b, imgs[i], PROMPTS[i], cont)
            assert abs(sums[i, k].item() - want) < TOL * max(1.0, abs(want)), (name, i, k)
            assert counts[i, k].item() == n
        one, _ = b.continuation_logprobs(imgs[i:i + 1], PROMPTS[i:i + 1], CONTS[i:i + 1])
        assert torch.allclose(one[0], sums[i], atol=TOL)
    plain, plain_counts = b.continuation_logprobs(imgs, PROMPTS, CONTS, reuse_cache=False)
    assert torch.allclose(plain, sums, atol=TOL) and torch.equal(plain_counts, counts)


@pytest.mark.parametrize("name", GENERATIVE)
def test_generate_batch_equals_one_at_a_time(name, root):
    b = backend(name, root)
    imgs = one_image_each(seed=2)
    batch = b.generate(imgs, PROMPTS, max_new_tokens=4)
    assert batch == [b.generate([im], [p], max_new_tokens=4)[0] for im, p in zip(imgs, PROMPTS)]
    assert all(isinstance(t, str) for t in batch)
    assert not any(p.split()[0] in t for p, t in zip(PROMPTS, batch))       # the prompt is stripped
    assert not any("USER" in t for t in batch)


@pytest.mark.parametrize("name", ["llava", "blip2-opt"])
@torch.inference_mode()
def test_blind_control_in_a_mixed_batch(name, root):
    b = backend(name, root)
    imgs = [[images(1)[0]], [None]]
    got = b.choice_logits(imgs, PROMPTS[:2], LETTERS)
    ref = ref_next_logits(b, [None], PROMPTS[1])
    assert torch.allclose(got[1], want_letters(b, ref, PROMPTS[0]), atol=TOL)
    if not b.blip:      # LLaVA-like: the blind prompt carries no image token at all
        assert "<image>" not in b.render(PROMPTS[1], 0)


@pytest.mark.parametrize("name", ["llava", "blip2-opt"])
@torch.inference_mode()
def test_image_after_a_blind_first_item_is_kept(name, root):
    """The batch's first item has no image: the second item's image must still reach the model."""
    b = backend(name, root)
    image = images(1)[0]
    got = b.choice_logits([[None], [image]], PROMPTS[:2], LETTERS)
    ref = ref_next_logits(b, [image], PROMPTS[1])
    assert torch.allclose(got[1], want_letters(b, ref, PROMPTS[0]), atol=TOL)


def test_render_uses_chat_template_or_documented_fallback(root):
    llava = backend("llava", root)
    assert llava.prompt_format == "chat_template"
    assert llava.render("Question: hi? Short Answer:", 1) == "USER: <image>\nQuestion: hi? Short Answer: ASSISTANT:"
    assert llava.render("Q", 2) == "USER: <image>\n<image>\nQ ASSISTANT:"
    raw = backend("llava", root, chat_template=False)
    assert raw.prompt_format.startswith("fallback") and raw.render("Q", 1) == "<image>\nQ"
    blip = backend("blip2-t5", root)
    assert blip.prompt_format.startswith("fallback") and blip.render("Question: hi?", 1) == "Question: hi?"


@torch.inference_mode()
def test_multi_image_prompts_and_max_images(root):
    b = backend("llava", root, max_images=2)
    two = [images(2, seed=3), images(2, seed=4)]
    got = b.choice_logits(two, PROMPTS[:2], LETTERS)
    for i in range(2):
        ref = ref_next_logits(b, two[i], PROMPTS[i])
        assert torch.allclose(got[i], want_letters(b, ref, PROMPTS[0]), atol=TOL)
    with pytest.raises(BackendInputError, match="at most 2"):  # a user error: one line on the command line
        b.choice_logits([images(3)], PROMPTS[:1], LETTERS)
    with pytest.raises(BackendInputError, match="at most 1"):
        backend("blip2-opt", root).choice_logits([images(2)], PROMPTS[:1], LETTERS)
    assert backend("llava", root).max_images == 1          # LLaVA-1.5: trained on one image per prompt
    with pytest.raises(BackendInputError, match=r"max_images 2 \(spec.extra / --extra\): .*blip2-opt's processor "
                                                r"places one image per prompt"):
        backend("blip2-opt", root, max_images=2)            # the query tokens come once per prompt


def test_choice_token_error_names_model_and_choice(root):
    b = backend("blip2-opt", root)
    with pytest.raises(ChoiceTokenError, match=r"blip2-opt: the choice 'Zebra-Q' .*--rule open"):
        b.choice_logits(one_image_each(1), PROMPTS[:1], ["A", "Zebra-Q"])
    ids = b.choice_ids(LETTERS)       # the natural spelling only: " A" after "Short Answer:" (byte-level BPE)
    assert all(len(v) == 1 for v in ids) and [b.tokenizer.decode(v) for v in ids] == [" A", " B", " C", " D"]
    every = backend("blip2-opt", root, letter_spellings="all")   # "A" and " A" are both single tokens, both used
    ids = every.choice_ids(LETTERS)
    assert all(len(v) == 2 for v in ids) and len({i for v in ids for i in v}) == 8
    with pytest.raises(ChoiceTokenError, match="share the token"):
        every.choice_ids(["A", " A"])


@torch.inference_mode()
def test_letter_spellings_all_is_logsumexp_not_max(root):
    b = backend("blip2-opt", root, letter_spellings="all")
    imgs = one_image_each(2)
    got = b.choice_logits(imgs, PROMPTS[:2], LETTERS)
    for i in range(2):
        logits = ref_next_logits(b, imgs[i], PROMPTS[i])
        want = torch.stack([torch.logsumexp(logits[letter_ids(b.tokenizer, c)], 0) for c in LETTERS])
        assert torch.allclose(got[i], want.float(), atol=TOL)
    with pytest.raises(ValueError, match="letter_spellings 'max'"):
        backend("blip2-opt", root, letter_spellings="max")


def test_empty_continuation_is_an_error(root):
    with pytest.raises(ValueError, match="has no tokens"):
        backend("llava", root).continuation_logprobs(one_image_each(1), PROMPTS[:1], [["", " a"]])


# ---- dual encoders ---------------------------------------------------------------------------------------
def ref_dual(b, name, imgs, texts):
    if name == "mclip":
        state = torch.load(b.spec.model + "/pytorch_model.bin", weights_only=True)
        from transformers import AutoConfig, XLMRobertaModel
        cfg = json.load(open(b.spec.model + "/config.json"))
        text = XLMRobertaModel(AutoConfig.from_pretrained(cfg["modelBase"])).eval()
        text.load_state_dict({k[12:]: v for k, v in state.items() if k.startswith("transformer.")}, strict=False)
        w, bias = state["LinearTransformation.weight"], state["LinearTransformation.bias"]
        rows = []
        for t in texts:
            enc = b.tokenizer([t], return_tensors="pt")
            rows.append(text(**enc).last_hidden_state[0].mean(0) @ w.T + bias)       # no padding: mean over all
        clip = b.vision
        ims = [_features(clip.get_image_features(**b.image_processor(images=[im], return_tensors="pt")))[0]
               for im in imgs]
        return F.normalize(torch.stack(ims), dim=-1), F.normalize(torch.stack(rows), dim=-1)
    pad = "max_length" if b.padding == "max_length" else False
    ims = [_features(b.model.get_image_features(**b.processor(images=[im], return_tensors="pt")))[0] for im in imgs]
    txs = [_features(b.model.get_text_features(**b.processor(text=[t], padding=pad, truncation=True, max_length=b.max_length,
                                                              return_tensors="pt")))[0] for t in texts]
    return F.normalize(torch.stack(ims), dim=-1), F.normalize(torch.stack(txs), dim=-1)


def _features(out):
    return out if isinstance(out, torch.Tensor) else out.pooler_output


@pytest.mark.parametrize("name", DUAL)
@torch.inference_mode()
def test_dual_encoder_equals_reference_and_batch(name, root):
    b = backend(name, root)
    assert isinstance(b, DualEncoder)
    imgs = images(2, seed=5) + images(1, seed=6, size=(25, 60))      # mixed sizes: NaFlex patch padding
    texts = [p + c for p, cs in zip(PROMPTS, CONTS) for c in cs[:2]]
    got_i, got_t = b.embed_images(imgs), b.embed_texts(texts)
    want_i, want_t = ref_dual(b, name, imgs, texts)
    assert torch.allclose(got_i, want_i, atol=TOL) and torch.allclose(got_t, want_t, atol=TOL)
    assert torch.allclose(got_t.norm(dim=-1), torch.ones(len(texts)), atol=1e-5)
    assert got_i.dtype == torch.float32 and got_i.device.type == "cpu"
    blank = b.embed_images([None])
    assert blank.shape == (1, got_i.shape[1]) and torch.isfinite(blank).all()


# ---- loading ---------------------------------------------------------------------------------------------
def test_backends_table_and_unknown_kind():
    assert set(BACKENDS) == {"clip", "mclip", "mllm", "vllm", "openai"}
    with pytest.raises(ValueError, match="unknown HF backend 'gpt'; supported: clip, mclip, mllm, vllm, openai"):
        load_backend("gpt", ModelSpec("x"))


def test_load_errors_are_one_line(root, tmp_path):
    with pytest.raises(ModelLoadError, match="does not exist"):
        load_backend("clip", ModelSpec(str(tmp_path / "nope")))
    with pytest.raises(ModelLoadError, match="has no config.json"):
        load_backend("mllm", ModelSpec(str(tmp_path)))
    with pytest.raises(ModelLoadError, match="unknown or unsupported architecture") as e:
        load_backend("mllm", ModelSpec(str(build("clip", root))))
    assert "\n" not in str(e.value)
    with pytest.raises(ModelLoadError, match="unknown dtype 'fp8'"):
        load_backend("clip", ModelSpec(str(build("clip", root)), dtype="fp8"))
    with pytest.raises(ModelLoadError, match="not 'M-CLIP'"):
        load_backend("mclip", ModelSpec(str(build("clip", root))))
    bad = tmp_path / "weird"
    bad.mkdir()
    (bad / "config.json").write_text(json.dumps({"model_type": "no-such-arch"}))
    with pytest.raises(ModelLoadError, match="unknown or unsupported architecture"):
        load_backend("clip", ModelSpec(str(bad)))
    broken = tmp_path / "broken-mclip"  # M-CLIP's weights file cut short: one line naming the file
    shutil.copytree(build("mclip", root), broken)
    weights = broken / "pytorch_model.bin"
    weights.write_bytes(weights.read_bytes()[:1000])
    with pytest.raises(ModelLoadError, match=r"broken-mclip: cannot read .*pytorch_model\.bin") as e:
        load_backend("mclip", ModelSpec(str(broken)))
    assert "\n" not in str(e.value)


def test_mclip_text_base_outside_the_cache_is_one_line(root, tmp_path, monkeypatch):
    """M-CLIP builds its XLM-R tower from the config of `modelBase` (a hub id in the published models): not in the
    local HF cache, that is one line saying so; `text_base` (--text-base) points at a local copy instead."""
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)     # nothing is downloaded
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "empty-cache"))
    built = build("mclip", root)
    model = tmp_path / "mclip-hub-base"
    shutil.copytree(built, model)
    config = json.loads((model / "config.json").read_text())
    (model / "config.json").write_text(json.dumps(dict(config, modelBase="FacebookAI/xlm-roberta-large")))
    extra = spec_extra("mclip", built)
    with pytest.raises(ModelLoadError) as e:
        load_backend("mclip", ModelSpec(str(model), extra=extra))
    message = str(e.value)
    assert "\n" not in message and "'FacebookAI/xlm-roberta-large'" in message
    assert "must be in the local Hugging Face cache or be given as a local folder (--text-base" in message
    backend = load_backend("mclip", ModelSpec(str(model), extra=dict(extra, text_base=str(built / "xlmr-base"))))
    reference = load_backend("mclip", ModelSpec(str(built), extra=extra))
    torch.testing.assert_close(backend.embed_texts(["ein Hund", "a dog"]), reference.embed_texts(["ein Hund", "a dog"]))


def _transparent_photos() -> dict:
    from PIL import Image

    rng = np.random.default_rng(0)
    rgba = Image.fromarray(rng.integers(0, 256, (20, 30, 4), dtype=np.uint8), "RGBA")   # every alpha level
    palette = Image.fromarray(rng.integers(0, 8, (20, 30), dtype=np.uint8), "P")
    palette.putpalette(list(rng.integers(0, 256, 768, dtype=np.uint8)))
    palette.info["transparency"] = 3
    return {"RGBA": rgba, "LA": rgba.convert("LA"), "P+transparency": palette, "RGB": rgba.convert("RGB"),
            "L": rgba.convert("L")}


@pytest.mark.parametrize("mode", ["RGBA", "LA", "P+transparency", "RGB", "L"])
def test_photos_are_composited_on_white_as_the_processors_do(root, tmp_path, mode):
    """One convention for every HF backend's photos: `photo_rgb` (transparency on white) gives the pixels of
    transformers' `convert_to_rgb`, so a CLIP processor sees the same image whether the project or the
    processor converts it; both image readers (IGLUE files, CVQA parquet bytes) use it."""
    from transformers.image_transforms import convert_to_rgb

    from volta_ml.cvqa.backend_run import decode_photo
    from volta_ml.hf.loading import photo_rgb
    from volta_ml.iglue_hf.images import ImageRef, ImageSource

    image = _transparent_photos()[mode]
    expected = convert_to_rgb(image, return_numpy=True)
    assert np.array_equal(np.asarray(photo_rgb(image)), expected)
    image.save(tmp_path / "photo.png")
    read = ImageSource(tmp_path, "{id}.png").load(ImageRef(id="photo"))
    assert read.mode == "RGB" and np.array_equal(np.asarray(read), expected)
    decoded = decode_photo((tmp_path / "photo.png").read_bytes(), "photo", {"max_pixels": 10**8, "max_side": None}, {})
    assert decoded.mode == "RGB" and np.array_equal(np.asarray(decoded), expected)
    backend = load_backend("clip", ModelSpec(str(build("clip", root))))
    torch.testing.assert_close(backend.embed_images([read]), backend.embed_images([image]), rtol=0, atol=0)


def test_dtype_is_applied(root):
    b = load_backend("mllm", ModelSpec(str(build("blip2-opt", root)), dtype="bf16"))
    assert next(b.model.parameters()).dtype == torch.bfloat16
    logits = b.choice_logits(one_image_each(1), PROMPTS[:1], LETTERS)
    assert logits.dtype == torch.float32 and torch.isfinite(logits).all()


def test_revision_dtype_and_device_map_are_passed_through(root, monkeypatch):
    from transformers import AutoModel
    seen = {}

    def fake(src, **kwargs):
        seen.update(kwargs, src=src)
        raise OSError("stop here\nsecond line")
    monkeypatch.setattr(AutoModel, "from_pretrained", fake)
    path = build("clip", root)
    with pytest.raises(ModelLoadError, match=r"cannot load a CLIP-family dual encoder \(stop here\)$"):
        load_backend("clip", ModelSpec(str(path), revision="0123abc", dtype="fp16", device_map="auto"))
    assert seen == {"src": str(path), "revision": "0123abc", "dtype": torch.float16, "device_map": "auto",
                    "output_loading_info": True,   # the loading report is checked (test_hf_loading_report.py),
                    "ignore_mismatched_sizes": True}   # other shapes into it too, refused naming the tensor


@torch.inference_mode()
def test_device_map_auto_gives_the_same_scores(root):
    path = build("blip2-opt", root)
    mapped = load_backend("mllm", ModelSpec(str(path), device_map="auto"))
    imgs = one_image_each(2, seed=6)
    assert torch.allclose(mapped.choice_logits(imgs, PROMPTS[:2], LETTERS),
                          backend("blip2-opt", root).choice_logits(imgs, PROMPTS[:2], LETTERS), atol=TOL)


@torch.inference_mode()
def test_legacy_mblip_layout_gets_its_image(root):
    """mBLIP ships no image token: without the fix transformers 5 would silently drop the image."""
    b = backend("mblip-legacy", root)
    assert b.processor.num_query_tokens == 4 and b.model.config.image_token_index == b.tokenizer.convert_tokens_to_ids("<image>")
    enc = _single(b, images(1)[0:1], PROMPTS[0])
    assert (enc["input_ids"][0, :4] == b.model.config.image_token_index).all()
    a, c = b.choice_logits([images(1, seed=7), images(1, seed=8)], PROMPTS[:1] * 2, LETTERS)
    assert not torch.allclose(a, c, atol=1e-5)


@pytest.mark.parametrize("name", ["llava", "blip2-opt", "blip2-t5"])
def test_generate_says_which_answers_were_cut_at_max_new_tokens(name, root):
    """(#44) An answer is truncated when generation stopped at max_new_tokens, not at a stop token: decided from the
    generated ids. A random tiny model never emits its EOS in 4 tokens (checked on its raw ids here); made to stop at
    the token it emits first, the same prompt is not truncated."""
    from volta_ml.hf.base import Answer

    b = backend(name, root)
    imgs = one_image_each(seed=2)
    batch = b.generate(imgs, PROMPTS, max_new_tokens=4)
    assert all(isinstance(a, Answer) and a.truncated in (True, False) for a in batch)
    assert [a.truncated for a in batch] == [b.generate([im], [p], max_new_tokens=4)[0].truncated
                                            for im, p in zip(imgs, PROMPTS)]
    inputs = b._batch(imgs[:1], PROMPTS[:1])
    raw = b._generated(b.model.generate(**inputs, max_new_tokens=4, do_sample=False, num_beams=1,
                                        pad_token_id=b.pad_id), inputs)[0].tolist()
    assert batch[0].truncated == (not set(raw) & b.stop_ids())
    first = raw[0]
    configs = [c for c in {id(o.generation_config): o.generation_config for o in (b.model, b.lm)}.values()]
    saved = [c.eos_token_id for c in configs]
    try:
        for c in configs:
            c.eos_token_id = first
        stopped = b.generate(imgs[:1], PROMPTS[:1], max_new_tokens=4)[0]
        assert stopped.truncated is False and batch[0].truncated is True, (raw, first)
    finally:
        for c, eos in zip(configs, saved):
            c.eos_token_id = eos
