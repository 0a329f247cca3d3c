"""`train_concap.py` / `train_concap_wiki.py` and `volta-ml pretrain` / `volta-ml pretrain-wiki`.

Every flag of VOLTA's two scripts is accepted with its name, type and default; volta-ml's engine flags are added
(`--amp`, `--device`, `--compile`, `--checkpoint_every_steps`, `--adam_impl`, `--bert_lr_scale`, ...). The flags
are then mapped onto the engine's names (`normalise`), so the run is the engine's: DDP under torchrun / Slurm,
bf16, gradient accumulation, exact resume, TensorBoard, VOLTA's log lines. Exit status as train_task.py
(docs/training.md, "When things go wrong"); the run prints no "Best Validation score" line (there is no score).
"""
from __future__ import annotations

import argparse
import sys

from volta_ml.options import SEED, VoltaArgumentParser, float_in, int_at_least

CONCAP_PROG, WIKI_PROG = "train_concap.py", "train_concap_wiki.py"


_betas = float_in(0, 1, open_high=True)   # each of --adam_betas, as torch's AdamW requires


def add_pretrain_flags(parser: argparse.ArgumentParser, wiki: bool) -> argparse.ArgumentParser:
    """VOLTA's flags of train_concap.py (`wiki=False`) or train_concap_wiki.py (`wiki=True`), then volta-ml's."""
    add = parser.add_argument_group("VOLTA's flags (train_concap_wiki.py)" if wiki else
                                    "VOLTA's flags (train_concap.py)").add_argument
    # Data
    add("--annotations_path", default="datasets/conceptual_caption/annotations", type=str,
        help="folder of caption_train.json / caption_valid.json")
    add("--features_path", default="datasets/conceptual_caption/imgfeats", type=str,
        help="folder of training_feat_all.lmdb (or training_feat_part_<rank>.lmdb) and validation_feat_all.lmdb")
    if wiki:
        add("--dataroot", default="datasets/wikipedia", type=str, help="folder of <lang>.20180201.txt files")
        add("--ann_files", default="datasets/wikipedia/txt/en.20180201.txt", type=str,
            help="comma-separated Wikipedia text files (accepted; VOLTA reads <dataroot>/<lang>.20180201.txt)")
        add("--lgs", type=str, default="en", help="languages lg1-lg2-... (ALL: every <lang>.20180201.txt)")
        add("--lg_sampling_factor", type=float_in(), default=-1,
            help="language sampling exponent (-1: languages drawn uniformly)")
    # Model
    if wiki:
        add("--m_pretrained", default="bert-base-uncased", type=str,
            help="text model (folder, or a hub id in the local Hugging Face cache): initial weights and tokenizer")
        add("--x_pretrained", default="", type=str,
            help="VOLTA checkpoint whose tensors (those under the config's v_layers, if it lists any) replace the "
                 "text initialisation")
    else:
        add("--from_pretrained", default="bert-base-uncased", type=str,
            help="text checkpoint to start from (folder or file; a hub id only if in the local Hugging Face "
                 "cache); '' for random weights")
    add("--config_file", type=str, default="config/vilbert_base.json", help="model config JSON (or shipped name)")
    add("--resume_file", default="", type=str, help="pytorch_ckpt_latest.tar to resume from")
    # Output
    add("--output_dir", default="checkpoints", type=str, help="checkpoints go to <output_dir>/<cfg>/")
    add("--logdir", default="logs", type=str, help="TensorBoard goes to <logdir>/<cfg>/")
    # Text
    if wiki:
        add("--max_m_seq_length", default=128, type=int_at_least(3), help="Wikipedia sequence length")
        add("--max_x_seq_length", default=36, type=int_at_least(3), help="caption sequence length")
    else:
        add("--max_seq_length", default=36, type=int_at_least(3), help="caption sequence length")
    # Training
    if wiki:
        add("--train_m_batch_size", default=512, type=int_at_least(1), help="Wikipedia batch (total)")
        add("--train_x_batch_size", default=512, type=int_at_least(1), help="Conceptual Captions batch (total)")
    else:
        add("--train_batch_size", default=512, type=int_at_least(1), help="total batch size")
    add("--learning_rate", default=1e-4, type=float_in(), help="initial learning rate")
    add("--gradient_accumulation_steps", dest="grad_acc_steps", type=int_at_least(1), default=1,
        help="micro-batches per optimizer step (the batch is divided by it)")
    add("--num_train_epochs", default=10.0, type=float_in(0), help="epochs (int(N) are run; N sizes the LR schedule)")
    # Scheduler
    add("--warmup_proportion", default=0.1, type=float_in(0, 1), help="warmup = proportion x optimizer steps")
    add("--warmup_steps", default=None, type=float_in(0), help="warmup steps (overrides the proportion; 0 = unset)")
    # Seed
    add("--seed", type=SEED, default=42)
    # Distributed
    add("--local_rank", type=int, default=-1, help="from old launch scripts; torchrun / Slurm need no flag")
    add("--num_workers", type=int_at_least(0), default=25, help="DataLoader workers (divided by world size)")
    add("--distributed", action="store_true",
        help="accepted (VOLTA: unused); under DDP each rank reads training_feat_part_<rank>.lmdb when present")
    # Objective
    add("--objective", default=0, type=int,
        help="0: with ITM loss; 1: with ITM loss, no masking objective for the not aligned pairs; "
             "2: without ITM loss, no negative pairs")
    # Optimizer
    add("--adam_epsilon", default=1e-8, type=float_in(0))
    add("--adam_betas", default=[0.9, 0.98], nargs="+", type=_betas)
    add("--weight_decay", default=0.01, type=float_in(0))
    add("--clip_grad_norm", default=0.0, type=float_in(0), help="clip the gradient norm when > 0")

    extra = parser.add_argument_group("volta-ml additions").add_argument
    extra("--bert_model", default=None, help="tokenizer folder (default: " + (
        "--m_pretrained" if wiki else "the config's bert_model") + "); never downloaded")
    extra("--do_lower_case", action="store_true", default=None, help="lower-case text (default: the config's key)")
    extra("--bert_lr_scale", type=float_in(0), default=0.1,
          help="lr multiplier of the tensors the text checkpoint initialised (VOLTA's intended 0.1; its scripts' "
               "name test matched none, so 1 reproduces the runs they made: docs/training.md, Pretraining)")
    extra("--amp", choices=["none", "bf16", "fp16"], default="none", help="mixed precision (torch.amp)")
    extra("--adam_impl", choices=["volta", "torch"], default="volta",
          help="volta: pytorch-transformers' AdamW exactly; torch: torch.optim.AdamW (fused on CUDA)")
    extra("--compile", action="store_true", help="torch.compile the model")
    extra("--checkpoint_every_steps", type=int_at_least(0), default=0,
          help="also write pytorch_ckpt_latest.tar every N optimizer steps (0: at epoch ends only)")
    extra("--num_val_workers", type=int_at_least(0), default=2, help="validation DataLoader workers (VOLTA: 2)")
    extra("--device", default=None, help="cpu, cuda or cuda:N (default: cuda if available)")
    extra("--cache_dir", default=None, help="where the encoded captions are kept between runs and ranks (default "
                                            "$VOLTA_ML_CACHE or ~/.cache/volta_ml/tokens)")
    extra("--no_cache", action="store_true", help="encode the captions file anew, keep nothing")
    return parser


def build_parser(wiki: bool = False, prog: str | None = None) -> argparse.ArgumentParser:
    parser = VoltaArgumentParser(prog=prog or (WIKI_PROG if wiki else CONCAP_PROG),
                                 description=_DESCRIPTIONS[wiki])
    return add_pretrain_flags(parser, wiki)


_DESCRIPTIONS = {
    False: "Pretrain a VOLTA model on Conceptual Captions (masked tokens, masked regions, image-text matching).",
    True: "Pretrain on Conceptual Captions with an interleaved Wikipedia MLM step per optimizer step.",
}


def normalise(args: argparse.Namespace, wiki: bool) -> argparse.Namespace:
    """VOLTA's names and semantics onto the engine's flags (`volta_ml.engine.train`), in place."""
    args.wiki = wiki
    if wiki:
        args.batch_size, args.max_seq_length = args.train_x_batch_size, args.max_x_seq_length
        args.init_checkpoint, args.init_flag = args.m_pretrained, "--m_pretrained"
    else:
        args.batch_size = args.train_batch_size
        args.init_checkpoint, args.init_flag, args.x_pretrained = args.from_pretrained, "--from_pretrained", ""
    args.lr = args.learning_rate
    args.num_epoch = int(args.num_train_epochs)            # VOLTA: range(int(num_train_epochs))
    args.optim_train_epochs = args.num_train_epochs        # VOLTA's schedule length uses the float
    args.warmup_steps = args.warmup_steps or None          # VOLTA: `warmup_steps or proportion * total`
    args.optim, args.adam_correct_bias, args.lr_scheduler = "AdamW", True, "warmup_linear"
    args.drop_last = True                                   # tensorpack's BatchData drops the remainder
    args.eval_steps, args.max_val_batches = sys.maxsize, -1   # no mid-epoch validation
    args.save_best_only, args.save_every_num_epochs = False, 1  # every epoch's pytorch_model_<epoch>.bin
    args.eval_batch_size = None                            # set from the per-step batch (VOLTA's val batch)
    return args


def parse_args(argv=None, wiki: bool = False) -> argparse.Namespace:
    args = build_parser(wiki).parse_args(sys.argv[1:] if argv is None else argv)
    return normalise(args, wiki)


def run_pretraining(args, prog: str) -> int:
    from volta_ml.engine.run_job import run
    from volta_ml.pretrain.job import build_pretrain_job
    return run(args, build_pretrain_job, prog)


def main(argv=None) -> int:
    return run_pretraining(parse_args(argv, wiki=False), CONCAP_PROG)


def main_wiki(argv=None) -> int:
    return run_pretraining(parse_args(argv, wiki=True), WIKI_PROG)


def register(subparsers) -> None:
    for name, wiki, script in (("pretrain", False, CONCAP_PROG), ("pretrain-wiki", True, WIKI_PROG)):
        parser = subparsers.add_parser(name, help=f"pretrain a VOLTA model ({script} flags)",
                                       description=_DESCRIPTIONS[wiki] + f" Same flags as {script}.")
        parser.__class__ = VoltaArgumentParser
        add_pretrain_flags(parser, wiki)
        parser.set_defaults(func=lambda args, wiki=wiki, name=name: run_pretraining(normalise(args, wiki),
                                                                                      f"volta-ml {name}"))
