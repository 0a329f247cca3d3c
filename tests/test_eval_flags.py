"""VOLTA/IGLUE flag handling shared by the entry points."""
from __future__ import annotations

import types

import pytest

from volta_ml.cli.flags import eval_task_parser
from volta_ml.engine.run_setup import resolve_tokenizer_args


def test_iglue_eval_flags_parse_and_last_duplicate_wins():
    args = eval_task_parser().parse_args([
        "--bert_model", "/hf/xlm-roberta-base", "--config_file", "config/ctrl_xuniter_base.json",
        "--from_pretrained", "/ck/pytorch_model_best.bin", "--tasks_config_file", "config_tasks/x.yml",
        "--task", "19", "--split", "test", "--output_dir", "/out",
        "--val_annotations_jsonpath", "/a.jsonl", "--val_annotations_jsonpath", "/b.jsonl"])
    assert args.val_annotations_jsonpath == "/b.jsonl" and args.batch_size == 30 and args.num_val_workers == 2
    assert args.do_lower_case is None and args.save_name == ""


def test_unknown_flag_suggests_nearest(capsys):
    with pytest.raises(SystemExit) as stop:
        eval_task_parser().parse_args(["--task", "19", "--val_annotation_jsonpath", "x"])
    assert stop.value.code == 2
    assert "did you mean --val_annotations_jsonpath?" in capsys.readouterr().err


def test_trailing_deactivate_is_tolerated():
    with pytest.warns(UserWarning, match="deactivate"):
        args = eval_task_parser().parse_args(["--task", "15", "--split", "test_de", "deactivate"])
    assert args.split == "test_de"


def test_tokenizer_from_cli_or_model_config():
    head_config = types.SimpleNamespace(bert_model="/hf/bert-base-uncased", do_lower_case=True)
    from_config = eval_task_parser().parse_args([])
    assert resolve_tokenizer_args(from_config.bert_model, from_config.do_lower_case, head_config) == ("/hf/bert-base-uncased", True)
    from_cli = eval_task_parser().parse_args(["--bert_model", "/hf/xlmr"])
    assert resolve_tokenizer_args(from_cli.bert_model, from_cli.do_lower_case, types.SimpleNamespace()) == ("/hf/xlmr", False)
    lowered = eval_task_parser().parse_args(["--bert_model", "/hf/b", "--do_lower_case"])
    assert resolve_tokenizer_args(lowered.bert_model, lowered.do_lower_case, types.SimpleNamespace(do_lower_case=False)) == ("/hf/b", True)


def test_volta_ml_eval_subcommand_uses_the_same_flags(capsys):
    from volta_ml.cli import build_parser

    args = build_parser().parse_args(["eval", "--task", "12", "--split", "test", "--num_val_workers", "4"])
    assert args.command == "eval" and args.task == "12" and args.num_val_workers == 4 and callable(args.func)
    with pytest.raises(SystemExit):
        build_parser().parse_args(["eval", "--val_feature_lmdbpath", "x"])
    assert "did you mean --val_features_lmdbpath?" in capsys.readouterr().err
    score = build_parser().parse_args(["gqa-score", "--preds_file", "p.json", "--truth_file", "t.json"])
    assert score.preds_file == "p.json" and callable(score.func)
