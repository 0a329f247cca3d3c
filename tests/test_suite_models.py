"""The suite through the real Hugging Face backends on tiny random models (tests/helpers_hf.py,
tests/helpers_vlm_families.py), loaded by `run_suite` from their folders like hub checkpoints: every score equals
the same backend one item at a time, for a chat-template model (LLaVA), a model without a template (BLIP-2 T5:
the fallback prompt, a blank image for a text-only question), a multi-image family (Qwen2-VL) and a dual encoder
(CLIP) on XM3600 retrieval."""
from __future__ import annotations

import numpy as np
import pytest

from helpers_hf import build, spec_extra
from helpers_suite import build_suite, needs_java
from helpers_vlm_families import build_family, shared_root
from test_suite import data_of, reference
from volta_ml.hf import ModelSpec, load_backend
from volta_ml.suite.run import run_suite


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("suite_models")
    return {"suite": build_suite(tmp / "data"), "models": tmp / "models"}


def run(world, task, lang, model: str, out, backend="mllm", backend_object=None, **opts):
    data, more = data_of(world["suite"], task)
    options = {"task": task, "lang": lang, "data": data, "backend": backend, "model": model, "output_dir": str(out),
               "progress": False, "batch_size": 3, "chunk_size": 2, "max_new_tokens": 4, **more, **opts}
    return run_suite(options, backend=backend_object), options


@pytest.fixture(scope="module")
def loaded(world):
    """name -> (model folder, its backend loaded once): the runs below that are not about loading share it."""
    out = {}
    for name in ("llava", "blip2-t5"):
        path = build(name, world["models"])
        out[name] = (str(path), load_backend("mllm", ModelSpec(str(path), extra=spec_extra(name, path))))
    return out


@pytest.mark.parametrize("name,task,lang,rule,from_folder", [
    ("llava", "m3exam", "th", "letter", True),           # 5 options: letters A-E; the model loaded by the run
    pytest.param("llava", "xm3600", "zh", "cider", False, marks=needs_java),   # greedy captions, CIDEr on characters
    ("llava", "kaleidoscope", "uk", "generate", False),  # a text-only question among photos, image options stacked
    ("blip2-t5", "maxm", "en", "exact", False),          # no chat template: the fallback prompt; BLIP-2's VQA frame
    ("llava", "mmmb", "en", "vlmevalkit", False),        # base64 images from a TSV, two of them stacked
    ("llava", "mmmb", "zh", "letter", False),            # the letter rule after VLMEvalKit's prompt
])
def test_generative_scores_equal_one_item_at_a_time(world, loaded, tmp_path, name, task, lang, rule, from_folder):
    path, backend = loaded[name]
    result, options = run(world, task, lang, path, tmp_path, rule=rule, extra=backend.spec.extra,
                          backend_object=None if from_folder else backend)
    expected, errors = reference(task, lang, rule, options, backend)
    assert result["metrics"]["score"] == pytest.approx(expected)
    assert result["metrics"].get("format_error_rate") == (None if errors is None else pytest.approx(errors))
    assert result["prompt_format"] == ("chat_template" if name == "llava" else backend.prompt_format)
    if name == "blip2-t5":
        assert result["first_prompt"].startswith("Question: ") and result["first_prompt_rendered"] == \
            result["first_prompt"]


def test_multi_image_family_gets_every_image(world, tmp_path):
    """Qwen2-VL places several images: an xMMMU question with <image 1> and <image 2> gets both, none stacked."""
    path = str(build_family("qwen2-vl", shared_root()))
    result, options = run(world, "xmmmu", "ja", path, tmp_path, rule="letter")
    backend = load_backend("mllm", ModelSpec(path))
    assert backend.max_images is None and result["stacked_images"] == 0
    expected, _ = reference("xmmmu", "ja", "letter", options, backend)
    assert result["metrics"]["score"] == pytest.approx(expected)


def test_dual_encoder_retrieval(world, tmp_path):
    from test_iglue_hf import brute_force_recalls
    from volta_ml.suite.data import resolve
    from volta_ml.suite.table import TASKS

    path = build("clip", world["models"])
    result, options = run(world, "xm3600_retrieval", "de", str(path), tmp_path, backend="clip")
    backend = load_backend("clip", ModelSpec(str(path)))
    data = TASKS["xm3600_retrieval"].reader(resolve(options["data"]), "de", options)
    texts = np.concatenate([backend.embed_texts([c]).numpy() for c in data.retrieval.captions])
    images = np.concatenate([backend.embed_images([data.store.source.load(r)]).numpy() for r in data.retrieval.images])
    scores = np.load(tmp_path / "test_de_scores.npy")
    np.testing.assert_allclose(scores, texts @ images.T, atol=1e-5)
    for key, value in brute_force_recalls(scores, data.retrieval.caption_image).items():
        assert result["metrics"][key] == pytest.approx(value), key


def loaded_path(world) -> str:
    return str(build("llava", world["models"]))


def test_a_generative_model_cannot_do_retrieval(world, tmp_path):
    from volta_ml.iglue_hf.tasks import BackendTaskError

    with pytest.raises(BackendTaskError, match="cannot do xm3600_retrieval, which needs a dual encoder backend"):
        run(world, "xm3600_retrieval", "de", loaded_path(world), tmp_path, backend_object=None)
