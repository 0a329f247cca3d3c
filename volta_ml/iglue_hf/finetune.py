"""What fine-tuning a Hugging Face model trains, at which learning rates, and how the model is cut into FSDP units.

Generative models (`train_generative.py`) have three parts:
- `vision`: the vision tower (`model.get_encoder("image")`, transformers' own lookup), without the projector when the
  projector sits inside it (Qwen's `visual.merger`);
- `projector`: the multimodal projector (the family table's `projector` column, `hf/families.py`);
- `language`: everything else (the language model, its embeddings and LM head).
`--finetune lora` (the default) trains LoRA adapters on the language model (`lora.py`) plus, in full, the parts
`--train_parts` adds (vision, projector: peft's `modules_to_save`, saved with the adapter); `--finetune full`
trains every weight of the parts in `--train_parts` (default `language,projector`: the vision tower frozen, as
LLaVA-style full fine-tuning does). `--train_projector` (the older flag) adds `projector` to either default.
`--part_lr vision=2e-6,projector=1e-4` gives a part its own learning rate (the others: `--lr`); the optimiser's
groups are then per part, each split by VOLTA's decay / no-decay rule, and share the schedule.

`shard_units(model)`: the modules `--sharding fsdp` makes FSDP units: every block of a `torch.nn.ModuleList` (the
decoder layers, the vision blocks, CLIP's encoder layers, ...), outermost lists only. That is read from the model
itself; a family whose blocks are held otherwise would get a column in the family table.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

from torch import nn

from volta_ml.engine.failures import UsageError
from volta_ml.engine.optim import split_decay

PARTS = ("vision", "projector", "language")
MODES = ("lora", "full")


# --- FSDP units ------------------------------------------------------------------------------------------------
def shard_units(model: nn.Module) -> list[nn.Module]:
    """The blocks of the outermost `ModuleList`s of `model` that hold parameters (decoder layers, vision blocks), in
    module order. The `transformers` models inside are marked FSDP-managed, so their `generate` keeps the ranks in
    step (`synced_gpus`: a rank that has finished decoding runs forwards until every rank has)."""
    from transformers import PreTrainedModel
    units: list[nn.Module] = []

    def visit(module: nn.Module) -> None:
        for child in module.children():
            if isinstance(child, nn.ModuleList):
                units.extend(block for block in child if any(True for _ in block.parameters()))
            else:
                visit(child)
    visit(model)
    for module in model.modules():
        if isinstance(module, PreTrainedModel):
            module._is_fsdp_managed_module = True      # transformers' own marker (generation/utils.py)
    return units


# --- parts ------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Plan:
    mode: str                         # "lora" | "full"
    parts: frozenset[str]             # the parts trained (LoRA mode: "language" through the adapters)
    lrs: dict[str, float]             # part -> its own learning rate (others: --lr)

    def describe(self) -> str:
        trained = [p for p in PARTS if p in self.parts]
        frozen = [p for p in PARTS if p not in self.parts]
        lrs = ", ".join(f"{p} lr {lr:g}" for p, lr in self.lrs.items())
        how = ("LoRA on the language model" + (f", {' and '.join(p for p in trained if p != 'language')} in full"
                                               if len(trained) > 1 else "")
               if self.mode == "lora" else f"full: {', '.join(trained)}")
        return how + (f"; frozen: {', '.join(frozen)}" if frozen else "") + (f"; {lrs}" if lrs else "")


def _names(value: str | None, flag: str) -> list[str]:
    names = [n.strip() for n in (value or "").split(",") if n.strip()]
    unknown = [n for n in names if n not in PARTS]
    if unknown:
        raise UsageError(f"{flag} {value}: unknown part {unknown[0]!r}; parts: {', '.join(PARTS)}")
    return names


def plan(args) -> Plan:
    """The fine-tuning plan of the flags (`--finetune`, `--train_parts`, `--train_projector`, `--part_lr`)."""
    mode = args.finetune
    if mode not in MODES:
        raise UsageError(f"--finetune {mode}: unknown; known: {', '.join(MODES)}")
    if args.train_parts:
        parts = set(_names(args.train_parts, "--train_parts"))
    else:
        parts = {"language"} if mode == "lora" else {"language", "projector"}
    if args.train_projector:
        parts.add("projector")
    if mode == "lora" and "language" not in parts:
        raise UsageError(f"--train_parts {args.train_parts}: LoRA adapts the language model, so 'language' must be "
                         f"trained; use --finetune full to train only the vision tower or the projector")
    if not parts:
        raise UsageError("--train_parts: no part to train")
    lrs = {}
    for item in [i.strip() for i in (args.part_lr or "").split(",") if i.strip()]:
        part, _, value = item.partition("=")
        (part,) = _names(part, "--part_lr") or [""]
        try:
            lrs[part] = float(value)
        except ValueError:
            raise UsageError(f"--part_lr {args.part_lr}: expected part=learning rate, e.g. vision=2e-6") from None
        if part not in parts:
            raise UsageError(f"--part_lr {part}={value}: the {part} part is not trained (--train_parts)")
        if not lrs[part] >= 0:
            raise UsageError(f"--part_lr {part}={value}: a learning rate must be >= 0")
    if mode == "lora" and args.hf_adapter and (args.train_parts or args.train_projector):
        raise UsageError("--hf_adapter: the adapter's own trained parts are used; drop --train_parts / "
                         "--train_projector")
    return Plan(mode, frozenset(parts), lrs)


def _qualified(root: nn.Module, module: nn.Module) -> str:
    return next(name for name, m in root.named_modules() if m is module)


def vision_module(model: nn.Module) -> nn.Module | None:
    """The vision tower of a transformers image-text model (transformers' `get_encoder("image")`), or None."""
    try:
        tower = model.get_encoder("image")
    except (AttributeError, TypeError, ValueError):
        return None
    return None if tower is model else tower


def part_modules(model: nn.Module, projector: str, what: str) -> dict[str, str]:
    """Qualified names of the `vision` and `projector` modules of the transformers model `model` (`projector`: the
    family's projector name, matched at the end of a module name; one-line errors when either is not found)."""
    found = [name for name, _ in model.named_modules() if name == projector or name.endswith("." + projector)]
    if len(found) != 1:
        raise UsageError(f"{what}: {len(found)} modules named {projector!r} (its multimodal projector)")
    tower = vision_module(model)
    if tower is None:
        raise UsageError(f"{what}: no vision tower found (transformers' get_encoder('image'))")
    return {"vision": _qualified(model, tower), "projector": found[0]}


PEFT_SEGMENTS = re.compile(r"\.(?:modules_to_save\.[^.]+|original_module)(?=\.)")


def part_of_names(names: list[str], modules: dict[str, str]) -> dict[str, str]:
    """Part of each parameter name: the projector's, else the vision tower's (a name inside the module, once peft's
    `modules_to_save` segments are taken out), else language."""
    def inside(name: str, module: str) -> bool:
        return f".{module}." in "." + PEFT_SEGMENTS.sub("", name)
    return {name: ("projector" if inside(name, modules["projector"]) else
                   "vision" if inside(name, modules["vision"]) else "language") for name in names}


def freeze_full(model: nn.Module, modules: dict[str, str], parts: frozenset[str]) -> None:
    """Full fine-tuning: every weight of a trained part trainable, the others frozen."""
    names = [name for name, _ in model.named_parameters()]
    part = part_of_names(names, modules)
    for name, param in model.named_parameters():
        param.requires_grad_(part[name] in parts)


def param_groups_by_part(model: nn.Module, modules: dict[str, str], lrs: dict[str, float],
                         weight_decay: float) -> list[dict]:
    """The optimiser's groups: per part, VOLTA's decay / no-decay split; a part with its own learning rate carries
    it ("lr"). `model` may be the module the engine trains, around the transformers model (names keep its
    module names inside)."""
    trainable = [(name, p) for name, p in model.named_parameters() if p.requires_grad]
    part = part_of_names([name for name, _ in trainable], modules)
    groups = []
    for name in PARTS:
        for group in split_decay([(n, p) for n, p in trainable if part[n] == name],
                                 weight_decay):
            if name in lrs:
                group["lr"] = lrs[name]
            groups.append(group)
    return groups
