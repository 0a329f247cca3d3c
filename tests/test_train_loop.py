"""The training loop on the toy task: learning, outputs, precision, accumulation, evaluation points."""
import re
import subprocess

import pytest
import torch

from helpers_train import (assert_same_weights, load_weights, run_dir, run_toy_inprocess, toy_argv,
                           toy_env)
from volta_ml.engine.distributed import DistInfo
from volta_ml.engine.train_support import val_loader
from volta_ml.testing.toy_train import ToyDataset


def _train_losses(out_txt):
    return [float(m) for m in re.findall(r"^\[Toy\]: iter \d+ Ep: [\d.]+ loss ([\d.]+)", out_txt, re.M)]


def test_loss_decreases_on_learnable_task(tmp_path):
    assert run_toy_inprocess(tmp_path, "--toy_examples", "512", "--num_epoch", "3", "--optim_train_epochs", "3",
                             "--toy_dropout", "0.0") == 0
    out_txt = (run_dir(tmp_path) / "out.txt").read_text()
    losses = _train_losses(out_txt)
    assert len(losses) >= 6
    assert losses[-1] < 0.5 * losses[0]
    scores = [float(s) for s in re.findall(r"Validation \[Toy\]: loss [\d.]+ score ([\d.]+) ", out_txt)]
    assert len(scores) == 3 and scores[-1] > 80.0


def test_outputs_tensorboard_and_last_line(tmp_path):
    proc = subprocess.run(toy_argv(tmp_path, "--num_epoch", "2", "--save_every_num_epochs", "5"), cwd=tmp_path,
                          env=toy_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout
    last = proc.stdout.splitlines()[-1]
    assert re.fullmatch(r"Best Validation score: \d+\.\d{3} ", last), repr(last)
    files = {p.name for p in run_dir(tmp_path).iterdir()}
    assert {"out.txt", "pytorch_model_-1.bin", "pytorch_model_best.bin", "pytorch_ckpt_latest.tar",
            "pytorch_model_0.bin"} <= files
    assert list((tmp_path / "logs" / "Toy_toy").glob("events.out.tfevents.*"))
    best = float(last.split(" ")[3])  # what the few-shot scripts read: `cut -d' ' -f4`
    scores = [float(s) for s in re.findall(r"Validation \[Toy\]: loss [\d.]+ score ([\d.]+)", proc.stdout)]
    assert best == max(scores)


def test_bf16_autocast_runs_on_cpu(tmp_path):
    assert run_toy_inprocess(tmp_path, "--amp", "bf16", "--num_epoch", "1") == 0
    weights = load_weights(run_dir(tmp_path) / "pytorch_model_best.bin")
    assert all(t.dtype == torch.float32 and torch.isfinite(t).all() for t in weights.values())


def test_fp16_with_grad_scaler_runs_on_cpu(tmp_path):
    assert run_toy_inprocess(tmp_path, "--amp", "fp16", "--num_epoch", "1") == 0
    latest = torch.load(run_dir(tmp_path) / "pytorch_ckpt_latest.tar", weights_only=True)
    assert latest["scaler_state_dict"]["scale"] > 0


def test_non_finite_loss_stops_naming_the_step(tmp_path, capsys):
    assert run_toy_inprocess(tmp_path, "--toy_nan_at_call", "5") == 3
    assert "training loss is nan at optimizer step 5 (epoch 0, micro-batch 4)" in capsys.readouterr().err
    assert not (run_dir(tmp_path) / "pytorch_model_0.bin").exists()


def test_gradient_accumulation_divides_the_batch(tmp_path):
    common = ["--toy_dropout", "0.0", "--num_epoch", "2", "--batch_size", "16"]
    assert run_toy_inprocess(tmp_path / "a", *common, "--gradient_accumulation_steps", "2") == 0
    assert run_toy_inprocess(tmp_path / "b", *common, "--gradient_accumulation_steps", "1") == 0
    assert_same_weights(load_weights(run_dir(tmp_path / "a") / "pytorch_model_1.bin"),
                        load_weights(run_dir(tmp_path / "b") / "pytorch_model_1.bin"), exact=False)


def test_mid_epoch_evaluation_runs_once_per_point(tmp_path):
    # 64 examples, batch 16, grad-acc 2 -> 8 micro-batches; iter_id = micro//2 + epoch*8;
    # eval_steps 3 -> points where iter_id % 2 == 0: epoch 0 {2}, epoch 1 {8, 10}; + 2 epoch ends.
    assert run_toy_inprocess(tmp_path, "--batch_size", "16", "--gradient_accumulation_steps", "2",
                             "--num_epoch", "2", "--eval_steps", "3") == 0
    out_txt = (run_dir(tmp_path) / "out.txt").read_text()
    assert re.findall(r"Eval task TASK0 on iteration (\d+)", out_txt) == ["5", "8", "9", "13", "16"]


@pytest.mark.parametrize("world", [1, 2])
def test_validation_shards_cover_each_example_once_and_max_val_batches(world):
    dataset = ToyDataset(37, seed=0)
    args = type("A", (), {"num_val_workers": 0})()
    seen = []
    for rank in range(world):
        info = DistInfo(rank=rank, world_size=world)
        loader = val_loader(dataset, 8, info, args, None)
        seen += [x for batch in loader for x in batch["features"][:, 0].tolist()]
    assert sorted(seen) == sorted(dataset.x[:, 0].tolist())
    # --max_val_batches 3 evaluates 3-1 = 2 batches of 8 (VOLTA's off-by-one)
    limited = val_loader(dataset, 8, DistInfo(), args, None, max_batches=3 - 1)
    assert sum(len(b["target"]) for b in limited) == 16
