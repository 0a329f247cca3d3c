"""`volta-ml features convert|inspect|verify`."""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import lmdb
import numpy as np
import pytest

from volta_ml.features import cli as features_cli
from volta_ml.features import open_store
from volta_ml.testing import legacy_layouts as L

ROOT = Path(__file__).resolve().parents[1]


def run_features(*argv) -> int:
    parser = argparse.ArgumentParser(prog="volta-ml")
    features_cli.register(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["features", *map(str, argv)])
    return int(args.func(args) or 0)


@pytest.fixture()
def h5(tmp_path):
    return L.write_boxes36_h5(tmp_path / "a_boxes36.h5", L.random_images(5, boxes=36, dim=24))


def test_convert_inspect_verify(tmp_path, h5, capsys):
    dst = tmp_path / "a.vmlf"
    assert run_features("convert", h5, dst, "--to", "native", "--float16",
                        "--extractor", "butd-r101-c4") == 0
    assert "wrote 5 images" in capsys.readouterr().out
    assert open_store(dst).meta["feature_dtype"] == "float16"

    assert run_features("inspect", dst, "--json") == 0
    info = json.loads(capsys.readouterr().out)
    assert info["format"] == "native" and info["images"] == 5 and info["feature_dim"] == 24
    assert info["extractor"] == "butd-r101-c4"
    assert info["sample"]["features"] == "array float32 [36, 24]"

    assert run_features("inspect", h5) == 0
    out = capsys.readouterr().out
    assert "h5" in out and "obj_id" in out

    assert run_features("verify", dst, "--feature-dim", "24") == 0
    out = capsys.readouterr().out
    assert "5/5 records decode" in out and out.strip().endswith("OK")
    assert run_features("verify", dst, "--feature-dim", "2048") == 1
    assert "2048 expected" in capsys.readouterr().out


def test_convert_to_volta_lmdb_base64_and_num_imgs(tmp_path, h5):
    dst = tmp_path / "b.lmdb"
    assert run_features("convert", h5, dst, "--to", "volta-lmdb", "--encoding", "base64",
                        "--num-imgs", "3") == 0
    store = open_store(dst)
    assert len(store) == 3 and store.describe()["encoding"].startswith("base64")


def test_verify_flags_nan_and_corrupt_records(tmp_path, capsys):
    images = L.random_images(4, boxes=6, dim=8)
    first, second = list(images)[:2]
    images[first]["features"][2, 3] = np.nan
    path = L.write_volta_lmdb(tmp_path / "bad.lmdb", images)
    env = lmdb.open(path, map_size=1 << 30)
    with env.begin(write=True) as txn:
        txn.put(second.encode(), txn.get(second.encode())[:100])
    env.close()
    assert run_features("verify", path) == 1
    out = capsys.readouterr().out
    assert "3/4 records decode" in out and f"nonfinite: 1 images, e.g. ['{first}']" in out
    assert f"[key '{second}']" in out and out.strip().endswith("FAILED")


def _console(*argv):
    """`python -m volta_ml.cli ...`, the console command as users run it."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", "volta_ml.cli", *argv], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=120)


def test_console_command_subprocess(tmp_path, h5):
    r = _console("features", "convert", h5, str(tmp_path / "c"), "--to", "native")
    assert r.returncode == 0, r.stderr
    r = _console("features", "verify", str(tmp_path / "c"))
    assert r.returncode == 0 and "OK" in r.stdout, r.stderr
    r = _console("features", "inspect", str(tmp_path / "missing"))
    assert r.returncode != 0 and "does not exist" in r.stderr


def test_features_commands_reach_the_console_parser(monkeypatch):
    """`volta-ml features convert|verify|extract` dispatch to this area's actions."""
    from volta_ml.cli import build_parser

    called = []
    for action in ("_convert", "_verify"):
        monkeypatch.setattr(features_cli, action, lambda args, action=action: called.append(action) or 0)
    monkeypatch.setattr(features_cli, "register_extract", lambda sub: sub.add_parser("extract").set_defaults(
        func=lambda args: called.append("extract") or 0))
    parser = build_parser()
    for argv in (["features", "convert", "a", "b"], ["features", "verify", "store"], ["features", "extract"]):
        args = parser.parse_args(argv)
        assert args.func(args) == 0
    assert called == ["_convert", "_verify", "extract"]
