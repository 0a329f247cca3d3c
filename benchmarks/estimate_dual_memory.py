"""Estimated GPU memory of dual-encoder fine-tuning (`volta-ml train --hf_model`), per process, on the CPU.

    python benchmarks/estimate_dual_memory.py [--batch 64] [--amp bf16|none]

For each example config (CLIP ViT-B/32, SigLIP base-patch16-224, M-CLIP XLM-R-Large + CLIP ViT-L/14):
- parameters counted on the meta device at full size (nothing allocated); weights, gradients and AdamW's two
  moments are float32 (the engine keeps fp32 weights; bf16 is autocast): 4 + 4 + 8 bytes per trainable
  parameter, 4 per frozen one (M-CLIP's image tower: frozen, run without a graph);
- activations: the tensors autograd saves for the backward pass (counted once per storage through
  `torch.autograd.graph.saved_tensors_hooks`, the parameters themselves excluded), measured in the real
  training module (`DualEncoderForTraining` / `MClipForTraining`) at real widths and sequence lengths with
  1 and 2 layers per tower and batches of 2 and 4, then extrapolated with bytes = a + b L + (c + d L) B fitted
  to those four points (the batch-independent part is bf16 autocast's copies of the weights); the vocabulary is
  shrunk to 1000 for the measurement (it changes no activation shape).
Not counted: the CUDA context and allocator slack (~0.5-1 GiB), transient buffers of the backward pass, the
DataLoader. The GPU check (`benchmarks/gpu_check.py --only hf_train`) measures a full-size CLIP step.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

GIB = 2 ** 30
TEXT_TOKENS = 32          # a Flickr30k caption padded to the longest of a batch (CLIP, XLM-R tokenizers)


def _clip(layers, vocab, *, large=False):
    from transformers import CLIPConfig
    text = dict(num_hidden_layers=layers["text"], vocab_size=vocab)
    vision = dict(num_hidden_layers=layers["vision"])
    if large:   # ViT-L/14 (M-CLIP XLM-R-Large-Vit-L-14's image tower)
        text.update(hidden_size=768, intermediate_size=3072, num_attention_heads=12)
        vision.update(hidden_size=1024, intermediate_size=4096, num_attention_heads=16, patch_size=14)
    return CLIPConfig(text_config=text, vision_config=vision, projection_dim=768 if large else 512)


def clip_b32(layers, vocab):
    from transformers import CLIPModel
    from volta_ml.iglue_hf.contrastive import DualEncoderForTraining
    config = _clip(layers, vocab or 49408)
    return lambda: DualEncoderForTraining(CLIPModel(config), "infonce"), config.vision_config.image_size, TEXT_TOKENS


def siglip_base(layers, vocab):
    from transformers import SiglipConfig, SiglipModel
    from volta_ml.iglue_hf.contrastive import DualEncoderForTraining
    config = SiglipConfig(text_config=dict(num_hidden_layers=layers["text"], vocab_size=vocab or 32000),
                          vision_config=dict(num_hidden_layers=layers["vision"]))
    # SigLIP's texts are padded to max_length (64), as it was trained
    return lambda: DualEncoderForTraining(SiglipModel(config), "sigmoid"), 224, 64


def mclip_l14(layers, vocab):
    from transformers import CLIPModel, XLMRobertaConfig, XLMRobertaModel
    from volta_ml.iglue_hf.mclip_train import MClipForTraining
    text = XLMRobertaConfig(hidden_size=1024, intermediate_size=4096, num_attention_heads=16,
                            num_hidden_layers=layers["text"], vocab_size=vocab or 250002, max_position_embeddings=514)
    # CLIPModel's own text tower is never run: full size when counting parameters, 1 layer when measuring
    image = _clip({"text": 12 if vocab is None else 1, "vision": layers["vision"]}, vocab or 49408, large=True)
    return (lambda: MClipForTraining(XLMRobertaModel(text), torch.nn.Linear(1024, 768), CLIPModel(image), 0.01),
            224, TEXT_TOKENS)


# name: (builder, (text layers, vision layers) at full size, what is trained)
CONFIGS = {
    "CLIP ViT-B/32 (openai/clip-vit-base-patch32)": (clip_b32, (12, 12), "both towers"),
    "SigLIP base (google/siglip-base-patch16-224)": (siglip_base, (12, 12), "both towers"),
    "M-CLIP XLM-R-Large-ViT-L-14": (mclip_l14, (24, 24), "text tower (image tower frozen)"),
}


def parameters(builder, depth) -> tuple[int, int]:
    """(all, trainable) parameters at full size, built on the meta device."""
    with torch.device("meta"):
        make, _, _ = builder({"text": depth[0], "vision": depth[1]}, None)
        model = make()
    return (sum(p.numel() for p in model.parameters()),
            sum(p.numel() for p in model.parameters() if p.requires_grad))


def saved_bytes(builder, layers, batches, amp) -> list[int]:
    """Bytes autograd keeps for backward in one training forward (+ loss), parameters excluded, per batch size."""
    make, image_size, tokens = builder({"text": layers, "vision": layers}, 1000)
    torch.manual_seed(0)
    model = make().train()
    return [_saved(model, image_size, tokens, batch, amp) for batch in batches]


def _saved(model, image_size, tokens, batch, amp) -> int:
    from volta_ml.iglue_hf.contrastive import infonce_loss, sigmoid_loss
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    seen = {}

    def pack(tensor):
        storage = tensor.untyped_storage()
        if storage.data_ptr() not in params:
            seen[storage.data_ptr()] = storage.nbytes()
        return tensor

    ids = torch.randint(5, 900, (batch, tokens))
    text_inputs = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
    image_inputs = {"pixel_values": torch.randn(batch, 3, image_size, image_size)}
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), \
            torch.autocast("cpu", dtype=torch.bfloat16, enabled=amp == "bf16"):
        text, image, scale, bias = model(text_inputs, image_inputs)
        with torch.autocast("cpu", enabled=False):
            loss = (infonce_loss(text, image, text, image, scale) if bias is None
                    else sigmoid_loss(text, image, scale, bias))
    loss.backward()
    model.zero_grad(set_to_none=True)
    return sum(seen.values())


def estimate(name, batch, amp) -> dict:
    builder, depth, trained = CONFIGS[name]
    total, trainable = parameters(builder, depth)
    (l1b2, l1b4), (l2b2, l2b4) = saved_bytes(builder, 1, (2, 4), amp), saved_bytes(builder, 2, (2, 4), amp)
    d = ((l2b4 - l2b2) - (l1b4 - l1b2)) / 2       # per layer (one text AND one vision layer) per example
    c = (l1b4 - l1b2) / 2 - d                     # per example, outside the layers
    b = (l2b2 - l1b2) - 2 * d                     # per layer, batch-independent (autocast's weight copies)
    a = l1b2 - b - 2 * c - 2 * d
    layers = max(depth)                           # both towers have the same depth in these configs
    activations = a + b * layers + (c + d * layers) * batch
    states = trainable * 16 + (total - trainable) * 4
    return {"model": name, "trained": trained, "params_m": total / 1e6, "trainable_m": trainable / 1e6,
            "batch": batch, "states_gib": states / GIB, "activations_gib": activations / GIB,
            "total_gib": (states + activations) / GIB}


def main(argv=None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch", type=int, default=64, help="per-process batch (the task config's 64)")
    parser.add_argument("--amp", choices=["bf16", "none"], default="bf16")
    parser.add_argument("--only", nargs="+", choices=list(CONFIGS), default=list(CONFIGS))
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    rows = [estimate(name, args.batch, args.amp) for name in args.only]
    print(f"| model | trained | parameters (trainable) | batch per GPU | weights + grads + AdamW | activations "
          f"({args.amp}) | total |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['model']} | {r['trained']} | {r['params_m']:.0f}M ({r['trainable_m']:.0f}M) | {r['batch']} | "
              f"{r['states_gib']:.1f} GiB | {r['activations_gib']:.1f} GiB | {r['total_gib']:.1f} GiB |")
    return rows


if __name__ == "__main__":
    main()
