"""A bad file, path or flag is one line on stderr and exit code 2, never a traceback (issue #14), for every
entry point: train_task.py, eval_task.py, eval_retrieval.py and the volta-ml subcommands."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from helpers_eval import FEATURE_DIM, build_checkpoint, tiny_config_file
from helpers_tasks import REPO, bert_uncased_dir, make_store
from volta_ml import cli
from volta_ml.cli import eval_retrieval as retrieval_cli, eval_task as eval_cli, train_task as train_cli

TRAINVAL = "config_tasks/iglue_trainval_tasks_boxes36.yml"
TASKS = {"TASK19": {"name": "XVNLI", "type": "VL-tri-classifier", "num_labels": 3},
         "TASK8": {"name": "RetrievalFlickr30k", "type": "VL-logit", "num_labels": 1}}


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("usage")
    ids = [str(1000 + i) for i in range(8)]
    rows = [{"gold_label": ["entailment", "neutral", "contradiction"][i % 3], "sentence2": f"a dog number {i}",
             "Flikr30kID": image} for i, image in enumerate(ids)]
    annotations = tmp / "ve.jsonl"
    annotations.write_text("".join(json.dumps(r) + "\n" for r in rows))
    captions = tmp / "captions.jsonl"
    captions.write_text("".join(json.dumps({"sentences": [f"photo {i}"], "img_path": f"{i}.jpg"}) + "\n"
                                for i in ids))
    store = make_store(tmp / "data/flickr30k/features/flickr30k_boxes36.lmdb", ids, FEATURE_DIM)
    config = tiny_config_file(tmp / "config/tiny.json", vocab_size=30522)
    short = json.loads(config.read_text())
    short["max_position_embeddings"] = 64          # the issue's reproduction: tasks use max_seq_length 80
    (tmp / "config/short.json").write_text(json.dumps(short))
    (tmp / "garbage.json").write_text("{not json")
    (tmp / "garbage.tar").write_bytes(b"\x00\x01 not a checkpoint")
    (tmp / "a_file").write_text("x")
    return {"tmp": tmp, "ann": annotations, "captions": captions, "store": store, "config": config,
            "short": tmp / "config/short.json", "bert": bert_uncased_dir(tmp),
            "ckpt": build_checkpoint(config, TASKS, "TASK19", tmp / "ckpt/pytorch_model_best.bin"),
            "ckpt8": build_checkpoint(config, TASKS, "TASK8", tmp / "ckpt8/pytorch_model_best.bin")}


def _common(site, task="19", ckpt="ckpt"):
    return {"--bert_model": str(site["bert"]), "--config_file": str(site["config"]),
            "--from_pretrained": str(site[ckpt]), "--tasks_config_file": TRAINVAL, "--task": task,
            "--data_root": str(site["tmp"] / "data"), "--output_dir": str(site["tmp"] / "out"), "--device": "cpu"}


def train_argv(site, **over):
    flags = dict(_common(site), **{"--train_annotations_jsonpath": str(site["ann"]), "--val_annotations_jsonpath":
                                   str(site["ann"]), "--num_epoch": "1", "--batch_size": "4", "--num_workers": "0",
                                   "--num_val_workers": "0", "--logdir": str(site["tmp"] / "logs"), "--no_cache": None})
    flags.update(over)
    return [x for k, v in flags.items() for x in ((k,) if v is None else (k, v))]


def eval_argv(site, **over):
    flags = dict(_common(site), **{"--val_annotations_jsonpath": str(site["ann"]), "--num_val_workers": "0",
                                   "--no_cache": None})
    flags.update(over)
    return [x for k, v in flags.items() for x in ((k,) if v is None else (k, v))]


def retrieval_argv(site, **over):
    flags = dict(_common(site, "8", "ckpt8"), **{"--val_annotations_jsonpath": str(site["captions"]),
                                                 "--val_features_lmdbpath": str(site["store"]), "--split": "test",
                                                 "--no_cache": None, "--captions_per_chunk": "4"})
    flags.update(over)
    return [x for k, v in flags.items() for x in ((k,) if v is None else (k, v))]


ENTRY_POINTS = {
    "train_task.py": (train_cli.main, train_argv),
    "eval_task.py": (eval_cli.main, eval_argv),
    "eval_retrieval.py": (retrieval_cli.main, retrieval_argv),
    "volta-ml train": (lambda argv: cli.main(["train", *argv]), train_argv),
    "volta-ml eval": (lambda argv: cli.main(["eval", *argv]), eval_argv),
    "volta-ml eval-retrieval": (lambda argv: cli.main(["eval-retrieval", *argv]), retrieval_argv),
}
BAD = {  # flag -> (bad value, what the one line must say)
    "config not JSON": ({"--config_file": "{tmp}/garbage.json"}, "garbage.json:1:2: model config is not valid JSON"),
    "no task config": ({"--tasks_config_file": "{tmp}/nope.yml"}, "task config {tmp}/nope.yml not found"),
    "unknown task": ({"--task": "99"}, "TASK99 is not in"),
    "no tokenizer": ({"--bert_model": "{tmp}/no_tokenizer"}, "--bert_model"),
    "no checkpoint": ({"--from_pretrained": "{tmp}/nope.bin"}, "checkpoint not found"),
    "bad device": ({"--device": "tpu9"}, "--device tpu9"),
    # training checks the task against the config; evaluation first finds the checkpoint's 128-row table
    "too few positions": ({"--config_file": "{tmp}/config/short.json"},
                          "max_position_embeddings 64 is too small|position_embeddings.weight: checkpoint (128, 32)"),
    "output dir is a file": ({"--output_dir": "{tmp}/a_file"}, "a_file"),
}


def _bad(site, name):
    over, expected = BAD[name]
    return ({k: v.format(tmp=site["tmp"]) for k, v in over.items()}, expected.format(tmp=site["tmp"]))


@pytest.mark.parametrize("name", sorted(BAD))
@pytest.mark.parametrize("entry", sorted(ENTRY_POINTS))
def test_bad_input_is_one_line_and_exit_2(site, capsys, entry, name):
    main, argv = ENTRY_POINTS[entry]
    over, expected = _bad(site, name)
    capsys.readouterr()
    code = main(argv(site, **over))
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 2, err[-3000:]
    assert "Traceback" not in err, err[-3000:]
    assert lines[-1].startswith(f"{entry}: error: "), lines[-1]
    assert any(option in lines[-1] for option in expected.split("|")), lines[-1]


@pytest.mark.parametrize("entry", ["train_task.py", "volta-ml train"])
def test_training_only_inputs(site, capsys, entry):
    main, argv = ENTRY_POINTS[entry]
    capsys.readouterr()
    assert main(argv(site, **{"--resume_file": str(site["tmp"] / "garbage.tar")})) == 2
    err = capsys.readouterr().err
    assert err.strip().splitlines()[-1].startswith(f"{entry}: error: --resume_file ") and "Traceback" not in err
    assert main(argv(site, **{"--lr": "-1"})) == 2
    assert "invalid AdamW hyper-parameters" in capsys.readouterr().err


@pytest.mark.parametrize("flag", ["--batch_size", "--gradient_accumulation_steps", "--eval_steps", "--num_workers"])
def test_out_of_range_numbers_are_argparse_errors(site, capsys, flag):
    with pytest.raises(SystemExit) as stop:
        train_cli.main(train_argv(site, **{flag: "-1"}))
    assert stop.value.code == 2 and f"argument {flag}: must be an integer >=" in capsys.readouterr().err


@pytest.mark.parametrize("argv", [["models", "inspect", "/nope/config.json"], ["features", "inspect", "/nope.lmdb"],
                                  ["report", "/nope"], ["sweep", "/nope.yml"]])
def test_other_subcommands(capsys, argv):
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert err.strip().splitlines()[-1].startswith(f"volta-ml {argv[0]}") and "Traceback" not in err


def test_issue_reproduction_ends_at_once_with_ten_workers(site, tmp_path):
    """max_position_embeddings 64 and max_seq_length 80 with --num_workers 10 used to hang for ever."""
    proc = subprocess.run([sys.executable, "train_task.py", *train_argv(site, **{
        "--config_file": str(site["short"]), "--num_workers": "10", "--output_dir": str(tmp_path)})],
        cwd=REPO, capture_output=True, text=True, timeout=120,
        env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "1", "HOME": str(tmp_path)})
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert "max_position_embeddings 64 is too small for TASK19's max_seq_length 80" in proc.stderr


def test_logging_setup_touches_only_its_own_handler():
    """pytest's log capture (or an embedding program) attaches its own handlers: they must keep their stream."""
    import io
    import logging

    from volta_ml.engine.distributed import DistInfo
    from volta_ml.engine.logs import CurrentStderrHandler

    theirs = io.StringIO()
    foreign = logging.StreamHandler(theirs)
    for logger, setup in ((eval_cli.logger, eval_cli.setup_logging),
                          (logging.getLogger(), lambda: train_cli.setup_logging(DistInfo()))):
        logger.addHandler(foreign)
        try:
            setup()
            setup()
            assert foreign.stream is theirs
            assert sum(isinstance(h, CurrentStderrHandler) for h in logger.handlers) == 1
        finally:
            logger.removeHandler(foreign)
