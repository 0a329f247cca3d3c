"""Contrastive fine-tuning of a Hugging Face dual encoder (CLIP, SigLIP, SigLIP-2, M-CLIP) on IGLUE's retrieval
training data (English, or a few-shot file), as a `TrainJob` of the engine (`volta_ml.engine.train.train`:
optimiser groups, schedule, bf16, gradient accumulation, DDP, checkpoints, resume, failure handling, log lines
are all the engine's).

`volta-ml train --hf_model <folder or hub id[@revision]> --task 8|20 --images <image root> ...` builds it
(`volta_ml/cli/train_task.py`); docs/hf_models.md, "Fine-tuning a dual encoder".

- Data: the task config entry of `--task` (8: RetrievalFlickr30k, the train/valid files xFlickr&CO's English
  side comes from; 20: RetrievalWIT) gives the annotation files under `--data_root`, the batch size, LR and
  epochs, exactly as for the zoo (flags win). Rows are read by `iglue_hf.data.read_retrieval` and the images
  from `--images` with the task's path template (`iglue_hf.images`). `--hf_lang` is the language of the training
  file (IGLUE's few-shot files `xFlickrCO/annotations/<lang>/train_<shot>.jsonl`: `{lang}` in the template);
  the validation file is English (IGLUE's few-shot dev set is Flickr30k's `valid_ann.jsonl`).
- Training examples: one per image per epoch, with one of its captions drawn from (seed, epoch, image), so a
  batch never holds the same image twice (no false negatives from Flickr30k's 5 captions per image) and a
  resumed run draws the same captions.
- Model: `load_trainable` (CLIP family here, M-CLIP in `iglue_hf.mclip_train`); `--gradient_checkpointing`
  recomputes the trained towers' activations in the backward pass (`contrastive.enable_gradient_checkpointing`).
- Loss: `contrastive.infonce_loss` (CLIP, M-CLIP) or `contrastive.sigmoid_loss` (SigLIP), over the rows of this
  process against the columns of the whole global batch, gathered with gradients
  (`engine.distributed.gather_with_grad`): N processes with batch b train like one process with batch N*b.
- Validation score: text->image recall@1 (a fraction) within fixed galleries of `--hf_val_gallery` images of
  the validation file (each image with its first caption), so the number depends neither on the batch size
  nor on the number of processes. The training log's score is the in-batch text->image recall@1.
- Output: the engine's run directory (`<output_dir>/<task name>_<model name>[-<save_name>]`), plus `hf_best/`,
  the best model and its processor written each time a new best is saved (`save_pretrained`, safetensors;
  M-CLIP: its published layout, `mclip_train`),
  which `volta-ml iglue-hf --backend clip|mclip --model <run dir>/hf_best` evaluates and `--hf_model` starts from.
  `export_best` writes it (both kinds of HF models): swapped in whole, with the record of which best it holds
  (`volta_ml.hf.export`), so that a complete export is on disk at every instant after the first and a scorer
  reading one older than `pytorch_model_best.bin` (an export that failed) says so.
"""
from __future__ import annotations

import functools
import json
import logging
import random
from pathlib import Path

import torch
from torch.utils.data import Dataset

from volta_ml.engine.distributed import DistInfo, barrier, gather_with_grad
from volta_ml.engine.failures import UsageError
from volta_ml.engine.sharding import gather_full_state
from volta_ml.engine.task_job import resolve_hyperparameters
from volta_ml.atomic import finish_replace, replace_folder
from volta_ml.engine.train import SavedBest, TrainJob

from .contrastive import (LOSSES, DualEncoderForTraining, TrainableDualEncoder, enable_gradient_checkpointing,
                          pair_loss)
from .data import RetrievalData, read_retrieval
from .finetune import shard_units
from .images import DEFAULT_TEMPLATES, ImageSource

logger = logging.getLogger("volta_ml.train")

DEFAULT_TASKS_CONFIG = "config_tasks/vilbert_trainval_tasks.yml"   # train_task.py's default --tasks_config_file
HF_TASKS_CONFIG = "iglue_trainval_tasks_boxes36.yml"               # the shipped IGLUE config (paths, batch, LR)
TRAINABLE = {"8": "xflickrco", "20": "wit"}                        # task id -> images.DEFAULT_TEMPLATES key
EXPORT_DIR = "hf_best"


# --- the model spec and what it can train on -------------------------------------------------------------------
def model_spec(args):
    """`--hf_model PATH` or `HUB_ID[@REVISION]` as a `ModelSpec` (fp32 weights: bf16 is autocast, `--amp`)."""
    from volta_ml.hf import export
    from volta_ml.hf.base import ModelSpec
    model, revision = args.hf_model, None
    if "@" in model and not Path(model).expanduser().exists():
        model, revision = model.rsplit("@", 1)
    for folder in (model, getattr(args, "hf_adapter", None)):   # a run's hf_best older than its best: said
        export.check(folder)
    return ModelSpec(model=model, revision=revision, device="cpu", extra=dict(args.hf_extra or {}))


def model_type(spec) -> str | None:
    """config.json's `model_type` (one-line error when the folder or its config cannot be read)."""
    from volta_ml.hf.loading import ModelLoadError, read_config
    try:
        return read_config(spec).get("model_type")
    except ModelLoadError as error:
        raise UsageError(str(error)) from None


def training_kind(spec, backend: str | None) -> str:
    """"generative" (LoRA, `train_generative.py`) or "dual encoder" (this module), from `--hf_backend` or, without
    it, from config.json's `model_type` (a family LoRA fine-tunes: `lora.trainable`, the family table's rows with a
    projector)."""
    from .lora import trainable
    if backend not in (None, "clip", "mclip", "mllm"):
        raise UsageError(f"--hf_backend {backend!r}: unknown; known: clip (CLIP, SigLIP, SigLIP-2), mclip, mllm")
    if backend == "mllm" or (backend is None and trainable(model_type(spec))):
        return "generative"
    return "dual encoder"


def dual_encoder_loss(spec, backend: str | None) -> str:
    """The loss the model was trained with (M-CLIP: InfoNCE), from its config.json `model_type`; one-line errors
    otherwise."""
    from volta_ml.hf.families import fine_tuned
    kind = model_type(spec)
    if backend in ("clip", "mclip") and (backend == "mclip") != (kind == "M-CLIP"):
        raise UsageError(f"--hf_backend {backend}: {spec.model} has model_type {kind!r}")
    if kind == "M-CLIP":
        return "infonce"
    if kind not in LOSSES:
        raise UsageError(f"{spec.model}: model_type {kind!r} is not a dual encoder volta-ml can fine-tune "
                         f"(known: {', '.join(LOSSES)}, M-CLIP; generative families, --hf_backend mllm: "
                         f"{', '.join(fine_tuned())})")
    return LOSSES[kind]


def task_entry(args, trainable: dict, refusal: str) -> tuple[str, dict]:
    """(task id, resolved task config entry) for `--task` (a number or an IGLUE name) from the shipped IGLUE task
    config (or --tasks_config_file); a task not in `trainable` is `refusal` (formatted with key and name)."""
    from volta_ml.protocols.iglue import TASKS
    from volta_ml.tasks.config import PathResolver, get_task_entry, load_task_config
    task = str(args.task).strip().lower().removeprefix("task")
    task = TASKS[task].task_id if task in TASKS else task
    config_file = HF_TASKS_CONFIG if args.tasks_config_file == DEFAULT_TASKS_CONFIG else args.tasks_config_file
    key, entry = get_task_entry(load_task_config(config_file), task)
    if task not in trainable:
        raise UsageError(f"--task {args.task}: " + refusal.format(key=key, name=entry["name"]))
    return key, PathResolver(args.data_root, args.path_map).resolve_entry(entry)


def retrieval_entry(args) -> tuple[str, dict]:
    """`task_entry` for a dual encoder: a task it cannot train on is an error."""
    return task_entry(args, TRAINABLE, "{key} ({name}) is not a retrieval task; a dual encoder fine-tunes on "
                                       "--task 8 (xFlickrCO: Flickr30k's train file) or --task 20 (WIT)")


def run_name(entry: dict, spec, args) -> str:
    """`<task name>_<model folder name>[-<save_name>]`, the engine's run directory name for an HF model."""
    return f"{entry['name']}_{Path(spec.model.rstrip('/')).name}" + (f"-{args.save_name}" if args.save_name else "")


def image_source(args, default_template: str) -> ImageSource:
    if not args.images:
        raise UsageError("--hf_model: give --images, the folder of the training and validation images")
    if not Path(args.images).is_dir():
        raise UsageError(f"--images {args.images}: no such folder")
    return ImageSource(args.images, args.image_template or default_template)


# --- data --------------------------------------------------------------------------------------------------------
def _captions_per_image(data: RetrievalData) -> list[list[str]]:
    out = [[] for _ in data.images]
    for caption, image in zip(data.captions, data.caption_image):
        out[image].append(caption)
    return out


def _pixels(image_processor, image) -> dict:
    return {k: v[0] for k, v in image_processor(images=[image], return_tensors="pt").items()}


class PairDataset(Dataset):
    """Training pairs: image i with one of its captions, drawn from (seed, epoch, i)."""

    def __init__(self, data: RetrievalData, source: ImageSource, image_processor, seed: int):
        self.images, self.captions = data.images, _captions_per_image(data)
        self.source, self.image_processor, self.seed, self.epoch = source, image_processor, seed, 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self):
        return len(self.images)

    def __getitem__(self, index):
        captions = self.captions[index]
        caption = captions[random.Random(f"{self.seed}/{self.epoch}/{index}").randrange(len(captions))]
        return {"text": caption, "image": _pixels(self.image_processor, self.source.load(self.images[index]))}


class GalleryDataset(Dataset):
    """Validation galleries: item k is images k*G .. (k+1)*G-1 (the last one may be smaller), each with its
    first caption."""

    def __init__(self, data: RetrievalData, source: ImageSource, image_processor, gallery: int):
        self.images, self.captions = data.images, _captions_per_image(data)
        self.source, self.image_processor, self.gallery = source, image_processor, gallery

    def __len__(self):
        return -(-len(self.images) // self.gallery)

    def __getitem__(self, index):
        rows = range(index * self.gallery, min((index + 1) * self.gallery, len(self.images)))
        return [{"text": self.captions[i][0], "image": _pixels(self.image_processor, self.source.load(self.images[i]))}
                for i in rows]


class Collate:
    """Tokenises the captions as the iglue-hf backend does (SigLIP: padded to the model's length) and stacks
    the pixel tensors; validation galleries are flattened with their gallery number in `gallery`."""

    def __init__(self, tokenizer, max_length: int, padding):
        self.tokenizer, self.max_length, self.padding = tokenizer, max_length, padding

    def __call__(self, items):
        batch = {}
        if isinstance(items[0], list):
            batch["gallery"] = torch.tensor([g for g, gallery in enumerate(items) for _ in gallery])
            items = [pair for gallery in items for pair in gallery]
        text = self.tokenizer([item["text"] for item in items], padding=self.padding, truncation=True,
                              max_length=self.max_length, return_tensors="pt")
        batch["text_inputs"] = dict(text)
        batch["image_inputs"] = {k: torch.stack([item["image"][k] for item in items]) for k in items[0]["image"]}
        return batch


# --- loss and score ----------------------------------------------------------------------------------------------
def forward_and_loss(model, batch, task_id, *, loss: str, info: DistInfo):
    """Training batch: this rank's rows against the gathered global batch. Validation batch: per gallery."""
    text, image, scale, bias = model(batch["text_inputs"], batch["image_inputs"])
    with torch.autocast(text.device.type, enabled=False):   # the similarities and the loss in float32
        if "gallery" in batch:
            return _gallery_loss_and_score(loss, text, image, scale, bias, batch["gallery"])
        all_text, all_image = gather_with_grad(text, info), gather_with_grad(image, info)
        offset = info.rank * text.shape[0] if all_text.shape[0] != text.shape[0] else 0
        value = pair_loss(loss, text, image, all_text, all_image, scale, bias, offset)
        with torch.no_grad():
            own = torch.arange(offset, offset + text.shape[0], device=text.device)
            correct = ((text @ all_image.T).argmax(dim=1) == own).sum()
    return value, correct, text.shape[0], None


def _gallery_loss_and_score(loss, text, image, scale, bias, gallery):
    """Loss per gallery weighted by its size, and text->image R@1 within each gallery."""
    similarity = (text @ image.T).masked_fill(gallery[:, None] != gallery[None, :], float("-inf"))
    correct = (similarity.argmax(dim=1) == torch.arange(len(text), device=text.device)).sum()
    total = text.new_zeros(())
    for g in gallery.unique():
        rows = gallery == g
        total = total + pair_loss(loss, text[rows], image[rows], text[rows], image[rows], scale, bias) * rows.sum()
    return total / len(text), correct, len(text), None


# --- the model ---------------------------------------------------------------------------------------------------
def load_trainable(spec, loss: str, args) -> TrainableDualEncoder:
    """The model of `spec` wrapped for training; one-line `UsageError`s for what cannot be loaded or asked of it."""
    from transformers import AutoModel, AutoProcessor

    from volta_ml.hf.loading import ModelLoadError, load_model, load_processor, read_config
    mclip = read_config(spec).get("model_type") == "M-CLIP"
    if not mclip and (args.hf_temperature is not None or args.hf_train_image_tower):
        flag = "--hf_temperature" if args.hf_temperature is not None else "--hf_train_image_tower"
        raise UsageError(f"{flag}: M-CLIP only (CLIP and SigLIP train their own logit scale and both towers)")
    if args.hf_temperature is not None and not args.hf_temperature > 0:
        raise UsageError(f"--hf_temperature {args.hf_temperature}: must be > 0")
    try:
        if mclip:
            from .mclip_train import load_mclip
            return load_mclip(spec, args.hf_temperature, args.hf_train_image_tower)
        hf_model = load_model(AutoModel, spec, "a CLIP-family dual encoder")
        processor = load_processor(AutoProcessor, spec)
    except ModelLoadError as error:
        raise UsageError(str(error)) from None

    def save(folder: Path, state: dict) -> None:
        hf_model.save_pretrained(folder, state_dict={k.removeprefix("hf."): v for k, v in state.items()})
        processor.save_pretrained(folder)

    text_config = getattr(hf_model.config, "text_config", hf_model.config)
    return TrainableDualEncoder(
        module=DualEncoderForTraining(hf_model, loss), loss=loss, tokenizer=processor.tokenizer,
        image_processor=processor.image_processor, max_length=int(text_config.max_position_embeddings),
        padding="max_length" if loss == "sigmoid" else True, config=hf_model.config.to_dict(),
        family=hf_model.config.model_type, save=save)


# --- export ------------------------------------------------------------------------------------------------------
def export_best(run_dir: Path, write, best: SavedBest) -> None:
    """`<run dir>/hf_best`: what `write(folder)` saves, plus the record of which best it holds (`hf.export`),
    swapped in whole (`atomic.replace_folder`): a failure or a kill leaves the previous export complete, a full
    disk is one line naming the file (exit 4)."""
    from volta_ml.hf import export

    def write_with_record(folder: Path) -> None:
        write(folder)
        export.write_record(folder, best.checkpoint, best.epoch, best.global_step, best.score)
    replace_folder(run_dir / EXPORT_DIR, write_with_record)


def prepare_run_dir(run_dir: Path, args, described: str) -> None:
    """Rank 0: the run directory, `command.txt`, and an export swap a kill interrupted finished."""
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "command.txt").write_text(f"{args!r}\n\n{described}\n", encoding="utf-8")
    finish_replace(run_dir / EXPORT_DIR)


def export_dual_encoder(module, model: TrainableDualEncoder, run_dir: Path, best: SavedBest) -> None:
    """`<run dir>/hf_best` from the trained module's whole state (gathered: under --sharding fsdp every rank calls
    this, rank 0 writes), through `export_best`."""
    state = gather_full_state(module)
    if state is not None:
        export_best(run_dir, lambda folder: model.save(folder, state), best)


# --- the job -----------------------------------------------------------------------------------------------------
def build_dual_encoder_job(args, info: DistInfo) -> TrainJob:
    from volta_ml.tasks.config import entry_path

    spec = model_spec(args)
    loss = dual_encoder_loss(spec, args.hf_backend)
    if args.hf_dtype != "fp32":
        raise UsageError(f"--hf_dtype {args.hf_dtype}: a dual encoder trains all its weights, kept in fp32 "
                         "(use --amp bf16 for bf16 compute)")
    if args.train_parts or args.part_lr:
        raise UsageError(f"{'--train_parts' if args.train_parts else '--part_lr'}: generative models only (a dual "
                         f"encoder trains both towers; M-CLIP its text tower, and with --hf_train_image_tower its "
                         f"image tower)")
    task_id, entry = retrieval_entry(args)
    task_key = TRAINABLE[task_id.removeprefix("TASK")]
    source = image_source(args, DEFAULT_TEMPLATES[task_key])
    if args.hf_val_gallery < 2:
        raise UsageError(f"--hf_val_gallery {args.hf_val_gallery}: a gallery needs at least 2 images")
    resolve_hyperparameters(args, entry, info.world_size)
    paths = {split: entry_path(entry, f"{split}_annotations_jsonpath", getattr(args, f"{split}_annotations_jsonpath"))
             for split in ("train", "val")}
    data = {split: read_retrieval(path, args.hf_lang if split == "train" else "en") for split, path in paths.items()}
    for split, path in paths.items():
        source.check(data[split].images, path)
    if min(len(data["train"].images), args.batch_size // args.grad_acc_steps) < 2:
        logger.warning("%s: one image per batch: the in-batch contrastive loss is 0 and the model will not change",
                       paths["train"])

    model = load_trainable(spec, loss, args)
    checkpointed = enable_gradient_checkpointing(model.module) if args.gradient_checkpointing else []
    collate = Collate(model.tokenizer, model.max_length, model.padding)
    train_set = PairDataset(data["train"], source, model.image_processor, args.seed)
    val_set = GalleryDataset(data["val"], source, model.image_processor, args.hf_val_gallery)

    name = run_name(entry, spec, args)
    run_dir = Path(args.output_dir) / name
    if info.is_main:
        prepare_run_dir(run_dir, args, json.dumps(model.config, default=str))
    barrier(info)
    return TrainJob(
        model=model.module, train_dataset=train_set, val_dataset=val_set,
        forward_and_loss=functools.partial(forward_and_loss, loss=loss, info=info),
        task_id=task_id, task_name=entry["name"], run_dir=run_dir, tb_dir=Path(args.logdir) / name,
        collate_fn=collate,
        on_best_saved=lambda module, best: export_dual_encoder(module, model, run_dir, best),
        shard_units=shard_units,
        origin={"model": f"{spec.pinned} ({model.family})"},
        summary={"hf model": f"{spec.pinned} ({model.family}, {loss} loss"
                             + (f", gradient checkpointing in {', '.join(checkpointed)}" if checkpointed else "") + ")",
                 "data": f"train {paths['train']} ({args.hf_lang}, {len(data['train'].images)} images, one caption "
                         f"each per epoch), val {paths['val']}",
                 "images": f"{source.root} (template {source.template!r})",
                 "validation": f"text->image R@1 in galleries of {args.hf_val_gallery} images (first caption)",
                 "export": f"{run_dir / EXPORT_DIR} (written at each new best)"},
    )
