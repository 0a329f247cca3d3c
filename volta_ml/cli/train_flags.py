"""train_task.py's flags: IGLUE-VOLTA's set (specs/pipeline.md §a.1) plus volta-ml's additions.

Model, task and volta-ml-extra flags come from `volta_ml.cli.flags` (shared with eval_task.py), with
train_task's own defaults (`--seed 0`, `--config_file config/vilbert_base.json`). Both tokenizer styles
work: IGLUE-VOLTA's `--bert_model/--do_lower_case` flags and VOLTA-HEAD's config JSON keys.
A repeated flag keeps its last value; a trailing bare `deactivate` is dropped with a warning.
"""
from __future__ import annotations

import argparse
import sys

from volta_ml.cli.flags import (
    VoltaArgumentParser, add_model_flags, add_task_flags, add_volta_ml_flags, float_in, int_at_least,
)


def backend_options(text: str) -> dict:
    """`--hf_extra`'s type: `volta_ml.hf.base.backend_options`, imported when the flag is given (torch loads then)."""
    from volta_ml.hf.base import backend_options as parse
    return parse(text)


def add_train_flags(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    add_model_flags(parser)
    add_task_flags(parser)
    add_volta_ml_flags(parser)
    parser.set_defaults(seed=0, config_file="config/vilbert_base.json")

    # "resolve": --amp and --device replace the shared definitions with training's choices
    group = parser.add_argument_group("training", conflict_handler="resolve")

    def add(name, **kwargs):
        group.add_argument(name, **kwargs)

    # --- IGLUE-VOLTA flags -------------------------------------------------------------
    add("--resume_file", default="", help="pytorch_ckpt_latest.tar to resume from; ignored if missing")
    add("--output_dir", default="save", help="checkpoint root")
    add("--logdir", default="logs", help="TensorBoard root")
    add("--save_name", default="", help="suffix -<save_name> of the run directory")
    add("--save_best_only", action="store_true", help="no per-epoch pytorch_model_<epoch>.bin on non-best epochs")
    add("--save_every_num_epochs", type=int_at_least(1), default=1, help="save non-best epochs when (epoch+1) %% N == 0")
    add("--train_split", default="", help="overrides the task config train_split")
    add("--val_split", default="", help="overrides the task config val_split")
    add("--train_annotations_jsonpath", default="", help="overrides the training annotations path")
    add("--val_annotations_jsonpath", default="", help="overrides the validation annotations path")
    add("--train_features_lmdbpath", default="", help="feature store for the training set only")
    add("--num_epoch", type=int_at_least(0), default=None, help="epochs to run (default: the task config num_epoch)")
    add("--optim_train_epochs", type=int_at_least(1), default=20, help="epochs used ONLY to size the LR schedule")
    add("--gradient_accumulation_steps", dest="grad_acc_steps", type=int_at_least(1), default=1,
        help="micro-batches per optimizer step; the batch size is divided by it")
    add("--batch_size", type=int_at_least(1), default=None, help="effective batch (default: task config batch_size)")
    add("--eval_batch_size", type=int_at_least(1), default=None, help="validation batch (default: task config, then train batch)")
    add("--max_val_batches", type=int, default=-1, help="epoch-end validation evaluates N-1 batches (VOLTA)")
    add("--eval_steps", type=int_at_least(2), default=sys.maxsize, help="mid-epoch validation period (VOLTA's rule)")
    add("--cache", type=int, default=5000, help="serialized loaders: shuffle/prefetch buffer")
    add("--lr", type=float_in(), default=None, help="learning rate (default: task config lr)")
    add("--lr_scheduler", default="warmup_linear", help="warmup_linear, anything else: warmup then constant")
    add("--warmup_proportion", type=float_in(0, 1), default=0.1, help="warmup steps = proportion x total steps")
    add("--warmup_steps", type=float_in(0), default=None, help="absolute warmup steps (overrides the proportion)")
    add("--num_workers", type=int_at_least(0), default=16, help="training DataLoader workers (divided by world size)")
    add("--num_val_workers", type=int_at_least(0), default=2, help="validation DataLoader workers")
    add("--optim", default="AdamW", help="AdamW or RAdam")
    add("--adam_epsilon", type=float_in(0), default=1e-6)
    add("--adam_betas", type=float_in(0, 1, open_high=True), nargs="+", default=[0.9, 0.999])
    add("--adam_correct_bias", action="store_true", help="Adam bias correction (VOLTA default: off)")
    add("--weight_decay", type=float_in(0), default=0.01)
    add("--clip_grad_norm", type=float_in(0), default=0.0, help="clip the total gradient norm when > 0")

    # --- volta-ml additions ------------------------------------------------------------
    add("--amp", choices=["none", "bf16", "fp16"], default="none",
        help="mixed precision with torch.amp (fp16 adds gradient scaling); off by default")
    add("--adam_impl", choices=["volta", "torch"], default="volta",
        help="volta: pytorch-transformers' AdamW exactly; torch: torch.optim.AdamW (fused on CUDA), "
             "close to but not bit-identical with VOLTA")
    add("--compile", action="store_true",
        help="torch.compile the model (the first steps compile; pays off on long runs, see docs/training.md)")
    add("--checkpoint_every_steps", type=int_at_least(0), default=0,
        help="also write pytorch_ckpt_latest.tar every N optimizer steps (0: at epoch ends only)")
    add("--device", default=None, help="cpu, cuda or cuda:N (default: cuda if available; under torchrun/Slurm "
                                       "each process takes cuda:<local rank>)")
    add("--sharding", choices=["ddp", "fsdp"], default="ddp",
        help="ddp: every process holds the whole model (DistributedDataParallel); fsdp: FSDP2 shards parameters, "
             "gradients and optimizer state over the processes, one unit per decoder layer / vision block "
             "(Hugging Face models, --hf_model; --amp bf16 is then FSDP's bf16 parameters with fp32 gradient "
             "reduction; resume files are sharded; docs/hf_models.md)")
    add("--fsdp_offload", action="store_true",
        help="--sharding fsdp: keep the sharded parameters, gradients and optimizer state in CPU memory")

    # --- a Hugging Face model instead of a VOLTA model (volta_ml/iglue_hf/train.py, train_generative.py) -----
    hf = parser.add_argument_group("Hugging Face models (docs/hf_models.md)")
    hf.add_argument("--hf_model", default="", help="fine-tune this Hugging Face folder or hub id[@revision] instead "
                                                   "of --config_file/--from_pretrained: a CLIP / SigLIP / SigLIP-2 / "
                                                   "M-CLIP dual encoder (contrastive) or a generative model (LoRA)")
    hf.add_argument("--hf_backend", default=None, help="clip, mclip (dual encoders) or mllm (generative models); "
                                                       "default: detected from config.json")
    hf.add_argument("--images", default="", help="image root of the training and validation images")
    hf.add_argument("--image_template", default=None, help="image path under --images with {id} {file} "
                                                           "(default per task, as volta-ml iglue-hf; NLVR2: {file})")
    hf.add_argument("--hf_val_gallery", type=int_at_least(2), default=100,
                    help="dual encoders' validation score: text->image R@1 within galleries of this many images")
    hf.add_argument("--hf_lang", default="en",
                    help="language of the training file (a few-shot file xFlickrCO/annotations/<lang>/"
                         "train_<shot>.jsonl): {lang} of the image template")
    hf.add_argument("--hf_extra", type=backend_options, default=None, metavar="JSON",
                    help="backend options, as volta-ml iglue-hf --extra: M-CLIP's "
                         '\'{"image_model": ..., "text_base": ...}\'')
    hf.add_argument("--hf_temperature", type=float_in(), default=None,
                    help="M-CLIP: fixed InfoNCE temperature (default 0.01: CLIP's final logit scale 100)")
    hf.add_argument("--hf_train_image_tower", action="store_true",
                    help="M-CLIP: train the CLIP image tower too (frozen by default; hf_best/ then holds a copy)")
    hf.add_argument("--gradient_checkpointing", action="store_true",
                    help="recompute each layer's activations in the backward pass (transformers' activation "
                         "checkpointing): less memory, about a third more time")
    hf.add_argument("--hf_dtype", choices=["fp32", "bf16"], default="fp32",
                    help="generative models: the dtype of the frozen base weights (bf16 halves their memory; the "
                         "LoRA tensors stay fp32; combine with --amp bf16)")
    lora = parser.add_argument_group("Fine-tuning generative models: LoRA or full (volta_ml/iglue_hf/lora.py, "
                                     "finetune.py)")
    lora.add_argument("--finetune", choices=["lora", "full"], default="lora",
                      help="lora: adapters on the language model (plus the --train_parts trained in full); full: "
                           "every weight of the --train_parts")
    lora.add_argument("--train_parts", default=None,
                      help="comma-separated parts trained: vision, projector, language (default: language with "
                           "LoRA, language,projector with --finetune full)")
    lora.add_argument("--part_lr", default=None, metavar="PART=LR,...",
                      help="a learning rate per part, e.g. vision=2e-6,projector=1e-4 (the others: --lr)")
    lora.add_argument("--lora_r", type=int_at_least(1), default=8, help="LoRA rank")
    lora.add_argument("--lora_alpha", type=float_in(0, open_low=True), default=16, help="LoRA scale numerator (scale = alpha / r)")
    lora.add_argument("--lora_dropout", type=float_in(0, 1, open_high=True), default=0.05, help="dropout on LoRA's input")
    lora.add_argument("--lora_target", default=None,
                      help="comma-separated names of the language model's linear layers LoRA adapts "
                           "(default per family: q_proj,v_proj)")
    lora.add_argument("--train_projector", action="store_true",
                      help="also train the multimodal projector in full (saved with the adapter); "
                           "= adding projector to --train_parts")
    lora.add_argument("--hf_adapter", default="", help="start from this saved adapter folder (e.g. <run dir>/hf_best "
                                                       "of an English run, for few-shot) instead of a new LoRA")
    lora.add_argument("--allow_adapter_base_mismatch", action="store_true",
                      help="start from an --hf_adapter that records another base model than --hf_model (refused "
                           "otherwise; recorded in the run's summary)")
    return parser


def build_parser() -> argparse.ArgumentParser:
    parser = VoltaArgumentParser(prog="train_task.py",
                                 description="Fine-tune a VOLTA model on one task (IGLUE-VOLTA compatible).")
    return add_train_flags(parser)


def parse_train_args(argv: list[str] | None = None) -> argparse.Namespace:
    return build_parser().parse_args(sys.argv[1:] if argv is None else argv)
