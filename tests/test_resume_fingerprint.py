"""Resumable stores are keyed by what the model and the data hold, not by their paths (issue 23, items 1-2).

New weights written AT THE SAME PATH, then a rerun into the same output folder whose chunks were partly deleted:
`iglue-hf` recomputes everything (its result equals a clean run of the new weights), `cvqa score` refuses with
one line naming the changed file. Plus the one `engine/chunks.ChunkStore` and its two policies, and the
per-file digest cache (a big checkpoint is hashed once per version of the file).
"""
from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from conftest import shared_path
from helpers_cvqa import write_release
from helpers_hf import build
from helpers_iglue_hf import build_data_root, make_images
from volta_ml import digest
from volta_ml.cli import main
from volta_ml.engine.chunks import ChunkStore, ResumeMismatch
from volta_ml.iglue_hf.run import annotation_path


def new_weights_at_the_same_path(folder: Path, seed: int = 7) -> None:
    """Rewrite model.safetensors in place with other values (same names, shapes and file size)."""
    from safetensors.torch import load_file, save_file

    file = folder / "model.safetensors"
    state = load_file(file)
    generator = torch.Generator().manual_seed(seed)
    changed = {k: (torch.randn(v.shape, generator=generator).to(v.dtype) * 0.5 if v.is_floating_point() else v)
               for k, v in state.items()}
    size = file.stat().st_size
    save_file(changed, file, metadata={"format": "pt"})
    assert file.stat().st_size == size


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("resume_fingerprint")
    root = build_data_root(shared_path("iglue", "datasets"), tmp / "datasets")
    make_images("xvnli", Path(annotation_path("xvnli", "ar", "zero-shot", str(root), None)), "ar", tmp / "images")
    return {"root": root, "images": tmp / "images", "tmp": tmp}


def iglue_hf(world, model: Path, out: Path, *extra) -> dict:
    code = main(["iglue-hf", "--task", "xvnli", "--backend", "mllm", "--model", str(model), "--lang", "ar",
                 "--data_root", str(world["root"]), "--images", str(world["images"]), "--output_dir", str(out),
                 "--rule", "letter", "--batch_size", "4", "--chunk_size", "4", "--no_progress", *extra])
    assert code == 0
    return json.loads((out / "iglue_hf_results.json").read_text())


def test_iglue_hf_rerun_after_new_weights_at_the_same_path_recomputes(world, tmp_path, capsys):
    model = build("llava", tmp_path / "models")
    out = tmp_path / "run"
    first = iglue_hf(world, model, out, "--keep_chunks")
    chunks = out / "test_ar_chunks"
    for name in ("chunk_000001.npz", "chunk_000004.npz"):      # an interrupted rerun's state: some chunks gone
        (chunks / name).unlink()
    new_weights_at_the_same_path(model)
    capsys.readouterr()
    rerun = iglue_hf(world, model, out, "--keep_chunks")
    err = capsys.readouterr().err
    assert "saved chunks belong to another run (model_content (model.safetensors changed)); recomputing" in err
    clean = iglue_hf(world, model, tmp_path / "clean")
    assert rerun["metrics"] == clean["metrics"]
    assert (out / "predictions.jsonl").read_text() == (tmp_path / "clean" / "predictions.jsonl").read_text()
    # the run before the change, for the record: the two weights give different predictions, so a mix would show
    assert first["n_examples"] == rerun["n_examples"] == 24


def test_cvqa_rerun_after_new_weights_at_the_same_path_is_refused(tmp_path, capsys):
    model = build("llava", tmp_path / "models")
    release = write_release(tmp_path / "cvqa", "latest")
    out = tmp_path / "run"
    args = ["cvqa", "score", "--backend", "mllm", "--model", str(model), "--data", str(release), "--output_dir",
            str(out), "--device", "cpu", "--no-progress", "--conditions", "en-aware", "--chunk-size", "2",
            "--batch-size", "2", "--no-text-only"]
    assert main(args) == 0
    before = {p.name: p.read_bytes() for p in (out / "chunks" / "en-aware").glob("*.npz")}
    (out / "chunks" / "en-aware" / "00000002.npz").unlink()
    new_weights_at_the_same_path(model)
    capsys.readouterr()
    assert main(args) == 2
    errors = [line for line in capsys.readouterr().err.splitlines() if "error" in line]
    assert len(errors) == 1 and "model_content (model.safetensors changed)" in errors[0]
    assert "refusing to mix them" in errors[0]
    after = {p.name: p.read_bytes() for p in (out / "chunks" / "en-aware").glob("*.npz")}
    assert after == {k: v for k, v in before.items() if k != "00000002.npz"}   # nothing was touched
    shutil.rmtree(out)
    assert main(args) == 0                                    # a fresh folder scores the new weights


def test_cvqa_rerun_with_another_letter_variant_is_refused(tmp_path, capsys):
    """`--letter_spellings all` scores other numbers than the paper's rule: its chunks never mix with those of
    the default (and a default rerun still resumes a run saved before the variant was fingerprinted)."""
    model = build("llava", tmp_path / "models")
    release = write_release(tmp_path / "cvqa", "latest")
    out = tmp_path / "run"
    args = ["cvqa", "score", "--backend", "mllm", "--model", str(model), "--data", str(release), "--output_dir",
            str(out), "--device", "cpu", "--no-progress", "--conditions", "en-aware", "--chunk-size", "2",
            "--batch-size", "2", "--no-text-only", "--rule", "letter"]
    assert main(args) == 0
    (out / "chunks" / "en-aware" / "00000002.npz").unlink()
    capsys.readouterr()
    assert main(args + ["--letter_spellings", "all"]) == 2
    errors = [line for line in capsys.readouterr().err.splitlines() if "error" in line]
    assert len(errors) == 1 and "letter_spellings" in errors[0] and "refusing to mix them" in errors[0]
    assert main(args + ["--letter_spellings", "natural"]) == 0


def test_one_chunk_store_two_policies(tmp_path, capsys):
    store = ChunkStore(tmp_path / "s", {"model": "m", "weights": {"a.bin": "1:x"}})
    store.save("pass/00000000", {"score": np.ones((3, 4))})
    store.save_json("photos/00000000", {"img": "broken"})
    again = ChunkStore(tmp_path / "s", {"model": "m", "weights": {"a.bin": "1:x"}})
    assert again.load("pass/00000000", rows=3)["score"].shape == (3, 4)
    assert again.load("pass/00000000", rows=2) is None         # another chunk length: computed again
    assert again.load_json("photos/00000000") == {"img": "broken"}
    with pytest.raises(ResumeMismatch, match=r"scored with weights \(a.bin changed\); refusing to mix them"):
        ChunkStore(tmp_path / "s", {"model": "m", "weights": {"a.bin": "1:y"}}, on_mismatch="refuse")
    assert (tmp_path / "s" / "pass" / "00000000.npz").is_file()
    ChunkStore(tmp_path / "s", {"model": "m2", "weights": {"a.bin": "1:x"}})      # recompute
    assert "(model 'm' but this run has 'm2'); recomputing" in capsys.readouterr().err
    assert not list((tmp_path / "s").rglob("*.npz")) and not (tmp_path / "s" / "photos" / "00000000.json").exists()


def test_a_file_is_hashed_once_per_version(tmp_path, monkeypatch):
    monkeypatch.setenv(digest.CACHE_ENV, str(tmp_path / "cache.json"))
    weights = tmp_path / "model" / "model.safetensors"
    weights.parent.mkdir()
    weights.write_bytes(b"a" * 1000)
    (weights.parent / "config.json").write_text("{}")
    calls = []
    real = digest.file_digest
    monkeypatch.setattr(digest, "file_digest", lambda path, limit=None: calls.append(Path(path).name) or real(path))
    first = digest.content_fingerprint(str(weights.parent))
    assert sorted(calls) == ["config.json", "model.safetensors"]
    assert digest.content_fingerprint(str(weights.parent)) == first and len(calls) == 2   # from the cache
    weights.write_bytes(b"b" * 1000)                                  # same size, new content and mtime
    stat = weights.stat()
    os.utime(weights, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000))
    second = digest.content_fingerprint(str(weights.parent))
    assert calls[2:] == ["model.safetensors"] and second["model.safetensors"] != first["model.safetensors"]
    assert second["config.json"] == first["config.json"]
    assert digest.content_fingerprint("org/not-in-the-cache") == {"commit": "unresolved"}


def test_hub_id_resolves_to_the_cached_commit(tmp_path, monkeypatch):
    commit = "0123456789abcdef0123456789abcdef01234567"
    repo = tmp_path / "hub" / "models--org--tiny"
    (repo / "snapshots" / commit).mkdir(parents=True)
    (repo / "snapshots" / commit / "config.json").write_text("{}")
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(commit)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    import huggingface_hub.constants as constants
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    assert digest.content_fingerprint("org/tiny") == {"commit": commit}


def test_many_files_are_keyed_by_size_and_mtime(tmp_path):
    """Image folders and feature stores: a replaced file changes the key, a reader's LMDB lock file does not."""
    store = tmp_path / "features.lmdb"
    store.mkdir()
    (store / "data.mdb").write_bytes(b"x" * 10)
    (store / "lock.mdb").write_bytes(b"")
    key = digest.stat_digest([store])
    (store / "lock.mdb").write_bytes(b"reader")
    assert digest.stat_digest([store]) == key
    stat = (store / "data.mdb").stat()
    os.utime(store / "data.mdb", ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000))
    assert digest.stat_digest([store]) != key
