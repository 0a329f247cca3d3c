"""Tiny random Hugging Face models of every architecture the HF backends run, saved as local folders.

No downloads: every model is a randomly initialised `transformers` model built from its config class, with a
small stand-in tokenizer TRAINED here with `tokenizers` (the algorithm each family ships: byte-level BPE for
CLIP/OPT/BLOOM/Llama-like, Unigram for SigLIP/T5/XLM-R, WordPiece for the Q-Former's BERT) and the family's own
processor, all written with `save_pretrained`, so the backends load them exactly like a hub checkpoint.

Use (a builder runs once per folder, ~1 s per model; share the folder through a module/session fixture):

    from tests.helpers_hf import TINY, build, images, spec_extra
    from volta_ml.hf import ModelSpec, load_backend
    path = build("llava", tmp_path_factory.mktemp("hf"))                 # a local model folder
    backend = load_backend(TINY["llava"][0], ModelSpec(str(path), extra=spec_extra("llava", path)))
    imgs = images(3)                                                       # deterministic RGB PIL images

`TINY` maps a name to (backend kind, builder): "clip", "siglip", "siglip2" (kind "clip"), "mclip" (kind "mclip";
its image tower lives in a sub-folder that `spec_extra` names) and "llava", "blip2-opt", "blip2-bloom",
"blip2-t5", "instructblip-t5", "mblip-legacy" (mBLIP's published layout without an image token) (kind "mllm").
Only the LLaVA tokenizer carries a chat template (LLaVA-1.5's "USER: <image>\\n... ASSISTANT:" shape); the
BLIP-family models have none and exercise the documented fallback. Letters A-D are single tokens everywhere.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch
from PIL import Image
from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers
from transformers import PreTrainedTokenizerFast

CORPUS = [
    "Question: what is shown in the picture? Options: A. a red car B. a blue bird C. a green tree D. a dog",
    "Location: Brazil. Question: which food is this? Short Answer: rice and beans",
    "the statement is true or false . the left image shows two dogs and the right image one cat",
    "Answer: A B C D yes no true false entailment neutral contradiction Paris London market temple",
    "USER: ASSISTANT: a photo of a street with people , bicycles and a small shop near the river",
    "Quelle est la capitale ? La réponse est Paris . ¿Qué comida es esta ? arroz con frijoles",
]
LETTERS = ["A", "B", "C", "D"]
IMAGE = 32            # pixels; patch 8 -> 16 patches
HIDDEN = 32
LLAVA_TEMPLATE = (
    "{% for m in messages %}{% if m['role'] == 'user' %}USER: "
    "{% for c in m['content'] %}{% if c['type'] == 'image' %}<image>\n{% endif %}{% endfor %}"
    "{% for c in m['content'] %}{% if c['type'] == 'text' %}{{ c['text'] }}{% endif %}{% endfor %}"
    "{% else %} ASSISTANT: {% for c in m['content'] %}{{ c['text'] }}{% endfor %}{% endif %}{% endfor %}"
    "{% if add_generation_prompt %} ASSISTANT:{% endif %}"
)


def images(n: int, seed: int = 0, size: tuple[int, int] = (40, 30)) -> list[Image.Image]:
    """n deterministic RGB images (random pixels, not square, so resizing is exercised)."""
    rng = np.random.default_rng(seed)
    return [Image.fromarray(rng.integers(0, 256, (size[1], size[0], 3), dtype=np.uint8)) for _ in range(n)]


def _letters_alphabet(extra: list[str]) -> list[str]:
    return sorted(set("".join(CORPUS))) + extra


def _bpe(specials: list[str], bos: str | None, eos: str | None, vocab: int = 300, add_bos: bool = True,
         add_eos: bool = False) -> Tokenizer:
    """Byte-level BPE (GPT-2 / OPT / BLOOM / CLIP style); letters get their own tokens, with and without space."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab, special_tokens=specials, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(CORPUS + [" A B C D"] * 5, trainer)
    single = ([bos] if add_bos and bos else []) + ["$A"] + ([eos] if add_eos and eos else [])
    if len(single) > 1:
        tok.post_processor = processors.TemplateProcessing(
            single=" ".join(single), special_tokens=[(t, tok.token_to_id(t)) for t in {bos, eos} if t and t in single])
    return tok


def _unigram(specials: list[str], eos: str | None, bos: str | None = None, vocab: int = 200,
             extra: tuple[str, ...] = ()) -> Tokenizer:
    """SentencePiece-like Unigram with Metaspace (T5 / SigLIP / XLM-R / Gemma / Llama-2 style), trained on CORPUS
    (x3) plus `extra`."""
    tok = Tokenizer(models.Unigram())
    tok.normalizer = normalizers.NFKC()
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    tok.decoder = decoders.Metaspace()
    trainer = trainers.UnigramTrainer(vocab_size=vocab, special_tokens=specials, unk_token="<unk>",
                                      show_progress=False)
    tok.train_from_iterator(CORPUS * 3 + list(extra), trainer)
    single = ([bos] if bos else []) + ["$A"] + ([eos] if eos else [])
    if len(single) > 1:
        tok.post_processor = processors.TemplateProcessing(
            single=" ".join(single), special_tokens=[(t, tok.token_to_id(t)) for t in (bos, eos) if t])
    return tok


def _wordpiece() -> Tokenizer:
    """BERT-like WordPiece (the Q-Former's tokenizer)."""
    tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.decoder = decoders.WordPiece()
    trainer = trainers.WordPieceTrainer(vocab_size=150, special_tokens=["[PAD]", "[UNK]", "[CLS]", "[SEP]"],
                                        show_progress=False)
    tok.train_from_iterator(CORPUS, trainer)
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", special_tokens=[("[CLS]", tok.token_to_id("[CLS]")), ("[SEP]", tok.token_to_id("[SEP]"))])
    return tok


def _fast(tok: Tokenizer, **kw) -> PreTrainedTokenizerFast:
    return PreTrainedTokenizerFast(tokenizer_object=tok, **kw)


def _vision(**kw) -> dict:
    return dict(hidden_size=HIDDEN, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                image_size=IMAGE, patch_size=8, **kw)


def _clip_image_processor():
    from transformers import CLIPImageProcessor
    return CLIPImageProcessor(size={"shortest_edge": IMAGE}, crop_size={"height": IMAGE, "width": IMAGE})


def _save(model, processor, out: Path) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    processor.save_pretrained(out)
    return out


def build_clip(out: Path) -> Path:
    from transformers import CLIPConfig, CLIPModel, CLIPProcessor
    tok = _fast(_bpe(["<|startoftext|>", "<|endoftext|>"], "<|startoftext|>", "<|endoftext|>", add_eos=True),
                bos_token="<|startoftext|>", eos_token="<|endoftext|>", pad_token="<|endoftext|>")
    cfg = CLIPConfig(text_config=dict(vocab_size=len(tok), hidden_size=HIDDEN, intermediate_size=64,
                                      num_hidden_layers=2, num_attention_heads=4, max_position_embeddings=64,
                                      eos_token_id=tok.eos_token_id, bos_token_id=tok.bos_token_id,
                                      pad_token_id=tok.pad_token_id),
                     vision_config=_vision(), projection_dim=24)
    torch.manual_seed(0)
    return _save(CLIPModel(cfg).eval(), CLIPProcessor(image_processor=_clip_image_processor(), tokenizer=tok), out)


def build_siglip(out: Path) -> Path:
    from transformers import SiglipConfig, SiglipImageProcessor, SiglipModel, SiglipProcessor
    tok = _fast(_unigram(["<pad>", "</s>", "<unk>"], "</s>"), eos_token="</s>", pad_token="<pad>", unk_token="<unk>",
                model_max_length=16)
    cfg = SiglipConfig(text_config=dict(vocab_size=len(tok), hidden_size=HIDDEN, intermediate_size=64,
                                        num_hidden_layers=2, num_attention_heads=4, max_position_embeddings=16,
                                        pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id),
                       vision_config=_vision())
    torch.manual_seed(1)
    proc = SiglipProcessor(image_processor=SiglipImageProcessor(size={"height": IMAGE, "width": IMAGE}), tokenizer=tok)
    return _save(SiglipModel(cfg).eval(), proc, out)


def build_siglip2(out: Path) -> Path:
    """SigLIP-2 (NaFlex): patches of 16 and up to 256 of them, as the processor's defaults fix them."""
    from transformers import Siglip2Config, Siglip2ImageProcessor, Siglip2Model, Siglip2Processor
    tok = _fast(_unigram(["<pad>", "</s>", "<unk>"], "</s>"), eos_token="</s>", pad_token="<pad>", unk_token="<unk>",
                model_max_length=16)
    vision = dict(_vision(), patch_size=16, num_patches=256)
    vision.pop("image_size")
    cfg = Siglip2Config(text_config=dict(vocab_size=len(tok), hidden_size=HIDDEN, intermediate_size=64,
                                         num_hidden_layers=2, num_attention_heads=4, max_position_embeddings=16,
                                         pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id),
                        vision_config=vision)
    torch.manual_seed(8)
    proc = Siglip2Processor(image_processor=Siglip2ImageProcessor(), tokenizer=tok)
    return _save(Siglip2Model(cfg).eval(), proc, out)


def build_mclip(out: Path) -> Path:
    """M-CLIP as the `multilingual-clip` package publishes it: config.json (model_type "M-CLIP", modelBase,
    transformerDimensions, numDims), pytorch_model.bin with `transformer.*` (XLM-R) and `LinearTransformation.*`,
    the XLM-R tokenizer; plus `xlmr-base/` (the modelBase config) and `clip-image/` (the CLIP image tower)."""
    from transformers import XLMRobertaConfig, XLMRobertaModel
    out.mkdir(parents=True, exist_ok=True)
    tok = _fast(_unigram(["<s>", "<pad>", "</s>", "<unk>"], "</s>", bos="<s>"), bos_token="<s>", eos_token="</s>",
                pad_token="<pad>", unk_token="<unk>")
    xcfg = XLMRobertaConfig(vocab_size=len(tok), hidden_size=HIDDEN, num_hidden_layers=2, num_attention_heads=4,
                            intermediate_size=64, max_position_embeddings=130, pad_token_id=tok.pad_token_id,
                            type_vocab_size=1)
    xcfg.save_pretrained(out / "xlmr-base")
    torch.manual_seed(2)
    text = XLMRobertaModel(xcfg, add_pooling_layer=True).eval()
    linear = torch.nn.Linear(HIDDEN, 24)
    state = {f"transformer.{k}": v for k, v in text.state_dict().items()}
    state.update({f"LinearTransformation.{k}": v for k, v in linear.state_dict().items()})
    torch.save(state, out / "pytorch_model.bin")
    (out / "config.json").write_text(json.dumps({
        "model_type": "M-CLIP", "architectures": ["MultilingualCLIP"], "modelBase": str(out / "xlmr-base"),
        "transformerDimensions": HIDDEN, "numDims": 24}))
    tok.save_pretrained(out)
    build_clip(out / "clip-image")
    return out


def _llama_tok() -> PreTrainedTokenizerFast:
    return _fast(_bpe(["<unk>", "<s>", "</s>", "<pad>", "<image>"], "<s>", "</s>"), bos_token="<s>",
                 eos_token="</s>", unk_token="<unk>", pad_token="<pad>", extra_special_tokens={"image_token": "<image>"})


def build_llava(out: Path) -> Path:
    from transformers import LlavaConfig, LlavaForConditionalGeneration, LlavaProcessor
    tok = _llama_tok()
    tok.chat_template = LLAVA_TEMPLATE
    text = dict(model_type="llama", vocab_size=len(tok), hidden_size=HIDDEN, intermediate_size=64,
                num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    cfg = LlavaConfig(vision_config=dict(model_type="clip_vision_model", projection_dim=HIDDEN, **_vision()),
                      text_config=text, image_token_index=tok.convert_tokens_to_ids("<image>"),
                      vision_feature_select_strategy="default", vision_feature_layer=-2)
    torch.manual_seed(3)
    proc = LlavaProcessor(image_processor=_clip_image_processor(), tokenizer=tok, patch_size=8,
                          vision_feature_select_strategy="default", num_additional_image_tokens=1,
                          chat_template=LLAVA_TEMPLATE)
    return _save(LlavaForConditionalGeneration(cfg).eval(), proc, out)


def _t5_tok() -> PreTrainedTokenizerFast:
    return _fast(_unigram(["<pad>", "</s>", "<unk>"], "</s>"), eos_token="</s>", pad_token="<pad>",
                 unk_token="<unk>")


def _lm_config(kind: str, tok) -> dict:
    common = dict(vocab_size=len(tok), pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id)
    if kind == "opt":
        return dict(model_type="opt", hidden_size=HIDDEN, ffn_dim=64, num_hidden_layers=2, num_attention_heads=4,
                    word_embed_proj_dim=HIDDEN, max_position_embeddings=512, bos_token_id=tok.bos_token_id, **common)
    if kind == "bloom":
        return dict(model_type="bloom", hidden_size=HIDDEN, n_layer=2, n_head=4, bos_token_id=tok.bos_token_id,
                    **common)
    common["vocab_size"] += 8           # padded vocabulary, as mT0 / BLOOMZ ship it
    return dict(model_type="t5", d_model=HIDDEN, d_kv=8, d_ff=64, num_layers=2, num_decoder_layers=2, num_heads=4,
                decoder_start_token_id=tok.pad_token_id, relative_attention_num_buckets=8, **common)


def _blip_processor(tok, instruct: bool):
    from transformers import BlipImageProcessor, Blip2Processor, InstructBlipProcessor
    ip = BlipImageProcessor(size={"height": IMAGE, "width": IMAGE})
    if instruct:
        qtok = _fast(_wordpiece(), unk_token="[UNK]", pad_token="[PAD]", cls_token="[CLS]", sep_token="[SEP]")
        return InstructBlipProcessor(image_processor=ip, tokenizer=tok, qformer_tokenizer=qtok, num_query_tokens=4)
    return Blip2Processor(image_processor=ip, tokenizer=tok, num_query_tokens=4)


def _build_blip(out: Path, lm: str, instruct: bool, seed: int) -> Path:
    from transformers import (Blip2Config, Blip2ForConditionalGeneration, InstructBlipConfig,
                              InstructBlipForConditionalGeneration)
    if lm == "t5":
        tok = _t5_tok()
    else:
        tok = _fast(_bpe(["<pad>", "</s>", "<unk>", "<s>"], "<s>", "</s>"), bos_token="<s>", eos_token="</s>",
                    unk_token="<unk>", pad_token="<pad>")
    proc = _blip_processor(tok, instruct)        # adds the <image> token to `tok`
    image_id = tok.convert_tokens_to_ids("<image>")
    qformer = dict(hidden_size=HIDDEN, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
                   encoder_hidden_size=HIDDEN, cross_attention_frequency=1, max_position_embeddings=512,
                   vocab_size=len(proc.qformer_tokenizer) if instruct else 30)
    cls, mcls = (InstructBlipConfig, InstructBlipForConditionalGeneration) if instruct else \
        (Blip2Config, Blip2ForConditionalGeneration)
    cfg = cls(vision_config=_vision(), qformer_config=qformer, text_config=_lm_config(lm, tok), num_query_tokens=4,
              image_token_index=image_id)
    torch.manual_seed(seed)
    return _save(mcls(cfg).eval(), proc, out)


def build_blip2_opt(out: Path) -> Path:
    return _build_blip(out, "opt", False, 4)


def build_blip2_bloom(out: Path) -> Path:
    return _build_blip(out, "bloom", False, 5)


def build_blip2_t5(out: Path) -> Path:
    return _build_blip(out, "t5", False, 6)


def build_mblip_legacy(out: Path) -> Path:
    """mBLIP's published layout (BLIP-2 + mT0): no image token in config.json, processor_config.json or tokenizer,
    and an LM vocabulary padded beyond the tokenizer's (so the added <image> id is an unused row)."""
    _build_blip(out, "t5", False, 9)
    cfg = json.loads((out / "config.json").read_text())
    cfg.pop("image_token_index", None)
    cfg.pop("image_token_id", None)
    (out / "config.json").write_text(json.dumps(cfg))
    proc = json.loads((out / "processor_config.json").read_text())
    proc.pop("num_query_tokens", None)
    (out / "processor_config.json").write_text(json.dumps(proc))
    _t5_tok().save_pretrained(out)          # the tokenizer as released, without <image>
    return out


def build_instructblip_t5(out: Path) -> Path:
    return _build_blip(out, "t5", True, 7)


TINY = {
    "clip": ("clip", build_clip),
    "siglip": ("clip", build_siglip),
    "siglip2": ("clip", build_siglip2),
    "mclip": ("mclip", build_mclip),
    "llava": ("mllm", build_llava),
    "blip2-opt": ("mllm", build_blip2_opt),
    "blip2-bloom": ("mllm", build_blip2_bloom),
    "blip2-t5": ("mllm", build_blip2_t5),
    "instructblip-t5": ("mllm", build_instructblip_t5),
    "mblip-legacy": ("mllm", build_mblip_legacy),
}
EXTRA = {"mclip": {"image_model": "{root}/clip-image"}}


def build(name: str, root: Path) -> Path:
    """Build (once per root) the tiny model `name` under root/name and return its folder."""
    out = Path(root) / name
    if not (out / "config.json").exists():
        TINY[name][1](out)
    return out


def spec_extra(name: str, path: Path) -> dict:
    return {k: v.replace("{root}", str(path)) for k, v in EXTRA.get(name, {}).items()}
