"""Sweeps with server engines: a grid model's `hf.engine` / `hf.serve` become the cell's flags and the serving
wrapper (`protocols/serving.py`: start the server on a free port, wait for /health, run the cell, stop the server),
the plan and the record name each row's engine, the example grid plans, and the wrapper runs a real cell against
the tests' stand-in server (tests/helpers_openai_server.py run as the server command)."""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from conftest import REPO
from test_openai_backend import FAST, expected_predictions, predictions, task  # noqa: F401  (the task fixture)
from volta_ml.protocols.errors import GridError
from volta_ml.protocols.grid import load_grid
from volta_ml.protocols.runners import plan_cells
from volta_ml.protocols.slurm import write_slurm

FAKE_SERVER = [sys.executable, str(REPO / "tests" / "helpers_openai_server.py")]


def test_example_grid_plans_each_engine(tmp_path):
    grid = load_grid(REPO / "examples/grids/served_engines.yml")
    cells = plan_cells(grid)
    engines = {(c.stage == "suite", c.model): c.extra["engine"] for c in cells}
    assert engines == {(False, "llava-1.5-7b"): "transformers", (False, "llava-1.5-7b-vllm"): "openai/vllm-serve",
                       (False, "hosted-vlm"): "openai", (True, "hosted-vlm"): "openai",
                       (True, "qwen2-vl-7b-vllm"): "openai/vllm-serve"}
    suite = next(c for c in cells if c.model == "qwen2-vl-7b-vllm").commands[0].argv
    assert suite[1:3] == ["-m", "volta_ml.protocols.serving"] and "suite" in suite[suite.index("--") + 1:]
    api = next(c for c in cells if c.stage == "suite" and c.model == "hosted-vlm").commands[0].argv
    assert api[api.index("--base_url") + 1] == "https://api.example.org/v1" and "--" not in api
    served = next(c for c in cells if c.model == "llava-1.5-7b-vllm" and c.task == "xvnli")
    run = served.commands[-2].argv
    assert run[1:4] == ["-m", "volta_ml.protocols.serving", "--spec"]
    spec = json.loads(run[4])
    assert spec == {"model": "llava-hf/llava-1.5-7b-hf", "name": "llava-hf/llava-1.5-7b-hf", "tensor_parallel": "auto",
                    "dtype": "float32", "args": ["--max-model-len", "4096"]}
    cell = run[run.index("--") + 1:]
    assert "--base_url" not in cell and cell[cell.index("--backend") + 1] == "openai"
    assert cell[cell.index("--max_concurrency") + 1] == "64"
    hosted = next(c for c in cells if c.model == "hosted-vlm").commands[-2].argv
    assert hosted[hosted.index("--base_url") + 1] == "https://api.example.org/v1"
    assert hosted[hosted.index("--api_key_env") + 1] == "VLM_API_KEY"
    submit = write_slurm(grid.name, cells, tmp_path / "slurm", grid.slurm, grid.env, grid.step())
    text = (submit.parent / "zero_shot.sbatch").read_text()
    assert "#SBATCH --gres=gpu:2" in text and "volta_ml.protocols.serving" in text
    for stage in ("zero_shot", "suite"):
        assert subprocess.run(["/bin/bash", "-n", str(submit.parent / f"{stage}.sbatch")]).returncode == 0


@pytest.mark.parametrize("hf,message", [
    ({"backend": "mllm", "model": "m", "engine": {"base_url": "http://x/v1"}}, "are options of the openai backend"),
    ({"backend": "openai", "model": "m"}, "needs engine.base_url (a running server) or serve"),
    ({"backend": "openai", "model": "m", "engine": {"port": 1}}, "hf.engine: expected a mapping with any of"),
    ({"backend": "openai", "model": "m", "serve": {"gpus": 2}}, "hf.serve: expected a mapping with any of"),
    ({"backend": "openai", "model": "m", "serve": {"tensor_parallel": 0}}, "tensor_parallel: 0; expected auto"),
    ({"backend": "openai", "model": "m", "serve": {}, "engine": {"base_url": "http://x/v1"}},
     "serve starts the server; engine.base_url cannot be given too"),
])
def test_grid_engine_errors_name_the_key(tmp_path, hf, message):
    path = tmp_path / "grid.yml"
    path.write_text(yaml.safe_dump({"name": "g", "data_root": str(tmp_path), "output_dir": str(tmp_path / "runs"),
                                    "tasks": ["xvnli"], "protocols": ["zero_shot"], "images": {"xvnli": "/i"},
                                    "models": {"m1": {"hf": hf}}}))
    with pytest.raises(GridError, match="models.m1.hf") as error:
        plan_cells(load_grid(path))
    assert message in str(error.value)


def _port_closed(port: int) -> bool:
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) != 0


def test_a_cell_starts_its_server_runs_against_it_and_stops_it(task, tmp_path, monkeypatch):  # noqa: F811
    from volta_ml.protocols import serving

    spec = {"model": "/models/fake", "name": "fake-vlm", "tensor_parallel": "auto", "command": FAKE_SERVER,
            "health_timeout": 60}
    command = [sys.executable, "-m", "volta_ml.cli", "iglue-hf", "--task", "xvnli", "--backend", "openai",
               "--model", "fake-vlm", "--lang", "ar", "--annotations", str(task["annotation"]), "--images",
               str(task["images"]), "--output_dir", str(tmp_path / "eval"), "--rule", "letter", "--no_progress",
               "--extra", json.dumps(FAST)]
    env = dict(os.environ, PYTHONPATH=f"{REPO}{os.pathsep}{REPO / 'tests'}", CUDA_VISIBLE_DEVICES="0,1")
    log = tmp_path / "serve.log"
    proc = subprocess.run([sys.executable, "-m", "volta_ml.protocols.serving", "--spec", json.dumps(spec),
                           "--log", str(log), "--", *command], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert predictions(tmp_path / "eval") == expected_predictions(task, "letter")
    results = json.loads((tmp_path / "eval" / "iglue_hf_results.json").read_text())
    port = int(results["engine"]["server"]["base_url"].rsplit(":", 1)[1].split("/")[0])
    assert _port_closed(port)                       # the server was stopped
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert serving.server_argv(spec, 8000)[len(FAKE_SERVER):] == [
        "--model", "/models/fake", "--served-model-name", "fake-vlm", "--host", "127.0.0.1", "--port", "8000",
        "--tensor-parallel-size", "1", "--seed", "0"]


def test_a_server_that_never_gets_healthy_is_one_line_naming_its_log(tmp_path):
    spec = {"model": "/models/fake", "name": "fake", "command": [sys.executable, "-c", "import sys; sys.exit(3)"],
            "health_timeout": 60}
    log = tmp_path / "serve.log"
    proc = subprocess.run([sys.executable, "-m", "volta_ml.protocols.serving", "--spec", json.dumps(spec),
                           "--log", str(log), "--", sys.executable, "-c", "print('never')"],
                          env=dict(os.environ, PYTHONPATH=str(REPO)), capture_output=True, text=True, timeout=120)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1 and "never" not in proc.stdout
    assert "exited with status 3 before it was healthy" in lines[0] and str(log) in lines[0]


def test_tensor_parallel_counts_the_jobs_gpus(monkeypatch):
    from volta_ml.protocols.serving import server_argv

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1,2,3")
    argv_ = server_argv({"model": "m", "name": "n", "tensor_parallel": "auto"}, 9)
    assert argv_[argv_.index("--tensor-parallel-size") + 1] == "4"
    assert argv_[1:3] == ["-m", "vllm.entrypoints.openai.api_server"]
    fixed = server_argv({"model": "m", "name": "n", "tensor_parallel": 2, "args": ["--max-model-len", "512"]}, 9)
    assert fixed[fixed.index("--tensor-parallel-size") + 1] == "2" and fixed[-2:] == ["--max-model-len", "512"]
