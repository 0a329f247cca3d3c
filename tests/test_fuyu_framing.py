"""Fuyu's open rule and blind control, in token ids (#42.8), on the tiny Fuyu of tests/helpers_vlm_families.py.

Fuyu's processor frames a prompt only around an image: `processor(text=prompt, images=[image])` writes the image as
rows of `|SPEAKER|` patch tokens each closed by `|NEWLINE|`, then BOS, the prompt, and `<0x04>`, its
beginning-of-answer token; its `post_process_image_text_to_text` reads the answer as the tokens after that token.
So the answer the model scores after a prompt is the tokens `prompt + "<0x04>" + continuation` adds after
`prompt + "<0x04>"` (" Paris" -> "▁Paris", the letter "▁A": the answer follows `<0x04>` after a space). The
backend's open rule must equal one plain forward of the processor's ids followed by those tokens, and a plain
computation done one token at a time. An outside computation that differs scored other ids; the miscountings
below show which: each scores one token more, and the continuation after it.

Blind control: a blank image, inside the same frame (rows, BOS, prompt, `<0x04>`); the processor's text-only
framing is another one (`[BOS] prompt`, no `<0x04>`), so a text-only computation is not the photo's absence alone.
Every test prints the ids each side scores (`pytest -s`).
"""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from helpers_hf import images
from helpers_vlm_families import build_family, shared_root

from volta_ml.hf import ModelSpec, load_backend
from volta_ml.hf.loading import blank_image

# Fuyu's post_process_image_text_to_text copies its tensors with torch.tensor(tensor): torch warns
pytestmark = [pytest.mark.usefixtures("one_thread"),
              pytest.mark.filterwarnings("ignore:To copy construct from a tensor:UserWarning")]
PROMPT = "Question: which food is this? Short Answer:"
CONTS = [" rice and beans", " Paris", " a small shop"]
TOL = 1e-4


@pytest.fixture(scope="module")
def fuyu():
    return load_backend("mllm", ModelSpec(str(build_family("fuyu", shared_root()))))


@pytest.fixture(scope="module")
def photo():
    return images(1, 5, (30, 70))[0]


def _frame(b, image, prompt=PROMPT) -> list[int]:
    """The processor's own ids for one prompt with one image (the model card's call)."""
    return b.processor(text=prompt, images=[image], return_tensors="pt")["input_ids"][0].tolist()


def _after(b, head: str, text: str) -> list[int]:
    """The tokens `head + text` adds after `head` (the prefix checked)."""
    short, full = b.tokenizer(head)["input_ids"], b.tokenizer(head + text)["input_ids"]
    assert full[:len(short)] == short
    return full[len(short):]


def _inputs(b, image, ids: list[int]) -> dict:
    """`ids` (a processor frame plus the scored tokens) with the image's patches, as one row."""
    enc = b.processor(text=PROMPT, images=[image], return_tensors="pt")
    return {"input_ids": torch.tensor([ids]), "attention_mask": torch.ones(1, len(ids), dtype=torch.long),
            "image_patches": enc["image_patches"]}


def plain(b, image, frame: list[int], cont: list[int]) -> float:
    """log P(cont | frame): one forward of frame + cont."""
    logits = b.model(**_inputs(b, image, frame + cont)).logits[0, len(frame) - 1:-1]
    return F.log_softmax(logits.float(), -1).gather(-1, torch.tensor(cont)[:, None]).sum().item()


def one_at_a_time(b, image, frame: list[int], cont: list[int]) -> float:
    """The same, written the obvious way: for each token, a forward of everything before it, its log-probability."""
    total = 0.0
    for t, token in enumerate(cont):
        logits = b.model(**_inputs(b, image, frame + cont[:t])).logits[0, -1]
        total += F.log_softmax(logits.float(), -1)[token].item()
    return total


def _show(b, label: str, ids: list[int]) -> None:
    print(f"{label}: {ids}\n  {b.tokenizer.convert_ids_to_tokens(ids)}")


@torch.inference_mode()
def test_the_open_rule_scores_the_tokens_after_fuyus_answer_marker_as_one_plain_forward(fuyu, photo):
    b, tok = fuyu, fuyu.tokenizer
    speaker, newline, bos = b.processor.image_token_id, b.processor.image_newline_id, tok.bos_token_id
    boa = tok.convert_tokens_to_ids("<0x04>")
    frame = _frame(b, photo)
    _show(b, "processor(text=prompt, images=[photo])", frame)
    rows = frame.index(bos)
    assert set(frame[:rows]) == {speaker, newline} and frame[rows - 1] == newline, "image rows, closed by |NEWLINE|"
    assert frame[rows:] == [bos] + tok(PROMPT, add_special_tokens=False)["input_ids"] + [boa], \
        "then BOS, the prompt and <0x04>, written once by the processor"
    assert b.encode([[photo]], [PROMPT])["input_ids"][0].tolist() == frame, "the backend feeds the processor's frame"
    sums, counts = b.continuation_logprobs([[photo]], [PROMPT], [CONTS])
    no_cache, _ = b.continuation_logprobs([[photo]], [PROMPT], [CONTS], reuse_cache=False)
    for k, text in enumerate(CONTS):
        ours = b.continuation_ids(PROMPT, text)
        _show(b, f"continuation {text!r} (both sides)", ours)
        assert ours == _after(b, PROMPT + "<0x04>", text), "the tokens prompt + <0x04> + continuation adds"
        assert boa not in ours and bos not in ours and tok.convert_ids_to_tokens(ours)[0].startswith("▁")
        # Fuyu's own reading of an answer: the tokens after its beginning-of-answer token, decoded
        assert b.processor.post_process_image_text_to_text(torch.tensor([frame + ours])) == [text.strip()]
        want = plain(b, photo, frame, ours)
        print(f"  ours {sums[0, k].item():.6f}  one forward {want:.6f}")
        assert counts[0, k].item() == len(ours)
        assert abs(sums[0, k].item() - want) < TOL and abs(no_cache[0, k].item() - want) < TOL
        assert abs(one_at_a_time(b, photo, frame, ours) - want) < TOL


@torch.inference_mode()
def test_outside_computations_that_score_other_ids_differ_by_exactly_what_they_add(fuyu, photo):
    """Each miscounting, in ids, against the open rule's: the processor's `<0x04>` scored again (the continuation
    taken after the prompt instead of after `<0x04>`), the tokenizer's BOS scored (the continuation tokenised
    alone with special tokens): each is the rule's ids with one token in front, and its sum is that token's
    log-probability plus the continuation's after it (not after `<0x04>`). The continuation without its leading
    space starts with another token."""
    b, tok = fuyu, fuyu.tokenizer
    boa, bos = tok.convert_tokens_to_ids("<0x04>"), tok.bos_token_id
    frame, text = _frame(b, photo), CONTS[0]
    ours = b.continuation_ids(PROMPT, text)
    rule = b.continuation_logprobs([[photo]], [PROMPT], [[text]])[0][0, 0].item()
    _show(b, "the open rule", ours)
    for label, ids, extra in (("after the prompt, not after <0x04>", _after(b, PROMPT, "<0x04>" + text), boa),
                              ("tokenised alone with special tokens", tok(text)["input_ids"], bos)):
        _show(b, label, ids)
        assert ids == [extra] + ours
        first = F.log_softmax(b.model(**_inputs(b, photo, frame)).logits[0, -1].float(), -1)[extra].item()
        other = plain(b, photo, frame, ids)
        print(f"  {other:.4f} = open rule {rule:.4f} + log P({tok.convert_ids_to_tokens(extra)}) {first:.4f} "
              f"+ (the rest after it) {other - rule - first:+.4f}")
        assert abs(other - plain(b, photo, frame + [extra], ours) - first) < TOL
    bare = _after(b, PROMPT + "<0x04>", text.lstrip())
    _show(b, "without its leading space", bare)
    assert bare[0] != ours[0] and not tok.convert_ids_to_tokens(bare)[0].startswith("▁")


@torch.inference_mode()
def test_the_blind_control_is_a_blank_image_in_the_same_frame_not_the_text_only_framing(fuyu, photo):
    b, tok = fuyu, fuyu.tokenizer
    boa, bos = tok.convert_tokens_to_ids("<0x04>"), tok.bos_token_id
    blank = _frame(b, blank_image())
    _show(b, "blind: processor(text=prompt, images=[blank image])", blank)
    assert blank[blank.index(bos):] == _frame(b, photo)[_frame(b, photo).index(bos):], \
        "the same BOS, prompt and <0x04> as with the photo; only the rows differ"
    assert b.encode([[None]], [PROMPT])["input_ids"][0].tolist() == blank
    text_only = b.processor(text=PROMPT, return_tensors="pt")["input_ids"][0].tolist()
    _show(b, "processor(text=prompt) (text only)", text_only)
    assert text_only == [bos] + tok(PROMPT, add_special_tokens=False)["input_ids"] and boa not in text_only, \
        "without an image the processor writes no rows and no <0x04>: another frame"
    sums, _ = b.continuation_logprobs([[None]], [PROMPT], [CONTS])
    for k, text in enumerate(CONTS):
        ours = b.continuation_ids(PROMPT, text)
        want = plain(b, blank_image(), blank, ours)
        assert abs(sums[0, k].item() - want) < TOL
        cont = _after(b, PROMPT, text)
        logits = b.model(input_ids=torch.tensor([text_only + cont])).logits[0, len(text_only) - 1:-1]
        outside = F.log_softmax(logits.float(), -1).gather(-1, torch.tensor(cont)[:, None]).sum().item()
        print(f"  {text!r}: blind (blank image) {sums[0, k].item():.4f}, text-only framing {outside:.4f}")
