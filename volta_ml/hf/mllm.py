"""Generative image-text models: LLaVA (and other `AutoModelForImageTextToText` models with image tokens in the
text), BLIP-2 / mBLIP and InstructBLIP with decoder-only (OPT, BLOOM) or encoder-decoder (T5, mT0) LMs.

How inputs are built. Each example is put through the model's own processor alone (no padding), then the batch
is padded by hand: decoder-only LMs on the LEFT, all pads before the first token (BLIP's processor would put
them between its query tokens and the text), with position ids counted over the real tokens only, so a batch
gives the numbers of one example at a time; encoder-decoder LMs on the RIGHT (T5's relative positions need the
real tokens contiguous from 0). Q-Former texts (InstructBLIP) are right-padded (a bidirectional BERT).

Prompts. `render` applies the processor's chat template with the prompt as the user turn (images first) and
the generation prompt added. Without a chat template (or with `spec.extra["chat_template"] = False`) the
documented fallback is: LLaVA-like models get one image token plus a newline per image, then the prompt;
BLIP-family models get the prompt as is (their processor prepends the query-token placeholders itself).
`self.prompt_format` says which was used. A `None` image is the blind control: LLaVA-like models then get no
image at all (a text-only prompt); BLIP-family models, which cannot run without one, get `blank_image()`.

Scoring. `choice_logits`: one forward per question, the next-token logit of each choice = the max over its
single-token spellings ("A" and " A"; a spelling counts only if it is one token, not <unk>, and decodes back to
the choice); `ChoiceTokenError` when a choice has none or two choices share a token.
`continuation_logprobs`: the prompt runs once; decoder-only LMs then run the K continuations of each prompt as
one batch on its KV cache (repeated K times); encoder-decoder LMs run the encoder once and the decoder on the K
continuations. Continuations are tokenised alone without special tokens, so pass the leading space your
prompt needs (" Paris" after "Answer:"). `reuse_cache=False` is the plain K-full-forwards path (benchmarks,
tests). `generate`: greedy (`model.generate`, no sampling, one beam).
`spec.extra["max_images"]` raises the images per prompt for LLaVA-like models (default 1: LLaVA-1.5 was trained
on one); BLIP-family models take exactly one.
"""
from __future__ import annotations

import inspect
from typing import Sequence

import torch
import torch.nn.functional as F
from PIL import Image

from .base import ChoiceTokenError, ModelSpec
from .loading import ModelLoadError, blank_image, float_dtype, input_device, load_model, load_processor

QUERY_PREPENDED = ("Blip2ForConditionalGeneration", "InstructBlipForConditionalGeneration")  # BLIP family
LM_KEYS = ("input_ids", "attention_mask")
QFORMER_KEYS = ("qformer_input_ids", "qformer_attention_mask")


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


def _accepts(fn, name: str) -> bool:
    return name in inspect.signature(fn).parameters


class GenerativeBackend:
    def __init__(self, spec: ModelSpec, model=None, processor=None):
        """Loads `spec`; or wraps an already built `model` + `processor` (benchmarks with random weights)."""
        from transformers import AutoModelForImageTextToText, AutoProcessor
        self.spec = spec
        self.model = model if model is not None else \
            load_model(AutoModelForImageTextToText, spec, "a generative image-text model")
        self.processor = processor if processor is not None else load_processor(AutoProcessor, spec)
        self.tokenizer = self.processor.tokenizer
        self.blip = type(self.model).__name__ in QUERY_PREPENDED
        if self.blip:
            self._query_placeholders()
        cfg = self.model.config
        self.encoder_decoder = bool(getattr(cfg.get_text_config(), "is_encoder_decoder", False))
        # the module that continues a sequence from a cache: the LM itself (BLIP) or the whole model without pixels
        self.lm = self.model.language_model if self.blip else self.model
        inner = self.lm if self.blip else getattr(getattr(self.model, "model", None), "language_model", self.model)
        self.pass_positions = not self.encoder_decoder and _accepts(inner.forward, "position_ids")
        self.keep_last = {"logits_to_keep": 1} if _accepts(self.lm.forward, "logits_to_keep") else {}
        self.max_images = 1 if self.blip else int(spec.extra.get("max_images", 1))
        use_template = spec.extra.get("chat_template", True) and getattr(self.processor, "chat_template", None)
        self.prompt_format = "chat_template" if use_template else ("fallback: prompt as is (query tokens prepended)"
                                                                   if self.blip else "fallback: <image>\\n per image")
        self.pad_id = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None \
            else self.tokenizer.eos_token_id
        self.device, self.dtype = input_device(self.model), float_dtype(self.model)
        self._choice_cache: dict[tuple, list[list[int]]] = {}

    def _query_placeholders(self) -> None:
        """Checkpoints published before transformers put the query tokens in the text (mBLIP: no image token in
        config or processor) would otherwise run with the image silently dropped: give the processor the model's
        query count and the model the processor's image-token id (an unused row of the padded vocabulary)."""
        cfg = self.model.config
        if getattr(self.processor, "num_query_tokens", None) is None:
            self.processor.num_query_tokens = cfg.num_query_tokens
        if cfg.image_token_index is None:
            image_id = self.tokenizer.convert_tokens_to_ids(str(self.processor.image_token))
            rows = self.model.get_input_embeddings().num_embeddings
            if image_id >= rows:
                raise ModelLoadError(f"{self.spec.model}: no image token in its config and the processor's "
                                     f"({image_id}) is outside the LM's {rows}-row vocabulary")
            cfg.image_token_index = image_id

    # ---- prompts and batches -------------------------------------------------------------------------------
    def render(self, prompt: str, num_images: int) -> str:
        if self.prompt_format == "chat_template":
            content = [{"type": "image"}] * (0 if self.blip else num_images) + [{"type": "text", "text": prompt}]
            return self.processor.apply_chat_template([{"role": "user", "content": content}],
                                                      add_generation_prompt=True, tokenize=False)
        if self.blip:
            return prompt
        return (str(self.processor.image_token) + "\n") * num_images + prompt

    def _example(self, images: Sequence[Image.Image | None], prompt: str) -> dict:
        imgs = [im for im in images if im is not None]
        if len(imgs) > self.max_images:
            raise ValueError(f"{self.spec.model}: {len(imgs)} images in one prompt, the model takes at most "
                             f"{self.max_images} (spec.extra['max_images'] for multi-image LLaVA-like models)")
        if self.blip and not imgs:
            imgs = [blank_image()]
        enc = self.processor(images=imgs or None, text=self.render(prompt, len(imgs)), return_tensors="pt")
        return {k: (v[0] if k in LM_KEYS + QFORMER_KEYS else v) for k, v in enc.items()}

    def _collate(self, items: list[dict]) -> dict:
        left = not self.encoder_decoder
        batch = {"input_ids": _pad([it["input_ids"] for it in items], self.pad_id, left),
                 "attention_mask": _pad([it["attention_mask"] for it in items], 0, left)}
        if "qformer_input_ids" in items[0]:
            qpad = self.processor.qformer_tokenizer.pad_token_id
            batch["qformer_input_ids"] = _pad([it["qformer_input_ids"] for it in items], qpad, False)
            batch["qformer_attention_mask"] = _pad([it["qformer_attention_mask"] for it in items], 0, False)
        for key in dict.fromkeys(k for it in items for k in it):   # every item's keys: the first may be blind
            if key not in batch:
                parts = [it[key] for it in items if key in it]
                if parts:
                    batch[key] = torch.cat(parts)
        return {k: (v.to(self.device, self.dtype) if v.is_floating_point() else v.to(self.device))
                for k, v in batch.items()}

    def _batch(self, images, prompts) -> tuple[list[dict], dict]:
        if len(images) != len(prompts):
            raise ValueError(f"{len(images)} image lists for {len(prompts)} prompts")
        items = [self._example(imgs, p) for imgs, p in zip(images, prompts)]
        return items, self._collate(items)

    def _forward(self, batch: dict, **kw):
        """The whole model on a prepared batch (images included); position ids over real tokens only."""
        if self.pass_positions:
            kw["position_ids"] = _positions(batch["attention_mask"])
        return self.model(**batch, **kw)

    def _start(self, n: int) -> torch.Tensor:
        start = self.model.config.get_text_config().decoder_start_token_id
        return torch.full((n, 1), start, dtype=torch.long, device=self.device)

    # ---- scoring -------------------------------------------------------------------------------------------
    def choice_ids(self, choices: Sequence[str]) -> list[list[int]]:
        """Per choice, its single-token spellings ("A", " A") that decode back to it; checked per model."""
        key = tuple(choices)
        if key not in self._choice_cache:
            tok, seen, out = self.tokenizer, {}, []
            for c in choices:
                ids = []
                for spelling in (c, " " + c):
                    t = tok(spelling, add_special_tokens=False)["input_ids"]
                    if len(t) == 1 and t[0] != tok.unk_token_id and tok.decode(t).strip() == c.strip() \
                            and t[0] not in ids:
                        ids.append(t[0])
                if not ids:
                    raise ChoiceTokenError(f"{self.spec.model}: the choice {c!r} is not a single token of its "
                                           f"tokenizer; score this model with the open rule (--rule open)")
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
        ids = self.choice_ids(choices)
        _, batch = self._batch(images, prompts)
        if self.encoder_decoder:
            logits = self.model(**batch, decoder_input_ids=self._start(len(prompts))).logits[:, -1]
        else:
            logits = self._forward(batch, **self.keep_last).logits[:, -1]
        logits = logits.float().cpu()
        return torch.stack([logits[:, c].max(dim=1).values for c in ids], dim=1)

    def _continuation_ids(self, continuations, n_prompts: int) -> tuple[list[torch.Tensor], int]:
        if len(continuations) != n_prompts:
            raise ValueError(f"{len(continuations)} continuation lists for {n_prompts} prompts")
        k = len(continuations[0])
        if any(len(c) != k for c in continuations):
            raise ValueError("every prompt needs the same number of continuations")
        flat = []
        for conts in continuations:
            for c in conts:
                t = self.tokenizer(c, add_special_tokens=False)["input_ids"]
                if not t:
                    raise ValueError(f"{self.spec.model}: continuation {c!r} has no tokens")
                flat.append(torch.tensor(t, dtype=torch.long))
        return flat, k

    @torch.inference_mode()
    def continuation_logprobs(self, images, prompts, continuations, *, reuse_cache: bool = True):
        flat, k = self._continuation_ids(continuations, len(prompts))
        items, batch = self._batch(images, prompts)
        if not reuse_cache:
            sums = self._full_forwards(items, batch, flat, k)
        elif self.encoder_decoder:
            sums = self._decoder_on_encoder(batch, flat, k)
        else:
            sums = self._on_cache(batch, flat, k)
        counts = torch.tensor([len(t) for t in flat], dtype=torch.long).view(len(prompts), k)
        return sums.view(len(prompts), k), counts

    @staticmethod
    def _gather(logits: torch.Tensor, targets: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """Sum over positions of log_softmax(logits)[target], counting only mask == 1; float32 on the CPU."""
        lp = F.log_softmax(logits.float(), dim=-1).gather(-1, targets.unsqueeze(-1)).squeeze(-1)
        return (lp * mask).sum(-1).cpu()

    def _cont_batch(self, flat: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        ids = _pad(flat, self.pad_id, left=False).to(self.device)
        mask = _pad([torch.ones_like(t) for t in flat], 0, left=False).to(self.device)
        return ids, mask

    def _on_cache(self, batch: dict, flat: list[torch.Tensor], k: int) -> torch.Tensor:
        out = self._forward(batch, use_cache=True, **self.keep_last)
        cache = out.cache if getattr(out, "cache", None) is not None else out.language_model_outputs.cache
        cache.batch_repeat_interleave(k)
        first = out.logits[:, -1:].repeat_interleave(k, dim=0)                   # predicts each first token
        prefix_mask = batch["attention_mask"].repeat_interleave(k, dim=0)
        ids, mask = self._cont_batch(flat)
        kw = {"position_ids": prefix_mask.sum(1, keepdim=True) + torch.arange(ids.shape[1], device=self.device)} \
            if self.pass_positions else {}
        rest = self.lm(input_ids=ids, attention_mask=torch.cat([prefix_mask, mask], 1), cache=cache,
                       use_cache=False, **kw).logits
        return self._gather(torch.cat([first, rest[:, :-1]], 1), ids, mask)

    def _decoder_on_encoder(self, batch: dict, flat: list[torch.Tensor], k: int) -> torch.Tensor:
        out = self.model(**batch, decoder_input_ids=self._start(len(batch["input_ids"])))
        encoded = out.language_model_outputs.encoder_last_hidden_state.repeat_interleave(k, dim=0)
        ids, mask = self._cont_batch(flat)
        dec_in = torch.cat([self._start(len(flat)), ids[:, :-1]], 1)
        logits = self.lm(encoder_outputs=(encoded,), attention_mask=batch["attention_mask"].repeat_interleave(k, 0),
                         decoder_input_ids=dec_in, decoder_attention_mask=torch.cat([mask[:, :1], mask[:, :-1]], 1)
                         ).logits
        return self._gather(logits, ids, mask)

    def _full_forwards(self, items: list[dict], batch: dict, flat: list[torch.Tensor], k: int) -> torch.Tensor:
        """No reuse: K forwards of the whole model (images included), one per continuation index."""
        sums = torch.zeros(len(items), k)
        for j in range(k):
            conts = [flat[i * k + j] for i in range(len(items))]
            ids, mask = self._cont_batch(conts)
            if self.encoder_decoder:
                dec_in = torch.cat([self._start(len(conts)), ids[:, :-1]], 1)
                logits = self.model(**batch, decoder_input_ids=dec_in).logits
                sums[:, j] = self._gather(logits, ids, mask)
                continue
            joined = [dict(it, input_ids=torch.cat([it["input_ids"], c]),
                           attention_mask=torch.cat([it["attention_mask"], torch.ones_like(c)])) for it, c in zip(items, conts)]
            full = self._collate(joined)
            width = ids.shape[1]   # left padding: every sequence ends at the last column
            keep = {"logits_to_keep": width + 1} if self.keep_last else {}
            pred = self._forward(full, **keep).logits[:, -width - 1:-1]
            shifted = _pad([c for c in conts], self.pad_id, left=True).to(self.device)
            smask = _pad([torch.ones_like(c) for c in conts], 0, left=True).to(self.device)
            sums[:, j] = self._gather(pred, shifted, smask)
        return sums.flatten()

    @torch.inference_mode()
    def generate(self, images, prompts, max_new_tokens: int) -> list[str]:
        _, batch = self._batch(images, prompts)
        out = self.model.generate(**batch, max_new_tokens=max_new_tokens, do_sample=False, num_beams=1,
                                  pad_token_id=self.pad_id)
        width = batch["input_ids"].shape[1]
        if not self.encoder_decoder and out.shape[1] >= width and torch.equal(out[:, :width], batch["input_ids"]):
            out = out[:, width:]
        return [t.strip() for t in self.tokenizer.batch_decode(out, skip_special_tokens=True)]
