"""A tiny learnable task for exercising the training engine without models or data files.

`python -m volta_ml.testing.toy_train <train_task.py flags> [--toy_* flags]` runs the real
engine (distributed start-up, loop, checkpoints, signals, final line) on generated
3-class data with a small MLP whose parameter names include `bias` and `LayerNorm`.
"""
from __future__ import annotations

import argparse
import os
import signal
import sys
import time
from pathlib import Path

import torch
from torch import nn
from torch.utils.data import Dataset

from volta_ml.engine.train import TrainJob
from volta_ml.engine.run_job import run
from volta_ml.cli.train_flags import add_train_flags

N_FEATURES, N_CLASSES = 8, 3


class ToyDataset(Dataset):
    """Examples whose label is the argmax of a fixed random projection: learnable by the MLP."""

    def __init__(self, count: int, seed: int):
        gen = torch.Generator().manual_seed(seed)
        self.x = torch.randn(count, N_FEATURES, generator=gen)
        projection = torch.randn(N_FEATURES, N_CLASSES, generator=torch.Generator().manual_seed(1234))
        self.y = (self.x @ projection).argmax(dim=1)

    def __len__(self):
        return len(self.x)

    def __getitem__(self, index):
        return {"features": self.x[index], "target": self.y[index]}


class FaultyToyDataset(ToyDataset):
    """Fails on the first item it loads in epoch `fail_epoch`: raises (`getitem`) or, inside a
    DataLoader worker, SIGKILLs that worker as the kernel's OOM killer would (`kill_worker`)."""

    def __init__(self, count: int, seed: int, fault: str, fail_epoch: int):
        super().__init__(count, seed)
        self.fault, self.fail_epoch, self.epoch = fault, fail_epoch, 0

    def set_epoch(self, epoch: int) -> None:  # the engine re-sends the dataset to the workers each epoch
        self.epoch = epoch

    def __getitem__(self, index):
        if self.epoch >= self.fail_epoch:
            print(f"toy fault {self.fault} at {time.time():.3f}", file=sys.stderr, flush=True)
            if self.fault == "kill_worker" and torch.utils.data.get_worker_info() is not None:
                os.kill(os.getpid(), signal.SIGKILL)
            raise IndexError(f"toy fault: item {index} of epoch {self.epoch} cannot be loaded")
        return super().__getitem__(index)


class ToyModel(nn.Module):
    def __init__(self, dropout: float, hidden: int = 32):
        super().__init__()
        self.encoder = nn.Linear(N_FEATURES, hidden)
        self.LayerNorm = nn.LayerNorm(hidden)
        self.dropout = nn.Dropout(dropout)
        self.classifier = nn.Linear(hidden, N_CLASSES)

    def forward(self, features):
        return self.classifier(self.dropout(torch.relu(self.LayerNorm(self.encoder(features)))))


def make_forward_and_loss(sleep: float = 0.0, nan_at_step: int = 0, fail_at_call: int = 0):
    calls = {"n": 0, "train": 0}

    def forward_and_loss(model, batch, task_id):
        calls["n"] += 1
        calls["train"] += model.training
        if sleep:
            time.sleep(sleep)
        if fail_at_call and calls["train"] == fail_at_call and model.training:
            print(f"toy fault forward at {time.time():.3f}", file=sys.stderr, flush=True)
            raise RuntimeError(f"toy fault: forward of training batch {fail_at_call} failed")
        logits = model(batch["features"]).float()
        target = nn.functional.one_hot(batch["target"], N_CLASSES).float()
        loss = nn.functional.binary_cross_entropy_with_logits(logits, target)  # VOLTA's tri-classifier loss
        if nan_at_step and calls["n"] == nan_at_step and model.training:
            loss = loss * float("nan")
        score_sum = (logits.argmax(dim=1) == batch["target"]).sum()
        return loss, score_sum, batch["target"].shape[0], logits

    return forward_and_loss


def add_toy_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--toy_examples", type=int, default=64)
    parser.add_argument("--toy_val_examples", type=int, default=40)
    parser.add_argument("--toy_dropout", type=float, default=0.1)
    parser.add_argument("--toy_sleep", type=float, default=0.0, help="seconds per forward (signal tests)")
    parser.add_argument("--toy_nan_at_call", type=int, default=0, help="make the loss NaN at this forward call")
    parser.add_argument("--toy_fail", choices=["forward", "getitem", "kill_worker"], default=None,
                        help="failure drill: raise in the forward at training call --toy_fail_at, or raise in / "
                             "SIGKILL the process loading the first item of epoch --toy_fail_at")
    parser.add_argument("--toy_fail_at", type=int, default=1)
    parser.add_argument("--toy_fail_rank", type=int, default=-1, help="only this rank fails (-1: every rank)")


def build_toy_job(args, info) -> TrainJob:
    args.batch_size = args.batch_size or 8
    args.num_epoch = args.num_epoch or 3
    args.lr = args.lr if args.lr is not None else 1e-2
    args.eval_batch_size = args.eval_batch_size or 16
    run_name = "Toy_toy" + (f"-{args.save_name}" if args.save_name else "")
    fault = args.toy_fail if args.toy_fail_rank in (-1, info.rank) else None
    train_set = (FaultyToyDataset(args.toy_examples, 1, fault, args.toy_fail_at) if fault in ("getitem", "kill_worker")
                 else ToyDataset(args.toy_examples, seed=1))
    return TrainJob(
        model=ToyModel(args.toy_dropout),
        train_dataset=train_set,
        val_dataset=ToyDataset(args.toy_val_examples, seed=2),
        forward_and_loss=make_forward_and_loss(args.toy_sleep, args.toy_nan_at_call,
                                               args.toy_fail_at if fault == "forward" else 0),
        task_id="TASK0", task_name="Toy",
        run_dir=Path(args.output_dir) / run_name,
        tb_dir=Path(args.logdir) / run_name,
    )


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="toy_train")
    add_train_flags(parser)
    add_toy_flags(parser)
    return parser.parse_args(argv)


def main(argv=None) -> int:
    return run(parse_args(argv), build_toy_job)


if __name__ == "__main__":
    sys.exit(main())
