"""The BLIP family (BLIP-2, mBLIP, InstructBLIP: the CVQA paper's models): the Q-Former's query tokens prepended to
the LM input (`Family.layout` "query_tokens"), with a decoder-only LM (OPT, BLOOM: `BlipBackend`) or an
encoder-decoder one (Flan-T5, mT0: `BlipSeq2SeqBackend`). The rest is the core, `hf/mllm.py`.

Inputs: each example goes through the processor alone and the batch is padded by hand: decoder-only LMs on the
LEFT with all pads before the query tokens (the processor would put them between the query tokens and the text);
encoder-decoder LMs on the RIGHT. Q-Former texts (InstructBLIP) are right-padded and truncated to the Q-Former's
length as LAVIS does (`max_txt_len`, 128 by default, never more than the Q-Former's position table);
`self.qformer_truncated` counts the cut texts. The chat template (where one exists) gets no image entry: the
processor prepends the query tokens. One image per prompt (the blind control: `blank_image()`, the processor
requires an image). Checkpoints published before transformers put the query tokens in the text (mBLIP) get the
placeholders they lack (`_query_placeholders`).

Encoder-decoder LMs: the letter rule reads the decoder's first token after its start token (the token of "A");
a continuation is tokenised alone (the decoder starts from its start token); the open rule runs the encoder once
and the decoder on the K continuations; no position ids (relative attention).

`vqa_frame`: the short-answer VQA frame of the family's paper (BLIP-2 §4.1, "Zero-shot VQA"; InstructBLIP as BLIP-2
with its LM), which `iglue-hf` xGQA uses.
"""
from __future__ import annotations

import torch

from .base import BackendInputError
from .loading import ModelLoadError
from .mllm import GenerativeBackend, _pad

LM_KEYS = ("input_ids", "attention_mask")
QFORMER_KEYS = ("qformer_input_ids", "qformer_attention_mask")
QFORMER_MAX_TXT_LEN = 128          # LAVIS InstructBLIP's `max_txt_len` for the Q-Former's instruction


class BlipBackend(GenerativeBackend):
    """Query tokens prepended; a decoder-only LM continuing from its own cache."""
    layout = "query_tokens"
    blip = True
    vqa_frame = "Question: {} Answer:"

    def _setup(self) -> None:
        self._query_placeholders()
        self.qformer_max = self._qformer_max()
        self.qformer_truncated = 0

    @property
    def lm(self):
        return self.model.language_model

    def _text_lm(self):
        return self.model.language_model

    def _template_images(self, num_images: int) -> int:
        return 0                     # the processor prepends the query tokens, the text has no image entry

    def _places_second_image(self) -> bool:
        return False                 # the query tokens come once per prompt

    def _continuation_keys(self, batch: dict, k: int, width: int) -> dict:
        return {}                    # the LM alone continues: no per-token keys of the multimodal forward

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

    def _qformer_max(self) -> int | None:
        """InstructBLIP: LAVIS truncates the Q-Former's instruction to `max_txt_len` (128) tokens."""
        if getattr(self.processor, "qformer_tokenizer", None) is None:
            return None
        table = getattr(self.model.config.qformer_config, "max_position_embeddings", QFORMER_MAX_TXT_LEN)
        return min(QFORMER_MAX_TXT_LEN, table)

    def _example(self, images, prompt: str) -> dict:
        imgs = self._images(images)
        enc = self.processor(images=imgs, text=self.render(prompt, len(imgs)), return_tensors="pt")
        return {k: (v[0] if k in LM_KEYS + QFORMER_KEYS else v) for k, v in enc.items() if k in self.forward_keys}

    def _batch(self, images, prompts) -> dict:
        items = [self._example(im, p) for im, p in zip(images, prompts)]
        batch = {"input_ids": _pad([it["input_ids"] for it in items], self.pad_id, self.pad_left),
                 "attention_mask": _pad([it["attention_mask"] for it in items], 0, self.pad_left)}
        if "qformer_input_ids" in items[0]:
            qpad = self.processor.qformer_tokenizer.pad_token_id
            qids = [it["qformer_input_ids"] for it in items]
            if self.qformer_max is not None:    # as the tokenizer truncates: the closing [SEP] kept
                self.qformer_truncated += sum(len(q) > self.qformer_max for q in qids)
                qids = [q if len(q) <= self.qformer_max else torch.cat([q[:self.qformer_max - 1], q[-1:]])
                        for q in qids]
            batch["qformer_input_ids"] = _pad(qids, qpad, False)
            batch["qformer_attention_mask"] = _pad([it["qformer_attention_mask"][:len(q)]
                                                    for it, q in zip(items, qids)], 0, False)
        batch["pixel_values"] = torch.cat([it["pixel_values"] for it in items])
        return self._device(batch)


class BlipSeq2SeqBackend(BlipBackend):
    """Query tokens prepended; an encoder-decoder LM (T5, mT0): the answer is the decoder's text."""
    encoder_decoder = True
    pad_left = False
    vqa_frame = "Question: {} Short answer:"

    def _position_kind(self) -> None:
        return None                  # relative attention

    def _start(self, n: int) -> torch.Tensor:
        start = self.model.config.get_text_config().decoder_start_token_id
        return torch.full((n, 1), start, dtype=torch.long, device=self.device)

    def _next_token_logits(self, batch: dict) -> torch.Tensor:
        return self.model(**batch, decoder_input_ids=self._start(len(batch["input_ids"]))).logits[:, -1]

    def _letter_ids(self, prompt: str, choice: str) -> list[int]:
        """The decoder's first token of `choice` (the answer starts the decoder's text)."""
        ids = self.tokenizer(choice, add_special_tokens=False)["input_ids"]
        ok = len(ids) == 1 and ids[0] != self.tokenizer.unk_token_id
        return ids if ok and self.tokenizer.decode(ids).strip() == choice.strip() else []

    def continuation_ids(self, prompt: str, continuation: str, num_images: int = 1) -> list[int]:
        """The continuation tokenised alone (the decoder starts from its start token)."""
        ids = self.tokenizer(continuation, add_special_tokens=False)["input_ids"]
        if not ids:
            raise BackendInputError(f"{self.spec.model}: continuation {continuation!r} has no tokens")
        return ids

    def _reused(self, batch: dict, flat: list[torch.Tensor], k: int) -> torch.Tensor:
        """The encoder once, the decoder on the K continuations of each prompt."""
        out = self.model(**batch, decoder_input_ids=self._start(len(batch["input_ids"])))
        encoded = out.language_model_outputs.encoder_last_hidden_state.repeat_interleave(k, dim=0)
        ids, mask = self._cont_batch(flat)
        dec_in = torch.cat([self._start(len(flat)), ids[:, :-1]], 1)
        logits = self.lm(encoder_outputs=(encoded,), attention_mask=batch["attention_mask"].repeat_interleave(k, 0),
                         decoder_input_ids=dec_in, decoder_attention_mask=torch.cat([mask[:, :1], mask[:, :-1]], 1)
                         ).logits
        return self._gather(logits, ids, mask)

    def _full_forward_sums(self, batch: dict, conts: list[torch.Tensor]) -> torch.Tensor:
        ids, mask = self._cont_batch(conts)
        dec_in = torch.cat([self._start(len(conts)), ids[:, :-1]], 1)
        return self._gather(self.model(**batch, decoder_input_ids=dec_in).logits, ids, mask)

    def _generated(self, out: torch.Tensor, batch: dict) -> torch.Tensor:
        """The decoder's tokens after its start token (the output holds no prompt; the start token is the pad id,
        which a truncated answer may repeat and which must not count as where it stopped)."""
        start = self.model.generation_config.decoder_start_token_id
        if start is None:
            start = getattr(self.lm.config, "decoder_start_token_id", None)
        return out[:, 1:] if out.shape[1] and start is not None and bool((out[:, 0] == start).all()) else out
