"""Tiny random models of the current open image-text families, saved as local folders (no downloads).

Each builder makes a randomly initialised `transformers` model from its config classes (2 text layers, 1-2 vision
layers, widths of 32-64), a stand-in tokenizer TRAINED here of the real checkpoint's kind (byte-level BPE for
Qwen, Llama 3, SmolLM, tekken, Cohere, GLM; SentencePiece-like Unigram with Metaspace for Gemma, Llama 2 / Vicuna),
the family's own processor with small image sizes, and a short chat template shaped like the real checkpoint's
(written here: the same turn markers, BOS, generation prompt and thinking switch). `build_family(name, root)`
builds once per root (tests use `shared_root()`, one folder per test process); `FAMILIES` maps the name used in
test ids to its builder, `VARIANTS` a family tested again with a template switch (`spec_extra(name)`), `REFUSED`
model types the backend refuses in one line.
"""
from __future__ import annotations

from pathlib import Path

import torch
import transformers
from packaging.version import Version
from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers
from transformers import PreTrainedTokenizerFast

from helpers_hf import CORPUS, _unigram

HIDDEN = 64
TEXT = dict(hidden_size=HIDDEN, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=4096)


def _bytelevel(specials: list[str], bos: str | None = None, vocab: int = 400) -> Tokenizer:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab, special_tokens=specials, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(CORPUS + [" A B C D", "A B C D"] * 5, trainer)
    if bos:
        tok.post_processor = processors.TemplateProcessing(single=f"{bos} $A", special_tokens=[(bos, tok.token_to_id(bos))])
    return tok


def _sentencepiece(specials: list[str], bos: str | None = None, vocab: int = 300) -> Tokenizer:
    """Unigram + Metaspace (Gemma / Llama-2 style; "▁A" is the letter after a space)."""
    return _unigram(specials, eos=None, bos=bos, vocab=vocab, extra=("A B C D",) * 5)


def _fast(tok: Tokenizer, **kw) -> PreTrainedTokenizerFast:
    return PreTrainedTokenizerFast(tokenizer_object=tok, **kw)


def _text(tok, **kw) -> dict:
    return dict(TEXT, vocab_size=len(tok), pad_token_id=tok.pad_token_id, bos_token_id=tok.bos_token_id,
                eos_token_id=tok.eos_token_id, **kw)


def _save(model, processor, out: Path) -> Path:
    """Save both; a weight matrix left at zero by the family's init (Gemma 3's image projection) gets random
    values, so that the image reaches the scores of a random model."""
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() >= 2 and not p.any():
                p.normal_(0.0, 0.02)
    out.mkdir(parents=True, exist_ok=True)
    model.eval().save_pretrained(out)
    processor.save_pretrained(out)
    return out


def _content(image: str, text: str = "{{ c['text'] }}") -> str:
    """Jinja for a message's content list: `image` for each image part, the text part(s) as they come."""
    return ("{% for c in m['content'] %}{% if c['type'] == 'image' %}" + image + "{% else %}" + text +
            "{% endif %}{% endfor %}")


# ---- Qwen2-VL / Qwen2.5-VL / Qwen3-VL (byte-level BPE, ChatML, M-RoPE) ------------------------------------------
QWEN_TEMPLATE = ("{% for m in messages %}{% if loop.first and m['role'] != 'system' %}<|im_start|>system\n"
                 "You are a helpful assistant.<|im_end|>\n{% endif %}<|im_start|>{{ m['role'] }}\n"
                 + _content("<|vision_start|><|image_pad|><|vision_end|>") + "<|im_end|>\n{% endfor %}"
                 "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
QWEN_SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|vision_start|>", "<|vision_end|>",
                 "<|image_pad|>", "<|video_pad|>"]


def _qwen_tok():
    return _fast(_bytelevel(QWEN_SPECIALS), eos_token="<|im_end|>", pad_token="<|endoftext|>")


def _qwen(out: Path, version: str) -> Path:
    from transformers import AutoProcessor
    import transformers as tf
    tok = _qwen_tok()
    tok.chat_template = QWEN_TEMPLATE
    ids = {k: tok.convert_tokens_to_ids(t) for k, t in (("image_token_id", "<|image_pad|>"),
                                                        ("video_token_id", "<|video_pad|>"),
                                                        ("vision_start_token_id", "<|vision_start|>"),
                                                        ("vision_end_token_id", "<|vision_end|>"))}
    head = HIDDEN // TEXT["num_attention_heads"]
    rope = {"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [head // 4, head // 8, head // 8]}
    if version == "qwen2":
        cfg = tf.Qwen2VLConfig(text_config=_text(tok, rope_parameters=rope),
                               vision_config=dict(depth=1, embed_dim=32, hidden_size=HIDDEN, num_heads=2,
                                                  patch_size=14, spatial_merge_size=2), **ids)
        model_cls, ip_cls, proc_cls = tf.Qwen2VLForConditionalGeneration, tf.Qwen2VLImageProcessor, tf.Qwen2VLProcessor
    elif version == "qwen2.5":
        cfg = tf.Qwen2_5_VLConfig(text_config=_text(tok, rope_parameters=rope),
                                  vision_config=dict(depth=1, hidden_size=32, out_hidden_size=HIDDEN, num_heads=2,
                                                     intermediate_size=64, patch_size=14, spatial_merge_size=2,
                                                     window_size=56, fullatt_block_indexes=[0]), **ids)
        model_cls, ip_cls, proc_cls = (tf.Qwen2_5_VLForConditionalGeneration, tf.Qwen2VLImageProcessor,
                                       tf.Qwen2_5_VLProcessor)
    else:
        rope3 = {"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [head // 4, head // 8, head // 8],
                 "mrope_interleaved": True}
        vision = dict(depth=2, hidden_size=32, out_hidden_size=HIDDEN, num_heads=2, intermediate_size=64, patch_size=16,
                      spatial_merge_size=2, num_position_embeddings=64, deepstack_visual_indexes=[0])
        if version == "qwen3":
            cfg = tf.Qwen3VLConfig(text_config=_text(tok, rope_parameters=rope3, head_dim=head), vision_config=vision,
                                   **ids)
            model_cls = tf.Qwen3VLForConditionalGeneration
        else:   # Qwen3-VL-MoE: sparse MLPs (4 experts, 2 per token)
            moe = dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32, decoder_sparse_step=1)
            cfg = tf.Qwen3VLMoeConfig(text_config=_text(tok, rope_parameters=rope3, head_dim=head, **moe),
                                      vision_config=vision, **ids)
            model_cls = tf.Qwen3VLMoeForConditionalGeneration
        ip_cls, proc_cls = tf.Qwen2VLImageProcessor, tf.Qwen3VLProcessor
    patch = 14 if version in ("qwen2", "qwen2.5") else 16
    ip = ip_cls(min_pixels=(2 * patch) ** 2 * 4, max_pixels=(2 * patch) ** 2 * 9, patch_size=patch, merge_size=2)
    vp_cls = tf.Qwen2VLVideoProcessor if version in ("qwen2", "qwen2.5") else tf.Qwen3VLVideoProcessor
    kw = {"video_processor": vp_cls(patch_size=patch, merge_size=2)}
    torch.manual_seed(20)
    proc = proc_cls(image_processor=ip, tokenizer=tok, chat_template=QWEN_TEMPLATE, **kw)
    return _save(model_cls(cfg), proc, out)


def build_qwen2_vl(out: Path) -> Path:
    return _qwen(out, "qwen2")


def build_qwen2_5_vl(out: Path) -> Path:
    return _qwen(out, "qwen2.5")


def build_qwen3_vl(out: Path) -> Path:
    return _qwen(out, "qwen3")


def build_qwen3_vl_moe(out: Path) -> Path:
    return _qwen(out, "qwen3-moe")


# ---- Qwen3.5 (hybrid: gated-delta-net linear attention + full attention; thinking template, on by default) -------
# The generation prompt opens the thinking block ("<think>\n"), or with enable_thinking=false gives it empty; an
# answered turn renders an empty block before the reply.
QWEN3_5_TEMPLATE = ("{%- set think = enable_thinking is not defined or enable_thinking -%}"
                    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n"
                    "{% if m['role'] == 'assistant' %}{{ '<think>\\n\\n</think>\\n\\n' }}{% endif %}"
                    + _content("<|vision_start|><|image_pad|><|vision_end|>") + "<|im_end|>\n{% endfor %}"
                    "{% if add_generation_prompt %}<|im_start|>assistant\n<think>\n"
                    "{% if not think %}{{ '\\n</think>\\n\\n' }}{% endif %}{% endif %}")


def build_qwen3_5(out: Path) -> Path:
    import transformers as tf
    tok = _fast(_bytelevel(QWEN_SPECIALS + ["<think>", "</think>"]), eos_token="<|im_end|>", pad_token="<|endoftext|>")
    ids = {k: tok.convert_tokens_to_ids(t) for k, t in (("image_token_id", "<|image_pad|>"),
                                                        ("video_token_id", "<|video_pad|>"),
                                                        ("vision_start_token_id", "<|vision_start|>"),
                                                        ("vision_end_token_id", "<|vision_end|>"))}
    rope = {"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [2, 1, 1], "mrope_interleaved": True,
            "partial_rotary_factor": 0.5}
    text = _text(tok, rope_parameters=rope, head_dim=16, layer_types=["linear_attention", "full_attention"],
                 linear_conv_kernel_dim=2, linear_key_head_dim=8, linear_value_head_dim=8, linear_num_key_heads=2,
                 linear_num_value_heads=4)
    cfg = tf.Qwen3_5Config(text_config=text, vision_config=dict(depth=1, hidden_size=32, out_hidden_size=HIDDEN,
                                                                num_heads=2, intermediate_size=64, patch_size=16,
                                                                spatial_merge_size=2, num_position_embeddings=64), **ids)
    ip = tf.Qwen2VLImageProcessor(min_pixels=32 ** 2 * 4, max_pixels=32 ** 2 * 9, patch_size=16, merge_size=2)
    torch.manual_seed(31)
    proc = tf.Qwen3VLProcessor(image_processor=ip, tokenizer=tok, chat_template=QWEN3_5_TEMPLATE,
                               video_processor=tf.Qwen3VLVideoProcessor(patch_size=16, merge_size=2))
    return _save(tf.Qwen3_5ForConditionalGeneration(cfg), proc, out)


# ---- Gemma 3 / PaliGemma (SentencePiece-like, Gemma turn markers; PaliGemma: no template, prefix-LM) -----------
GEMMA3_TEMPLATE = ("{{ bos_token }}{% for m in messages %}<start_of_turn>{{ 'model' if m['role'] == 'assistant' "
                   "else m['role'] }}\n" + _content("<start_of_image>", "{{ c['text'] | trim }}") +
                   "<end_of_turn>\n{% endfor %}{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}")
VISION_SIGLIP = dict(model_type="siglip_vision_model", hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                     num_attention_heads=2, image_size=32, patch_size=8)


def _gemma_text(tok, **kw) -> dict:
    return _text(tok, head_dim=16, query_pre_attn_scalar=16, sliding_window=512, **kw)


def build_gemma3(out: Path) -> Path:
    from transformers import Gemma3Config, Gemma3ForConditionalGeneration, Gemma3ImageProcessor, Gemma3Processor
    specials = ["<pad>", "<eos>", "<bos>", "<unk>", "<start_of_turn>", "<end_of_turn>", "<start_of_image>",
                "<end_of_image>", "<image_soft_token>"]
    tok = _fast(_sentencepiece(specials, bos="<bos>"), bos_token="<bos>", eos_token="<eos>", pad_token="<pad>",
                unk_token="<unk>", extra_special_tokens={"boi_token": "<start_of_image>", "eoi_token": "<end_of_image>",
                                                         "image_token": "<image_soft_token>"})
    ids = {k: tok.convert_tokens_to_ids(t) for k, t in (("boi_token_index", "<start_of_image>"),
                                                        ("eoi_token_index", "<end_of_image>"),
                                                        ("image_token_index", "<image_soft_token>"))}
    cfg = Gemma3Config(text_config=dict(model_type="gemma3_text", **_gemma_text(tok)), vision_config=VISION_SIGLIP,
                       mm_tokens_per_image=4, **ids)
    torch.manual_seed(21)
    proc = Gemma3Processor(image_processor=Gemma3ImageProcessor(size={"height": 32, "width": 32}), tokenizer=tok,
                           image_seq_length=4, chat_template=GEMMA3_TEMPLATE)
    return _save(Gemma3ForConditionalGeneration(cfg), proc, out)


def build_paligemma(out: Path) -> Path:
    from transformers import PaliGemmaConfig, PaliGemmaForConditionalGeneration, PaliGemmaProcessor, SiglipImageProcessor
    tok = _fast(_sentencepiece(["<pad>", "<eos>", "<bos>", "<unk>", "<image>"], bos="<bos>"), bos_token="<bos>",
                eos_token="<eos>", pad_token="<pad>", unk_token="<unk>", extra_special_tokens={"image_token": "<image>"})
    ip = SiglipImageProcessor(size={"height": 32, "width": 32})
    ip.image_seq_length = 16
    cfg = PaliGemmaConfig(text_config=dict(model_type="gemma", **_text(tok, head_dim=16)),
                          vision_config=dict(VISION_SIGLIP, projection_dim=HIDDEN), projection_dim=HIDDEN,
                          hidden_size=HIDDEN, image_token_index=tok.convert_tokens_to_ids("<image>"),
                          vocab_size=len(tok))
    torch.manual_seed(22)
    return _save(PaliGemmaForConditionalGeneration(cfg), PaliGemmaProcessor(image_processor=ip, tokenizer=tok), out)


# ---- Idefics3 = SmolVLM v1 (byte-level, "User:<image>... Assistant:", image tiles) --------------------------------
IDEFICS3_TEMPLATE = ("<|im_start|>{% for m in messages %}{{ m['role'] | capitalize }}"
                     "{% if m['content'][0]['type'] == 'image' %}{{ ':' }}{% else %}{{ ': ' }}{% endif %}"
                     + _content("<image>") + "<end_of_utterance>\n{% endfor %}"
                     "{% if add_generation_prompt %}{{ 'Assistant:' }}{% endif %}")
TILE_TOKENS = [f"<row_{r}_col_{c}>" for r in range(1, 4) for c in range(1, 4)]


def build_idefics3(out: Path) -> Path:
    from transformers import Idefics3Config, Idefics3ForConditionalGeneration, Idefics3ImageProcessor, Idefics3Processor
    specials = ["<|endoftext|>", "<|im_start|>", "<end_of_utterance>", "<fake_token_around_image>", "<image>",
                "<global-img>"] + TILE_TOKENS
    tok = _fast(_bytelevel(specials), bos_token="<|im_start|>", eos_token="<end_of_utterance>",
                pad_token="<|endoftext|>")
    cfg = Idefics3Config(text_config=dict(model_type="llama", **_text(tok)), scale_factor=2,
                         vision_config=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                            num_attention_heads=2, image_size=32, patch_size=8),
                         image_token_id=tok.convert_tokens_to_ids("<image>"))
    ip = Idefics3ImageProcessor(size={"longest_edge": 64}, max_image_size={"longest_edge": 32})
    torch.manual_seed(23)
    proc = Idefics3Processor(image_processor=ip, tokenizer=tok, image_seq_len=4, chat_template=IDEFICS3_TEMPLATE)
    return _save(Idefics3ForConditionalGeneration(cfg), proc, out)


# ---- LLaVA-NeXT (Mistral-7B variant: Llama-2 SentencePiece, "[INST] <image>\n... [/INST]", anyres patches) -------
MISTRAL_INST_TEMPLATE = ("{% for m in messages %}{% if m['role'] == 'user' %}[INST] " + _content("<image>\n") +
                         " [/INST]{% else %} " + _content("") + "</s>{% endif %}{% endfor %}")
VISION_CLIP = dict(model_type="clip_vision_model", hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                   num_attention_heads=2, image_size=32, patch_size=8, projection_dim=32)
PINPOINTS = [[32, 32], [32, 64], [64, 32], [64, 64]]


def _llama2_tok():
    return _fast(_sentencepiece(["<unk>", "<s>", "</s>", "<pad>", "<image>"], bos="<s>"), bos_token="<s>",
                 eos_token="</s>", unk_token="<unk>", pad_token="<pad>", extra_special_tokens={"image_token": "<image>"})


def build_llava_next(out: Path) -> Path:
    from transformers import (LlavaNextConfig, LlavaNextForConditionalGeneration, LlavaNextImageProcessor,
                              LlavaNextProcessor)
    tok = _llama2_tok()
    cfg = LlavaNextConfig(vision_config=VISION_CLIP, text_config=dict(model_type="mistral", **_text(tok)),
                          image_token_index=tok.convert_tokens_to_ids("<image>"), image_grid_pinpoints=PINPOINTS,
                          vision_feature_select_strategy="default", vision_feature_layer=-1)
    ip = LlavaNextImageProcessor(size={"shortest_edge": 32}, crop_size={"height": 32, "width": 32},
                                 image_grid_pinpoints=PINPOINTS)
    torch.manual_seed(24)
    proc = LlavaNextProcessor(image_processor=ip, tokenizer=tok, patch_size=8, vision_feature_select_strategy="default",
                              num_additional_image_tokens=1, chat_template=MISTRAL_INST_TEMPLATE)
    return _save(LlavaNextForConditionalGeneration(cfg), proc, out)


# ---- Mistral 3 (Pixtral vision; tekken byte-level; "<s>[INST][IMG]...[/INST]" with BOS in the template) ----------
MISTRAL3_TEMPLATE = ("{{ bos_token }}{% for m in messages %}{% if m['role'] == 'user' %}[INST]" + _content("[IMG]") +
                     "[/INST]{% else %}" + _content("") + "</s>{% endif %}{% endfor %}")


def build_mistral3(out: Path) -> Path:
    from transformers import Mistral3Config, Mistral3ForConditionalGeneration, PixtralImageProcessor, PixtralProcessor
    tok = _fast(_bytelevel(["<unk>", "<s>", "</s>", "<pad>", "[INST]", "[/INST]", "[IMG]", "[IMG_BREAK]", "[IMG_END]"],
                           bos="<s>"), bos_token="<s>", eos_token="</s>", unk_token="<unk>", pad_token="<pad>")
    cfg = Mistral3Config(vision_config=dict(model_type="pixtral", hidden_size=32, intermediate_size=64,
                                            num_hidden_layers=1, num_attention_heads=2, image_size=64, patch_size=8,
                                            head_dim=16),
                         text_config=dict(model_type="mistral", **_text(tok, head_dim=16)), spatial_merge_size=2,
                         image_token_index=tok.convert_tokens_to_ids("[IMG]"), vision_feature_layer=-1)
    ip = PixtralImageProcessor(size={"longest_edge": 64}, patch_size={"height": 8, "width": 8})
    torch.manual_seed(25)
    proc = PixtralProcessor(image_processor=ip, tokenizer=tok, patch_size=8, spatial_merge_size=2,
                            chat_template=MISTRAL3_TEMPLATE)
    return _save(Mistral3ForConditionalGeneration(cfg), proc, out)


# ---- Mllama (Llama 3.2 Vision: byte-level, Llama 3 headers, cross-attention to image tiles) ----------------------
LLAMA3_TEMPLATE = ("{{ bos_token }}{% for m in messages %}<|start_header_id|>{{ m['role'] }}<|end_header_id|>\n\n"
                   + _content("<|image|>") + "<|eot_id|>{% endfor %}"
                   "{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}")


def build_mllama(out: Path) -> Path:
    from transformers import MllamaConfig, MllamaForConditionalGeneration, MllamaImageProcessor, MllamaProcessor
    specials = ["<|begin_of_text|>", "<|end_of_text|>", "<|finetune_right_pad_id|>", "<|start_header_id|>",
                "<|end_header_id|>", "<|eot_id|>", "<|image|>", "<|python_tag|>"]
    tok = _fast(_bytelevel(specials, bos="<|begin_of_text|>"), bos_token="<|begin_of_text|>",
                eos_token="<|eot_id|>", pad_token="<|finetune_right_pad_id|>")
    vision = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_global_layers=1, attention_heads=2,
                  image_size=32, patch_size=8, max_num_tiles=2, intermediate_layers_indices=[0],
                  vision_output_dim=64, supported_aspect_ratios=[[1, 1], [1, 2], [2, 1]])
    cfg = MllamaConfig(vision_config=vision, text_config=_text(tok, cross_attention_layers=[1]),
                       image_token_index=tok.convert_tokens_to_ids("<|image|>"))
    ip = MllamaImageProcessor(size={"height": 32, "width": 32}, max_image_tiles=2)
    torch.manual_seed(26)
    proc = MllamaProcessor(image_processor=ip, tokenizer=tok, chat_template=LLAMA3_TEMPLATE)
    model = MllamaForConditionalGeneration(cfg)
    with torch.no_grad():            # the cross-attention gates start at 0 (tanh(0): the image would not count)
        for key, p in model.named_parameters():
            if "cross_attn_attn_gate" in key or "cross_attn_mlp_gate" in key or key.endswith(".gate"):
                p.fill_(1.0)
    return _save(model, proc, out)


# ---- SmolVLM2 (Idefics3's layout, its own processor; needs num2words) ---------------------------------------------
def build_smolvlm2(out: Path) -> Path:
    from transformers import (SmolVLMConfig, SmolVLMForConditionalGeneration, SmolVLMImageProcessor, SmolVLMProcessor,
                              SmolVLMVideoProcessor)
    specials = ["<|endoftext|>", "<|im_start|>", "<end_of_utterance>", "<fake_token_around_image>", "<image>",
                "<global-img>", "<video>"] + TILE_TOKENS
    tok = _fast(_bytelevel(specials), bos_token="<|im_start|>", eos_token="<end_of_utterance>",
                pad_token="<|endoftext|>")
    cfg = SmolVLMConfig(text_config=dict(model_type="llama", **_text(tok)), scale_factor=2,
                        vision_config=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                           num_attention_heads=2, image_size=32, patch_size=8),
                        image_token_id=tok.convert_tokens_to_ids("<image>"))
    ip = SmolVLMImageProcessor(size={"longest_edge": 64}, max_image_size={"longest_edge": 32})
    vp = SmolVLMVideoProcessor(size={"longest_edge": 64}, max_image_size={"longest_edge": 32})
    torch.manual_seed(27)
    proc = SmolVLMProcessor(image_processor=ip, tokenizer=tok, video_processor=vp, image_seq_len=4,
                            chat_template=IDEFICS3_TEMPLATE)
    return _save(SmolVLMForConditionalGeneration(cfg), proc, out)


# ---- LLaVA-OneVision, InternVL (Qwen2 LMs: byte-level, ChatML) --------------------------------------------------
CHATML = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{IMAGE}<|im_end|>\n{% endfor %}"
          "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def build_llava_onevision(out: Path) -> Path:
    from transformers import (LlavaOnevisionConfig, LlavaOnevisionForConditionalGeneration,
                              LlavaOnevisionImageProcessor, LlavaOnevisionProcessor, LlavaOnevisionVideoProcessor)
    tok = _fast(_bytelevel(QWEN_SPECIALS + ["<image>", "<video>"]), eos_token="<|im_end|>", pad_token="<|endoftext|>",
                extra_special_tokens={"image_token": "<image>", "video_token": "<video>"})
    template = CHATML.replace("{IMAGE}", _content("<image>\n"))
    vision = dict(VISION_SIGLIP)
    cfg = LlavaOnevisionConfig(vision_config=vision, text_config=dict(model_type="qwen2", **_text(tok)),
                               image_token_index=tok.convert_tokens_to_ids("<image>"),
                               video_token_index=tok.convert_tokens_to_ids("<video>"), image_grid_pinpoints=PINPOINTS,
                               vision_feature_select_strategy="full", vision_feature_layer=-1)
    ip = LlavaOnevisionImageProcessor(size={"height": 32, "width": 32}, image_grid_pinpoints=PINPOINTS)
    vp = LlavaOnevisionVideoProcessor(size={"height": 32, "width": 32})
    torch.manual_seed(28)
    proc = LlavaOnevisionProcessor(image_processor=ip, tokenizer=tok, video_processor=vp, num_image_tokens=16,
                                   vision_feature_select_strategy="full", chat_template=template)
    return _save(LlavaOnevisionForConditionalGeneration(cfg), proc, out)


def build_internvl(out: Path) -> Path:
    from transformers import (GotOcr2ImageProcessor, InternVLConfig, InternVLForConditionalGeneration, InternVLProcessor,
                              InternVLVideoProcessor)
    names = {"start_image_token": "<img>", "end_image_token": "</img>", "context_image_token": "<IMG_CONTEXT>",
             "video_token": "<video>"}
    tok = _fast(_bytelevel(QWEN_SPECIALS + list(names.values())), eos_token="<|im_end|>", pad_token="<|endoftext|>",
                extra_special_tokens=names)
    template = CHATML.replace("{IMAGE}", _content("<IMG_CONTEXT>\n"))
    vision = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                  image_size=[32, 32], patch_size=[8, 8])
    cfg = InternVLConfig(vision_config=vision, text_config=dict(model_type="qwen2", **_text(tok)),
                         image_token_id=tok.convert_tokens_to_ids("<IMG_CONTEXT>"), image_seq_length=4)
    ip = GotOcr2ImageProcessor(size={"height": 32, "width": 32}, crop_to_patches=True, min_patches=1, max_patches=4)
    vp = InternVLVideoProcessor(size={"height": 32, "width": 32})
    torch.manual_seed(29)
    proc = InternVLProcessor(image_processor=ip, tokenizer=tok, video_processor=vp, image_seq_length=4,
                             chat_template=template)
    return _save(InternVLForConditionalGeneration(cfg), proc, out)


# ---- Aya Vision (Cohere 2 LM: byte-level, Cohere turn tokens; SigLIP tiles, pixel shuffle) -------------------------
AYA_TEMPLATE = ("{{ bos_token }}{% for m in messages %}<|START_OF_TURN_TOKEN|>"
                "{{ '<|USER_TOKEN|>' if m['role'] == 'user' else '<|CHATBOT_TOKEN|>' }}" + _content("<image>") +
                "<|END_OF_TURN_TOKEN|>{% endfor %}"
                "{% if add_generation_prompt %}<|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>{% endif %}")


def build_aya_vision(out: Path) -> Path:
    from transformers import AyaVisionConfig, AyaVisionForConditionalGeneration, AyaVisionProcessor, GotOcr2ImageProcessor
    specials = ["<PAD>", "<UNK>", "<BOS_TOKEN>", "<|END_OF_TURN_TOKEN|>", "<|START_OF_TURN_TOKEN|>", "<|USER_TOKEN|>",
                "<|CHATBOT_TOKEN|>", "<image>", "<|START_OF_IMG|>", "<|END_OF_IMG|>", "<|IMG_PATCH|>",
                "<|IMG_LINE_BREAK|>", "TILE", "TILE_GLOBAL"]
    tok = _fast(_bytelevel(specials, bos="<BOS_TOKEN>"), bos_token="<BOS_TOKEN>", eos_token="<|END_OF_TURN_TOKEN|>",
                pad_token="<PAD>", unk_token="<UNK>")
    cfg = AyaVisionConfig(vision_config=VISION_SIGLIP, text_config=dict(model_type="cohere2", **_text(tok, head_dim=16)),
                          downsample_factor=2, image_token_index=tok.convert_tokens_to_ids("<|IMG_PATCH|>"))
    ip = GotOcr2ImageProcessor(size={"height": 32, "width": 32}, crop_to_patches=True, min_patches=1, max_patches=4)
    torch.manual_seed(30)
    proc = AyaVisionProcessor(image_processor=ip, tokenizer=tok, patch_size=8, img_size=32, downsample_factor=2,
                              chat_template=AYA_TEMPLATE)
    return _save(AyaVisionForConditionalGeneration(cfg), proc, out)


# ---- Gemma 4 (SentencePiece-like; <|turn> markers; thinking off by default, on: <|think|> in a system turn) -------
# Two shapes of template: E2B / E4B end the generation prompt with the model turn; 26B / 31B also give an empty
# thought channel there ("<|channel>thought\n<channel|>") while answered turns render without it.
_GEMMA4_TURNS = ("{{ bos_token }}{%- set think = enable_thinking is defined and enable_thinking -%}"
                 "{% if think %}<|turn>system\n<|think|><turn|>\n{% endif %}"
                 "{% for m in messages %}<|turn>{{ 'model' if m['role'] == 'assistant' else m['role'] }}\n"
                 + _content("<|image|>", "{{ c['text'] | trim }}") + "<turn|>\n{% endfor %}")
GEMMA4_TEMPLATE = _GEMMA4_TURNS + "{% if add_generation_prompt %}<|turn>model\n{% endif %}"
GEMMA4_LARGE_TEMPLATE = (_GEMMA4_TURNS + "{% if add_generation_prompt %}<|turn>model\n"
                         "{% if not think %}<|channel>thought\n<channel|>{% endif %}{% endif %}")
GEMMA4_SPECIALS = ["<pad>", "<eos>", "<bos>", "<unk>", "<|turn>", "<turn|>", "<|think|>", "<|channel>", "<channel|>",
                   "<|image>", "<image|>", "<|image|>", "<|audio>", "<audio|>", "<|audio|>", "<|video|>"]


def build_gemma4(out: Path) -> Path:
    import transformers as tf
    names = {"image_token": "<|image|>", "boi_token": "<|image>", "eoi_token": "<image|>", "audio_token": "<|audio|>",
             "boa_token": "<|audio>", "eoa_token": "<audio|>"}
    tok = _fast(_sentencepiece(GEMMA4_SPECIALS, bos="<bos>"), bos_token="<bos>", eos_token="<turn|>", pad_token="<pad>",
                unk_token="<unk>", extra_special_tokens=names)
    ids = {k: tok.convert_tokens_to_ids(t) for k, t in (("image_token_id", "<|image|>"), ("boi_token_id", "<|image>"),
                                                        ("eoi_token_id", "<image|>"), ("video_token_id", "<|video|>"),
                                                        ("audio_token_id", "<|audio|>"), ("boa_token_id", "<|audio>"),
                                                        ("eoa_token_index", "<audio|>"))}
    # as E2B / E4B: per-layer input embeddings, and the last layer reusing the KV of the last full-attention one
    text = dict(model_type="gemma4_text", **_text(tok, head_dim=16, global_head_dim=16, hidden_size_per_layer_input=8,
                                                  vocab_size_per_layer_input=len(tok), num_kv_shared_layers=1,
                                                  layer_types=["sliding_attention", "full_attention", "full_attention"]))
    text["num_hidden_layers"] = 3
    vision = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                  num_key_value_heads=2, head_dim=16, patch_size=8, pooling_kernel_size=2, position_embedding_size=64)
    cfg = tf.Gemma4Config(text_config=text, vision_config=vision, audio_config=None, **ids)
    size = dict(patch_size=8, pooling_kernel_size=2, max_soft_tokens=70)     # 70: the smallest budget it takes
    torch.manual_seed(32)
    proc = tf.Gemma4Processor(feature_extractor=tf.Gemma4AudioFeatureExtractor(), tokenizer=tok,
                              image_processor=tf.Gemma4ImageProcessor(**size),
                              video_processor=tf.Gemma4VideoProcessor(**size), chat_template=GEMMA4_TEMPLATE,
                              image_seq_length=70)
    return _save(tf.Gemma4ForConditionalGeneration(cfg), proc, out)


def build_gemma4_large(out: Path) -> Path:
    """The Gemma 4 model with the 26B / 31B template shape (a copy of `gemma4`'s folder, template replaced)."""
    import shutil
    shutil.copytree(build_family("gemma4", Path(out).parent), out)
    (Path(out) / "chat_template.jinja").write_text(GEMMA4_LARGE_TEMPLATE)
    return out


# ---- GLM-4.6V (byte-level, "[gMASK]<sop>", <|user|> / <|assistant|>; M-RoPE; thinking on by default) -------------
# Thinking on: the generation prompt is "<|assistant|>" (the model opens <think>); off: "<|assistant|>\n<think></think>";
# an answered turn renders "<|assistant|>\n<think></think>\n" before the reply.
GLM46V_TEMPLATE = ("[gMASK]<sop>{%- set think = enable_thinking is not defined or enable_thinking -%}"
                   "{% for m in messages %}{% if m['role'] == 'user' %}<|user|>\n"
                   + _content("<|begin_of_image|><|image|><|end_of_image|>") +
                   "{% else %}<|assistant|>{{ '\\n<think></think>\\n' }}" + _content("") + "{% endif %}{% endfor %}"
                   "{% if add_generation_prompt %}<|assistant|>{% if not think %}{{ '\\n<think></think>' }}{% endif %}"
                   "{% endif %}")
GLM_SPECIALS = ["<|endoftext|>", "[gMASK]", "<sop>", "<|system|>", "<|user|>", "<|assistant|>", "<think>", "</think>",
                "<|begin_of_image|>", "<|end_of_image|>", "<|image|>", "<|begin_of_video|>", "<|end_of_video|>",
                "<|video|>"]


def build_glm46v(out: Path) -> Path:
    import transformers as tf
    tok = _fast(_bytelevel(GLM_SPECIALS), eos_token="<|user|>", pad_token="<|endoftext|>",
                extra_special_tokens={"image_token": "<|image|>", "video_token": "<|video|>"})
    ids = {k: tok.convert_tokens_to_ids(t) for k, t in (("image_token_id", "<|image|>"), ("video_token_id", "<|video|>"),
                                                        ("image_start_token_id", "<|begin_of_image|>"),
                                                        ("image_end_token_id", "<|end_of_image|>"),
                                                        ("video_start_token_id", "<|begin_of_video|>"),
                                                        ("video_end_token_id", "<|end_of_video|>"))}
    rope = {"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [2, 1, 1], "partial_rotary_factor": 0.5}
    vision = dict(model_type="glm4v_vision", depth=1, hidden_size=32, out_hidden_size=HIDDEN, num_heads=2,
                  intermediate_size=64, patch_size=14, spatial_merge_size=2, image_size=28)
    cfg = tf.Glm46VConfig(text_config=dict(model_type="glm4v_text", **_text(tok, rope_parameters=rope, head_dim=16)),
                          vision_config=vision, **ids)
    ip = tf.Glm46VImageProcessor(size={"shortest_edge": 28 ** 2 * 4, "longest_edge": 28 ** 2 * 9}, patch_size=14,
                                 merge_size=2)
    torch.manual_seed(33)
    proc = tf.Glm46VProcessor(image_processor=ip, tokenizer=tok, chat_template=GLM46V_TEMPLATE,
                              video_processor=tf.Glm46VVideoProcessor(patch_size=14, merge_size=2))
    return _save(tf.Glm46VForConditionalGeneration(cfg), proc, out)


# ---- LFM2-VL (hybrid LM: short convolutions + attention; SigLIP-2 NaFlex tiles + thumbnail; BOS in the template) ---
LFM2_VL_TEMPLATE = ("{{ bos_token }}{% for m in messages %}<|im_start|>{{ m['role'] }}\n" + _content("<image>") +
                    "<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
LFM2_SPECIALS = (["<|pad|>", "<|startoftext|>", "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<image>",
                  "<|image_start|>", "<|image_end|>", "<|img_thumbnail|>"]
                 + [f"<|img_row_{r}_col_{c}|>" for r in range(1, 4) for c in range(1, 4)])


def build_lfm2_vl(out: Path) -> Path:
    import transformers as tf
    tok = _fast(_bytelevel(LFM2_SPECIALS, bos="<|startoftext|>"), bos_token="<|startoftext|>", eos_token="<|im_end|>",
                pad_token="<|pad|>")
    text = dict(model_type="lfm2", **_text(tok, layer_types=["conv", "full_attention"], conv_L_cache=3,
                                           block_auto_adjust_ff_dim=False))
    vision = dict(model_type="siglip2_vision_model", hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                  num_attention_heads=2, patch_size=8, num_patches=64)
    cfg = tf.Lfm2VlConfig(text_config=text, vision_config=vision, image_token_id=tok.convert_tokens_to_ids("<image>"),
                          projector_hidden_size=64, downsample_factor=2)
    ip = tf.Lfm2VlImageProcessor(encoder_patch_size=8, tile_size=32, min_image_tokens=4, max_image_tokens=16,
                                 min_tiles=2, max_tiles=4, downsample_factor=2)
    torch.manual_seed(34)
    proc = tf.Lfm2VlProcessor(image_processor=ip, tokenizer=tok, chat_template=LFM2_VL_TEMPLATE)
    return _save(tf.Lfm2VlForConditionalGeneration(cfg), proc, out)


# ---- Cohere2 Vision = Command A Vision (byte-level, Cohere turns; the reply inside <|START_RESPONSE|> ... , which the
# generation prompt does not open: the model writes it) ------------------------------------------------------------
COHERE2_VISION_TEMPLATE = ("{{ bos_token }}{% for m in messages %}<|START_OF_TURN_TOKEN|>"
                           "{% if m['role'] == 'user' %}<|USER_TOKEN|>" + _content("<|IMG_PATCH|>") +
                           "{% else %}<|CHATBOT_TOKEN|><|START_RESPONSE|>" + _content("") + "<|END_RESPONSE|>"
                           "{% endif %}<|END_OF_TURN_TOKEN|>{% endfor %}"
                           "{% if add_generation_prompt %}<|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>{% endif %}")


def build_cohere2_vision(out: Path) -> Path:
    import transformers as tf
    specials = ["<PAD>", "<UNK>", "<BOS_TOKEN>", "<|END_OF_TURN_TOKEN|>", "<|START_OF_TURN_TOKEN|>", "<|USER_TOKEN|>",
                "<|CHATBOT_TOKEN|>", "<|START_RESPONSE|>", "<|END_RESPONSE|>", "<|START_OF_IMG|>", "<|END_OF_IMG|>",
                "<|IMG_PATCH|>", "<|IMG_LINE_BREAK|>"]
    names = {"image_token": "<|IMG_PATCH|>", "boi_token": "<|START_OF_IMG|>", "eoi_token": "<|END_OF_IMG|>",
             "img_line_break_token": "<|IMG_LINE_BREAK|>"}
    tok = _fast(_bytelevel(specials, bos="<BOS_TOKEN>"), bos_token="<BOS_TOKEN>", eos_token="<|END_OF_TURN_TOKEN|>",
                pad_token="<PAD>", unk_token="<UNK>", extra_special_tokens=names)
    cfg = tf.Cohere2VisionConfig(vision_config=VISION_SIGLIP, downsample_factor=2, alignment_intermediate_size=64,
                                 text_config=dict(model_type="cohere2", **_text(tok, head_dim=16)),
                                 image_token_id=tok.convert_tokens_to_ids("<|IMG_PATCH|>"))
    ip = tf.Cohere2VisionImageProcessor(size={"height": 32, "width": 32}, patch_size=2, max_patches=4)
    torch.manual_seed(35)
    proc = tf.Cohere2VisionProcessor(image_processor=ip, tokenizer=tok, chat_template=COHERE2_VISION_TEMPLATE)
    return _save(tf.Cohere2VisionForConditionalGeneration(cfg), proc, out)


# ---- Molmo2 (Qwen3 LM: byte-level, ChatML; low-res view + overlapping crops, pooled patches; the processor adds
# the tokenizer's BOS-or-EOS before every prompt) ----------------------------------------------------------------
MOLMO2_SPECIALS = ["<im_patch>", "<im_col>", "<im_start>", "<low_res_im_start>", "<frame_start>", "<im_end>",
                   "<frame_end>", "<im_low>", "<|image|>", "<|video|>"]


def build_molmo2(out: Path) -> Path:
    import transformers as tf
    tok = _fast(_bytelevel(QWEN_SPECIALS + MOLMO2_SPECIALS), eos_token="<|im_end|>", pad_token="<|endoftext|>",
                extra_special_tokens={"image_token": "<|image|>", "video_token": "<|video|>"})
    ids = {k: tok.convert_tokens_to_ids(t) for k, t in (("image_start_token_id", "<im_start>"),
                                                        ("low_res_image_start_token_id", "<low_res_im_start>"),
                                                        ("image_end_token_id", "<im_end>"), ("image_patch_id", "<im_patch>"),
                                                        ("frame_start_token_id", "<frame_start>"),
                                                        ("frame_end_token_id", "<frame_end>"))}
    text = {k: v for k, v in _text(tok, head_dim=16, additional_vocab_size=0).items()
            if k not in ("pad_token_id", "bos_token_id", "eos_token_id")}
    vision = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                  num_key_value_heads=2, head_dim=16, image_size=[32, 32], patch_size=8, num_position_embeddings=16)
    adapter = dict(vision_feature_layer=[-1], hidden_size=32, num_attention_heads=2, num_key_value_heads=2, head_dim=16,
                   intermediate_size=64, text_hidden_size=HIDDEN)
    cfg = tf.Molmo2Config(text_config=text, vision_config=vision, adapter_config=adapter, **ids)
    size = dict(size={"height": 32, "width": 32}, patch_size=8, pooling_size=[2, 2])
    torch.manual_seed(36)
    proc = tf.Molmo2Processor(image_processor=tf.Molmo2ImageProcessor(max_crops=2, overlap_margins=[1, 1], **size),
                              video_processor=tf.Molmo2VideoProcessor(**size), tokenizer=tok,
                              chat_template=CHATML.replace("{IMAGE}", _content("<|image|>")))
    model = tf.Molmo2ForConditionalGeneration(cfg)
    with torch.no_grad():   # its pooling + projector at std 0.02 shrink the features to ~1e-9 (added to embeddings)
        for p in model.model.multi_modal_projector.parameters():
            if p.dim() == 2:
                p.normal_(0.0, p.shape[1] ** -0.5)
    return _save(model, proc, out)


# ---- Fuyu (Persimmon LM; no chat template and no image encoder: the processor itself writes the image as rows of
# |SPEAKER| patch tokens + |NEWLINE|, then BOS, the prompt and "<0x04>" (beginning of answer); SentencePiece-like with
# the image tokens as vocabulary pieces, as the real tokenizer: its split after BOS drops a leading "▁") ----------------
def build_fuyu(out: Path) -> Path:
    import json

    import transformers as tf
    from tokenizers import models as tok_models
    base = _sentencepiece(["<unk>", "<s>", "|ENDOFTEXT|"], bos="<s>")
    vocab = [tuple(v) for v in json.loads(base.to_str())["model"]["vocab"]]
    base.model = tok_models.Unigram(vocab + [(p, 0.0) for p in ("|SPEAKER|", "|NEWLINE|", "<0x04>")], unk_id=0,
                                    byte_fallback=False)
    tok = _fast(base, bos_token="<s>", eos_token="|ENDOFTEXT|", unk_token="<unk>")
    text = dict(model_type="persimmon", **_text(tok, qk_layernorm=True, partial_rotary_factor=0.5))
    text.pop("num_key_value_heads")
    cfg = tf.FuyuConfig(text_config=text, patch_size=8, num_channels=3,
                        image_token_id=tok.convert_tokens_to_ids("|SPEAKER|"))
    ip = tf.FuyuImageProcessor(size={"height": 32, "width": 32}, patch_size={"height": 8, "width": 8})
    torch.manual_seed(38)
    return _save(tf.FuyuForCausalLM(cfg), tf.FuyuProcessor(image_processor=ip, tokenizer=tok), out)


# ---- Llama 4 (fails inside transformers 5.24's own forward: the one-line refusal; a family from 5.25) ------------
LLAMA4_TEMPLATE = ("{{ bos_token }}{% for m in messages %}<|header_start|>{{ m['role'] }}<|header_end|>\n\n"
                   + _content("<|image|>") + "<|eot|>{% endfor %}"
                   "{% if add_generation_prompt %}<|header_start|>assistant<|header_end|>\n\n{% endif %}")


def build_llama4(out: Path) -> Path:
    import transformers as tf
    specials = ["<|begin_of_text|>", "<|end_of_text|>", "<|finetune_right_pad|>", "<|header_start|>", "<|header_end|>",
                "<|eot|>", "<|image|>", "<|image_start|>", "<|image_end|>", "<|patch|>", "<|tile_x_separator|>",
                "<|tile_y_separator|>"]
    tok = _fast(_bytelevel(specials, bos="<|begin_of_text|>"), bos_token="<|begin_of_text|>", eos_token="<|eot|>",
                pad_token="<|finetune_right_pad|>")
    text = _text(tok, head_dim=16, intermediate_size_mlp=96, num_local_experts=2, attention_chunk_size=64,
                 no_rope_layer_interval=2)
    vision = dict(hidden_size=32, intermediate_size=128, num_hidden_layers=1, num_attention_heads=2, image_size=32,
                  patch_size=8, vision_output_dim=64, projector_input_dim=64, projector_output_dim=64)
    cfg = tf.Llama4Config(text_config=text, vision_config=vision, image_token_index=tok.convert_tokens_to_ids("<|patch|>"),
                          boi_token_index=tok.convert_tokens_to_ids("<|image_start|>"),
                          eoi_token_index=tok.convert_tokens_to_ids("<|image_end|>"))
    torch.manual_seed(37)
    proc = tf.Llama4Processor(image_processor=tf.Llama4ImageProcessor(size={"height": 32, "width": 32}, max_patches=2),
                              tokenizer=tok, patch_size=8, pixel_shuffle_ratio=0.5, chat_template=LLAMA4_TEMPLATE)
    return _save(tf.Llama4ForConditionalGeneration(cfg), proc, out)


FAMILIES = {
    "smolvlm2": build_smolvlm2,
    "llava-onevision": build_llava_onevision,
    "internvl": build_internvl,
    "aya-vision": build_aya_vision,
    "idefics3": build_idefics3,
    "llava-next": build_llava_next,
    "mistral3": build_mistral3,
    "mllama": build_mllama,
    "gemma3": build_gemma3,
    "paligemma": build_paligemma,
    "qwen2-vl": build_qwen2_vl,
    "qwen2.5-vl": build_qwen2_5_vl,
    "qwen3-vl": build_qwen3_vl,
    # the newest families (#30): thinking templates, hybrid caches, M-RoPE with GLM's layout, MoE
    "qwen3.5": build_qwen3_5,
    "gemma4": build_gemma4,
    "gemma4-31b": build_gemma4_large,
    "glm-4.6v": build_glm46v,
    "lfm2-vl": build_lfm2_vl,
    "cohere2-vision": build_cohere2_vision,
    "molmo2": build_molmo2,
    "qwen3-vl-moe": build_qwen3_vl_moe,
    # a processor that places the image tokens, BOS and its answer marker itself (no chat template)
    "fuyu": build_fuyu,
}
# Llama 4 fails inside transformers 5.24's own forward (the backend refuses it in one line:
# test_a_model_type_whose_own_forward_fails_is_one_line); from 5.25 its forward runs, and it is a family like the others
if Version(transformers.__version__) >= Version("5.25"):
    FAMILIES["llama4"] = build_llama4
# a family tested again with the chat template's switch set (the folder of the family named first)
VARIANTS = {"qwen3.5-nothink": ("qwen3.5", {"enable_thinking": False})}
REFUSED = {"llama4": build_llama4}   # model types the backend refuses in one line (not in the family tests)


_ROOT: list[Path] = []


def shared_root() -> Path:
    """One folder per test process for these models (removed at exit): each family is built once, whichever test
    module asks first."""
    if not _ROOT:
        import atexit
        import shutil
        import tempfile
        _ROOT.append(Path(tempfile.mkdtemp(prefix="vlm-families-")))
        atexit.register(shutil.rmtree, _ROOT[0], ignore_errors=True)
    return _ROOT[0]


def build_family(name: str, root: Path) -> Path:
    """The folder of `name` (a key of FAMILIES, or of VARIANTS: its family's folder), built on first use."""
    name = VARIANTS[name][0] if name in VARIANTS else name
    out = Path(root) / name
    if not (out / "config.json").exists():
        {**FAMILIES, **REFUSED}[name](out)
    return out


def spec_extra(name: str) -> dict:
    """The ModelSpec.extra a family's tests load it with (a variant's template switch)."""
    return dict(VARIANTS[name][1]) if name in VARIANTS else {}
