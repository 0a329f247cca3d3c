"""The contract every Hugging Face backend keeps (CVQA and the IGLUE tasks both build on it).

A backend is loaded once from a `ModelSpec` (hub id or local path, pinned revision, dtype, device) through
`volta_ml.hf.load_backend(kind, spec)`, where `kind` is a key of the `BACKENDS` table in
`volta_ml/hf/__init__.py`. Two kinds of backend exist:

- `DualEncoder` (CLIP, SigLIP, M-CLIP): images and texts are embedded separately, once each; a score is the
  cosine similarity of the two L2-normalised embeddings.
- `Generative` (LLaVA, InstructBLIP, BLIP-2/mBLIP and the current families docs/hf_backends.md lists as tested,
  all loaded as `AutoModelForImageTextToText`): a prompt (the user turn,
  rendered through the model's chat template where it has one) plus zero or more images; scores are
  next-token logits over given candidate tokens, or log-probabilities of given continuations.

Images are `PIL.Image.Image` (RGB) or `None` for the blind (text-only / blank image) control. Every method
takes a batch and must give the same numbers as one example at a time (left padding for decoder-only LMs).

Refinements made while implementing (no signature changed; all additions are optional):
- `load_backend` raises `UnknownBackendError` (lists the supported kinds) and the loaders `ModelLoadError`
  (one line naming the model: missing folder, no config.json, unknown architecture, unknown dtype); both are
  `ValueError`s and are exported from `volta_ml.hf`.
- `Generative.continuation_logprobs(..., *, reuse_cache=True)`: `reuse_cache=False` runs K full forwards (the
  no-reuse baseline; same numbers). A continuation's tokens are those it adds after the rendered prompt
  (decoder-only LMs; alone for encoder-decoder LMs): pass the leading
  space your prompt needs (" Paris" after "Answer:").
- `choice_logits`: a choice's logit is that of the letter typed right after the generation prompt (after the
  space the template writes before its reply where the letter absorbs it, LLaVA's `" A"`; without a template
  what `" A"` adds after the prompt; thinking templates: right after the generation prompt they end with), one
  spelling for every choice, checked per model (one token, decodes back to the choice, no two choices share a
  token); `spec.extra["letter_spellings"] = "all"`: logsumexp over every single-token spelling.
- Chat-template switches are `spec.extra` options (`enable_thinking`: true / false, absent = the template's own
  default), refused where the template has none, and carried as `backend.template_options` for the records.
- Generative backends also carry `prompt_format` ("chat_template" or "fallback: ...", to record with results)
  and `choice_ids(choices)`; a blind prompt on a LLaVA-like model has no image at all, BLIP-family models get
  `volta_ml.hf.loading.blank_image()` (uniform grey), as do the dual encoders for a `None` image.
- `ModelSpec.adapter`: a folder written by peft's `save_pretrained` (`volta-ml train --hf_backend mllm` writes
  one, `<run dir>/hf_best`); the generative backend applies it to the loaded model (`loading.attach_adapter`).
- Backends accept an already built model/processor (`ClipBackend(spec, model, processor)`,
  `hf.generative.generative_backend(spec, model, processor)`, `MClipBackend(spec, parts)`) for random-weight
  benchmarks; the generative one picks the class for the model (`hf/mllm.py`'s core, or `hf/blip.py`).
"""
from __future__ import annotations

import argparse
import json
from dataclasses import dataclass, field
from typing import Protocol, Sequence, runtime_checkable

import torch
from PIL import Image

from volta_ml.options import json_object


@dataclass(frozen=True)
class ModelSpec:
    model: str                      # hub id ("llava-hf/llava-1.5-7b-hf") or a local folder
    revision: str | None = None     # pinned commit; written into every result file
    dtype: str = "fp32"             # "bf16" | "fp16" | "fp32"
    device: str = "cpu"             # "cpu", "cuda", "cuda:1"; ignored when device_map is set; "meta": no weights (FSDP ranks > 0)
    device_map: str | None = None   # "auto": accelerate spreads a model larger than one GPU
    extra: dict = field(default_factory=dict)  # backend-specific options (e.g. M-CLIP's image tower)
    allow_missing_keys: bool = False  # load weights that miss / add tensors (recorded; otherwise refused)
    adapter: str | None = None      # generative models: a peft (LoRA) adapter folder applied on top of the model
    allow_adapter_base_mismatch: bool = False  # apply an adapter that records another base model (recorded)

    @property
    def pinned(self) -> str:
        """`model@revision` (the model alone when no revision is pinned), as logs and resume files name it."""
        return self.model + (f"@{self.revision}" if self.revision else "")


@runtime_checkable
class DualEncoder(Protocol):
    spec: ModelSpec

    def embed_images(self, images: Sequence[Image.Image | None]) -> torch.Tensor:
        """[N, D] float32, L2-normalised, on the CPU."""

    def embed_texts(self, texts: Sequence[str]) -> torch.Tensor:
        """[N, D] float32, L2-normalised, on the CPU."""


@runtime_checkable
class Generative(Protocol):
    spec: ModelSpec
    max_images: int | None          # images one prompt may carry (1 for single-image models; None: no limit)

    def render(self, prompt: str, num_images: int) -> str:
        """The exact text the model sees for this user turn (chat template applied, image tokens in place)."""

    def choice_logits(self, images: Sequence[Sequence[Image.Image | None]], prompts: Sequence[str],
                      choices: Sequence[str]) -> torch.Tensor:
        """[B, len(choices)] next-token logits (float32, CPU) of each choice's single token after each prompt.
        Raises `ChoiceTokenError` naming the model and the choice when a choice is not one token."""

    def continuation_logprobs(self, images: Sequence[Sequence[Image.Image | None]], prompts: Sequence[str],
                              continuations: Sequence[Sequence[str]]) -> tuple[torch.Tensor, torch.Tensor]:
        """(sum of log-probabilities [B, K], number of tokens [B, K]) of each of the K continuations of each
        prompt; the prompt is encoded once and its KV cache reused for the K continuations."""

    def generate(self, images: Sequence[Sequence[Image.Image | None]], prompts: Sequence[str],
                 max_new_tokens: int) -> list[str]:
        """Greedy answers, special tokens and the prompt stripped; each an `Answer` (a `str`) whose `truncated`
        says that generation stopped at `max_new_tokens`, not at an end token."""


class Answer(str):
    """A generated answer: the text (it is a `str`), and `truncated`: True when generation stopped because it
    reached `max_new_tokens` rather than at an end-of-sequence / stop token (the answer is then cut short)."""
    truncated: bool

    def __new__(cls, text: str, truncated: bool = False):
        answer = super().__new__(cls, text)
        answer.truncated = bool(truncated)
        return answer


LETTER_SPELLINGS = ("natural", "all")   # Generative letter rule: the answer token | logsumexp of every spelling


class ChoiceTokenError(ValueError):
    """A choice (e.g. the letter "C") is not a single token of this model's tokenizer."""


class BackendInputError(ValueError):
    """An input the model cannot take (more images in one prompt than it accepts): a user error, one line."""


class EngineError(ValueError):
    """An inference server (`--backend openai`) that cannot be reached, refuses the key or the model, fails an
    item after its retries, or cannot run the rule asked for: one line naming the server and what to do.
    `item`: the position in the batch of the item whose request failed (None: not one item's)."""

    def __init__(self, message: str, item: int | None = None):
        super().__init__(message)
        self.item = item

    def within(self, rows) -> "EngineError":
        """The same error for a call on the sub-batch `rows` of a batch: `item` as the batch's position."""
        return EngineError(str(self), None if self.item is None else rows[self.item])


def engine_record(backend) -> dict:
    """What ran the model, for every result file: the backend's `engine` (`{"engine": "openai", request options}`),
    with its `server` (openai: the URL, the model id the server reported, requests sent), else
    `{"engine": "transformers"}` (the HF backends, in this process)."""
    record = dict(getattr(backend, "engine", None) or {"engine": "transformers"})
    server = getattr(backend, "server", None)
    return {**record, "server": server} if server else record


def keep_answers(backend, folder) -> None:
    """A backend that asks a server (`openai`) journals every answer in `folder`, beside the chunk store, so a
    resumed run never asks again what was answered; other backends have nothing to keep."""
    journal = getattr(backend, "journal_in", None)
    if journal is not None:
        journal(folder)


def _count(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


def _number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _text(value) -> bool:
    return isinstance(value, str) and bool(value.strip())


# The `ModelSpec.extra` options the backends read (`--extra` of iglue-hf, `--hf_extra` of train), with the JSON
# value each takes: a value of another type is refused before any model loads (`extra_option_error`). Keys not
# listed here pass through to the backend unchecked.
EXTRA_OPTIONS = {
    "max_images": ("an integer >= 1 (images per prompt)", _count),
    "batch_size": ("an integer >= 1 (dual encoders: images or texts per forward)", _count),
    "image_model": ("a model folder or hub id (a non-empty string)", _text),
    "image_revision": ("a commit (a non-empty string)", _text),
    "text_base": ("a model folder or hub id (a non-empty string)", _text),
    "letter_spellings": (" or ".join(map(repr, LETTER_SPELLINGS)), lambda v: v in LETTER_SPELLINGS),
    "enable_thinking": ("true or false", lambda v: isinstance(v, bool)),
    "chat_template": ("true or false", lambda v: isinstance(v, bool)),
    # --backend vllm: the engine's options (hf/vllm_engine.py, VLLM_OPTIONS; recorded with every result)
    "tensor_parallel_size": ("an integer >= 1 (GPUs one vLLM engine spans)", _count),
    "gpu_memory_utilization": ("a number in (0, 1] (vLLM: the GPU memory fraction it takes)",
                               lambda v: isinstance(v, (int, float)) and not isinstance(v, bool) and 0 < v <= 1),
    "max_model_len": ("an integer >= 1 (vLLM: the context length it reserves for)", _count),
    "max_num_seqs": ("an integer >= 1 (vLLM: sequences per engine step)", _count),
    "enforce_eager": ("true or false (vLLM: no CUDA graphs / compilation)", lambda v: isinstance(v, bool)),
    "load_format": ("a vLLM load format, e.g. \"dummy\" (random weights: benchmarks)", _text),
    # --backend openai (hf/openai_client.py); flags as sugar: SERVER_FLAGS
    "base_url": ("an http(s) URL of an OpenAI-compatible server (.../v1)",
                 lambda v: isinstance(v, str) and v.startswith(("http://", "https://"))),
    "api_key_env": ("the name of an environment variable holding the key", _text),
    "max_concurrency": ("an integer >= 1 (requests in flight)", _count),
    "request_timeout": ("a number of seconds > 0", lambda v: _number(v) and v > 0),
    "retries": ("an integer >= 0 (retries of a failed request)", lambda v: _count(v) or v == 0),
    "retry_backoff": ("a number of seconds > 0 (the first retry's wait, doubled each time)",
                      lambda v: _number(v) and v > 0),
    "seed": ("an integer (the request seed)", lambda v: isinstance(v, int) and not isinstance(v, bool)),
    "top_logprobs": ("an integer >= 1 (the letter rule's alternatives per request; OpenAI's API takes at most 20, "
                     "vLLM up to its --max-logprobs)", _count),
    "letter_lead": ("'auto', ' ' or '' (the letter rule's spelling on a server: a space before the letter or "
                    "none; auto: as the first answer of the run spells it)", lambda v: v in ("auto", " ", "")),
    "server_fields": ("a JSON object merged into every request (e.g. vLLM's {\"add_special_tokens\": true})",
                      lambda v: isinstance(v, dict)),
}
SERVER_FLAGS = ("base_url", "api_key_env", "max_concurrency", "request_timeout", "retries")
# how a server is reached, not what it answers: left out of resume keys (a server restarted elsewhere, or more
# requests in flight, reuses what was scored)
TRANSPORT = SERVER_FLAGS + ("retry_backoff",)


def answer_options(extra: dict | None) -> dict:
    """The options of `extra` that can change a score (resume keys): all but the TRANSPORT ones."""
    return {key: value for key, value in (extra or {}).items() if key not in TRANSPORT}


def extra_option_error(extra: dict) -> str | None:
    """What is wrong with the first ill-typed option of `extra` (a ModelSpec.extra), or None."""
    for key, value in extra.items():
        if key in EXTRA_OPTIONS and not EXTRA_OPTIONS[key][1](value):
            return f"{key!r} must be {EXTRA_OPTIONS[key][0]}, got {value!r}"
    return None


class ExtraFlag(argparse.Action):
    """`--base_url URL` is sugar for `--extra '{"base_url": URL}'` (SERVER_FLAGS): the value, checked by its
    EXTRA_OPTIONS row, is merged into the `extra` dict, whatever the order of the flags (`--extra` merges too)."""

    def __call__(self, parser, namespace, values, option_string=None):
        if self.dest == "extra":
            merged = {**values, **(getattr(namespace, "extra", None) or {})}
        else:
            problem = extra_option_error({self.dest: values})
            if problem:
                parser.error(f"{option_string}: {problem}")
            merged = {**(getattr(namespace, "extra", None) or {}), self.dest: values}
        namespace.extra = merged


def _flag_value(text: str):
    try:
        return json.loads(text)
    except ValueError:
        return text


def add_server_flags(parser) -> None:
    """The flags of `--backend openai` (SERVER_FLAGS), each a key of `extra`; for every command line that loads
    a generative backend (`iglue-hf` and `suite` through `add_run_flags`, `cvqa score`)."""
    group = parser.add_argument_group("--backend openai (an OpenAI-compatible server; docs/serving.md)")
    for key in SERVER_FLAGS:
        group.add_argument(f"--{key}", dest=key, action=ExtraFlag, type=_flag_value, default=argparse.SUPPRESS,
                           help=f"{EXTRA_OPTIONS[key][0]} (= extra {key})")


def backend_options(text: str) -> dict:
    """argparse `type`: a JSON object of backend options (`ModelSpec.extra`: `--extra`, `--hf_extra`) whose known
    keys have the type the backends read (`EXTRA_OPTIONS`): `{"max_images": "lots"}` is refused. It sits here, below
    the pipelines' command lines (`iglue_hf/cli.py`, `suite/cli.py`) and `cli/train_flags.py`, which all use it."""
    value = json_object(text)
    problem = extra_option_error(value)
    if problem:
        raise argparse.ArgumentTypeError(problem)
    return value


# Run flags that are sugar for engine options of `EXTRA_OPTIONS` (`--tensor_parallel_size N` = extra
# {"tensor_parallel_size": N}), with the backend kinds that read them.
ENGINE_FLAGS = {"tensor_parallel_size": ("vllm",)}


def fold_engine_flags(backend: str, extra: dict | None, options: dict) -> dict | None:
    """`extra` with the engine flags set in `options` folded in; a flag the backend kind does not read is refused
    (`BackendInputError`, one line) rather than silently ignored."""
    out = dict(extra or {})
    for flag, kinds in ENGINE_FLAGS.items():
        value = options.get(flag)
        if value is None:
            continue
        if backend not in kinds:
            raise BackendInputError(f"--{flag}: only the {' / '.join(kinds)} backend reads it (got --backend {backend})")
        out[flag] = value
    problem = extra_option_error(out)
    if problem:
        raise BackendInputError(problem)
    return out or None
