"""train_task.py's flag set: VOLTA names, defaults and quirks, plus the volta-ml additions."""
import pytest

from volta_ml.engine.task_job import config_label, resolve_hyperparameters, run_name
from volta_ml.cli.train_flags import parse_train_args


def test_volta_defaults_and_quirks():
    args = parse_train_args(["--task", "19", "--in_memory", "False", "--val_annotations_jsonpath", "a.jsonl",
                             "--val_annotations_jsonpath", "b.jsonl", "--gradient_accumulation_steps", "4"])
    assert args.seed == 0 and args.config_file == "config/vilbert_base.json"
    assert args.optim_train_epochs == 20 and args.adam_epsilon == 1e-6 and args.adam_correct_bias is False
    assert args.max_val_batches == -1 and args.save_every_num_epochs == 1 and args.num_workers == 16
    assert args.in_memory is True  # type=bool: "False" turns it on
    assert args.val_annotations_jsonpath == "b.jsonl"  # the last repeated flag wins
    assert args.grad_acc_steps == 4
    assert args.amp == "none" and args.adam_impl == "volta" and args.local_rank == -1


def test_trailing_deactivate_is_dropped_and_unknown_flags_get_a_hint(capsys):
    with pytest.warns(UserWarning, match="deactivate"):
        args = parse_train_args(["--task", "12", "--amp", "bf16", "deactivate"])
    assert args.task == "12" and args.amp == "bf16"
    with pytest.raises(SystemExit):
        parse_train_args(["--num_epochs", "3"])
    assert "did you mean --num_epoch" in capsys.readouterr().err


def test_run_directory_name():
    assert run_name("XVNLI", "config/ctrl_xuniter_base.json", "") == "XVNLI_ctrl_xuniter_base"
    assert run_name("NLVR2", "config/uc2_base.json", "lr1e-4") == "NLVR2_uc2_base-lr1e-4"
    assert config_label("/abs/path/m3p_base.json") == "m3p_base"  # VOLTA gave "abs"
    assert config_label("m3p_base.json") == "m3p_base"  # VOLTA crashed


def test_flags_win_over_the_task_config_and_eval_batch_fallback():
    entry = {"name": "XVNLI", "batch_size": 128, "lr": 2e-5, "num_epoch": 10, "train_split": "train",
             "val_split": "dev"}
    args = parse_train_args(["--gradient_accumulation_steps", "4", "--lr", "1e-4"])
    resolve_hyperparameters(args, entry, world_size=2)
    assert (args.batch_size, args.lr, args.num_epoch, args.eval_batch_size) == (128, 1e-4, 10, 16)
    args = parse_train_args(["--batch_size", "64", "--num_epoch", "20", "--val_split", "dev_de"])
    resolve_hyperparameters(args, dict(entry, eval_batch_size=512), world_size=1)
    assert (args.batch_size, args.num_epoch, args.val_split, args.eval_batch_size) == (64, 20, "dev_de", 512)
    with pytest.raises(KeyError, match="lr"):
        resolve_hyperparameters(parse_train_args([]), {"name": "X", "batch_size": 8, "num_epoch": 1}, 1)
