"""One run setup: train_task.py, eval_task.py, eval_retrieval.py and CVQA build the same model from the same flags.

The case VOLTA's scripts get wrong when the setup is copied: a model config without a "model" key used with an
XLM-R tokenizer. IGLUE-VOLTA switches the text embedding to RoBERTa on the tokenizer path (`config.model =
"roberta"`: RoBERTa position ids and a separate image token type in UNITER), so every entry point must too.
"""
from __future__ import annotations

import json

import pytest
import torch
import yaml
from helpers_cvqa import write_release
from helpers_eval import FEATURE_DIM, build_checkpoint, tiny_config_file
from helpers_tasks import make_store, xlmr_dir

from volta_ml.engine import run_setup

CAPTIONS = ["a dog runs on the grass", "two children play football", "a red car in the street",
            "a woman reads a book", "a cat sleeps on a sofa", "people walk along the beach"]


@pytest.fixture(scope="module")
def flags(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("run_setup")
    tokenizer = xlmr_dir(tmp, CAPTIONS * 20, vocab_size=120)
    assert "roberta" in tokenizer.name
    from transformers import AutoTokenizer
    vocab = len(AutoTokenizer.from_pretrained(str(tokenizer), local_files_only=True))
    config = tiny_config_file(tmp / "config" / "tiny_uniter.json", "ctrl_uniter_base", vocab)
    assert "model" not in json.loads(config.read_text())
    # the checkpoint holds every tensor of the RoBERTa-switched model (incl. UNITER's image token type), so
    # models built by different entry points can only differ through their setup
    switched = json.loads(config.read_text())
    switched["model"] = "roberta"
    switched_file = tmp / "config" / "switched.json"
    switched_file.write_text(json.dumps(switched))
    task = {"name": "RetrievalTiny", "type": "VL-logit", "num_labels": 1, "loss": "CrossEntropyLoss",
            "process": "retrieval", "task_id": 8, "format": "lmdb", "max_seq_length": 16, "max_region_num": 8,
            "batch_size": 2, "eval_batch_size": 2, "train_split": "trainval", "val_split": "val", "lr": 1e-4,
            "num_epoch": 1}
    annotations = tmp / "captions.jsonl"
    annotations.write_text("".join(json.dumps({"sentences": [c], "img_path": f"img{i}.jpg"}) + "\n"
                                   for i, c in enumerate(CAPTIONS)))
    store = make_store(tmp / "features.lmdb", [f"img{i}" for i in range(len(CAPTIONS))], FEATURE_DIM)
    task.update(features_h5path1=str(store), features_h5path2="", train_annotations_jsonpath=str(annotations),
                val_annotations_jsonpath=str(annotations))
    tasks_file = tmp / "tasks.yml"
    tasks_file.write_text(yaml.safe_dump({"TASK8": task}))
    checkpoint = build_checkpoint(switched_file, {"TASK8": task}, "TASK8", tmp / "ckpt" / "pytorch_model_best.bin",
                                  head_gain=3.0)
    common = ["--bert_model", str(tokenizer), "--config_file", str(config), "--from_pretrained", str(checkpoint),
              "--tasks_config_file", str(tasks_file), "--task", "8", "--no_cache", "--device", "cpu"]
    return {"tmp": tmp, "common": common, "tokenizer": tokenizer, "config": config, "checkpoint": checkpoint,
            "store": store, "annotations": annotations}


@pytest.fixture
def built(monkeypatch):
    """Every model an entry point builds through the shared setup, in order."""
    models = []
    original = run_setup.load_model

    def recording(*args, **kwargs):
        model, report = original(*args, **kwargs)
        models.append((model, report))
        return model, report

    monkeypatch.setattr(run_setup, "load_model", recording)
    return models


def from_train(flags, tmp):
    from volta_ml.cli.train_flags import parse_train_args
    from volta_ml.engine.distributed import DistInfo
    from volta_ml.engine.task_job import build_task_job

    args = parse_train_args(flags["common"] + ["--output_dir", str(tmp / "save"), "--logdir", str(tmp / "logs"),
                                               "--num_workers", "0"])
    return build_task_job(args, DistInfo()).model


def from_eval(flags, tmp):
    from volta_ml.cli.eval_task import run_eval
    from volta_ml.cli.flags import eval_task_parser

    run_eval(eval_task_parser().parse_args(flags["common"] + ["--output_dir", str(tmp / "eval"),
                                                              "--num_val_workers", "0"]))


def from_retrieval(flags, tmp):
    from volta_ml.cli.eval_retrieval import add_eval_retrieval_flags, run_eval_retrieval
    from volta_ml.cli.flags import VoltaArgumentParser

    parser = VoltaArgumentParser()
    add_eval_retrieval_flags(parser)
    run_eval_retrieval(parser.parse_args(flags["common"] + ["--output_dir", str(tmp / "retrieval"), "--split",
                                                            "val", "--no_running_lines"]))


def from_cvqa(flags, tmp):
    from volta_ml.cvqa.run import run_cvqa

    run_cvqa({"data": str(write_release(tmp / "cvqa")), "features": str(flags["store"]),
              "config": str(flags["config"]), "checkpoint": str(flags["checkpoint"]),
              "bert_model": str(flags["tokenizer"]), "output_dir": str(tmp / "cvqa_out"), "kind": "tasks",
              "task_id": "TASK8", "limit": 2, "conditions": ["en-agnostic"], "text_only": False,
              "device": "cpu", "progress": False, "max_seq_length": 16, "max_region_num": 8})


ENTRY_POINTS = {"train": from_train, "eval": from_eval, "retrieval": from_retrieval, "cvqa": from_cvqa}


def test_every_entry_point_builds_the_same_model(flags, built, tmp_path):
    for name, run in ENTRY_POINTS.items():
        before = len(built)
        run(flags, tmp_path / name)
        assert len(built) == before + 1, f"{name} did not build its model through volta_ml.engine.run_setup"
    models = dict(zip(ENTRY_POINTS, (model for model, _ in built)))
    reports = dict(zip(ENTRY_POINTS, (report for _, report in built)))

    for name, model in models.items():
        assert model.config.text_model == "roberta", f"{name}: no RoBERTa switch for an XLM-R tokenizer"
        assert model.bert.embeddings.roberta_positions, name
        assert reports[name].missing_keys == [], f"{name}: {reports[name].missing_keys}"

    reference = models["train"]
    batch = {"input_txt": torch.tensor([[0, 5, 9, 7, 2, 1], [0, 11, 2, 1, 1, 1]]),
             "input_imgs": torch.randn(2, 8, FEATURE_DIM), "image_loc": torch.rand(2, 8, 5),
             "token_type_ids": torch.zeros(2, 6, dtype=torch.long),
             "attention_mask": torch.tensor([[1, 1, 1, 1, 1, 0], [1, 1, 1, 0, 0, 0]]),
             "image_attention_mask": torch.ones(2, 8, dtype=torch.long)}
    with torch.no_grad():
        expected = reference.eval()(batch["input_txt"], batch["input_imgs"], batch["image_loc"], "TASK8",
                                    batch["token_type_ids"], batch["attention_mask"], batch["image_attention_mask"])
        for name, model in models.items():
            assert model.config.to_dict() == reference.config.to_dict(), name
            state, ref_state = model.state_dict(), reference.state_dict()
            assert state.keys() == ref_state.keys(), name
            assert all(torch.equal(state[k].cpu(), ref_state[k].cpu()) for k in state), name
            got = model.eval()(batch["input_txt"], batch["input_imgs"], batch["image_loc"], "TASK8",
                               batch["token_type_ids"], batch["attention_mask"], batch["image_attention_mask"])
            torch.testing.assert_close(got, expected, msg=name)


def test_the_switch_follows_the_tokenizer_path(flags):
    """VOLTA's rule is the substring "roberta" in --bert_model: the same files under another name keep the
    config's text model ("bert" when the key is missing)."""
    import shutil

    plain = flags["tmp"] / "multilingual-tokenizer"
    if not plain.exists():
        shutil.copytree(flags["tokenizer"], plain)
    assert run_setup.model_setup(flags["config"], bert_model=str(flags["tokenizer"])).config.text_model == "roberta"
    assert run_setup.model_setup(flags["config"], bert_model=str(plain)).config.text_model == "bert"


def test_a_task_fusion_method_overrides_the_model_config(flags, tmp_path):
    from volta_ml.cli.flags import eval_task_parser

    tasks = yaml.safe_load(open(flags["common"][flags["common"].index("--tasks_config_file") + 1]))
    tasks["TASK8"]["fusion_method"] = "sum"
    (tmp_path / "tasks.yml").write_text(yaml.safe_dump(tasks))
    args = eval_task_parser().parse_args(flags["common"] + ["--tasks_config_file", str(tmp_path / "tasks.yml")])
    setup = run_setup.task_setup(args)
    assert setup.model.config.fusion_method == "sum" and setup.model.config.text_model == "roberta"
