"""`--backend vllm` where vLLM is not installed (the main environment): one line, exit 2, no traceback. The
backend itself is tested in tests/test_vllm_engine.py, in the environment that has vLLM."""
from __future__ import annotations

import os
import subprocess
import sys
from importlib.util import find_spec
from pathlib import Path

import pytest

from helpers_hf import build

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.skipif(find_spec("vllm") is not None, reason="vLLM is installed here: its absence cannot be checked")
def test_vllm_not_installed_is_one_line(tmp_path):
    """In an environment without vLLM (the main one): --backend vllm ends in one line, exit 2."""
    from helpers_cvqa import write_release
    release = write_release(tmp_path / "data", "latest")
    proc = subprocess.run([sys.executable, "-m", "volta_ml.cli", "cvqa", "score", "--backend", "vllm", "--model",
                           str(build("llava", tmp_path / "models")), "--data", str(release), "--output_dir",
                           str(tmp_path / "o"), "--limit", "2"], capture_output=True, text=True,
                          env=dict(os.environ, PYTHONPATH=str(REPO)), timeout=120)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert proc.stderr.strip().splitlines() == [
        "volta-ml cvqa: error: --backend vllm: the Python package 'vllm' is not importable (No module named 'vllm'); "
        "install it (pip install vllm, or on a CPU machine scripts/install_vllm_env.sh VENV_DIR)"]
