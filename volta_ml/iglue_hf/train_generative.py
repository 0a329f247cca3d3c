"""LoRA fine-tuning of a generative image-text model (the `mllm` backend's families) on NLVR2, SNLI-VE (XVNLI's
English side) or GQA, as a `TrainJob` of the engine (`volta_ml.engine.train.train`: optimiser, schedule, bf16,
gradient accumulation, DDP, checkpoints, resume, failure handling and log lines are all the engine's).

`volta-ml train --hf_model <folder or hub id[@revision]> [--hf_backend mllm] --task 12|19|15 (or marvl|xvnli|xgqa)
--images <image root> ...` builds it (`volta_ml/cli/train_task.py`); docs/hf_models.md, "Fine-tuning a
generative model (LoRA)".

- Data: the task config entry of `--task` gives the dataroot, batch size, LR and epochs as for the zoo (flags
  win); the files are `--train/val_annotations_jsonpath` or `TRAIN_FILES` under the dataroot, read by the
  iglue-hf readers (`iglue_hf.data`: NLVR2 and MaRVL rows, XVNLI/SNLI-VE rows, GQA question JSON), so IGLUE's
  few-shot files (test-file format) train the same way. Training rows without a gold label (XVNLI `-`) are
  skipped; validation keeps them (they count wrong, as in iglue-hf).
- Input and target: the user turn iglue-hf's default rule of the task asks (`prompts.user_turn`, MaRVL's two
  photos side by side unless the model takes two images), encoded by the backend exactly as scoring encodes it
  (`GenerativeBackend.encode`), then the answer's tokens appended (`append_continuations`): the option letter's
  token that the letter rule reads (XVNLI, MaRVL), or the answer and end-of-turn tokens the generate rule
  decodes (xGQA, `reply_ids`). Loss: cross-entropy on the answer tokens only (prompt, image and pad positions
  carry no label), the mean over each example's answer tokens, then over examples, so N processes with
  batch b train like one with N*b.
- Model: `peft` LoRA on the language model (`lora.py`: flags `--lora_r/alpha/dropout/target`,
  `--train_projector`, `--hf_adapter` to start from a saved adapter); checkpoints (`pytorch_model_*.bin`, the
  resume file) hold the trainable tensors only.
- Validation score: the accuracy iglue-hf reports, computed by the same rule (`scoring.get_rule(task,
  DEFAULT_RULES[task])`) on the validation file. The training log's score: answers right at every token under
  teacher forcing.
- Output: the engine's run directory (`<output_dir>/<task name>_<model name>[-<save_name>]`) plus `hf_best/`,
  the adapter (`save_pretrained`: adapter_config.json, adapter_model.safetensors with the projector when it
  was trained) of each new best, which `volta-ml iglue-hf --backend mllm --model BASE --adapter <run dir>/hf_best`
  evaluates.
"""
from __future__ import annotations

import copy
import dataclasses
import functools
import json
import logging
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.utils.data import Dataset

from volta_ml.engine.distributed import DistInfo, barrier
from volta_ml.engine.evaluate import MeanLoss
from volta_ml.engine.failures import UsageError
from volta_ml.engine.sharding import gather_full_state, is_sharded
from volta_ml.engine.task_job import resolve_hyperparameters
from volta_ml.engine.train import TrainJob

from . import finetune, lora
from .contrastive import checkpoint_activations
from .data import Example, image_refs, read_task
from .images import DEFAULT_TEMPLATES
from .prompts import OPTIONS, letter_choices, user_turn
from .scoring import DEFAULT_RULES, get_rule
from .tasks import example_images, marvl_layout
from .train import EXPORT_DIR, export_best, image_source, model_spec, model_type, prepare_run_dir, run_name, task_entry

logger = logging.getLogger("volta_ml.train")

TRAINABLE = {"12": "marvl", "19": "xvnli", "15": "xgqa"}     # task id -> iglue-hf task (prompt, rule, reader)
TRAIN_FILES = {"marvl": "{split}.jsonl", "xvnli": "{split}.jsonl",        # under the entry's dataroot
               "xgqa": "{split}_balanced_questions.json"}
NLVR2_TEMPLATE = "{file}"   # --task 12 / nlvr2: NLVR2's images in one folder (<identifier stem>-img0.png)
CONTEXT = {"max_new_tokens": 10, "vocabulary": None}           # the generate rule's, as iglue-hf's default


# --- task, data ----------------------------------------------------------------------------------------------
def generative_entry(args) -> tuple[str, dict, str]:
    """(task id, resolved entry, iglue-hf task) for `--task`; a task a generative model cannot train on is an error."""
    task_id, entry = task_entry(args, TRAINABLE, "{key} ({name}) is not a task a generative model fine-tunes on; "
                                                 "--task 12 (NLVR2 -> MaRVL), 19 (SNLI-VE -> XVNLI) or 15 (GQA -> "
                                                 "xGQA), or marvl | xvnli | xgqa")
    return task_id, entry, TRAINABLE[task_id.removeprefix("TASK")]


def default_template(args, task: str) -> str:
    named = str(args.task).strip().lower().removeprefix("task")
    return NLVR2_TEMPLATE if named in ("12", "nlvr2") else DEFAULT_TEMPLATES[task]


def annotation_path(args, entry: dict, task: str, split: str) -> str:
    from volta_ml.tasks.config import entry_path
    path = entry_path(entry, f"{split}_annotations_jsonpath", getattr(args, f"{split}_annotations_jsonpath"))
    if path:
        return path
    dataroot = entry_path(entry, "dataroot")
    if not dataroot:
        raise UsageError(f"{entry['name']}: no --{split}_annotations_jsonpath and no dataroot in the task config")
    return str(Path(dataroot) / TRAIN_FILES[task].format(split=getattr(args, f"{split}_split")))


class AnswerDataset(Dataset):
    """Example i as the model is asked it: its images (loaded), its user turn, the answer's token ids (the
    first option's, weight 0, for an example without a gold answer) and its gold label."""

    def __init__(self, examples: list[Example], prompts: list[str], source, layout, backend, task: str, rule: str):
        self.examples, self.prompts, self.source, self.layout = examples, prompts, source, layout
        self.backend, self.task, self.rule = backend, task, rule

    def __len__(self):
        return len(self.examples)

    def answer_ids(self, prompt: str, label: str, n_images: int) -> list[int]:
        if self.rule == "letter":    # the option letter's token, as the letter rule reads it
            return self.backend.choice_ids(letter_choices(self.task), prompt)[OPTIONS[self.task].index(label)][:1]
        return self.backend.reply_ids(prompt, label, n_images)   # generate: the answer, then end of turn

    def __getitem__(self, index):
        example, prompt = self.examples[index], self.prompts[index]
        images = example_images(example, self.source, self.layout)
        known = has_answer(example, self.task)
        label = example.label if known else (OPTIONS[self.task][0] if self.task in OPTIONS else "-")
        return {"images": images, "prompt": prompt, "gold": example.label, "weight": float(known),
                "answer": torch.tensor(self.answer_ids(prompt, label, len(images)), dtype=torch.long)}


def has_answer(example: Example, task: str) -> bool:
    return example.label in OPTIONS[task] if task in OPTIONS else example.label not in ("", "-")


class Collate:
    """The backend's inputs for the prompts, each followed by its answer tokens (`append_continuations`); the
    images, prompts and gold labels ride along for the validation score."""

    def __init__(self, backend):
        self.backend = backend

    def __call__(self, items):
        inputs = self.backend.encode([it["images"] for it in items], [it["prompt"] for it in items])
        inputs, answer, mask = self.backend.append_continuations(inputs, [it["answer"] for it in items])
        return {"inputs": inputs, "answer": answer, "answer_mask": mask,
                "weight": torch.tensor([it["weight"] for it in items]),
                "images": [it["images"] for it in items], "prompts": [it["prompt"] for it in items],
                "gold": [it["gold"] for it in items]}


# --- the module the engine trains --------------------------------------------------------------------------------
class GenerativeForTraining(nn.Module):
    """The peft model (`self.peft`; LoRA injected into the backend's model in place) or, fine-tuned in full, the
    backend's model itself (`self.hf`), whose forward returns, per example, the mean negative log-likelihood of its
    answer tokens and whether greedy decoding under teacher forcing gets every one right. Its state_dict holds the
    trainable tensors only (LoRA, a trained projector, the trained parts), so the engine's checkpoints and resume
    file hold nothing frozen; loading one checks that exactly those are given."""

    def __init__(self, model: nn.Module, backend):
        super().__init__()
        if hasattr(model, "peft_config"):
            self.peft = model
        else:
            self.hf = model
        self.backend = backend          # a plain object (not a submodule): the same model, scoring methods

    def forward(self, inputs: dict, answer: torch.Tensor, mask: torch.Tensor):
        logits = self.backend.continuation_logits(inputs, answer.shape[1], use_cache=False)
        with torch.autocast(logits.device.type, enabled=False):   # the loss in float32
            logp = F.log_softmax(logits.float(), dim=-1).gather(-1, answer.unsqueeze(-1)).squeeze(-1)
            mask = mask.to(logp.dtype)
            nll = -(logp * mask).sum(1) / mask.sum(1).clamp(min=1)
        right = ((logits.argmax(-1) == answer) | (mask == 0)).all(1)
        return nll, right

    def _trainable(self) -> set[str]:
        return {name for name, p in self.named_parameters() if p.requires_grad}

    def state_dict(self, *args, **kwargs):
        prefix = kwargs.get("prefix", args[1] if len(args) > 1 else "")
        full = super().state_dict(*args, **kwargs)
        keep = self._trainable()
        for key in [k for k in full if k.removeprefix(prefix) not in keep]:
            del full[key]
        return full

    def load_state_dict(self, state_dict, strict: bool = True, assign: bool = False):
        given, wanted = set(state_dict), self._trainable()
        if strict and given != wanted:
            missing, extra = sorted(wanted - given), sorted(given - wanted)
            raise RuntimeError(f"the checkpoint's trainable tensors do not match this model: {len(missing)} "
                               f"missing ({', '.join(missing[:3])}), {len(extra)} unexpected ({', '.join(extra[:3])})")
        return super().load_state_dict(state_dict, strict=False, assign=assign)


# --- loss and score ----------------------------------------------------------------------------------------------
def forward_and_loss(model, batch, task_id, *, score_batch):
    """Training: the mean answer NLL over the examples with a gold answer and the teacher-forced exact answers.
    Validation: the same loss, as a `MeanLoss` over those examples (a row without a gold answer has no answer
    loss, but counts in the score), and the number of examples the task's iglue-hf rule gets right."""
    nll, right = model(batch["inputs"], batch["answer"], batch["answer_mask"])
    weight = batch["weight"].to(nll.dtype)
    labelled = weight.sum()
    loss = MeanLoss((nll * weight).sum() / labelled.clamp(min=1), labelled)
    n = len(batch["gold"])
    if model.training:
        return loss, (right & (weight > 0)).sum(), n, None
    return loss, score_batch(batch), n, None


def job_origin(spec, backend, plan, lora_config) -> dict:
    """What the trained model is, as the resume file records it (`TrainJob.origin`): LoRA's (`lora_origin`), or
    a full fine-tuning's parts."""
    if plan.mode == "lora":
        origin = lora_origin(spec, backend, lora_config)
        return dict(origin, **{"vision tower": "trained"}) if "vision" in plan.parts else origin
    return {"model": f"{spec.pinned} ({backend.model.config.model_type})", "fine-tuning": plan.describe()}


def lora_origin(spec, backend, lora_config) -> dict:
    """What the trained model is, as the resume file records it (`TrainJob.origin`)."""
    targets = lora_config.target_modules
    targets = [targets] if isinstance(targets, str) else sorted(targets)
    return {"model": f"{spec.pinned} ({backend.model.config.model_type})",
            "LoRA": f"r {lora_config.r} on {','.join(sorted({t.rsplit('.', 1)[-1] for t in targets}))} "
                    f"({len(targets)} modules)",
            "projector": "trained" if lora_config.modules_to_save else "frozen"}


def rule_score(backend, task: str, rule_name: str, batch) -> int:
    """Examples of `batch` the rule gets right: `Rule.score` then `Rule.predict`, as iglue-hf runs them."""
    from volta_ml.hf.loading import input_device
    rule = get_rule(task, rule_name)
    backend.device = input_device(backend.model)
    arrays = rule.score(backend, batch["images"], batch["prompts"], CONTEXT)
    return sum(p == g for p, g in zip(rule.predict(arrays, CONTEXT), batch["gold"]))


# --- export ------------------------------------------------------------------------------------------------------
def export_adapter(model: GenerativeForTraining, run_dir: Path, best) -> None:
    """`<run dir>/hf_best`: the adapter (peft's save_pretrained of the trained tensors), swapped in whole
    (`train.export_best`). Under --sharding fsdp every rank gathers, rank 0 writes."""
    state = gather_full_state(model)         # the trainable tensors only (GenerativeForTraining.state_dict)
    if state is not None:
        state = {key.removeprefix("peft."): value for key, value in state.items()}
        export_best(run_dir, lambda folder: model.peft.save_pretrained(folder, state_dict=state), best)


def export_model(model: GenerativeForTraining, run_dir: Path, best) -> None:
    """`<run dir>/hf_best` of a model fine-tuned in full: the whole model (save_pretrained, its frozen parts too)
    and its processor, which plain transformers and `volta-ml iglue-hf --backend mllm --model` load. Under
    --sharding fsdp every rank takes part and rank 0 writes one FSDP unit at a time (`hf.export.save_by_unit`:
    sharded safetensors and their index), never holding the whole model."""
    from volta_ml.hf import export
    if is_sharded(model.hf):
        if not dist.get_rank() == 0:
            export.save_by_unit(model.hf, None)
            return

        def write_units(folder: Path) -> None:
            export.save_by_unit(model.hf, folder)
            model.backend.processor.save_pretrained(folder)
        export_best(run_dir, write_units, best)
        return
    state = gather_full_state(model.hf)
    if state is not None:
        def write(folder: Path) -> None:
            model.hf.save_pretrained(folder, state_dict=state)
            model.backend.processor.save_pretrained(folder)
        export_best(run_dir, write, best)


# --- the job -----------------------------------------------------------------------------------------------------
def build_generative_job(args, info: DistInfo) -> TrainJob:
    from volta_ml.hf.loading import ModelLoadError
    from volta_ml.hf.generative import generative_backend

    spec = dataclasses.replace(model_spec(args), dtype=args.hf_dtype)   # frozen weights; LoRA tensors stay fp32
    if getattr(args, "sharding", "ddp") == "fsdp" and info.world_size > 1 and not info.is_main:
        spec = dataclasses.replace(spec, device="meta")   # rank 0 alone reads the weights (engine/sharding.py)
    family = lora.family(model_type(spec), spec.model)
    plan = finetune.plan(args)
    if plan.mode == "full" and args.hf_adapter:
        raise UsageError("--hf_adapter: an adapter is trained with --finetune lora (full fine-tuning starts from "
                         "a model: --hf_model)")
    task_id, entry, task = generative_entry(args)
    source = image_source(args, default_template(args, task))
    resolve_hyperparameters(args, entry, info.world_size)
    paths = {split: annotation_path(args, entry, task, split) for split in ("train", "val")}
    for split, path in paths.items():
        if not Path(path).is_file():
            raise UsageError(f"{entry['name']} {split} file {path} does not exist (give --{split}_annotations_jsonpath)")
    data = {split: read_task(task, path, args.hf_lang if split == "train" else "en") for split, path in paths.items()}
    data["train"] = [e for e in data["train"] if has_answer(e, task)]
    if not data["train"]:
        raise UsageError(f"{paths['train']}: no example with a gold answer")
    for split, path in paths.items():
        source.check(image_refs(data[split]), path)

    try:
        backend = generative_backend(spec)
    except ModelLoadError as error:
        raise UsageError(str(error)) from None
    if args.gradient_checkpointing:
        try:
            checkpoint_activations(backend.model)
        except ValueError as error:
            raise UsageError(f"--gradient_checkpointing: {error}") from None
    modules = finetune.part_modules(backend.model, family.projector, spec.model)
    if plan.mode == "lora":
        trained = lora.add_lora(backend.model, family, args, spec, plan.parts, modules)
    else:
        finetune.freeze_full(backend.model, modules, plan.parts)
        trained = backend.model
    rule = DEFAULT_RULES[task]
    layout = marvl_layout(backend, "auto") if task == "marvl" else None
    datasets = {}
    for split, examples in data.items():
        prompts = [user_turn(task, rule, e, layout, backend.vqa_frame) for e in examples]
        datasets[split] = AnswerDataset(examples, prompts, source, layout, backend, task, rule)
    inputs_backend = copy.copy(backend)        # the collate's: its tensors stay on the CPU (DataLoader workers)

    name = run_name(entry, spec, args)
    run_dir = Path(args.output_dir) / name
    lora_config = trained.peft_config["default"] if plan.mode == "lora" else None
    if info.is_main:
        prepare_run_dir(run_dir, args, f"{json.dumps(backend.model.config.to_dict(), default=str)}\n\n"
                                       + (json.dumps(lora_config.to_dict(), default=str) if lora_config
                                          else f"full fine-tuning: {plan.describe()}"))
    barrier(info)
    module = GenerativeForTraining(trained, backend)
    # --allow_adapter_base_mismatch: what the --hf_adapter's recorded base differs in (the summary records it)
    mismatch = (getattr(backend.model, "volta_loading_report", None) or {}).get("adapter_base_mismatch")
    if plan.mode == "lora":
        how = ((f"from {args.hf_adapter}: " if args.hf_adapter else "")
               + (f"(adapter base mismatch accepted: {mismatch}) " if mismatch else "")
               + f"LoRA r {lora_config.r}, alpha {lora_config.lora_alpha}, dropout {lora_config.lora_dropout}, "
               f"{len(lora_config.target_modules)} modules; " + plan.describe())
    else:
        how = plan.describe()
    return TrainJob(
        model=module, train_dataset=datasets["train"], val_dataset=datasets["val"],
        forward_and_loss=functools.partial(forward_and_loss,
                                           score_batch=functools.partial(rule_score, backend, task, rule)),
        task_id=task_id, task_name=entry["name"], run_dir=run_dir, tb_dir=Path(args.logdir) / name,
        collate_fn=Collate(inputs_backend),
        on_best_saved=lambda model, best: (export_adapter if plan.mode == "lora" else export_model)(model, run_dir,
                                                                                                  best),
        shard_units=finetune.shard_units,
        train_dtype=torch.float32 if args.hf_dtype == "bf16" and args.amp == "bf16" else None,
        param_groups=(functools.partial(finetune.param_groups_by_part, modules=modules, lrs=plan.lrs,
                                        weight_decay=args.weight_decay) if plan.lrs else None),
        origin=job_origin(spec, backend, plan, lora_config),
        summary={"hf model": f"{spec.pinned} ({backend.model.config.model_type}, prompt format: "
                             f"{backend.prompt_format})",
                 "fine-tuning": how + (", gradient checkpointing" if args.gradient_checkpointing else "")
                                + (", trained tensors in float32" if args.hf_dtype == "bf16" and args.amp == "bf16"
                                   else ""),
                 "data": f"train {paths['train']} ({len(data['train'])} examples with an answer), val {paths['val']}",
                 "images": f"{source.root} (template {source.template!r})"
                           + (f", MaRVL layout {layout}" if layout else ""),
                 "validation": f"iglue-hf {task} rule {rule!r}: {get_rule(task, rule).describe}",
                 "export": f"{run_dir / EXPORT_DIR} ("
                           + ("the adapter" if plan.mode == "lora" else "the whole model and its processor")
                           + ", save_pretrained at each new best)"},
    )
