"""Shared helpers of the tests/test_train_*.py files: run the toy task through the real engine."""
import os
import socket
import subprocess
import sys
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]

BASE_FLAGS = ["--num_workers", "0", "--num_val_workers", "0", "--adam_correct_bias", "--weight_decay", "0.0001",
              "--clip_grad_norm", "1.0", "--warmup_proportion", "0.1", "--adam_epsilon", "1e-6"]


def toy_env(**extra):
    env = dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore")
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "SLURM_NTASKS", "SLURM_PROCID"):
        env.pop(key, None)
    env.update(extra)
    return env


def toy_argv(out: Path, *flags):
    return [sys.executable, "-m", "volta_ml.testing.toy_train", "--output_dir", str(out / "save"),
            "--logdir", str(out / "logs"), *BASE_FLAGS, *flags]


def run_toy(out: Path, *flags, timeout=120, **env):
    return subprocess.run(toy_argv(out, *flags), cwd=out, env=toy_env(**env), capture_output=True, text=True,
                          timeout=timeout)


def run_dir(out: Path) -> Path:
    return out / "save" / "Toy_toy"


def load_weights(path: Path) -> dict:
    return torch.load(path, map_location="cpu", weights_only=True)


def assert_same_weights(a: dict, b: dict, exact=True, atol=1e-6):
    assert a.keys() == b.keys()
    for key in a:
        if exact:
            assert torch.equal(a[key], b[key]), f"{key} differs"
        else:
            torch.testing.assert_close(a[key], b[key], atol=atol, rtol=1e-5, msg=f"{key} differs")


def toy_args(out: Path, *flags):
    from volta_ml.testing.toy_train import parse_args
    return parse_args(["--output_dir", str(out / "save"), "--logdir", str(out / "logs"), *BASE_FLAGS, *flags])


def run_toy_inprocess(out: Path, *flags) -> int:
    from volta_ml.cli.train_task import run
    from volta_ml.testing.toy_train import build_toy_job
    return run(toy_args(out, *flags), build_toy_job)


def free_port() -> int:
    """A TCP port nobody listens on now, for a torchrun rendezvous."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]
