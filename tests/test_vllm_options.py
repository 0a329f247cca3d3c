"""The vLLM engine's options without vLLM (any environment): GPU placement of data-parallel ranks, the
`--tensor_parallel_size` flag's refusals and the engine options' types (docs/engines.md, docs/errors.md)."""
from __future__ import annotations

import pytest
import torch

from volta_ml.hf.base import BackendInputError, backend_options, fold_engine_flags
from volta_ml.hf.loading import ModelLoadError
from volta_ml.hf.vllm_engine import engine_options, visible_gpus


def test_ranks_take_their_own_gpus(monkeypatch):
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 4)
    assert visible_gpus("cuda:0", 2) == [0, 1] and visible_gpus("cuda:1", 2) == [2, 3]
    assert visible_gpus("cuda:3", 1) == [3] and visible_gpus("cuda", 4) == [0, 1, 2, 3]
    with pytest.raises(ModelLoadError, match=r"--tensor_parallel_size 2: 4 GPU\(s\) visible to this process "
                                             r"\(device cuda:2 takes GPUs 4..5\)"):
        visible_gpus("cuda:2", 2)
    with pytest.raises(ModelLoadError, match=r"--tensor_parallel_size 8: 4 GPU\(s\) visible"):
        visible_gpus("cuda", 8)


def test_cpu_takes_one_engine_process(monkeypatch):
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)
    assert visible_gpus("cpu", 1) == []
    with pytest.raises(ModelLoadError, match=r"--tensor_parallel_size 2: 0 GPU\(s\) visible"):
        visible_gpus("cpu", 2)


def test_engine_flags_fold_into_extra_or_are_refused():
    assert fold_engine_flags("vllm", {"max_model_len": 512}, {"tensor_parallel_size": 2}) == \
        {"max_model_len": 512, "tensor_parallel_size": 2}
    assert fold_engine_flags("mllm", None, {"tensor_parallel_size": None}) is None
    with pytest.raises(BackendInputError, match=r"--tensor_parallel_size: only the vllm backend reads it "
                                                r"\(got --backend mllm\)"):
        fold_engine_flags("mllm", None, {"tensor_parallel_size": 2})
    assert engine_options({"tensor_parallel_size": 2})["tensor_parallel_size"] == 2
    assert engine_options({})["max_model_len"] is None


@pytest.mark.parametrize("text,says", [('{"gpu_memory_utilization": 1.5}', "a number in (0, 1]"),
                                       ('{"tensor_parallel_size": 0}', "an integer >= 1"),
                                       ('{"enforce_eager": "yes"}', "true or false")])
def test_engine_options_of_the_wrong_type_are_refused(text, says):
    import argparse
    with pytest.raises(argparse.ArgumentTypeError, match=says.replace("(", r"\(").replace(")", r"\)")):
        backend_options(text)


def test_tensor_parallel_flag_with_another_backend_exits_2(tmp_path, capsys):
    from volta_ml.cli import main
    code = main(["iglue-hf", "--task", "xvnli", "--backend", "mllm", "--model", "m", "--lang", "ar", "--images",
                 str(tmp_path), "--annotations", str(tmp_path / "a.jsonl"), "--output_dir", str(tmp_path / "o"),
                 "--tensor_parallel_size", "2"])
    assert code == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        "volta-ml iglue-hf: error: --tensor_parallel_size: only the vllm backend reads it (got --backend mllm)"]
