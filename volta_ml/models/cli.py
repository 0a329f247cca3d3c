"""`volta-ml models ...`: list configs, inspect a config or checkpoint, convert checkpoints, self-test."""
from __future__ import annotations

import time

import torch

from volta_ml.options import int_at_least

from .checkpoint import load_checkpoint, read_state_dict, save_checkpoint, save_state_dict
from .config import available_configs, load_config
from .factory import build_model

IGLUE_HEADS = {
    "TASK19": {"name": "XVNLI", "type": "VL-tri-classifier", "num_labels": 3},
    "TASK15": {"name": "xGQA", "type": "VL-classifier-GQA", "num_labels": 1842},
    "TASK12": {"name": "MaRVL", "type": "VL-binary-classifier", "num_labels": 2},
    "TASK8": {"name": "xFlickrCO", "type": "VL-logit", "num_labels": 1},
}


def register(subparsers) -> None:
    p = subparsers.add_parser("models", help="model configs and checkpoints")
    sub = p.add_subparsers(dest="models_command", metavar="ACTION", required=True)

    s = sub.add_parser("list", help="list the shipped model configs")
    s.set_defaults(func=cmd_list)

    s = sub.add_parser("inspect", help="summarise a model config (and optionally check a checkpoint against it)")
    s.add_argument("config", help="config name (e.g. ctrl_xuniter_base) or JSON file")
    s.add_argument("--checkpoint", help="VOLTA .bin or .safetensors checkpoint to load and report on")
    s.add_argument("--task_cfg", help="JSON/YAML task config with the heads to build (default: the 4 IGLUE heads)")
    s.add_argument("--is_m3p", action="store_true", default=None)
    s.set_defaults(func=cmd_inspect)

    s = sub.add_parser("convert", help="convert a checkpoint between VOLTA .bin and .safetensors")
    s.add_argument("src")
    s.add_argument("dst", help="output path; .safetensors or .bin")
    s.set_defaults(func=cmd_convert)

    s = sub.add_parser("selftest", help="build a real config, save a VOLTA checkpoint, reload it and run it")
    s.add_argument("config", nargs="?", default="ctrl_uniter_base")
    s.add_argument("--batch", type=int_at_least(1), default=8)
    s.set_defaults(func=cmd_selftest)


def _task_cfg(path):
    if not path:
        return IGLUE_HEADS
    import yaml
    with open(path) as f:
        return yaml.safe_load(f)


def cmd_list(args) -> int:
    for name in available_configs():
        c = load_config(name)
        stream = "joint" if c.is_m3p else ("dual" if c.is_dual_stream else "single")
        print(f"{name:24s} {c.image_embeddings:10s} {stream:6s} fusion={c.fusion_method:5s} text={c.text_model} ({c.bert_model})")
    return 0


def cmd_inspect(args) -> int:
    config = load_config(args.config, is_m3p=args.is_m3p)
    task_cfg = _task_cfg(args.task_cfg)
    with torch.device("meta"):
        model = build_model(config, task_cfg, list(task_cfg))
    sd = model.state_dict()
    unique = {id(v) for v in model.state_dict(keep_vars=True).values()}
    n_params = sum(p.numel() for p in model.parameters())
    print(f"config: {config.source}\nfamily: {config.image_embeddings}  fusion: {config.fusion_method}  "
          f"text model: {config.text_model}\nstate-dict keys: {len(sd)} ({len(sd) - len(unique)} aliases)  "
          f"parameters: {n_params / 1e6:.1f}M")
    if args.checkpoint:
        model = build_model(config, task_cfg, list(task_cfg))
        print(load_checkpoint(model, args.checkpoint).summary())
    return 0


def cmd_convert(args) -> int:
    sd = read_state_dict(args.src)
    seen, aliases = {}, {}   # keys sharing one tensor are stored once in safetensors
    for k, v in sd.items():
        key = (v.data_ptr(), tuple(v.shape), v.dtype)
        if key in seen and v.numel():
            aliases[k] = seen[key]
        else:
            seen[key] = k
    save_state_dict(sd, args.dst, aliases)
    print(f"wrote {len(sd)} keys to {args.dst}")
    return 0


def cmd_selftest(args) -> int:
    """An honest smoke test of the model stage: real config, VOLTA-format checkpoint round trip, forward."""
    import tempfile
    from pathlib import Path
    config = load_config(args.config)
    torch.manual_seed(0)
    t0 = time.perf_counter()
    model = build_model(config, IGLUE_HEADS).eval()
    print(f"built {args.config} ({sum(p.numel() for p in model.parameters()) / 1e6:.1f}M parameters, random "
          f"weights: no pretrained weights ship offline) in {time.perf_counter() - t0:.1f}s")
    with tempfile.TemporaryDirectory() as tmp:
        path = save_checkpoint(model, Path(tmp) / "pytorch_model.bin")
        fresh = build_model(config, IGLUE_HEADS).eval()
        report = load_checkpoint(fresh, path)
        print(f"VOLTA checkpoint round trip: {report.summary()}")
    B, L, R = args.batch, 40, 37
    vocab = config.n_words if config.is_m3p else config.vocab_size
    feat = 2048 if config.is_m3p else config.v_feature_size
    locs = 5 if config.is_m3p else config.num_locs
    batch = dict(input_txt=torch.randint(5, vocab, (B, L)), input_imgs=torch.rand(B, R, feat),
                 image_loc=torch.rand(B, R, locs))
    with torch.no_grad():
        for tid in IGLUE_HEADS:
            t0 = time.perf_counter()
            a = model(**batch, task_id=tid)
            b = fresh(**batch, task_id=tid)
            same = torch.equal(a, b)
            print(f"{tid} ({IGLUE_HEADS[tid]['name']}): logits {tuple(a.shape)}, reloaded model identical: {same}, "
                  f"{(time.perf_counter() - t0) / 2 * 1000:.0f} ms/forward at batch {B}")
            if not same:
                return 1
    return 0
