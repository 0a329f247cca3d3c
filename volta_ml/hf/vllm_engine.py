"""`--backend vllm`: the `Generative` contract (hf/base.py) run by vLLM's offline engine (`vllm.LLM`) in the
scoring process; `import vllm` happens here only, when the backend is built.

The prompt is the one volta-ml renders: a composed `hf/mllm.GenerativeBackend` whose model is built on the meta
device (no weights are read or run by transformers) keeps the processor, the chat template, the image
placeholders, the letter rule's token choice (`choice_ids`) and the continuation tokens (`continuation_ids`). vLLM
gets the rendered prompt's token ids with the images as `multi_modal_data` and expands the placeholders with the
model's own processor; at load one probe (a blank image) checks that vLLM's expanded prompt equals the token ids
transformers' processor gives the model, else one `ModelLoadError` line naming the model type.

Scoring (greedy, temperature 0):
- `choice_logits`: one decoding step per prompt with `logprob_token_ids` = exactly the choices' tokens, so every
  choice's token is scored, not whatever lands in a top-k. The values are log-probabilities (log-softmax over the
  vocabulary of the next-token logits): the HF backend returns the raw logits; both give the same
  log-softmax over the choices, and the same argmax. `letter_spellings` "all": logsumexp over the spellings.
- `continuation_logprobs`: one request per (prompt, continuation) of prompt + continuation tokens with
  `prompt_logprobs`: the sum of the continuation tokens' log-probabilities.
- `generate`: `SamplingParams(temperature=0, max_tokens=...)`; the new tokens decoded as the HF backend decodes them
  (special tokens skipped, stripped); `Answer.truncated` is vLLM's `finish_reason == "length"`.

Engine options are `ModelSpec.extra` rows of `hf/base.EXTRA_OPTIONS` (`VLLM_OPTIONS`); they, the engine and its
version are `self.engine`, which the pipelines record in every result and put in the resume key. Refused with one
line: vLLM not installed, a model type vLLM does not serve, a family outside the image-token layout, a
`tensor_parallel_size` larger than the GPUs visible, `device_map`, an adapter vLLM's LoRA cannot apply as the
HF backend does (`_lora`); an adapter it can is one `LoRARequest` on every request, recorded in `engine`.
"""
from __future__ import annotations

import dataclasses
import math
import os
from typing import Sequence

import torch

from .base import Answer, BackendInputError, ModelSpec
from .families import family
from .loading import ModelLoadError, blank_image, load_processor, one_line, source
from .mllm import GenerativeBackend, is_encoder_decoder

DTYPES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}
# the engine options (ModelSpec.extra keys, typed in hf/base.EXTRA_OPTIONS) and their defaults here
VLLM_OPTIONS = {"tensor_parallel_size": 1, "gpu_memory_utilization": None, "max_model_len": None,
                "max_num_seqs": None, "enforce_eager": None, "load_format": None}


def import_vllm():
    """The `vllm` module, or one line saying it is not installed (scripts/install_vllm_env.sh builds an env)."""
    try:
        import vllm
    except ImportError as e:
        raise ModelLoadError(f"--backend vllm: the Python package 'vllm' is not importable ({one_line(e)}); install "
                             "it (pip install vllm, or on a CPU machine scripts/install_vllm_env.sh VENV_DIR)") from None
    return vllm


class _Renderer(GenerativeBackend):
    """The HF backend's prompt side on a meta-device model: rendering and tokenisation only (vLLM runs the model),
    so the load-time forward probe is skipped."""

    def _check_forward(self) -> None:
        """No forward here: the model has no weights; vLLM's own load and the prompt probe check the model."""


def _meta_model(spec: ModelSpec):
    """The model's architecture without weights (meta device): what the HF backend reads from it (config, family,
    forward signature, position kind) for rendering."""
    from transformers import AutoConfig, AutoModelForImageTextToText
    try:
        config = AutoConfig.from_pretrained(source(spec), revision=spec.revision)
        with torch.device("meta"):
            return AutoModelForImageTextToText.from_config(config)
    except (ValueError, KeyError, OSError) as e:
        raise ModelLoadError(f"{spec.model}: unknown or unsupported architecture for a generative image-text model "
                             f"({one_line(e)})") from None


def engine_options(extra: dict) -> dict:
    """The vLLM engine options set in `extra` (defaults filled in), as recorded."""
    return {key: extra.get(key, default) for key, default in VLLM_OPTIONS.items()}


def visible_gpus(device: str, tp: int) -> list[int]:
    """The GPUs this process's engine uses: `tp` of them from the index of `device` ("cuda:k": ranks k * tp on,
    so data-parallel ranks never share a GPU), within CUDA_VISIBLE_DEVICES; refused when fewer are visible."""
    count = torch.cuda.device_count()
    first = int(device.split(":")[1]) * tp if device.startswith("cuda:") else 0
    if tp > 1 and first + tp > count:
        raise ModelLoadError(f"--tensor_parallel_size {tp}: {count} GPU(s) visible to this process"
                             + (f" (device {device} takes GPUs {first}..{first + tp - 1})" if first else ""))
    return list(range(first, first + tp)) if count else []


class VllmBackend:
    """The `Generative` contract with vLLM's offline engine; prompts rendered by the composed HF backend."""

    def __init__(self, spec: ModelSpec):
        options = engine_options(spec.extra)
        gpus = visible_gpus(spec.device, int(options["tensor_parallel_size"]))   # before the slow import
        vllm = import_vllm()
        if spec.device_map:
            raise ModelLoadError(f"--device_map {spec.device_map}: the vllm backend places the model itself (use "
                                 "--tensor_parallel_size)")
        from transformers import AutoProcessor
        model = _meta_model(spec)
        cfg = model.config
        if family(cfg.model_type).layout != "image_tokens" or is_encoder_decoder(cfg):
            raise ModelLoadError(f"{spec.model}: model type {cfg.model_type!r} (query tokens or an encoder-decoder "
                                 "LM) is not taken by the vllm backend; score it with --backend mllm")
        archs = list(getattr(cfg, "architectures", None) or [])
        served = set(vllm.ModelRegistry.get_supported_archs())
        if not archs or not any(a in served for a in archs):
            raise ModelLoadError(f"{spec.model}: model type {cfg.model_type!r} ({', '.join(archs) or 'no architecture'})"
                                 f" is not served by the installed vLLM {vllm.__version__}; score it with --backend mllm")
        self.spec = spec
        self.hf = _Renderer(dataclasses.replace(spec, adapter=None), model, load_processor(AutoProcessor, spec))
        self.tokenizer, self.max_images = self.hf.tokenizer, self.hf.max_images
        self.prompt_format, self.template_options = self.hf.prompt_format, self.hf.template_options
        self.letter_spellings, self.vqa_frame = self.hf.letter_spellings, self.hf.vqa_frame
        if gpus and "CUDA_VISIBLE_DEVICES" in os.environ:
            shown = os.environ["CUDA_VISIBLE_DEVICES"].split(",")
            os.environ["CUDA_VISIBLE_DEVICES"] = ",".join(shown[i] for i in gpus)
        elif gpus:
            os.environ["CUDA_VISIBLE_DEVICES"] = ",".join(map(str, gpus))
        self.engine = {"engine": "vllm", "version": vllm.__version__, "options": options}
        self._cpu = vllm.platforms.current_platform.is_cpu()
        self._sampling = vllm.SamplingParams
        kwargs = {k: v for k, v in options.items() if v is not None}
        self.lora = None
        if spec.adapter:           # vLLM's LoRA, where its implementation of the family takes one
            self.lora, rank = self._lora(vllm, model, [a for a in archs if a in served][0])
            kwargs.update(enable_lora=True, max_lora_rank=rank, max_loras=1)
            self.engine["lora"] = {"adapter": spec.adapter, "max_lora_rank": rank,
                                   **({"base_mismatch": self.base_mismatch} if self.base_mismatch else {})}
        try:
            self.llm = vllm.LLM(model=source(spec), revision=spec.revision, dtype=DTYPES[spec.dtype], seed=0,
                                limit_mm_per_prompt={"image": self.max_images or 4}, **kwargs)
        except (ValueError, RuntimeError, OSError) as e:
            raise ModelLoadError(f"{spec.model}: vLLM {vllm.__version__} cannot load it ({one_line(e)})") from None
        try:            # the first request: an adapter vLLM cannot apply fails here (its modules, its shapes)
            self._check_prompts()
        except (ValueError, RuntimeError) as e:
            if isinstance(e, ModelLoadError):
                raise
            self.close()
            with_adapter = f" with adapter {spec.adapter}" if spec.adapter else ""
            raise ModelLoadError(f"{spec.model}: vLLM {vllm.__version__} cannot run it{with_adapter} "
                                 f"({one_line(e)})") from None

    def _lora(self, vllm, model, arch: str):
        """(LoRARequest, rank) of `spec.adapter`; one line where vLLM cannot apply it as volta-ml's HF backend does:
        not a LoRA, modules it trains in full (`modules_to_save`), a family vLLM serves no LoRA for, an adapter of
        another base model (unless `allow_adapter_base_mismatch`, as the HF backend)."""
        from pathlib import Path

        from vllm.lora.request import LoRARequest
        from vllm.model_executor.models.interfaces import supports_lora

        from .loading import _read_adapter_config, adapter_base_mismatch
        spec, folder = self.spec, Path(self.spec.adapter).expanduser()
        if not folder.is_dir():
            raise ModelLoadError(f"adapter folder {spec.adapter} does not exist")
        config = _read_adapter_config(folder, spec.adapter)
        if config.get("peft_type") != "LORA":
            raise ModelLoadError(f"adapter {spec.adapter}: peft_type {config.get('peft_type')!r}; vLLM applies LoRA "
                                 "adapters only (score it with --backend mllm)")
        if config.get("modules_to_save"):
            raise ModelLoadError(f"adapter {spec.adapter}: it trains {', '.join(config['modules_to_save'])} in full "
                                 "(modules_to_save), which vLLM's LoRA does not apply; score it with --backend mllm")
        cls = vllm.ModelRegistry._try_load_model_cls(arch)
        if cls is None or not supports_lora(cls):
            raise ModelLoadError(f"{spec.model}: vLLM {vllm.__version__} serves no LoRA for model type "
                                 f"{model.config.model_type!r} ({arch}); score --adapter with --backend mllm")
        mismatch = adapter_base_mismatch(config, model, spec)
        if mismatch and not spec.allow_adapter_base_mismatch:
            raise ModelLoadError(f"adapter {spec.adapter} was trained on another model ({mismatch}); "
                                 "--allow_adapter_base_mismatch applies it anyway and records that in the results")
        self.base_mismatch = mismatch       # accepted with allow_adapter_base_mismatch: recorded in `engine`
        return LoRARequest("adapter", 1, str(folder.resolve())), int(config.get("r") or 8)

    def close(self) -> None:
        """Stop the engine's processes now (they stop at exit otherwise)."""
        self.llm.llm_engine.engine_core.shutdown()

    # ---- requests ---------------------------------------------------------------------------------------------
    def render(self, prompt: str, num_images: int) -> str:
        return self.hf.render(prompt, num_images)

    def choice_ids(self, choices: Sequence[str], prompt: str = "Question: ? Short Answer:") -> list[list[int]]:
        return self.hf.choice_ids(choices, prompt)

    def _prompt_ids(self, prompt: str, num_images: int) -> list[int]:
        """The rendered prompt's token ids, image placeholders unexpanded (what the processor tokenises)."""
        text = self.hf.render(prompt, num_images)
        if self.prompt_format != "chat_template":
            text += self.hf.family.frame_end
        return self.hf._text_ids(text)

    def _requests(self, images, prompts, extra_ids=None) -> list[dict]:
        if len(images) != len(prompts):
            raise ValueError(f"{len(images)} image lists for {len(prompts)} prompts")
        out = []
        for i, (imgs, prompt) in enumerate(zip(images, prompts)):
            imgs = self.hf._images(imgs)
            request = {"prompt_token_ids": self._prompt_ids(prompt, len(imgs)) + list(extra_ids[i] if extra_ids else [])}
            if imgs:
                request["multi_modal_data"] = {"image": imgs if len(imgs) > 1 else imgs[0]}
            out.append(request)
        return out

    def _run(self, requests: list[dict], params) -> list:
        return self.llm.generate(requests, params, use_tqdm=False, lora_request=self.lora)

    def _check_prompts(self) -> None:
        """One request with a blank image: vLLM's expanded prompt must be the token ids transformers' processor
        gives the model for the same rendered prompt (else the two engines would score different prompts)."""
        prompt = "?"
        want = self.hf._probe_ids(self.hf.render(prompt, 1), 1)
        got = list(self._run(self._requests([[blank_image()]], [prompt]),
                             self._sampling(max_tokens=1, temperature=0.0))[0].prompt_token_ids)
        if got != want:
            raise ModelLoadError(f"{self.spec.model}: vLLM expands the image placeholders of model type "
                                 f"{self.hf.model.config.model_type!r} into other tokens than its processor does "
                                 f"({len(got)} vs {len(want)} prompt tokens); score it with --backend mllm")

    # ---- the contract -----------------------------------------------------------------------------------------
    def choice_logits(self, images, prompts, choices) -> torch.Tensor:
        ids = self.choice_ids(choices, prompts[0] if prompts else "")
        flat = list(dict.fromkeys(i for c in ids for i in c))
        outs = self._run(self._requests(images, prompts),
                         self._sampling(max_tokens=1, temperature=0.0, logprob_token_ids=flat))
        rows = []
        for out in outs:
            step = out.outputs[0].logprobs[0]
            rows.append([torch.logsumexp(torch.tensor([step[i].logprob for i in c], dtype=torch.float64), 0).item()
                         for c in ids])
        return torch.tensor(rows, dtype=torch.float32).reshape(len(prompts), len(ids))

    def continuation_logprobs(self, images, prompts, continuations, *, reuse_cache: bool = True):
        """`reuse_cache` is the HF backend's switch; vLLM scores each prompt + continuation in one request."""
        if self.lora is not None and self._cpu:
            raise BackendInputError(f"{self.spec.model}: continuation log-probabilities with an adapter fail in vLLM's "
                                    "CPU build (its LoRA kernel with prompt_logprobs); score this rule with --backend "
                                    "mllm")
        flat, k = self.hf._continuation_ids(images, prompts, continuations)
        conts = [t.tolist() for t in flat]
        outs = self._run(self._requests([im for im in images for _ in range(k)],
                                        [p for p in prompts for _ in range(k)], conts),
                         self._sampling(max_tokens=1, temperature=0.0, prompt_logprobs=0))
        sums = []
        for out, cont in zip(outs, conts):
            rows = out.prompt_logprobs[len(out.prompt_logprobs) - len(cont):]
            sums.append(math.fsum(row[t].logprob for row, t in zip(rows, cont)))
        counts = torch.tensor([len(c) for c in conts], dtype=torch.long).view(len(prompts), k)
        return torch.tensor(sums, dtype=torch.float32).view(len(prompts), k), counts

    def generate(self, images, prompts, max_new_tokens: int) -> list[Answer]:
        outs = self._run(self._requests(images, prompts),
                         self._sampling(max_tokens=max_new_tokens, temperature=0.0))
        return [Answer(self.tokenizer.decode(out.outputs[0].token_ids, skip_special_tokens=True).strip(),
                       truncated=out.outputs[0].finish_reason == "length") for out in outs]
