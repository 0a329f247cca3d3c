"""Never losing work: SIGKILL + resume gives the uninterrupted weights; SIGTERM/SIGUSR1 save and exit."""
import random
import signal
import subprocess
import time

import pytest
import torch

from helpers_train import assert_same_weights, load_weights, run_dir, run_toy, toy_argv, toy_env

# 92 examples at 4 per micro-batch = 23 micro-batches with grad-acc 2: an odd count, so VOLTA's
# leftover gradients carry across epochs and the resume file must hold them too.
FLAGS = ["--toy_examples", "92", "--batch_size", "8", "--gradient_accumulation_steps", "2", "--num_epoch", "3",
         "--checkpoint_every_steps", "1", "--toy_dropout", "0.2"]


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    out = tmp_path_factory.mktemp("reference")
    proc = run_toy(out, *FLAGS)
    assert proc.returncode == 0, proc.stderr
    return load_weights(run_dir(out) / "pytorch_model_2.bin")


def _start_slow_run(out, sleep="0.03"):
    proc = subprocess.Popen(toy_argv(out, *FLAGS, "--toy_sleep", sleep), cwd=out, env=toy_env(),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    marker = run_dir(out) / "out.txt"
    deadline = time.time() + 60
    while not marker.exists() and time.time() < deadline:  # out.txt appears once training starts
        time.sleep(0.05)
    assert marker.exists(), "training never started"
    return proc


def _resume(out):
    proc = run_toy(out, *FLAGS, "--resume_file", str(run_dir(out) / "pytorch_ckpt_latest.tar"))
    assert proc.returncode == 0, proc.stderr
    assert "Resumed from" in proc.stderr
    return load_weights(run_dir(out) / "pytorch_model_2.bin")


def test_sigkill_at_random_step_then_resume_matches_uninterrupted_run(tmp_path, reference):
    proc = _start_slow_run(tmp_path)
    time.sleep(random.uniform(0.2, 1.8))
    proc.kill()
    proc.communicate()
    assert proc.returncode == -signal.SIGKILL
    assert not (run_dir(tmp_path) / "pytorch_model_2.bin").exists(), "the run finished before the kill"
    assert_same_weights(_resume(tmp_path), reference, exact=True)


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGUSR1])
def test_preemption_signal_saves_and_exits_then_resumes(tmp_path, reference, signum):
    proc = _start_slow_run(tmp_path)
    time.sleep(0.5)
    proc.send_signal(signum)
    _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 128 + signum, stderr
    assert f"stopped by {signal.Signals(signum).name}" in stderr
    assert "Best Validation score" not in stderr
    latest = torch.load(run_dir(tmp_path) / "pytorch_ckpt_latest.tar", weights_only=True)
    assert latest["global_step"] > 0
    if signum == signal.SIGTERM:  # the resume itself does not depend on which signal stopped the run
        assert_same_weights(_resume(tmp_path), reference, exact=True)
