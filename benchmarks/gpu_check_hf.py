"""gpu_check.py's CVQA check of the Hugging Face backend families at real architecture size, random weights.

Each entry of `BACKENDS` builds the paper model's architecture from transformers config classes (no download):
the model is constructed on the meta device, materialised with `to_empty(device)` and initialised by
`init_weights()` (which, in transformers 5, also rebuilds position ids and rotary frequencies), then the scoring
call of its backend kind is timed on a batch of synthetic questions:
  dual encoder (CLIP, SigLIP, M-CLIP)  one image + the 4 option texts embedded per question, cosine scores
  letter rule (LLaVA, InstructBLIP, mBLIP)  one forward per question (image tokens + prompt), next-token logits
  open-ended (LLaVA)  the prompt once with its KV cache, then 4 continuations of 8 tokens on the repeated cache
Weights do not change the speed. `--quick` builds the same families at width 32 (CPU, seconds).
"""
from __future__ import annotations

import time

import torch

TEXT_TOKENS, CONT_TOKENS = 64, 8  # prompt text after the image tokens; one answer continuation


def _tiny_vision(**kw):
    return dict(hidden_size=32, intermediate_size=64, num_attention_heads=2, num_hidden_layers=2, image_size=32,
                patch_size=8, **kw)


def _llama(quick):
    from transformers import LlamaConfig
    if quick:
        return LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                           num_key_value_heads=2, vocab_size=1000)
    return LlamaConfig(hidden_size=4096, intermediate_size=11008, num_hidden_layers=32, num_attention_heads=32,
                       num_key_value_heads=32, vocab_size=32064, max_position_embeddings=4096)


def _t5(quick, vocab):  # Flan-T5-XL (InstructBLIP) / mT0-XL (mBLIP): the same shape, different vocabularies
    from transformers import MT5Config, T5Config
    cls = T5Config if vocab == 32128 else MT5Config
    if quick:
        return cls(d_model=32, d_ff=64, num_layers=2, num_decoder_layers=2, num_heads=2, d_kv=16, vocab_size=1000,
                   feed_forward_proj="gated-gelu", tie_word_embeddings=False)
    return cls(d_model=2048, d_ff=5120, num_layers=24, num_decoder_layers=24, num_heads=32, d_kv=64, vocab_size=vocab,
               feed_forward_proj="gated-gelu", tie_word_embeddings=False)


def clip_b32(quick):
    from transformers import CLIPConfig, CLIPModel
    if quick:
        return CLIPModel, CLIPConfig(text_config=dict(hidden_size=32, intermediate_size=64, num_attention_heads=2,
                                                      num_hidden_layers=2, vocab_size=1000),
                                     vision_config=_tiny_vision(), projection_dim=32)
    return CLIPModel, CLIPConfig()  # the defaults are openai/clip-vit-base-patch32's sizes


def clip_l14_336(quick):
    from transformers import CLIPConfig, CLIPModel
    if quick:
        return clip_b32(quick)
    return CLIPModel, CLIPConfig(
        text_config=dict(hidden_size=768, intermediate_size=3072, num_attention_heads=12, num_hidden_layers=12),
        vision_config=dict(hidden_size=1024, intermediate_size=4096, num_attention_heads=16, num_hidden_layers=24,
                           image_size=336, patch_size=14), projection_dim=768)


def siglip_base(quick):
    from transformers import SiglipConfig, SiglipModel
    if quick:
        return SiglipModel, SiglipConfig(text_config=dict(hidden_size=32, intermediate_size=64, num_attention_heads=2,
                                                          num_hidden_layers=2, vocab_size=1000),
                                         vision_config=_tiny_vision())
    return SiglipModel, SiglipConfig()  # google/siglip-base-patch16-224's sizes


class MClip(torch.nn.Module):
    """M-CLIP XLM-R-Large-ViT-B/32: XLM-R text tower, mean pooling, a linear map into CLIP ViT-B/32's image space."""

    def __init__(self, text_config, vision_config):
        super().__init__()
        from transformers import CLIPVisionModelWithProjection, XLMRobertaModel
        self.text = XLMRobertaModel(text_config, add_pooling_layer=False)
        self.proj = torch.nn.Linear(text_config.hidden_size, vision_config.projection_dim)
        self.vision = CLIPVisionModelWithProjection(vision_config)

    def init_weights(self):
        self.text.init_weights()
        self.vision.init_weights()
        torch.nn.init.normal_(self.proj.weight, std=0.02)
        torch.nn.init.zeros_(self.proj.bias)

    def forward(self, input_ids, attention_mask, pixel_values):
        hidden = self.text(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
        mask = attention_mask.unsqueeze(-1).to(hidden.dtype)
        text = self.proj((hidden * mask).sum(1) / mask.sum(1))
        image = self.vision(pixel_values=pixel_values).image_embeds
        return torch.nn.functional.normalize(image, dim=-1) @ torch.nn.functional.normalize(text, dim=-1).T


def mclip(quick):
    from transformers import CLIPVisionConfig, XLMRobertaConfig
    if quick:
        text = XLMRobertaConfig(hidden_size=32, intermediate_size=64, num_attention_heads=2, num_hidden_layers=2,
                                vocab_size=1000)
        return MClip, (text, CLIPVisionConfig(**_tiny_vision(), projection_dim=32))
    text = XLMRobertaConfig(hidden_size=1024, intermediate_size=4096, num_attention_heads=16, num_hidden_layers=24,
                            vocab_size=250002, max_position_embeddings=514)
    return MClip, (text, CLIPVisionConfig(projection_dim=512))


def llava_7b(quick):
    from transformers import CLIPVisionConfig, LlavaConfig, LlavaForConditionalGeneration
    vision = CLIPVisionConfig(**_tiny_vision()) if quick else CLIPVisionConfig(
        hidden_size=1024, intermediate_size=4096, num_attention_heads=16, num_hidden_layers=24, image_size=336,
        patch_size=14, projection_dim=768)
    text = _llama(quick)
    return LlavaForConditionalGeneration, LlavaConfig(vision_config=vision, text_config=text,
                                                      image_token_index=text.vocab_size - 64 if not quick else 999,
                                                      vision_feature_layer=-2, projector_hidden_act="gelu")


def _blip(cls_name, config_name, text, quick):
    import transformers
    extra = dict(vision_config=_tiny_vision(), num_query_tokens=4,
                 qformer_config=dict(hidden_size=32, intermediate_size=64, num_attention_heads=2, num_hidden_layers=2,
                                     encoder_hidden_size=32, vocab_size=1000)) if quick else {}
    config = getattr(transformers, config_name)(text_config=text.to_dict(), image_token_index=text.vocab_size - 1,
                                                **extra)
    return getattr(transformers, cls_name), config


def instructblip_flan_t5_xl(quick):
    return _blip("InstructBlipForConditionalGeneration", "InstructBlipConfig", _t5(quick, 32128), quick)


def mblip_mt0_xl(quick):
    return _blip("Blip2ForConditionalGeneration", "Blip2Config", _t5(quick, 250112), quick)


def mblip_bloomz_7b(quick):
    from transformers import BloomConfig
    text = BloomConfig(hidden_size=32, n_layer=2, n_head=2, vocab_size=1000) if quick else \
        BloomConfig(hidden_size=4096, n_layer=30, n_head=32, vocab_size=250880)
    return _blip("Blip2ForConditionalGeneration", "Blip2Config", text, quick)


# name: (builder, scoring kind, questions per timed batch on the GPU)
BACKENDS = {
    "clip-vit-b32": (clip_b32, "dual", 256),
    "clip-vit-l14-336": (clip_l14_336, "dual", 256),
    "siglip-base-p16-224": (siglip_base, "dual", 256),
    "m-clip-xlmr-large-vit-b32": (mclip, "mclip", 256),
    "llava-1.5-7b letter": (llava_7b, "letter", 16),
    "llava-1.5-7b open-ended": (llava_7b, "open", 8),
    "instructblip-flan-t5-xl letter": (instructblip_flan_t5_xl, "letter", 32),
    "mblip-mt0-xl letter": (mblip_mt0_xl, "letter", 32),
    "mblip-bloomz-7b letter": (mblip_bloomz_7b, "letter", 16),
}


def materialise(model_cls, config, device, dtype):
    """Real-size model without a download: meta-device construction, to_empty on `device`, init_weights()."""
    with torch.device("meta"):
        model = model_cls(*config) if isinstance(config, tuple) else model_cls(config)
    model = model.to(dtype).to_empty(device=device)
    tensors = dict(model.named_parameters())
    tensors.update(model.named_buffers())
    with torch.no_grad():
        for tensor in tensors.values():  # NaN marks what init_weights leaves untouched
            if tensor.is_floating_point():
                tensor.fill_(float("nan"))
        model.init_weights()
        for name, tensor in tensors.items():
            if name.endswith("position_ids"):  # index buffers must be ranges, never garbage
                tensor.copy_(torch.arange(tensor.shape[-1], device=device).expand_as(tensor))
            elif tensor.is_floating_point() and torch.isnan(tensor).any():  # e.g. CLIP's logit_scale
                tensor.normal_(0.0, 0.02) if tensor.dim() >= 2 else tensor.zero_()
    return model.eval()


def _image_size(config):
    vision = config[1] if isinstance(config, tuple) else config.vision_config
    return vision.image_size


def _inputs(model, config, kind, batch, device):
    """Synthetic inputs of one timed call: ids in range, image tokens where the processor would put them."""
    size = _image_size(config)
    pixels = torch.randn(batch, 3, size, size, device=device, dtype=next(model.parameters()).dtype)
    if kind in ("dual", "mclip"):
        vocab = (config[0] if isinstance(config, tuple) else config.text_config).vocab_size
        ids = torch.randint(5, vocab - 5, (4 * batch, 32), device=device)
        return dict(input_ids=ids, attention_mask=torch.ones_like(ids), pixel_values=pixels)
    text = config.text_config
    if hasattr(config, "num_query_tokens"):  # BLIP-2 family: the Q-Former's query outputs replace image tokens
        n_image = config.num_query_tokens
    else:  # LLaVA: one token per patch, CLS dropped ("default" feature selection)
        n_image = (config.vision_config.image_size // config.vision_config.patch_size) ** 2
    image_token = config.image_token_index
    ids = torch.randint(5, image_token - 1, (batch, n_image + TEXT_TOKENS), device=device)
    ids[:, 1:1 + n_image] = image_token
    out = dict(input_ids=ids, attention_mask=torch.ones_like(ids), pixel_values=pixels)
    if hasattr(config, "qformer_config") and "InstructBlip" in type(model).__name__:
        q = torch.randint(5, config.qformer_config.vocab_size - 5, (batch, 24), device=device)
        out.update(qformer_input_ids=q, qformer_attention_mask=torch.ones_like(q))
    if getattr(text, "is_encoder_decoder", False):
        out["decoder_input_ids"] = torch.zeros(batch, 1, dtype=torch.long, device=device)
    return out


@torch.no_grad()
def score_call(model, config, kind, inputs):
    """One scoring call of the backend kind: what CVQA runs per batch of questions."""
    if kind == "open":
        prompt = model(**inputs, use_cache=True, logits_to_keep=1)
        cache = prompt.cache
        cache.batch_repeat_interleave(4)
        rows = inputs["input_ids"].shape[0] * 4
        conts = torch.randint(5, config.image_token_index - 1, (rows, CONT_TOKENS), device=inputs["input_ids"].device)
        mask = torch.ones(rows, inputs["input_ids"].shape[1] + CONT_TOKENS, dtype=torch.long, device=conts.device)
        logits = model(input_ids=conts, attention_mask=mask, cache=cache).logits
        return torch.log_softmax(logits.float(), -1).gather(-1, conts[..., None]).sum((1, 2))
    if kind == "letter" and not getattr(config.text_config, "is_encoder_decoder", False):
        return model(**inputs, logits_to_keep=1).logits[:, -1]
    out = model(**inputs)
    if isinstance(out, torch.Tensor):  # M-CLIP: the cosine matrix itself
        return out
    return out.logits_per_image if getattr(out, "logits_per_image", None) is not None else out.logits


def check_cvqa_hf(ctx) -> None:
    device = torch.device(ctx.device)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    for name, (builder, kind, batch) in BACKENDS.items():
        if ctx.skip_if_late(name, 2 if ctx.quick else 25):
            continue
        batch = 2 if ctx.quick else batch
        start = time.perf_counter()
        model_cls, config = builder(ctx.quick)
        model = materialise(model_cls, config, device, dtype)
        build_s = time.perf_counter() - start
        inputs = _inputs(model, config, kind, batch, device)
        reps = 1 if ctx.quick else 3
        scores = score_call(model, config, kind, inputs)  # warm-up
        _sync(device)
        start = time.perf_counter()
        for _ in range(reps):
            scores = score_call(model, config, kind, inputs)
        _sync(device)
        seconds = (time.perf_counter() - start) / reps
        ctx.row(item=name, kind=kind, dtype=str(dtype).replace("torch.", ""), batch=batch,
                questions_per_s=batch / seconds, params_b=sum(p.numel() for p in model.parameters()) / 1e9,
                build_s=build_s, finite=bool(torch.isfinite(scores.float()).all()),
                peak_gib=torch.cuda.max_memory_allocated() / 2**30 if device.type == "cuda" else None)
        del model, inputs, scores
        if device.type == "cuda":
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()


def _sync(device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


# --- fine-tuning steps (volta-ml train --hf_model: iglue_hf/train.py, train_generative.py) ------------------------
ANSWER_TOKENS = 2        # a letter + end of turn: the loss is on the last tokens only, as the LoRA job's
TRAIN_JOBS = {           # name: (builder, job kind, examples per step on the GPU, gradient checkpointing)
    "llava-1.5-7b LoRA r8 q_proj,v_proj, gradient checkpointing": (llava_7b, "lora", 8, True),
    "clip-vit-b32 contrastive": (clip_b32, "contrastive", 64, False),
    "clip-vit-b32 contrastive, gradient checkpointing": (clip_b32, "contrastive", 64, True),
}


def _train_step(model, kind, inputs, optimizer, device):
    """Forward, the job's loss, backward, AdamW step, under bf16 autocast on CUDA."""
    import torch.nn.functional as F
    with torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda"):
        if kind == "lora":    # the answer tokens' cross-entropy, logits kept for them only
            ids = inputs["input_ids"]
            logits = model(**inputs, logits_to_keep=ANSWER_TOKENS + 1).logits[:, :-1].float()
            loss = F.cross_entropy(logits.flatten(0, 1), ids[:, -ANSWER_TOKENS:].flatten())
        else:
            from volta_ml.iglue_hf.contrastive import pair_loss
            n = inputs["pixel_values"].shape[0]
            text, image, scale, bias = model({"input_ids": inputs["input_ids"][:n],
                                              "attention_mask": inputs["attention_mask"][:n]},
                                             {"pixel_values": inputs["pixel_values"].float()})
            loss = pair_loss("infonce", text, image, text, image, scale, bias)
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return loss.detach()


def check_hf_train(ctx) -> None:
    """One optimizer step of each HF fine-tuning job at real size, random weights: LoRA on LLaVA-1.5-7B (bf16
    weights frozen, fp32 LoRA tensors, gradient checkpointing, the answer-token loss) and CLIP ViT-B/32's
    contrastive step (fp32 weights, bf16 autocast, with and without gradient checkpointing); samples/s and peak
    GPU memory (what docs/hf_models.md's memory tables estimate). Full size on a GPU only; --quick runs it tiny
    anywhere."""
    from volta_ml.iglue_hf.contrastive import checkpoint_activations
    device = torch.device(ctx.device)
    for name, (builder, kind, batch, checkpointing) in TRAIN_JOBS.items():
        if not ctx.quick and device.type != "cuda":
            ctx.row(item=name, status="skipped", reason="full size runs on a GPU only (--quick: tiny on any device)")
            continue
        if ctx.skip_if_late(name, 2 if ctx.quick else 40):
            continue
        batch = 2 if ctx.quick else batch
        model_cls, config = builder(ctx.quick)
        dtype = torch.bfloat16 if device.type == "cuda" and kind == "lora" else torch.float32
        model = materialise(model_cls, config, device, dtype)
        if checkpointing:
            checkpoint_activations(model)
        if kind == "lora":
            from peft import LoraConfig, get_peft_model
            from volta_ml.iglue_hf.lora import lora_targets
            targets = lora_targets(model, ["q_proj", "v_proj"], name)
            model = get_peft_model(model, LoraConfig(r=8, lora_alpha=16, lora_dropout=0.05, target_modules=targets))
            inputs = _inputs(model, config, "letter", batch, device)
        else:
            from volta_ml.iglue_hf.contrastive import DualEncoderForTraining
            inputs = _inputs(model, config, "dual", batch, device)
            model = DualEncoderForTraining(model, "infonce")
        model.train()
        trainable = [p for p in model.parameters() if p.requires_grad]
        optimizer = torch.optim.AdamW(trainable, lr=1e-4)
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats()
        loss = _train_step(model, kind, inputs, optimizer, device)     # warm-up (optimizer state)
        _sync(device)
        reps = 1 if ctx.quick else 3
        start = time.perf_counter()
        for _ in range(reps):
            loss = _train_step(model, kind, inputs, optimizer, device)
        _sync(device)
        seconds = (time.perf_counter() - start) / reps
        ctx.row(item=name, kind=kind, weights=str(dtype).replace("torch.", ""), batch=batch,
                samples_per_s=batch / seconds, step_s=seconds,
                params_b=sum(p.numel() for p in model.parameters()) / 1e9,
                trainable_m=sum(p.numel() for p in trainable) / 1e6, finite=bool(torch.isfinite(loss).all()),
                peak_gib=torch.cuda.max_memory_allocated() / 2**30 if device.type == "cuda" else None)
        del model, inputs, optimizer, trainable
        if device.type == "cuda":
            torch.cuda.empty_cache()


# --- one sharded step (volta-ml train --hf_model ... --sharding fsdp: engine/sharding.py) ---------------------------
FSDP_JOBS = {            # name: (fine-tuning, --fsdp_offload)
    "qwen2.5-vl-7b widths, 8 layers, LoRA r16, fsdp bf16": ("lora", False),
    "qwen2.5-vl-7b widths, 8 layers, full, fsdp bf16": ("full", False),
    "qwen2.5-vl-7b widths, 8 layers, full, fsdp bf16 + CPU offload": ("full", True),
}


def check_hf_fsdp(ctx) -> None:
    """One training step through the engine's FSDP2 path on the device, as `--sharding fsdp --amp bf16 --hf_dtype bf16
    --gradient_checkpointing` runs it: Qwen2.5-VL-7B's widths (hidden 3584, its 152k vocabulary, the 32-block vision
    tower's block shape) at 8 decoder layers and 4 vision blocks, random weights, bf16 (`FullySharded.place`: one unit
    per block, trained tensors cast to fp32 unit by unit, bf16 parameters / fp32 reduction), volta-ml's AdamW,
    an image + text batch; then the sharded resume state written and read back (`save_sharded_state` /
    `load_sharded_state`, torch.distributed.checkpoint). One process (a group of one: the collectives run, NCCL on a
    GPU). Rows: step seconds, peak GPU memory, bytes held for parameters + gradients + optimizer state, whether the
    state read back equals the state written. --quick: widths / 28, 2 layers, on any device."""
    import tempfile
    from pathlib import Path
    from types import SimpleNamespace

    import torch.nn.functional as F
    from bench_fsdp_memory import Step, held_bytes, qwen25_vl_config, synthetic_batch, trainable_setup
    from transformers import Qwen2_5_VLForConditionalGeneration
    from volta_ml.engine import checkpointing as ckpt
    from volta_ml.engine import sharding
    from volta_ml.engine.distributed import DistInfo
    from volta_ml.engine.optim import build_optimizer
    from volta_ml.engine.train_support import Precision
    from volta_ml.iglue_hf.contrastive import checkpoint_activations
    from volta_ml.iglue_hf.finetune import shard_units
    device = torch.device(ctx.device)
    info = DistInfo(device=device)
    for name, (mode, offload) in FSDP_JOBS.items():
        if ctx.skip_if_late(name, 2 if ctx.quick else 60):
            continue
        config = (qwen25_vl_config("Qwen2.5-VL-7B", 2, 1, divisor=28) if ctx.quick
                  else qwen25_vl_config("Qwen2.5-VL-7B", 8, 4))
        model = materialise(Qwen2_5_VLForConditionalGeneration, config, device, torch.bfloat16)
        checkpoint_activations(model)
        model = Step(trainable_setup(model.train(), mode))
        args = SimpleNamespace(amp="bf16", fsdp_offload=offload, compile=False, sharding="fsdp", optim="AdamW",
                               adam_impl="volta", lr=1e-5, weight_decay=0.01, adam_epsilon=1e-6,
                               adam_betas=[0.9, 0.999], adam_correct_bias=True)
        job = SimpleNamespace(shard_units=shard_units, train_dtype=torch.float32, interleaved=None)
        strategy = sharding.FullySharded(args, job, info)
        try:
            model = strategy.place(model)
            optimizer = build_optimizer(model, args, device)
            batch = {k: v.to(device) for k, v in synthetic_batch(config, batch=2 if ctx.quick else 4,
                                                                text=64 if ctx.quick else 512).items()}
            if device.type == "cuda":
                torch.cuda.reset_peak_memory_stats()
            seconds = []
            for _ in range(1 if ctx.quick else 3):    # the first step creates the optimizer state
                _sync(device)
                start = time.perf_counter()
                with Precision("bf16", device).autocast():
                    logits = model(batch)
                loss = F.cross_entropy(logits[:, :-1].float().flatten(0, 1), batch["input_ids"][:, 1:].flatten())
                loss.backward()
                optimizer.step()
                held = held_bytes(model, optimizer)
                optimizer.zero_grad(set_to_none=True)
                _sync(device)
                seconds.append(time.perf_counter() - start)
            with tempfile.TemporaryDirectory() as tmp:
                latest = Path(tmp) / ckpt.LATEST_NAME
                scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
                sharding.save_sharded_state(latest, model, optimizer, False, info, scheduler=scheduler, scaler=None,
                                            global_step=1, epoch_id=-1, resume_epoch=0, resume_micro_step=1,
                                            best_score=-1.0)
                before = {n: p.detach().to_local().clone() for n, p in model.named_parameters() if p.requires_grad}
                with torch.no_grad():
                    for p in model.parameters():
                        if p.requires_grad:
                            p.zero_()
                sharding.load_sharded_state(latest, ckpt.load_latest(latest), model, optimizer)
                restored = all(torch.equal(before[n], p.detach().to_local()) for n, p in model.named_parameters()
                               if p.requires_grad)
            ctx.row(item=name, mode=mode, offload=offload, units=strategy.units, step_s=min(seconds),
                    samples_per_s=batch["input_ids"].shape[0] / min(seconds),
                    params_b=sum(p.numel() for p in model.parameters()) / 1e9,
                    states_gib=held["total"] / 2**30, finite=bool(torch.isfinite(loss).all()),
                    checkpoint_restored=restored,
                    peak_gib=torch.cuda.max_memory_allocated() / 2**30 if device.type == "cuda" else None)
        finally:
            strategy.close()
        del model, optimizer, batch, logits, loss
        if device.type == "cuda":
            torch.cuda.empty_cache()
