"""The one table of generative image-text families (`config.model_type` -> `Family`): how the model takes its inputs,
and what LoRA fine-tunes in it.

A family not in the table gets `Family()`: image placeholders the processor expands in the text, processed in
batches, no frame of its own without a chat template beyond `<image>\\n`, any number of images per prompt the
processor places, not fine-tuned. A row is needed only where a family differs:
- `layout`: how the image reaches the LM, which picks the backend class (`hf/generative.py`): "image_tokens"
  (`hf/mllm.py`) or "query_tokens" (BLIP-2 / mBLIP / InstructBLIP: Q-Former queries prepended, `hf/blip.py`);
- input quirks read by the backend (`needs_image` ... `continuation_types`, see the fields);
- `projector`: the families `volta-ml train --hf_backend mllm` fine-tunes with LoRA (`iglue_hf/lora.py`): the
  multimodal projector module `--train_projector` unfreezes, and `lora_targets`, the language model's linear
  layers LoRA adapts by default.
"""
from __future__ import annotations

from dataclasses import dataclass

ATTENTION = ("q_proj", "v_proj")     # LoRA's original choice (Hu et al., 2021): query and value projections
LAYOUTS = ("image_tokens", "query_tokens")


@dataclass(frozen=True)
class Family:
    layout: str = "image_tokens"     # "image_tokens": placeholders in the text; "query_tokens": BLIP's Q-Former
    needs_image: bool = False        # the processor cannot run without an image, or frames the prompt only around
    #                                  one (set at load for Fuyu's): the blind control gets a blank one
    fallback: str = "image_newline"  # frame without a chat template: "image_newline" (<image>\n per image),
    #                                  "image_prefix" (<image> per image, the processor adds BOS), "as_is" (BLIP)
    max_images: int | None = None    # images per prompt of its checkpoints' training when one (model cards); None:
    #                                  as many as the processor places (probed at load)
    frame_end: str = ""              # what the processor appends after the prompt (PaliGemma: "\n")
    answer_sep: str = " "            # between that and the answer without a chat template (PaliGemma: none)
    continuation_types: int = 0      # token_type_ids of answer tokens (PaliGemma: 1 = the causal suffix)
    projector: str | None = None     # LoRA fine-tuning: the multimodal projector's module name (last part(s) of its
    #                                  qualified name); None: not a family volta-ml fine-tunes
    lora_targets: tuple[str, ...] = ATTENTION


_MMP = "multi_modal_projector"
FAMILIES = {
    "llava": Family(max_images=1, projector=_MMP),      # LLaVA-1.5 (LLaVA-Interleave, Pixtral-12B share the type:
    #                                                     max_images 2)
    "llava_next": Family(max_images=1, projector=_MMP),  # LLaVA-NeXT (1.6)
    "llava_onevision": Family(projector=_MMP),
    "qwen2_vl": Family(projector="visual.merger"),
    "qwen2_5_vl": Family(projector="visual.merger"),
    "qwen3_vl": Family(projector="visual.merger"),
    "idefics3": Family(projector="connector"),
    "smolvlm": Family(projector="connector"),
    "gemma3": Family(projector=_MMP),
    "paligemma": Family(needs_image=True, fallback="image_prefix", max_images=1, frame_end="\n", answer_sep="",
                        continuation_types=1, projector=_MMP),
    "mistral3": Family(projector=_MMP),
    "mllama": Family(max_images=1, projector=_MMP),      # Llama 3.2 Vision: Meta recommends one image per prompt
    "aya_vision": Family(projector=_MMP),
    "internvl": Family(projector=_MMP),
    "blip-2": Family(layout="query_tokens", needs_image=True, fallback="as_is", max_images=1),   # BLIP-2, mBLIP
    "instructblip": Family(layout="query_tokens", needs_image=True, fallback="as_is", max_images=1),
}


def family(model_type: str | None) -> Family:
    return FAMILIES.get(model_type, Family())


def fine_tuned() -> list[str]:
    """The model types `volta-ml train --hf_backend mllm` fine-tunes (rows with a projector), in table order."""
    return [name for name, row in FAMILIES.items() if row.projector]
