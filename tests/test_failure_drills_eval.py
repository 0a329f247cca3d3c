"""Failure drills of eval_task.py and eval_retrieval.py (issue #14): every error ends the run within 60 s,
non-zero, with a one-line cause as the last stderr line, no process left behind and the previous result
files intact. Faults are injected by tests/helpers_drill_entry.py around the unchanged scripts.

Which drills apply: eval_task.py reads through DataLoader workers (0, 2, 10: forward, __getitem__, a killed
worker, a full disk when writing results); eval_retrieval.py reads the gallery once without workers and
runs on several ranks (forward, full disk while saving score chunks, one of two torchrun ranks raising).
A NaN is a score there, not an error, so no NaN drill.
"""
from __future__ import annotations

import os
import socket
import sys

import pytest

from helpers_drills import assert_failed_cleanly, drill, full_disk_argv
from helpers_eval import FEATURE_DIM, build_checkpoint, tiny_config_file
from helpers_tasks import REPO, bert_uncased_dir, make_store, need_iglue, read_jsonl, write_jsonl

TASKS = str(REPO / "config_tasks" / "iglue_test_tasks_boxes36.yml")
ENTRY = str(REPO / "tests" / "helpers_drill_entry.py")
PREVIOUS = '[{"previous": "result"}]'


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    iglue = need_iglue()
    tmp = tmp_path_factory.mktemp("drills_eval")
    ve = read_jsonl(iglue / "XVNLI/annotations/en/test.jsonl")[:40]
    captions = read_jsonl(iglue / "xFlickrCO/annotations/de/test.jsonl")[:8]
    config = tiny_config_file(tmp / "config" / "tiny_uniter.json", vocab_size=30522)
    tasks = {"TASK19": {"name": "XVNLI", "type": "VL-tri-classifier", "num_labels": 3},
             "TASK8": {"name": "RetrievalxFlickrCO", "type": "VL-logit", "num_labels": 1}}
    return {
        "tmp": tmp, "config": config, "bert": bert_uncased_dir(tmp),
        "ve": write_jsonl(tmp / "ve.jsonl", ve), "ve_store": make_store(tmp / "ve.lmdb", [r["Flikr30kID"] for r in ve]),
        "captions": write_jsonl(tmp / "xf.jsonl", captions),
        "xf_store": make_store(tmp / "xf.lmdb", [r["img_path"] for r in captions], FEATURE_DIM),
        "ckpt19": build_checkpoint(config, tasks, "TASK19", tmp / "ckpt19" / "pytorch_model_best.bin"),
        "ckpt8": build_checkpoint(config, tasks, "TASK8", tmp / "ckpt8" / "pytorch_model_best.bin"),
    }


def _env(**extra):
    env = dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore")
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "SLURM_NTASKS", "SLURM_PROCID"):
        env.pop(key, None)
    return dict(env, **extra)


def _eval_task(site, fault, out, workers):
    return [sys.executable, ENTRY, fault, "eval_task.py", "--bert_model", str(site["bert"]), "--do_lower_case",
            "--config_file", str(site["config"]), "--from_pretrained", str(site["ckpt19"]),
            "--tasks_config_file", TASKS, "--task", "19", "--val_annotations_jsonpath", str(site["ve"]),
            "--val_features_lmdbpath", str(site["ve_store"]), "--batch_size", "4", "--no_cache",
            "--num_val_workers", str(workers), "--output_dir", str(out), "--device", "cpu"]


def _eval_retrieval(site, fault, out, launcher=()):
    return [sys.executable, *launcher, ENTRY, fault, "eval_retrieval.py", "--bert_model", str(site["bert"]),
            "--do_lower_case", "--config_file", str(site["config"]), "--from_pretrained", str(site["ckpt8"]),
            "--tasks_config_file", TASKS, "--task", "8", "--split", "test_de", "--caps_per_image", "1",
            "--val_annotations_jsonpath", str(site["captions"]), "--val_features_lmdbpath", str(site["xf_store"]),
            "--output_dir", str(out), "--no_cache", "--device", "cpu", "--captions_per_chunk", "2",
            "--pair_batch", "8", "--no_running_lines"]


EVAL_FAULTS = {"forward": "RuntimeError: toy fault: the model's forward failed",
               "getitem": "toy fault: item", "kill_worker": "DataLoader worker"}


@pytest.mark.parametrize("fault,workers", [(fault, workers) for fault in sorted(EVAL_FAULTS) for workers in (0, 2, 10)
                                           if not (fault == "kill_worker" and workers == 0)])  # no worker to kill
def test_eval_task_fault_ends_the_run(site, tmp_path, fault, workers):
    result_dir = tmp_path / "pytorch_model_best.bin-"
    result_dir.mkdir()
    (result_dir / "test_result.json").write_text(PREVIOUS)       # an earlier run's results
    result = drill(_eval_task(site, fault, tmp_path, workers), _env(), REPO)
    assert_failed_cleanly(result, 1, EVAL_FAULTS[fault])
    assert result.seconds_after_fault() < 30
    assert (result_dir / "test_result.json").read_text() == PREVIOUS


def _full_disk(tmp_path, argv_for, result_name):
    disk = tmp_path / "disk"
    disk.mkdir()
    previous = disk / result_name
    argv = argv_for(disk)
    # the results folder exists with an earlier result; the disk is full before the run starts
    setup = ["sh", "-c", f'mkdir -p "{previous.parent}" && printf %s \'{PREVIOUS}\' > "{previous}" && exec "$@"',
             "setup", *argv]
    wrapped = full_disk_argv(disk, previous, tmp_path / "kept", setup)
    if wrapped is None:
        pytest.skip("needs `unshare -rm` (user namespaces) for a tiny tmpfs, or a non-root user for chmod")
    return wrapped


def test_eval_task_full_disk_keeps_the_previous_results(site, tmp_path):
    wrapped = _full_disk(tmp_path, lambda disk: _eval_task(site, "none", disk, 2),
                         "pytorch_model_best.bin-/test_result.json")
    result = drill(wrapped, _env(), REPO)
    assert_failed_cleanly(result, 4, "cannot write")
    assert "test_result.json" in result.last_line
    assert (tmp_path / "kept" / "test_result.json").read_text() == PREVIOUS


def test_eval_retrieval_forward_error(site, tmp_path):
    result = drill(_eval_retrieval(site, "forward", tmp_path), _env(), REPO)
    assert_failed_cleanly(result, 1, EVAL_FAULTS["forward"])
    assert result.seconds_after_fault() < 30


def test_eval_retrieval_full_disk_while_saving_chunks(site, tmp_path):
    folder = str(site["ckpt8"]).split("/")[1]          # VOLTA's result folder: `tmp` for /tmp/...
    wrapped = _full_disk(tmp_path, lambda disk: _eval_retrieval(site, "none", disk), f"{folder}/test_de_result.json")
    result = drill(wrapped, _env(), REPO)
    assert_failed_cleanly(result, 4, "cannot write")
    assert (tmp_path / "kept" / "test_de_result.json").read_text() == PREVIOUS


def test_eval_retrieval_one_of_two_ranks_raising_ends_both(site, tmp_path):
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    launcher = ("-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", str(port))
    result = drill(_eval_retrieval(site, "forward", tmp_path, launcher), _env(DRILL_RANK="1"), REPO)
    assert result.returncode != 0
    assert "eval_retrieval.py: error: RuntimeError: toy fault: the model's forward failed" in result.stderr
    assert not result.leftovers, result.leftovers
    assert result.seconds_after_fault() < 30
