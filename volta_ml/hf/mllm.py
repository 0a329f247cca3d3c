"""Generative image-text models, the core: a decoder-only LM whose text holds the image placeholders the model's
own processor expands (LLaVA, Qwen-VL, Qwen3.5, Gemma 3 / 4, PaliGemma, Idefics3/SmolVLM, LLaVA-NeXT/OneVision,
Mistral 3, Mllama, Aya Vision, InternVL, GLM-4.6V, LFM2-VL, Cohere2 Vision, Molmo2: docs/hf_backends.md has the
table). The BLIP family (query tokens prepended, OPT / BLOOM or T5 / mT0 LMs) is `hf/blip.py`; which class a model
gets is the table of `hf/generative.py`; what differs between families is the one family table, `hf/families.py`.

How inputs are built: ONE call of the model's own processor per batch, with the tokenizer's padding side set to
the left. The processor then pads every per-token key (`token_type_ids`, `mm_token_type_ids`,
`cross_attention_mask`) and every pixel tensor (patches, tiles, H x W, `pixel_attention_mask`, `image_sizes`,
`image_grid_thw`) the way its model expects. Outputs that are not arguments of the model's forward (`labels`) are
dropped. A batch mixing prompts with different numbers of images (a blind row among photo rows) is split into
groups of equal image count, one processor call each.

The text is tokenised once, as `processor.apply_chat_template(tokenize=True)` does: the user turn is rendered
through the chat template; when the rendered text already starts with the tokenizer's BOS, no special tokens are
added again (no double BOS). The template's switches are options: `spec.extra["enable_thinking"]` (true / false;
absent: the template's own default, e.g. Qwen3.5 and GLM-4.6V think, Gemma 4 does not) is passed to every
rendering, refused where the template has no such switch, and recorded (`template_options`). Without a chat
template (or `spec.extra["chat_template"] = False`) the frame is the family's (`Family.fallback`): LLaVA-like
`<image>\\n` per image then the prompt; PaliGemma `<image>` per image then the prompt (its processor adds BOS and
the closing newline); BLIP family the prompt as is. A processor that places the image tokens itself (Fuyu's: the
patch rows, BOS, the prompt, `<0x04>`) is detected at load (`_own_placement`) and framed as the BLIP family: the
prompt as is, a blank image for the blind control, and what it writes after the prompt as the frame's end, after
which the letter and the continuations are read (Fuyu: the answer after its beginning-of-answer `<0x04>`, which
the processor writes once and is never scored). `self.prompt_format` says which was used.

Positions come from each batch's own inputs, never from state the model keeps between calls (Qwen-VL's and GLM's
`rope_deltas` of the previous batch): `prompt_positions(batch)` is the model's `get_rope_index` on this batch for
M-RoPE families (a text-only batch: text positions in each section), else counted over the real tokens (cumsum of
the attention mask - 1, as `generate` does for left padding); every forward passes them. A continuation written
after the prompt (KV cache or full forward) counts on from each row's largest prompt position, as `generate` does.
KV-cache continuations carry what `generate` carries: `cross_attention_mask` (Mllama: the prompt's last row
repeated), `token_type_ids` / `mm_token_type_ids` over the continuation (0 = text; PaliGemma 1 = causal suffix).

Blind control (`None` images): families whose processor runs without an image get none (a text-only prompt);
those whose processor requires an image (`Family.needs_image`: PaliGemma, BLIP family) or frames the prompt only
around one (Fuyu: without an image `[BOS] prompt`, no rows and no `<0x04>`) get `blank_image()`, in the frame a
photo gets.

At load, probes run the model's own code (one forward of a one-word blind prompt; the processor on blank images):
a model type whose code fails there in the installed transformers (Llama 4's forward in 5.24, an Aria processor's
KeyError) is one `ModelLoadError` line naming it, the probe and the version (`_load_probe`).

Scoring.
- `choice_logits` (the CVQA paper's MMLU-style letter rule): a choice's score is the next-token logit of the letter
  typed right after the generation prompt: the tokens that `choice` adds after the rendered prompt, after the
  separator the model's reply starts with when it merges into the letter (the template's whitespace between its
  generation prompt and the reply of the answered conversation: LLaVA's "ASSISTANT:" + " A"; without a template
  the family's " " (PaliGemma: "A" after its processor's newline)); else the bare letter. Thinking templates
  (Qwen3.5 thinking on, Gemma 4 26B / 31B, GLM-4.6V) render answered turns without the thinking block their
  generation prompt opens or closes: the letter is read right after that generation prompt. One token per
  choice; `ChoiceTokenError` (one line) when a choice is not one token. `spec.extra["letter_spellings"] = "all"`
  instead combines every single-token spelling of the choice ("A", " A") by logsumexp of their logits (summed
  probabilities), never a max of raw logits.
- `continuation_logprobs`: the tokens that `prompt + continuation` adds after the prompt (the prompt's tokens
  checked to be a prefix), so pass the leading space your prompt needs (" Paris" after "Answer:"). The prompt
  runs once and the K continuations of each prompt run as one batch on its KV cache, repeated K times per row;
  a cache whose states the repeat does not cover (linear-attention / convolution layers: Qwen3.5, LFM2-VL) turns
  `self.cache_reuse` off and the K continuations run as full forwards (same numbers), as `reuse_cache=False` does.
- `generate`: greedy (`model.generate`, no sampling, one beam).

Images per prompt (`self.max_images`; None = no limit but the context): `spec.extra["max_images"]` when given;
else `Family.max_images` for families whose checkpoints were trained on one image per prompt (BLIP family,
PaliGemma, LLaVA-1.5, LLaVA-NeXT, Mllama); else no limit when the processor places a second image (probed at
load: a prompt with two images gets other image tokens than with one: `_places_second_image`), 1 when it does
not. A value of 2 or more is refused (`BackendInputError`) where the processor places one image only. `iglue-hf`
gives MaRVL's two photos as two images when the backend takes two, else the side-by-side canvas.
`self.vqa_frame`: the short-answer VQA frame of the BLIP family's paper (`iglue-hf` xGQA), None for others.
"""
from __future__ import annotations

import contextlib
import dataclasses
import inspect
import re
from typing import Sequence

import torch
import torch.nn.functional as F
from PIL import Image

from .base import LETTER_SPELLINGS, Answer, BackendInputError, ChoiceTokenError, ModelSpec
from .families import Family, family
from .loading import (ModelLoadError, attach_adapter, blank_image, float_dtype, input_device, load_model,
                      load_processor, one_line)

PROBE_PROMPTS = ("A", "B")          # two prompts whose encodings differ in the last token only (the frame's end)
NOT_INPUTS = ("labels",)             # processor outputs that the forward takes but that are not inputs (a loss)
# per-token keys (shape [B, L, ...]) and how a continuation extends them: a fill value, or "last" (repeat the
# prompt's last position, as Mllama's generate does for cross_attention_mask)
PER_TOKEN = {"token_type_ids": 0, "mm_token_type_ids": 0, "cross_attention_mask": "last"}


def _pad(seqs: Sequence[torch.Tensor], value: int, left: bool) -> torch.Tensor:
    out = torch.full((len(seqs), max(len(s) for s in seqs)), value, dtype=seqs[0].dtype)
    for i, s in enumerate(seqs):
        if left:
            out[i, out.shape[1] - len(s):] = s
        else:
            out[i, :len(s)] = s
    return out


def _positions(mask: torch.Tensor) -> torch.Tensor:
    return (mask.long().cumsum(-1) - 1).clamp(min=0)


def _params(fn) -> set[str]:
    return set(inspect.signature(fn).parameters)


def is_encoder_decoder(config) -> bool:
    """Whether the model's language model is an encoder-decoder (T5 / mT0 in BLIP-2, InstructBLIP, mBLIP)."""
    return bool(getattr(config.get_text_config(), "is_encoder_decoder", False))


def _batch_tensors(layer) -> dict[str, torch.Tensor]:
    """A cache layer's tensors by attribute (and key, for dicts of states), to check its batch dimension."""
    out = {}
    for name, value in vars(layer).items():
        items = value.items() if isinstance(value, dict) else [(None, value)]
        for key, tensor in items:
            if torch.is_tensor(tensor) and tensor.dim() > 0:
                out[f"{name}[{key}]"] = tensor
    return out


def _expand_cache(cache, k: int, rows: int) -> bool:
    """Repeat each row of `cache` K times in place (`batch_repeat_interleave`); False when the cache cannot be
    expanded: it has no such method, or a layer kept a tensor of `rows` rows that the repeat left as it was (a
    linear-attention layer's conv / recurrent states, which only some cache classes repeat). The cache is then
    unusable and the caller takes the no-cache path."""
    if k == 1:
        return True
    layers = list(getattr(cache, "layers", []))
    before = [{n for n, t in _batch_tensors(layer).items() if t.shape[0] == rows} for layer in layers]
    try:
        cache.batch_repeat_interleave(k)
    except (AttributeError, NotImplementedError):
        return False
    after = [_batch_tensors(layer) for layer in layers]
    return all(now[n].shape[0] == rows * k for now, names in zip(after, before) for n in names if n in now)


class GenerativeBackend:
    """The `Generative` contract (hf/base.py) for a decoder-only LM with image placeholders in its text. Subclasses
    (hf/blip.py) override the hooks marked "hook" for another input layout or an encoder-decoder LM."""
    layout = "image_tokens"          # the `Family.layout` and LM kind this class takes (hf/generative.py's table)
    encoder_decoder = False
    blip = False                     # query tokens prepended to the LM input (hf/blip.py)
    pad_left = True                  # decoder-only LMs continue after the prompt: pads on the left

    def __init__(self, spec: ModelSpec, model=None, processor=None):
        """Loads `spec`; or wraps an already built `model` + `processor` (benchmarks with random weights).
        `hf.generative.generative_backend` picks the class for a model."""
        from transformers import AutoModelForImageTextToText, AutoProcessor
        self.spec = spec
        self.model = model if model is not None else \
            load_model(AutoModelForImageTextToText, spec, "a generative image-text model")
        self.processor = processor if processor is not None else load_processor(AutoProcessor, spec)
        if spec.adapter:   # a LoRA adapter (volta-ml train --hf_backend mllm): injected into self.model in place
            attach_adapter(self.model, spec).eval()
        self.tokenizer = self.processor.tokenizer
        cfg = self.model.config
        self.family = family(cfg.model_type)
        if (self.family.layout, is_encoder_decoder(cfg)) != (self.layout, self.encoder_decoder):
            raise ModelLoadError(f"{spec.model}: {type(self).__name__} does not take model type {cfg.model_type!r} "
                                 "(build the backend with volta_ml.hf.generative.generative_backend)")
        if self.pad_left:
            self.tokenizer.padding_side = "left"
        self._setup()
        self.forward_keys = _params(self.model.forward)
        self.positions = self._position_kind()
        self.keep_last = {"logits_to_keep": 1} if "logits_to_keep" in _params(self.lm.forward) else {}
        self.letter_spellings = spec.extra.get("letter_spellings", "natural")
        if self.letter_spellings not in LETTER_SPELLINGS:
            raise BackendInputError(f"letter_spellings {self.letter_spellings!r}: use one of {', '.join(LETTER_SPELLINGS)}")
        use_template = spec.extra.get("chat_template", True) and getattr(self.processor, "chat_template", None)
        self.enable_thinking = spec.extra.get("enable_thinking")
        self.template_options = self._template_options(use_template)
        if not use_template and self.family.fallback == "image_newline":
            self.family = self._own_placement() or self.family
        self.prompt_format = "chat_template" if use_template else {
            "as_is": "fallback: prompt as is (the processor places the image tokens"
                     + (f", appends {self.family.frame_end!r}" if self.family.frame_end else "") + ")",
            "image_prefix": "fallback: <image> per image, then the prompt (the processor adds BOS and \\n)",
            "image_newline": "fallback: <image>\\n per image"}[self.family.fallback]
        self.max_images = self._max_images(spec.extra.get("max_images"))
        self.pad_id = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None \
            else self.tokenizer.eos_token_id
        self.device, self.dtype = input_device(self.model), float_dtype(self.model)
        self._choice_cache: dict[tuple, list[list[int]]] = {}
        # the open rule continues each prompt from its KV cache repeated K times, until a cache that cannot be
        # repeated (hybrid / linear-attention layers' recurrent states) turns this off: K full forwards instead
        self.cache_reuse = True
        if self.device.type == "meta":   # built without weights (FSDP ranks > 0, `loading.meta_model`): inputs are
            self.device = torch.device("cpu")   # built on the CPU; the forward is checked where the weights are
        else:
            self._check_forward()

    # ---- hooks: what the layout / LM kind changes ------------------------------------------------------------
    vqa_frame: str | None = None     # the short-answer VQA frame of the family's paper (BLIP family)

    def _setup(self) -> None:
        """hook: what a layout needs before the inputs are built."""

    @property
    def lm(self):
        """hook: the module that continues a sequence from a cache (here the whole model, without pixels)."""
        return self.model

    def _text_lm(self):
        """hook: the text model whose forward says whether it takes `position_ids`."""
        return getattr(getattr(self.model, "model", None), "language_model", self.model)

    def _position_kind(self) -> str | None:
        """hook: "mrope" (the model has `get_rope_index`), "mask" (its LM takes `position_ids`) or None."""
        self.rope_index = getattr(getattr(self.model, "model", None), "get_rope_index", None)
        if self.rope_index is not None:
            self.rope_keys = _params(self.rope_index)
            return "mrope"
        return "mask" if "position_ids" in _params(self._text_lm().forward) else None

    def _template_images(self, num_images: int) -> int:
        """hook: the image entries the chat template gets for `num_images` images."""
        return num_images

    def _batch(self, images, prompts) -> dict:
        """hook: the model inputs of prompts that share their number of images (one processor call)."""
        imgs = [self._images(im) for im in images]
        texts = [self.render(p, len(im)) for p, im in zip(prompts, imgs)]
        kw = {"add_special_tokens": self._special_tokens(texts[0])}
        if any(imgs):
            kw["images"] = imgs
        enc = self.processor(text=texts, padding=True, return_tensors="pt", **kw)
        return self._device({k: v for k, v in enc.items()
                             if k in self.forward_keys and k not in NOT_INPUTS and torch.is_tensor(v)})

    def _next_token_logits(self, batch: dict) -> torch.Tensor:
        """hook: [B, V] logits of the token after each prompt."""
        return self._forward(batch, **self.keep_last).logits[:, -1]

    def _letter_ids(self, prompt: str, choice: str) -> list[int]:
        """hook: the letter rule's token of `choice` (the module docstring), empty when it is not one token."""
        before = self.render(prompt, 1)
        if self.prompt_format != "chat_template":
            before += self.family.frame_end
        head = self._text_ids(before)
        for sep in dict.fromkeys((self._reply_separator(prompt, before, choice), "")):
            full = self._text_ids(before + sep + choice)
            if full[:len(head)] == head and len(full) == len(head) + 1 and \
                    self.tokenizer.decode(full[-1:]).strip() == choice.strip():
                return full[-1:]
        return []

    def continuation_ids(self, prompt: str, continuation: str, num_images: int = 1) -> list[int]:
        """hook: the tokens `continuation` adds after the rendered prompt (checked to be a prefix)."""
        text = self.render(prompt, num_images)
        if self.prompt_format != "chat_template":
            text += self.family.frame_end
            if not self.family.answer_sep:
                continuation = continuation.lstrip()
        head, full = self._text_ids(text), self._text_ids(text + continuation)
        if full[:len(head)] != head:
            raise BackendInputError(f"{self.spec.model}: the prompt's tokens change when {continuation!r} follows it "
                             "(the continuation merges with the prompt's last token)")
        ids = full[len(head):]
        if not ids:
            raise BackendInputError(f"{self.spec.model}: continuation {continuation!r} has no tokens")
        return ids

    def _reused(self, batch: dict, flat: list[torch.Tensor], k: int) -> torch.Tensor:
        """hook: the summed log-probabilities [n * k] of the K continuations of each prompt, the prompt encoded
        once: its KV cache repeated K times (the no-cache path where the cache cannot be repeated)."""
        positions = self.prompt_positions(batch)
        out = self._forward(batch, positions, use_cache=True, **self.keep_last)
        cache = out.cache if getattr(out, "cache", None) is not None else out.language_model_outputs.cache
        if not _expand_cache(cache, k, len(batch["input_ids"])):
            self.cache_reuse = False            # a cache with states that cannot be repeated: K full forwards
            return self._full_forwards(batch, flat, k)
        first = out.logits[:, -1:].repeat_interleave(k, dim=0)                   # predicts each first token
        prefix_mask = batch["attention_mask"].repeat_interleave(k, dim=0)
        ids, mask = self._cont_batch(flat)
        kw = self._continuation_keys(batch, k, ids.shape[1])
        if positions is not None:   # the continuation's: after each prompt's own last position
            kw["position_ids"] = self._next_positions(positions.repeat_interleave(k, dim=-2), ids.shape[1])
        rest = self.lm(input_ids=ids, attention_mask=torch.cat([prefix_mask, mask], 1), cache=cache,
                       use_cache=False, **kw).logits
        return self._gather(torch.cat([first, rest[:, :-1]], 1), ids, mask)

    def _continuation_keys(self, batch: dict, k: int, width: int) -> dict:
        """hook: the per-token keys of `width` continuation positions of each prompt repeated K times."""
        return self._per_token({key: v.repeat_interleave(k, dim=0) for key, v in batch.items() if key in PER_TOKEN},
                               width, only_new=True)

    def _full_forward_sums(self, batch: dict, conts: list[torch.Tensor]) -> torch.Tensor:
        """hook: [n] summed log-probabilities of one continuation per prompt, one forward of prompt + answer."""
        full, ids, mask = self.append_continuations(batch, conts)
        return self._gather(self.continuation_logits(full, ids.shape[1]), ids, mask)

    def _generated(self, out: torch.Tensor, batch: dict) -> torch.Tensor:
        """hook: the new tokens of `generate`'s output (decoder-only LMs return the prompt first)."""
        width = batch["input_ids"].shape[1]
        if out.shape[1] >= width and torch.equal(out[:, :width], batch["input_ids"]):
            return out[:, width:]
        return out

    # ---- load-time checks and options -------------------------------------------------------------------------
    @contextlib.contextmanager
    def _load_probe(self, what: str):
        """Every load-time probe runs inside this: whatever the model's own code raises there (Llama 4's forward,
        an Aria processor that ignores its saved image size: a KeyError) is one `ModelLoadError` line naming the
        model type and the installed transformers, not a traceback."""
        import transformers
        try:
            yield
        except (torch.OutOfMemoryError, ModelLoadError, BackendInputError):
            raise
        except Exception as e:
            raise ModelLoadError(f"{self.spec.model}: model type {self.model.config.model_type!r} fails in {what} of "
                                 f"the installed transformers {transformers.__version__} ({type(e).__name__}: "
                                 f"{one_line(e)}); run it with a transformers version that supports it") from None

    def _check_forward(self) -> None:
        """One forward of a one-word blind prompt at load: a model type whose own forward fails in the installed
        transformers (Llama 4 in 5.24: its output class lacks a field the forward reads) is one line naming it,
        not a traceback at the first batch."""
        with self._load_probe("the forward"), torch.inference_mode():
            self._next_token_logits(self._batch([[None]], ["?"]))

    def _image_token_id(self) -> int | None:
        cfg = self.model.config
        image_id = getattr(cfg, "image_token_id", None)
        return getattr(cfg, "image_token_index", None) if image_id is None else image_id

    def _probe_ids(self, text: str, num_images: int) -> list[int]:
        """The processor's input ids for `text` with `num_images` blank images."""
        enc = self.processor(text=[text], images=[[blank_image()] * num_images], return_tensors="pt",
                             add_special_tokens=self._special_tokens(text))
        return enc["input_ids"][0].tolist()

    def _own_placement(self) -> Family | None:
        """Without a chat template: the family row of a processor that places the image tokens itself (Fuyu's
        writes the patch rows, BOS and its beginning-of-answer marker around a prompt that names no image), else
        None. Probed at load: a prompt without any placeholder plus one blank image gets image tokens. Such a
        processor gets the prompt as is (the default `<image>\\n` frame would give it a second image token), the
        blind control a blank image (the processor frames the prompt only around an image), and what it writes
        after the prompt (the tokens two prompts' encodings end with alike, as text) is the frame's end, after
        which the letter and the continuations are read. A processor that refuses an image without its
        placeholder places none itself."""
        image_id = self._image_token_id()
        if image_id is None:
            return None
        try:
            first = self._probe_ids(PROBE_PROMPTS[0], 1)
        except Exception:   # noqa: BLE001 - its refusal is the answer: the placeholder must be in the text
            return None
        if image_id not in first:
            return None
        with self._load_probe("its processor (a prompt with one blank image)"):
            second = self._probe_ids(PROBE_PROMPTS[1], 1)
        width = 0
        while width < min(len(first), len(second)) and first[-1 - width] == second[-1 - width]:
            width += 1
        tail = first[len(first) - width:]
        end = self.tokenizer.decode(tail) if tail else ""
        head = self.tokenizer(PROBE_PROMPTS[0], add_special_tokens=False)["input_ids"]
        if self.tokenizer(PROBE_PROMPTS[0] + end, add_special_tokens=False)["input_ids"] != head + tail:
            raise ModelLoadError(f"{self.spec.model}: its processor writes tokens {tail} after the prompt that its "
                                 f"tokenizer does not write as text ({end!r}); the answer's position is unknown")
        return dataclasses.replace(self.family, fallback="as_is", needs_image=True, frame_end=end)

    def _template_options(self, template) -> dict:
        """The chat template's switches set in spec.extra (`enable_thinking`: None = the template's own default);
        a switch the template does not read is refused (it would silently change nothing)."""
        if self.enable_thinking is None:
            return {}
        if not isinstance(self.enable_thinking, bool):
            raise BackendInputError(f"enable_thinking {self.enable_thinking!r} (spec.extra / --extra): use true or "
                                    "false")
        if not template or "enable_thinking" not in str(template):
            raise BackendInputError(f"enable_thinking (spec.extra / --extra): {self.spec.model}'s chat template has no "
                                    "such switch")
        return {"enable_thinking": self.enable_thinking}

    def _max_images(self, asked) -> int | None:
        """Images one prompt may carry (None: no limit but the context); the module docstring has the rule."""
        if asked is not None:
            if int(asked) >= 2 and not self._places_second_image():
                raise BackendInputError(f"max_images {asked} (spec.extra / --extra): {self.spec.model}'s processor "
                                        f"places one image per prompt")
            return int(asked)
        if self.family.max_images is not None:
            return self.family.max_images
        return None if self._places_second_image() else 1

    def _places_second_image(self) -> bool:
        """Whether the processor puts a second image of a prompt into the text: the model's image tokens for two
        blank images differ in number from those for one (most processors: twice as many; LLaVA-OneVision
        switches to its multi-image mode). A processor that refuses two images (Fuyu's) places one."""
        image_id = self._image_token_id()
        if image_id is None:
            return False
        with self._load_probe("its processor (a prompt with one blank image)"):
            one = self._probe_ids(self.render("?", 1), 1).count(image_id)
        try:
            two = self._probe_ids(self.render("?", 2), 2).count(image_id)
        except Exception:   # noqa: BLE001 - a processor that takes one image per prompt may refuse two
            return False
        return two not in (0, one)

    # ---- prompts ---------------------------------------------------------------------------------------------
    def _conversation(self, prompt: str, num_images: int, reply: str | None = None) -> list[dict]:
        content = [{"type": "image"}] * self._template_images(num_images) + [{"type": "text", "text": prompt}]
        turns = [{"role": "user", "content": content}]
        if reply is not None:
            turns.append({"role": "assistant", "content": [{"type": "text", "text": reply}]})
        return turns

    def _template(self, conversation: list[dict], generation_prompt: bool) -> str:
        return self.processor.apply_chat_template(conversation, add_generation_prompt=generation_prompt,
                                                  tokenize=False, **self.template_options)

    def render(self, prompt: str, num_images: int) -> str:
        """The text the processor gets for this user turn (chat template or the family's fallback frame)."""
        if self.prompt_format == "chat_template":
            return self._template(self._conversation(prompt, num_images), True)
        if self.family.fallback == "as_is":
            return prompt
        sep = "\n" if self.family.fallback == "image_newline" else ""
        return (str(self.processor.image_token) + sep) * num_images + prompt

    def _special_tokens(self, text: str) -> bool:
        """Whether tokenising `text` should add the tokenizer's special tokens: not when it already has BOS."""
        bos = self.tokenizer.bos_token
        return not (bos is not None and text.startswith(str(bos)))

    def _text_ids(self, text: str) -> list[int]:
        """`text` tokenised as the processor's tokenizer does it for the model (image tokens unexpanded)."""
        return self.tokenizer(text, add_special_tokens=self._special_tokens(text))["input_ids"]

    # ---- batches -----------------------------------------------------------------------------------------------
    def _images(self, images: Sequence[Image.Image | None]) -> list[Image.Image]:
        imgs = [im for im in images if im is not None]
        if self.max_images is not None and len(imgs) > self.max_images:
            raise BackendInputError(f"{self.spec.model}: {len(imgs)} images in one prompt, the model takes at most "
                                    f"{self.max_images} (spec.extra['max_images'] for multi-image models)")
        if self.family.needs_image and not imgs:
            imgs = [blank_image()]
        return imgs

    def _groups(self, images) -> list[list[int]]:
        """Indices of the batch grouped by number of images (one processor call per group), in first-seen order."""
        groups: dict[int, list[int]] = {}
        for i, imgs in enumerate(images):
            groups.setdefault(len(self._images(imgs)), []).append(i)
        return list(groups.values())

    def _device(self, batch: dict) -> dict:
        return {k: (v.to(self.device, self.dtype) if v.is_floating_point() else v.to(self.device))
                for k, v in batch.items()}

    def _grouped(self, images, prompts, fn) -> torch.Tensor:
        """fn(sub-batch inputs, indices) -> [n, ...] per group of equal image count, put back in batch order."""
        if len(images) != len(prompts):
            raise ValueError(f"{len(images)} image lists for {len(prompts)} prompts")
        out = None
        for idx in self._groups(images):
            part = fn(self._batch([images[i] for i in idx], [prompts[i] for i in idx]), idx)
            if out is None:
                out = torch.zeros((len(prompts), *part.shape[1:]), dtype=part.dtype)
            out[idx] = part
        return out

    def prompt_positions(self, batch: dict) -> torch.Tensor | None:
        """The position ids of a prepared batch, from its own inputs only (never from what the model keeps
        between calls): M-RoPE ([3, B, L]) from the model's `get_rope_index` on this batch (a text-only batch:
        no image tokens, the text positions in each section); otherwise counted over the real tokens ([B, L]);
        None where the model takes none (encoder-decoder LMs, LMs without `position_ids`)."""
        if self.positions == "mask":
            return _positions(batch["attention_mask"])
        if self.positions != "mrope":
            return None
        inputs = {k: v for k, v in batch.items() if k in self.rope_keys}
        if "mm_token_type_ids" in self.rope_keys and "mm_token_type_ids" not in inputs:
            inputs["mm_token_type_ids"] = torch.zeros_like(batch["input_ids"])
        return self.rope_index(**inputs)[0]

    @staticmethod
    def _next_positions(positions: torch.Tensor, width: int) -> torch.Tensor:
        """The positions of `width` tokens written after each row of a prompt whose positions are `positions`
        ([..., B, L]): one after the row's largest, then counting up (as `generate` continues a prompt)."""
        return positions.amax(-1, keepdim=True) + 1 + torch.arange(width, device=positions.device)

    def _forward(self, batch: dict, positions: torch.Tensor | None = None, **kw):
        """The whole model on a prepared batch (images included), with the batch's own positions."""
        positions = self.prompt_positions(batch) if positions is None else positions
        if positions is not None:
            kw["position_ids"] = positions
        return self.model(**batch, **kw)

    # ---- inputs + answers, for training (volta_ml/iglue_hf/train_generative.py) ------------------------------
    def encode(self, images, prompts) -> dict:
        """The model inputs of a batch whose prompts all carry the same number of images: what the scoring methods
        give the model for these prompts (one processor call, left padding)."""
        if len(self._groups(images)) > 1:
            raise BackendInputError(f"{self.spec.model}: a batch mixes prompts with different numbers of images")
        return self._batch(images, prompts)

    def append_continuations(self, batch: dict, continuations: Sequence[torch.Tensor]) -> tuple[dict, torch.Tensor,
                                                                                                torch.Tensor]:
        """(inputs, ids, mask): the prompt batch with row i's continuation token ids after its prompt, each row
        [left pads][prompt][continuation][right pads] (decoder-only LMs); per-token keys extended as a KV-cache
        continuation extends them. `ids` / `mask` [B, W]: the continuations right-padded, 1 on real tokens."""
        ids, mask = self._cont_batch(list(continuations))
        full = dict(batch, input_ids=torch.cat([batch["input_ids"], ids], 1),
                    attention_mask=torch.cat([batch["attention_mask"], mask], 1),
                    **self._per_token(batch, ids.shape[1], only_new=False))
        return full, ids, mask

    def continuation_logits(self, full: dict, width: int, **kw) -> torch.Tensor:
        """[B, width, V] logits predicting the last `width` positions of `full` (from `append_continuations`):
        one forward of the whole model, only the logits needed computed where the model allows it."""
        keep = {"logits_to_keep": width + 1} if self.keep_last else {}
        return self._forward(full, **keep, **kw).logits[:, -width - 1:-1]

    def reply_ids(self, prompt: str, answer: str, num_images: int = 1) -> list[int]:
        """The tokens the model writes to answer `answer` and end its turn, as `continuation_ids`: with a chat
        template, the assistant turn it renders after the generation prompt, cut after the tokenizer's EOS (the
        end-of-turn token `generate` stops at); without one, the answer after the family's separator, then EOS."""
        eos = str(self.tokenizer.eos_token or "")
        if self.prompt_format == "chat_template":
            head = self.render(prompt, num_images)
            full = self._template(self._conversation(prompt, num_images, answer), False)
            if not full.startswith(head):
                raise BackendInputError(f"{self.spec.model}: its chat template renders an answered conversation that does "
                                 "not start with the generation prompt; it cannot be trained on answers")
            reply = full[len(head):]
            if eos and eos in reply:
                reply = reply[:reply.index(eos) + len(eos)]
        else:
            reply = self.family.answer_sep + answer + eos
        return self.continuation_ids(prompt, reply, num_images)

    # ---- the letter rule ---------------------------------------------------------------------------------------
    def _reply_separator(self, prompt: str, before: str, choice: str) -> str:
        """What the model writes between the generation prompt and its answer: without a chat template the
        family's separator (" "; PaliGemma none); with one, the whitespace the template renders between the
        generation prompt and the reply `choice` of the answered conversation (LLaVA's "ASSISTANT:" + " A"), none
        where the answered conversation does not continue the generation prompt (thinking templates render their
        answered turns without the thinking block their generation prompt opens or closes)."""
        if self.prompt_format != "chat_template":
            return self.family.answer_sep
        full = self._template(self._conversation(prompt, 1, choice), False)
        if not full.startswith(before) or choice not in full[len(before):]:
            return ""
        gap = full[len(before):][:full[len(before):].index(choice)]
        return gap if not gap.strip() else ""

    def _all_spellings(self, choice: str) -> list[int]:
        tok, ids = self.tokenizer, []
        for spelling in (choice, " " + choice):
            t = tok(spelling, add_special_tokens=False)["input_ids"]
            if len(t) == 1 and t[0] != tok.unk_token_id and tok.decode(t).strip() == choice.strip() and t[0] not in ids:
                ids.append(t[0])
        return ids

    def choice_ids(self, choices: Sequence[str], prompt: str = "Question: ? Short Answer:") -> list[list[int]]:
        """Per choice, the token(s) scored: the letter rule's token (letter_spellings "natural", one each) or
        every single-token spelling ("all"); checked per model."""
        key = tuple(choices)
        if key not in self._choice_cache:
            seen, out = {}, []
            for c in choices:
                ids = self._letter_ids(prompt, c) if self.letter_spellings == "natural" else self._all_spellings(c)
                if not ids:
                    raise ChoiceTokenError(f"{self.spec.model}: the choice {c!r} is not a single token of its "
                                           f"tokenizer after the prompt; score this model with the open rule "
                                           f"(--rule open)")
                for i in ids:
                    if i in seen:
                        raise ChoiceTokenError(f"{self.spec.model}: choices {seen[i]!r} and {c!r} share the token "
                                               f"{i}; use the open rule (--rule open)")
                    seen[i] = c
                out.append(ids)
            self._choice_cache[key] = out
        return self._choice_cache[key]

    @torch.inference_mode()
    def choice_logits(self, images, prompts, choices) -> torch.Tensor:
        ids = self.choice_ids(choices, prompts[0] if prompts else "")

        def run(batch, idx):
            logits = self._next_token_logits(batch).float().cpu()
            return torch.stack([torch.logsumexp(logits[:, c], dim=1) for c in ids], dim=1)
        return self._grouped(images, prompts, run)

    # ---- continuations -----------------------------------------------------------------------------------------
    def _continuation_ids(self, images, prompts, continuations) -> tuple[list[torch.Tensor], int]:
        if len(continuations) != len(prompts):
            raise ValueError(f"{len(continuations)} continuation lists for {len(prompts)} prompts")
        k = len(continuations[0])
        if any(len(c) != k for c in continuations):
            raise ValueError("every prompt needs the same number of continuations")
        flat = [torch.tensor(self.continuation_ids(p, c, len(self._images(im))), dtype=torch.long)
                for im, p, conts in zip(images, prompts, continuations) for c in conts]
        return flat, k

    @torch.inference_mode()
    def continuation_logprobs(self, images, prompts, continuations, *, reuse_cache: bool = True):
        flat, k = self._continuation_ids(images, prompts, continuations)

        def run(batch, idx):
            conts = [flat[i * k + j] for i in idx for j in range(k)]
            reuse = reuse_cache and self.cache_reuse
            sums = self._reused(batch, conts, k) if reuse else self._full_forwards(batch, conts, k)
            return sums.view(len(idx), k)
        sums = self._grouped(images, prompts, run)
        counts = torch.tensor([len(t) for t in flat], dtype=torch.long).view(len(prompts), k)
        return sums, counts

    @staticmethod
    def _gather(logits: torch.Tensor, targets: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """Sum over positions of log_softmax(logits)[target], counting only mask == 1; float32 on the CPU."""
        lp = F.log_softmax(logits.float(), dim=-1).gather(-1, targets.unsqueeze(-1)).squeeze(-1)
        return (lp * mask).sum(-1).cpu()

    def _cont_batch(self, flat: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        ids = _pad(flat, self.pad_id, left=False).to(self.device)
        mask = _pad([torch.ones_like(t) for t in flat], 0, left=False).to(self.device)
        return ids, mask

    def _per_token(self, batch: dict, width: int, only_new: bool) -> dict:
        """The batch's per-token keys extended over `width` continuation positions (only those if `only_new`):
        a fill value (token types: text 0; `Family.continuation_types` for `token_type_ids`) or the prompt's last
        position repeated (PER_TOKEN)."""
        out = {}
        for key in PER_TOKEN:
            if key in batch:
                value = batch[key]
                fill = self.family.continuation_types if key == "token_type_ids" else PER_TOKEN[key]
                if fill == "last":
                    tail = value[:, -1:].expand(-1, width, *value.shape[2:])
                else:
                    tail = torch.full((value.shape[0], width, *value.shape[2:]), fill, dtype=value.dtype,
                                      device=value.device)
                out[key] = tail if only_new else torch.cat([value, tail], 1)
        return out

    def _full_forwards(self, batch: dict, flat: list[torch.Tensor], k: int) -> torch.Tensor:
        """No reuse: K forwards of the whole model (images included), one per continuation index."""
        n = len(batch["input_ids"])
        sums = torch.zeros(n, k)
        for j in range(k):
            sums[:, j] = self._full_forward_sums(batch, [flat[i * k + j] for i in range(n)])
        return sums.flatten()

    @torch.inference_mode()
    def generate(self, images, prompts, max_new_tokens: int) -> list[Answer]:
        """Greedy answers (`Answer`s): text stripped of special tokens and the prompt, `truncated` when the generated
        ids hold none of the tokens generation stops at (`stop_ids`): it ran until `max_new_tokens`."""
        if len(images) != len(prompts):
            raise ValueError(f"{len(images)} image lists for {len(prompts)} prompts")
        answers: list[Answer] = [Answer("")] * len(prompts)
        stops = torch.tensor(sorted(self.stop_ids()), dtype=torch.long)
        for idx in self._groups(images):
            batch = self._batch([images[i] for i in idx], [prompts[i] for i in idx])
            out = self.model.generate(**batch, max_new_tokens=max_new_tokens, do_sample=False, num_beams=1,
                                      pad_token_id=self.pad_id)
            new = self._generated(out, batch)
            ended = torch.isin(new.cpu(), stops).any(dim=1).tolist()
            for i, text, stopped in zip(idx, self.tokenizer.batch_decode(new, skip_special_tokens=True), ended):
                answers[i] = Answer(text.strip(), truncated=not stopped)
        return answers

    def stop_ids(self) -> set[int]:
        """The token ids `generate` stops at: the generation configs' `eos_token_id` (an id or a list: a chat model's
        end-of-turn token too), of the model and of its language model, and the tokenizer's EOS. A row that holds
        none of them stopped at `max_new_tokens` (greedy search has no other stopping rule here)."""
        ids: set[int] = set()
        for owner in (self.model, self.lm):
            config = getattr(owner, "generation_config", None)
            eos = getattr(config, "eos_token_id", None)
            ids.update([eos] if isinstance(eos, int) else list(eos or []))
        if self.tokenizer.eos_token_id is not None:
            ids.add(self.tokenizer.eos_token_id)
        return ids


LETTER_ANSWER = re.compile(r"^\W*([A-Z])(?:\W|$)")


def parse_choice(answer: str, letters: Sequence[str], options: Sequence[str]) -> int | None:
    """The option a generated answer names: its leading letter ("B", "(B)", "B. rice"), else the one option
    text it equals or contains (case-insensitive); None when it names none or several."""
    m = LETTER_ANSWER.match(answer.strip())
    if m and m.group(1) in letters:
        return list(letters).index(m.group(1))
    text = answer.strip().lower().rstrip(".")
    exact = [i for i, o in enumerate(options) if o.strip().lower() == text]
    if len(exact) == 1:
        return exact[0]
    within = [i for i, o in enumerate(options) if o.strip() and o.strip().lower() in text]
    return within[0] if len(within) == 1 else None
