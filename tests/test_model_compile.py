"""torch.compile gives the eager model's outputs and gradients: the `--compile` training path.

Dual- and single-stream models go through dynamo + AOTAutograd with `fullgraph=True` (no graph breaks in
the model code) on the `aot_eager` backend, which is quick; one small forward also runs through inductor,
the backend `--compile` uses, so its generated kernels are checked against eager numbers too.
"""
import os
import shutil

import pytest
import torch

from helpers_tiny import IGLUE_TASKS, tiny_batch, tiny_config
from volta_ml.cli.train_flags import build_parser
from volta_ml.models import build_model, load_config

SUBLAYER_KEYS = ("tt_attn_sublayers", "tv_attn_sublayers", "vt_attn_sublayers", "vv_attn_sublayers",
                 "t_ff_sublayers", "v_ff_sublayers", "shared_sublayers", "single_ln_sublayers")


def _short_lxmert():
    """ctrl_lxmert's sub-layer kinds, one of each (both-stream, text-only, cross, self), renumbered:
    tracing all 33 sub-layers would take minutes."""
    keep = [0, 1, 10, 11, 18, 19, 20]
    cfg = tiny_config("ctrl_lxmert").to_dict()
    for key in SUBLAYER_KEYS:
        cfg[key] = [keep.index(n) for n in cfg[key] if n in keep]
    cfg["bert_layer2attn_sublayer"], cfg["bert_layer2ff_sublayer"] = {"0": 0, "1": 2}, {"0": 1, "1": 3}
    return load_config(cfg)


def _model(family, layers=2):
    torch.manual_seed(0)
    torch._dynamo.reset()
    config = _short_lxmert() if family == "ctrl_lxmert" else tiny_config(family, layers=layers)
    model = build_model(config, {"TASK15": IGLUE_TASKS["TASK15"]})
    return model.eval()   # eval: no dropout RNG, so eager and compiled see the same function


@pytest.mark.parametrize("family", ["ctrl_lxmert", "ctrl_uniter_base"])   # dual- and single-stream paths
def test_compiled_graph_matches_eager_with_gradients(family):
    model = _model(family)
    if family == "ctrl_lxmert":
        assert 0 < model.bert.encoder.cross_start < len(model.bert.encoder.layer)   # cross layers included
    batch = tiny_batch(model.config)
    compiled = torch.compile(model, backend="aot_eager", fullgraph=True)

    def run(m):
        model.zero_grad(set_to_none=True)
        logits = m(**batch, task_id="TASK15")
        logits.square().mean().backward()
        return logits.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}

    eager_logits, eager_grads = run(model)
    comp_logits, comp_grads = run(compiled)
    torch.testing.assert_close(comp_logits, eager_logits, rtol=1e-5, atol=1e-6)
    assert comp_grads.keys() == eager_grads.keys()
    for name, g in eager_grads.items():
        torch.testing.assert_close(comp_grads[name], g, rtol=1e-4, atol=1e-7, msg=name)


@pytest.mark.skipif(not any(shutil.which(c) for c in (os.environ.get("CXX", "g++"), "g++", "clang++")),
                    reason="inductor needs a C++ compiler")
def test_inductor_forward_matches_eager():
    model = _model("ctrl_uniter_base", layers=1)
    batch = tiny_batch(model.config)
    with torch.no_grad():
        eager = model(**batch, task_id="TASK15")
        compiled = torch.compile(model, fullgraph=True)(**batch, task_id="TASK15")
    torch.testing.assert_close(compiled, eager, rtol=1e-4, atol=1e-5)


def test_compile_flag_is_off_by_default():
    base = ["--bert_model", "bert-base-uncased", "--config_file", "x.json", "--tasks_config_file", "t.yml"]
    assert build_parser().parse_args(base).compile is False
    assert build_parser().parse_args(base + ["--compile"]).compile is True
