"""Failure drills of train_task.py's engine (issue #14): every error ends the job within 60 s, non-zero, with
a one-line cause as the last stderr line, no process left behind and the last good checkpoint intact.

The toy task (`volta_ml.testing.toy_train`) runs the real engine with an injected fault: an exception in
the forward, one in a dataset `__getitem__` (inside a worker when there are workers), a worker SIGKILLed
as by the OOM killer, a NaN loss, a full disk while saving; with 0, 2 and 10 DataLoader workers; and a
2-process gloo DDP job (torchrun and Slurm's variables) where one rank raises at step k.
"""
from __future__ import annotations

import sys
import threading

import pytest

from helpers_drills import assert_failed_cleanly, drill, full_disk_argv
from helpers_train import free_port as _free_port, run_dir, toy_argv, toy_env
from volta_ml.engine import checkpointing as ckpt

EPOCH = 8          # training forwards per epoch: 64 toy examples, batch 8
VAL = 3            # validation forwards per epoch: 40 toy examples, batch 16
# every fault strikes in epoch 1, so the last good checkpoint is the one saved at the end of epoch 0
FAULTS = {
    "forward": (["--toy_fail", "forward", "--toy_fail_at", str(EPOCH + 3)], 1, "toy fault: forward"),
    "getitem": (["--toy_fail", "getitem", "--toy_fail_at", "1"], 1, "toy fault: item"),
    "kill_worker": (["--toy_fail", "kill_worker", "--toy_fail_at", "1"], 1, "DataLoader worker"),
    "nan": (["--toy_nan_at_call", str(EPOCH + VAL + 3)], 3, "training loss is nan"),  # counts validation calls
}


def _check_last_good(folder, resume_epoch: int) -> None:
    state = ckpt.load_latest(folder / ckpt.LATEST_NAME)     # loads: not truncated
    assert state["resume_epoch"] == resume_epoch
    assert not list(folder.glob(".*.tmp")), "a half-written checkpoint was left"


# each fault in the main process (0 workers, except kill_worker: no worker to kill) and with workers; forward-2 also
# resumes
WORKERS = {"forward": (0, 2), "getitem": (0, 10), "kill_worker": (2, 10), "nan": (0, 10)}


@pytest.mark.parametrize("fault,workers", [(fault, workers) for fault in sorted(FAULTS) for workers in WORKERS[fault]])
def test_training_fault_ends_the_job(tmp_path, fault, workers):
    flags, code, cause = FAULTS[fault]
    result = drill(toy_argv(tmp_path, "--num_workers", str(workers), *flags), toy_env(), tmp_path)
    assert_failed_cleanly(result, code, cause)
    _check_last_good(run_dir(tmp_path), resume_epoch=1)
    if fault != "nan":
        assert result.seconds_after_fault() < 30
    if fault == "forward" and workers == 2:   # the documented recovery: the same command plus --resume_file
        again = drill(toy_argv(tmp_path, "--num_workers", "2", "--resume_file",
                               str(run_dir(tmp_path) / ckpt.LATEST_NAME)), toy_env(), tmp_path)
        assert again.returncode == 0, again.stderr[-3000:]
        assert "Resumed from" in again.stderr and again.stdout.startswith("Best Validation score: ")


@pytest.mark.parametrize("workers", [0, 10])
def test_full_disk_while_saving_keeps_the_last_checkpoint(tmp_path, workers):
    """The disk fills up during epoch 1 (0.4 s after epoch 0's saves, epoch 1 takes >= 1.6 s): epoch 1's
    save fails, epoch 0's resume file stays loadable."""
    disk = tmp_path / "disk"
    disk.mkdir()
    folder = disk / "save" / "Toy_toy"
    argv = toy_argv(tmp_path, "--num_workers", str(workers), "--toy_sleep", "0.2", "--num_epoch", "2")
    argv[argv.index("--output_dir") + 1] = str(disk / "save")
    wrapped = full_disk_argv(disk, folder / "pytorch_model_0.bin", tmp_path / "kept", argv, delay=0.4)
    if wrapped is None:
        pytest.skip("needs `unshare -rm` (user namespaces) for a tiny tmpfs, or a non-root user for chmod")
    result = drill(wrapped, toy_env(), tmp_path)
    assert_failed_cleanly(result, 4, "cannot write")
    assert "pytorch_model_" in result.last_line and "is unchanged" in result.last_line
    _check_last_good(tmp_path / "kept", resume_epoch=1)



DDP_FAULT = ["--num_workers", "2", "--toy_fail", "forward", "--toy_fail_at", str(EPOCH + 3), "--toy_fail_rank", "1"]


def test_ddp_torchrun_one_rank_raising_ends_both(tmp_path):
    argv = toy_argv(tmp_path, *DDP_FAULT)
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
                "--master_port", str(_free_port()), "-m", "volta_ml.testing.toy_train", *argv[3:]]
    result = drill(torchrun, toy_env(), tmp_path)
    assert result.returncode != 0
    assert "train_task.py: error: RuntimeError: toy fault: forward of training batch 11" in result.stderr
    assert not result.leftovers, result.leftovers
    assert result.seconds_after_fault() < 30
    _check_last_good(run_dir(tmp_path), resume_epoch=1)


def test_ddp_slurm_one_rank_raising_ends_both(tmp_path):
    port, results = str(_free_port()), []

    def rank(r):
        env = toy_env(SLURM_NTASKS="2", SLURM_PROCID=str(r), SLURM_LOCALID=str(r), SLURM_JOB_ID="4343",
                      SLURM_JOB_NODELIST="localhost", MASTER_PORT=port)
        results.append((r, drill(toy_argv(tmp_path, *DDP_FAULT), env, tmp_path)))

    threads = [threading.Thread(target=rank, args=(r,)) for r in (0, 1)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    outcome = dict(results)
    assert_failed_cleanly(outcome[1], 1, "RuntimeError: toy fault: forward")
    assert_failed_cleanly(outcome[0], 1, "another process of the job failed")   # rank 0 waited in a collective
    fault_time = float(outcome[1].stderr.split("toy fault forward at ")[1].split()[0])
    assert max(o.ended for o in outcome.values()) - fault_time < 30
    _check_last_good(run_dir(tmp_path), resume_epoch=1)
