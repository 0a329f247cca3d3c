"""Bad input gives errors a user can act on, and nothing unsafe happens."""
import json
import pickle
import warnings

import pytest
import torch

from volta_ml.models import (CheckpointError, ConfigError, build_model, load_checkpoint, load_config,
                             read_state_dict)

from helpers_tiny import IGLUE_TASKS, tiny_config


def test_wrong_shape_checkpoint_names_key_and_shapes(tmp_path):
    model = build_model(tiny_config(), IGLUE_TASKS)
    sd = model.state_dict()
    sd["bert.embeddings.word_embeddings.weight"] = torch.zeros(123, 32)
    path = tmp_path / "bad.bin"
    torch.save(sd, path)
    with pytest.raises(CheckpointError) as e:
        load_checkpoint(build_model(tiny_config(), IGLUE_TASKS), path)
    msg = str(e.value)
    assert "bert.embeddings.word_embeddings.weight" in msg and "(123, 32)" in msg and "(100, 32)" in msg
    assert str(path) in msg


def test_unknown_image_embeddings_lists_valid_ones():
    cfg = tiny_config().to_dict()
    cfg["image_embeddings"] = "clip"
    with pytest.raises(ConfigError) as e:
        load_config(cfg)
    for name in ("vilbert", "lxmert", "vl-bert", "visualbert", "uniter", "uc2", "m3p"):
        assert name in str(e.value)
    assert "clip" in str(e.value)


class _Evil:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (open, (self.marker, "w"))


def test_checkpoint_pickle_that_would_run_code_is_refused(tmp_path):
    marker = tmp_path / "pwned"
    path = tmp_path / "evil.bin"
    with open(path, "wb") as f:
        pickle.dump({"bert.embeddings.word_embeddings.weight": _Evil(str(marker))}, f)
    with pytest.raises(CheckpointError) as e:
        read_state_dict(path)
    assert "refused" in str(e.value) and str(path) in str(e.value)
    assert not marker.exists()
    # the same through a torch.save'd (zip) file
    zpath = tmp_path / "evil_zip.bin"
    torch.save({"x": _Evil(str(marker))}, zpath)
    with pytest.raises(CheckpointError):
        read_state_dict(zpath)
    assert not marker.exists()


def test_config_that_is_not_json_names_file_and_position(tmp_path):
    path = tmp_path / "broken.json"
    path.write_text('{\n  "hidden_size": 768,\n  "image_embeddings": uniter\n}\n')
    with pytest.raises(ConfigError) as e:
        load_config(path)
    assert str(path) in str(e.value) and ":3:" in str(e.value)


def test_wrong_type_is_an_error_and_unknown_key_a_warning(tmp_path):
    cfg = tiny_config().to_dict()
    with pytest.raises(ConfigError, match="hidden_size"):
        load_config({**cfg, "hidden_size": "768"})
    with pytest.warns(UserWarning, match="hiden_size"):
        load_config({**cfg, "hiden_size": 768})


def test_missing_model_key_means_bert_unless_bert_model_is_roberta():
    cfg = tiny_config().to_dict()
    cfg.pop("model", None)
    assert load_config(cfg).text_model == "bert"
    assert load_config({**cfg, "bert_model": "xlm-roberta-base"}).text_model == "roberta"


def test_missing_checkpoint_is_an_error(tmp_path):
    with pytest.raises(CheckpointError, match="does not exist"):
        read_state_dict(tmp_path / "nope.bin")


def test_unknown_task_id_is_an_error():
    model = build_model(tiny_config(), IGLUE_TASKS, ["TASK19"])
    with pytest.raises(KeyError, match="TASK19"):
        model(torch.zeros(1, 3, dtype=torch.long), torch.zeros(1, 2, 16), torch.zeros(1, 2, 5), "TASK8")
    with pytest.raises(ConfigError, match="TASK99"):
        build_model(tiny_config(), IGLUE_TASKS, ["TASK99"])


def test_shipped_configs_load_without_warnings():
    from volta_ml.models import available_configs
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for name in available_configs():
            load_config(name)
    assert json.loads(load_config("uc2_base").to_json_string())["layer_norm_eps"] == 1e-5
