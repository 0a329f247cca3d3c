"""eval_retrieval.py end to end on subsets of the real IGLUE annotation files: files, Final lines, 2 ranks."""
import json
import os
import socket
import subprocess
import sys

import numpy as np
import pytest
import torch

from helpers_eval import FEATURE_DIM, build_checkpoint, tiny_config_file
from helpers_tasks import REPO, bert_uncased_dir, make_store, need_iglue, read_jsonl
from helpers_tasks import write_jsonl as subset
from volta_ml.tasks.retrieval_metrics import image_retrieval_ranks, read_final_lines, recall_metrics

TASKS_YAML = REPO / "config_tasks" / "iglue_test_tasks_boxes36.yml"
TASK8 = {"TASK8": {"name": "RetrievalxFlickrCO", "type": "VL-logit", "num_labels": 1}}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    iglue = need_iglue()
    tmp = tmp_path_factory.mktemp("retrieval")
    rows = read_jsonl(iglue / "xFlickrCO/annotations/de/test.jsonl")
    flickr = subset(tmp / "xFlickrCO/de/test.jsonl", rows[:7] + rows[-3:])   # Flickr30k and COCO rows
    make_store(tmp / "xflickrco.lmdb", [r["img_path"] for r in rows[:7] + rows[-3:]], FEATURE_DIM)
    wit_rows = read_jsonl(iglue / "wit/annotations/test_en.jsonl")[:14]            # wit_ix repeats
    wit = subset(tmp / "wit/test_en.jsonl", wit_rows)
    make_store(tmp / "wit.lmdb", [r["wit_ix"] for r in wit_rows], FEATURE_DIM)
    tokenizer = bert_uncased_dir(tmp)
    config = tiny_config_file(tmp / "config" / "tiny_uniter.json", vocab_size=30522)
    checkpoint = build_checkpoint(config, TASK8, "TASK8", tmp / "ckpt" / "pytorch_model_best.bin")
    return dict(tmp=tmp, flickr=flickr, wit=wit, tokenizer=tokenizer, config=config, checkpoint=checkpoint)


def run(setup, out, *extra, annotations=None, features=None, launcher=(), task="8", split="test_de"):
    cmd = [sys.executable, *launcher, "eval_retrieval.py", "--bert_model", str(setup["tokenizer"]),
           "--do_lower_case", "--config_file", str(setup["config"]), "--from_pretrained", str(setup["checkpoint"]),
           "--tasks_config_file", str(TASKS_YAML), "--task", task, "--split", split, "--batch_size", "1",
           "--caps_per_image", "1", "--val_annotations_jsonpath", str(annotations or setup["flickr"]),
           "--val_features_lmdbpath", str(features or setup["tmp"] / "xflickrco.lmdb"), "--output_dir", str(out),
           "--no_cache", "--device", "cpu", "--captions_per_chunk", "3", "--pair_batch", "16", *extra]
    env = dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS="1")
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


def result_dir(out, checkpoint):
    return out / str(checkpoint).split("/")[1]      # VOLTA's quirk: `tmp` for /tmp/...


@pytest.fixture(scope="module")
def single(setup):
    out = setup["tmp"] / "out1"
    return out, run(setup, out)


def test_outputs_final_lines_and_top20(setup, single):
    out, proc = single
    ir, tr = read_final_lines(proc.stdout)
    lines = proc.stdout.splitlines()
    stars = ["*" * 50] * 3
    assert lines[-10:] == stars + ["Image Retrieval", lines[-6]] + stars + ["Text Retrieval", lines[-1]]
    running = [l for l in lines if l.split(" ")[0].isdigit() and " Final r1:" in l]
    assert [int(l.split()[0]) for l in running] == [2 * c + 1 for c in range(10)]   # num_subiters 2
    folder = result_dir(out, setup["checkpoint"])
    top = json.loads((folder / "test_de_result.json").read_text())
    assert json.loads((folder / "test_de_others.json").read_text()) == []
    assert len(top) == 10 and all(sorted(t) == list(range(10)) for t in top)   # 10 images, fewer than 20
    scores = np.load(folder / "test_de_scores.npy")
    assert scores.shape == (10, 10)
    # IR R@1/5/10 recomputed from the top-20 file reproduce the printed line (as verified on IGLUE's files)
    gold = np.arange(10)
    for k in (1, 5, 10):
        assert ir[f"r{k}"] == round(100 * np.mean([g in t[:k] for g, t in zip(gold, top)]), 3)
    assert ir == {k: round(v, 3) for k, v in recall_metrics(image_retrieval_ranks(scores, gold)).items()}
    report = json.loads((folder / "test_de_retrieval.json").read_text())
    assert report["standard"] is True and report["text_retrieval"]["r1"] == pytest.approx(tr["r1"], abs=1e-3)
    assert not (folder / "test_de_chunks").exists()   # chunks are dropped once the matrix is saved


def test_two_ranks_give_the_identical_matrix(setup, single):
    one, proc1 = single
    two = setup["tmp"] / "out_2ranks"
    proc2 = run(setup, two, "--no_running_lines",
                launcher=("-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", str(free_port())))
    a, b = result_dir(one, setup["checkpoint"]), result_dir(two, setup["checkpoint"])
    np.testing.assert_array_equal(np.load(a / "test_de_scores.npy"), np.load(b / "test_de_scores.npy"))
    assert (a / "test_de_result.json").read_text() == (b / "test_de_result.json").read_text()
    assert read_final_lines(proc1.stdout) == read_final_lines(proc2.stdout)
    assert json.loads((b / "test_de_retrieval.json").read_text())["world_size"] == 2


def test_preempted_run_resumes_from_saved_chunks(setup, single):
    out = setup["tmp"] / "out_resume"
    run(setup, out, "--no_running_lines", "--keep_chunks")
    folder = result_dir(out, setup["checkpoint"])
    chunks = sorted((folder / "test_de_chunks").glob("chunk_*.npz"))
    assert len(chunks) == 4                          # 10 captions, 3 per chunk
    for lost in chunks[2:] + [folder / "test_de_scores.npy", folder / "test_de_result.json"]:
        lost.unlink()                                # as if the job was killed after two chunks
    proc = run(setup, out, "--no_running_lines")
    assert "resuming: 2 of 4 chunks already in" in proc.stderr
    assert "40.0/40.0" in proc.stderr                 # only the 2 missing chunks (4 captions)' pairs were scored
    np.testing.assert_array_equal(np.load(folder / "test_de_scores.npy"),
                                  np.load(result_dir(single[0], setup["checkpoint"]) / "test_de_scores.npy"))
    assert read_final_lines(proc.stdout) == read_final_lines(single[1].stdout)
    assert not (folder / "test_de_chunks").exists()


def test_wit_zero_shot_several_captions_per_image(setup):
    from volta_ml.models import build_model, load_config

    torch.manual_seed(0)
    pretrained = build_model(load_config(str(setup["config"])), kind="pretraining")
    checkpoint = setup["tmp"] / "pre" / "pytorch_model_9.bin"
    checkpoint.parent.mkdir()
    torch.save(pretrained.state_dict(), checkpoint)
    out = setup["tmp"] / "out_wit"
    proc = run(dict(setup, checkpoint=checkpoint), out, "--zero_shot", "--shortlist", "4", task="20",
               split="test_en", annotations=setup["wit"], features=setup["tmp"] / "wit.lmdb")
    ir, tr = read_final_lines(proc.stdout)
    assert "NON-STANDARD fast mode" in proc.stdout
    folder = result_dir(out, checkpoint)
    scores = np.load(folder / "test_en_scores.npy")
    n_images = len({r["wit_ix"] for r in read_jsonl(setup["wit"])})
    assert scores.shape == (14, n_images) and n_images < 14
    report = json.loads((folder / "test_en_retrieval.json").read_text())
    assert report["zero_shot"] is True and report["standard"] is False and report["shortlist"] == 4


def test_volta_ml_command_and_clear_errors(setup, tmp_path):
    env = dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS="1")
    proc = subprocess.run([sys.executable, "-m", "volta_ml.cli", "eval-retrieval", "--config_file",
                           str(setup["config"]), "--from_pretrained", str(tmp_path / "missing.bin"),
                           "--bert_model", str(setup["tokenizer"]), "--tasks_config_file", str(TASKS_YAML),
                           "--task", "8", "--split", "x", "--val_annotations_jsonpath", str(setup["flickr"]),
                           "--val_features_lmdbpath", str(setup["tmp"] / "xflickrco.lmdb"), "--device", "cpu",
                           "--output_dir", str(tmp_path)],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "missing.bin" in proc.stderr and "Traceback" not in proc.stderr
