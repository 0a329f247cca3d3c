"""LoRA on the language model of a generative image-text model, with `peft`. Which families can be fine-tuned, the
modules LoRA adapts by default and the multimodal projector `--train_projector` unfreezes are columns of the one
family table, `volta_ml/hf/families.py` (rows with a `projector`).

- LoRA goes on the linear layers named by `--lora_target` (default: the family's attention projections) INSIDE
  the language model only (`model.get_decoder()`): vision towers that also have `q_proj`/`v_proj` (SigLIP, CLIP)
  stay untouched. Every name must match at least one linear layer there (one-line error otherwise).
- Everything else is frozen (peft freezes the base model), except the parts `--train_parts` / `--train_projector`
  add (`finetune.py`): the vision tower, the projector, trained in full and saved with the adapter (peft's
  `modules_to_save`).
- `--hf_adapter DIR` starts from a saved adapter instead (its own r / alpha / targets / projector), trainable, after
  the checks of every adapter (`hf/loading.attach_adapter`: every tensor loads, the recorded base model is this one
  unless `--allow_adapter_base_mismatch`).
"""
from __future__ import annotations

from torch import nn

from volta_ml.engine.failures import UsageError
from volta_ml.hf.families import FAMILIES, Family, fine_tuned

from .finetune import part_of_names


def trainable(model_type: str | None) -> bool:
    """Whether `model_type` is a generative family volta-ml fine-tunes (BLIP-2 / InstructBLIP, whose query tokens
    are prepended and whose T5 LMs are encoder-decoders, are not)."""
    return model_type in fine_tuned()


def family(model_type: str | None, model: str) -> Family:
    if not trainable(model_type):
        raise UsageError(f"{model}: model_type {model_type!r} is not a generative family volta-ml can fine-tune "
                         f"(known: {', '.join(fine_tuned())})")
    return FAMILIES[model_type]


def _qualified_name(model: nn.Module, module: nn.Module) -> str:
    return next(name for name, m in model.named_modules() if m is module)


def lora_targets(model: nn.Module, names: list[str], what: str) -> list[str]:
    """The qualified names of the language model's linear layers whose own name is one of `names`."""
    lm = model.get_decoder()
    prefix = _qualified_name(model, lm)
    linear = {name: name.rsplit(".", 1)[-1] for name, m in lm.named_modules() if isinstance(m, nn.Linear)}
    for wanted in names:
        if wanted not in linear.values():
            raise UsageError(f"--lora_target {wanted}: no linear layer of that name in the language model of {what} "
                             f"(its linear layers: {', '.join(sorted(set(linear.values())))})")
    return [f"{prefix}.{name}" for name, leaf in linear.items() if leaf in names]


def add_lora(model: nn.Module, fam: Family, args, spec, parts: frozenset[str] = frozenset({"language"}),
             modules: dict[str, str] | None = None):
    """The `PeftModel` around `model` (loaded from the `ModelSpec` `spec`, modified in place): a new LoRA from the
    flags, or `--hf_adapter`'s (checked as every adapter is: `hf.loading.attach_adapter`). The adapter's config
    records `spec` as its base (model and revision). `parts` (`finetune.plan`): the parts trained besides the
    adapters ("vision", "projector": in full, peft's `modules_to_save`); `modules`: their qualified names
    (`finetune.part_modules`)."""
    import dataclasses

    from peft import LoraConfig, get_peft_model

    from volta_ml.hf.loading import ModelLoadError, attach_adapter
    what = spec.model
    if getattr(args, "allow_adapter_base_mismatch", False) and not args.hf_adapter:
        raise UsageError("--allow_adapter_base_mismatch: no --hf_adapter to start from")
    if args.hf_adapter:
        try:
            return attach_adapter(model, dataclasses.replace(
                spec, adapter=args.hf_adapter,
                allow_adapter_base_mismatch=bool(getattr(args, "allow_adapter_base_mismatch", False))), trainable=True)
        except ModelLoadError as error:
            raise UsageError(f"--hf_adapter: {error}") from None
    names = [n.strip() for n in (args.lora_target or ",".join(fam.lora_targets)).split(",") if n.strip()]
    if args.lora_r < 1:
        raise UsageError(f"--lora_r {args.lora_r}: the rank must be at least 1")
    saved = [modules[part] for part in ("vision", "projector") if part in parts]
    # a projector inside the vision tower (Qwen's visual.merger) is saved with it
    saved = [name for name in saved if not any(name.startswith(other + ".") for other in saved)]
    config = LoraConfig(r=args.lora_r, lora_alpha=args.lora_alpha, lora_dropout=args.lora_dropout,
                        target_modules=lora_targets(model, names, what), bias="none",
                        modules_to_save=saved or None)
    peft_model = get_peft_model(model, config, revision=spec.revision)
    if "vision" in parts and "projector" not in parts:   # the projector's copy inside the saved tower stays frozen
        named = list(peft_model.named_parameters())
        part = part_of_names([name for name, _ in named], modules)
        for name, param in named:
            if part[name] == "projector":
                param.requires_grad_(False)
    return peft_model
