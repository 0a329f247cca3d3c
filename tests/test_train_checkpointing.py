"""Atomic checkpoint writes, resume-file contents and RNG state round trips."""
import random
import subprocess
import sys
import textwrap
import time

import numpy as np
import torch
from torch import nn

from helpers_train import REPO, toy_env
from volta_ml.engine import checkpointing as ckpt


def test_kill_inside_save_keeps_previous_checkpoint(tmp_path):
    target = tmp_path / "pytorch_ckpt_latest.tar"
    script = textwrap.dedent(f"""
        import os, signal, torch
        from volta_ml.engine import checkpointing as ckpt
        ckpt.atomic_torch_save({{"w": torch.ones(3)}}, {str(target)!r})
        def dying_save(obj, handle, *args, **kwargs):
            handle.write(b"half a checkpoint" * 1000)
            handle.flush()
            os.kill(os.getpid(), signal.SIGKILL)
        torch.save = dying_save
        ckpt.atomic_torch_save({{"w": torch.zeros(3)}}, {str(target)!r})
    """)
    proc = subprocess.run([sys.executable, "-c", script], env=toy_env(), cwd=REPO, timeout=60)
    assert proc.returncode == -9
    assert torch.equal(torch.load(target, weights_only=True)["w"], torch.ones(3))
    leftovers = list(tmp_path.glob(".*.tmp"))
    assert len(leftovers) == 1
    assert ckpt.remove_stale_temp_files(tmp_path) == leftovers
    assert not list(tmp_path.glob(".*.tmp"))


def test_sigkill_at_random_time_during_repeated_saves(tmp_path):
    target = tmp_path / "pytorch_model_best.bin"
    script = textwrap.dedent(f"""
        import torch
        from volta_ml.engine import checkpointing as ckpt
        big = torch.zeros(4_000_000)
        for version in range(1000):
            big[0] = version
            ckpt.atomic_torch_save({{"w": big}}, {str(target)!r})
    """)
    proc = subprocess.Popen([sys.executable, "-c", script], env=toy_env(), cwd=REPO)
    deadline = time.time() + 60
    while not target.exists() and time.time() < deadline:
        time.sleep(0.05)
    time.sleep(random.uniform(0.05, 0.5))
    proc.kill()
    proc.wait()
    state = torch.load(target, weights_only=True)  # whole and loadable, whatever moment the kill hit
    assert state["w"].shape == (4_000_000,) and state["w"][1:].abs().sum() == 0


def test_rng_state_round_trip():
    random.seed(1), np.random.seed(1), torch.manual_seed(1)
    state = ckpt.capture_rng_state()
    expected = (random.random(), np.random.rand(), torch.rand(1).item())
    random.seed(9), np.random.seed(9), torch.manual_seed(9)
    ckpt.restore_rng_state(state)
    assert (random.random(), np.random.rand(), torch.rand(1).item()) == expected


def test_latest_file_loads_with_weights_only(tmp_path):
    model = nn.Linear(3, 2)
    opt = torch.optim.AdamW(model.parameters())
    model(torch.ones(1, 3)).sum().backward()
    opt.step()
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)
    path = tmp_path / ckpt.LATEST_NAME
    ckpt.save_latest(path, model=model, optimizer=opt, scheduler=sched, scaler=None, global_step=7, epoch_id=1,
                     resume_epoch=2, resume_micro_step=3, best_score=0.5, rng_states=[ckpt.capture_rng_state()],
                     pending_grads={"weight": model.weight.grad})
    raw = torch.load(path, weights_only=True)
    assert raw["global_step"] == 7 and raw["epoch_id"] == 1 and raw["score"] == 0.5
    assert torch.equal(raw["pending_grads"]["weight"], model.weight.grad)
    state = ckpt.load_latest(path)
    assert (state["resume_epoch"], state["resume_micro_step"]) == (2, 3)


def test_model_bin_has_unwrapped_keys(tmp_path):
    wrapped = nn.DataParallel(nn.Linear(3, 2))
    ckpt.save_model_bin(wrapped, tmp_path / "pytorch_model_0.bin")
    assert set(torch.load(tmp_path / "pytorch_model_0.bin", weights_only=True)) == {"weight", "bias"}


FULL_DISK_SAVE = textwrap.dedent("""
    import os, resource, signal, sys, torch
    from volta_ml.engine import checkpointing as ckpt
    folder, how = sys.argv[1], sys.argv[2]
    ckpt.atomic_torch_save({"w": torch.ones(3)}, os.path.join(folder, "pytorch_model_best.bin"))
    if how == "tmpfs":       # the disk full but 20 kB
        with open(os.path.join(folder, "filler"), "wb", buffering=0) as handle:
            try:
                while True:
                    handle.write(bytes(4096))
            except OSError:
                handle.truncate(handle.tell() - 20000)
    else:                    # no file may grow past 20 kB (EFBIG)
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (20000, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))
    try:
        ckpt.atomic_torch_save({"w": torch.zeros(100000)}, os.path.join(folder, "pytorch_model_best.bin"))
    except OSError as error:           # what the CLI's error boundary turns into exit 4 and this line
        from volta_ml.engine.failures import describe
        kept = torch.load(os.path.join(folder, "pytorch_model_best.bin"), weights_only=True)["w"].tolist()
        print(*describe(error), kept, sep="|")
""")


def test_full_disk_inside_torch_save_is_a_write_error_naming_the_file(tmp_path):
    """torch's zip writer turns the OSError of a write into a RuntimeError ('PytorchStreamWriter failed ...',
    'unexpected pos ...'); the save is still a disk error naming the file (exit 4), the previous file kept."""
    from helpers_drills import userns_tmpfs_available
    disk = tmp_path / "disk"
    disk.mkdir()
    if userns_tmpfs_available():
        argv = ["unshare", "-rm", "sh", "-c", 'mount -t tmpfs -o size=1m tmpfs "$1" && shift && exec "$@"', "disk",
                str(disk), sys.executable, "-c", FULL_DISK_SAVE, str(disk), "tmpfs"]
    else:
        argv = [sys.executable, "-c", FULL_DISK_SAVE, str(disk), "fsize"]
    proc = subprocess.run(argv, env=toy_env(), cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    code, line, kept = proc.stdout.strip().split("|")
    assert code == "4" and kept == "[1.0, 1.0, 1.0]", proc.stdout
    assert line.startswith(f"cannot write {disk / 'pytorch_model_best.bin'}: ") and "MiB free there" in line, line
    assert "No space left on device" in line or "File too large" in line, line
    assert line.endswith("the previous pytorch_model_best.bin (if any) is unchanged"), line
