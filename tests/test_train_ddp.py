"""Distributed data parallel on CPU (gloo): 2 processes == 1 process with the same global batch."""
import re
import subprocess
import sys

import pytest

from helpers_train import (assert_same_weights, free_port as _free_port, load_weights, run_dir, run_toy, toy_argv,
                           toy_env)
from volta_ml.engine.distributed import detect_launch, first_slurm_host

FLAGS = ["--toy_dropout", "0.0", "--batch_size", "16", "--gradient_accumulation_steps", "2", "--num_epoch", "2",
         "--toy_val_examples", "37"]



def _validation_lines(out):
    return re.findall(r"Validation \[Toy\].*", (run_dir(out) / "out.txt").read_text())


@pytest.fixture(scope="module")
def single(tmp_path_factory):
    out = tmp_path_factory.mktemp("single")
    proc = run_toy(out, *FLAGS)
    assert proc.returncode == 0, proc.stderr
    return out


def _port_taken(stderr: str) -> bool:
    # another program on this machine can grab the free port between our probe and rank 0's bind
    return "Address already in use" in stderr or "EADDRINUSE" in stderr


def test_torchrun_two_processes_match_one_process(tmp_path, single):
    argv = toy_argv(tmp_path, *FLAGS)
    for _attempt in range(3):
        torchrun = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
                    "--master_port", str(_free_port()), "-m", "volta_ml.testing.toy_train", *argv[3:]]
        proc = subprocess.run(torchrun, cwd=tmp_path, env=toy_env(), capture_output=True, text=True, timeout=180)
        if not _port_taken(proc.stderr):
            break
    assert proc.returncode == 0, proc.stderr
    assert "world size 2" in proc.stderr
    assert proc.stdout.count("Best Validation score") == 1  # rank 0 only
    assert_same_weights(load_weights(run_dir(tmp_path) / "pytorch_model_1.bin"),
                        load_weights(run_dir(single) / "pytorch_model_1.bin"), exact=False)
    # sharded validation over 37 examples gives the single-process numbers
    assert _validation_lines(tmp_path) == _validation_lines(single)


def test_slurm_srun_environment_starts_distributed_without_flags(tmp_path, single):
    for _attempt in range(3):
        port = str(_free_port())
        procs = []
        for rank in range(2):
            env = toy_env(SLURM_NTASKS="2", SLURM_PROCID=str(rank), SLURM_LOCALID=str(rank), SLURM_JOB_ID="4242",
                          SLURM_JOB_NODELIST="localhost", MASTER_PORT=port)
            procs.append(subprocess.Popen(toy_argv(tmp_path, *FLAGS), cwd=tmp_path, env=env,
                                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
        results = [p.communicate(timeout=180) for p in procs]
        if not any(_port_taken(err) for _, err in results):
            break
    assert [p.returncode for p in procs] == [0, 0], results[0][1] + results[1][1]
    assert "world size 2" in results[0][1]
    assert_same_weights(load_weights(run_dir(tmp_path) / "pytorch_model_1.bin"),
                        load_weights(run_dir(single) / "pytorch_model_1.bin"), exact=False)


def test_launch_detection_rules():
    assert detect_launch({}) is None
    assert detect_launch({"SLURM_NTASKS": "1", "SLURM_PROCID": "0"}) is None
    torchrun = detect_launch({"RANK": "1", "WORLD_SIZE": "4", "LOCAL_RANK": "1", "SLURM_NTASKS": "8",
                              "SLURM_PROCID": "5"})
    assert (torchrun["rank"], torchrun["world_size"], torchrun["env"]) == (1, 4, {})
    slurm = detect_launch({"SLURM_NTASKS": "8", "SLURM_PROCID": "5", "SLURM_LOCALID": "1", "SLURM_JOB_ID": "123",
                           "SLURM_JOB_NODELIST": "gpu[07-08]"})
    assert (slurm["rank"], slurm["world_size"], slurm["local_rank"]) == (5, 8, 1)
    assert slurm["env"] == {"MASTER_ADDR": "gpu07", "MASTER_PORT": "20123"}
    assert first_slurm_host("node1,node2") == "node1"
    assert first_slurm_host("a[3,5-9]") == "a3"
