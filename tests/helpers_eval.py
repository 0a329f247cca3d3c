"""Tiny models and checkpoints for the end-to-end evaluation tests."""
from __future__ import annotations

import json
from pathlib import Path

import torch

from helpers_tasks import REPO

FEATURE_DIM = 16


def tiny_config_file(out: Path, base: str = "ctrl_uniter_base", vocab_size: int | None = None) -> Path:
    """`config_models/<base>.json` shrunk to 2 layers of width 32 over 16-d region features."""
    config = json.loads((REPO / "config_models" / f"{base}.json").read_text())
    config.update(hidden_size=32, intermediate_size=64, num_attention_heads=2, pooler_size=32,
                  v_hidden_size=32, v_intermediate_size=64, v_num_attention_heads=2, v_pooler_size=32,
                  v_feature_size=FEATURE_DIM, clf_hidden_size=32, max_position_embeddings=128)
    if vocab_size:
        config["vocab_size"] = vocab_size
    config.update(tt_attn_sublayers=[0, 2], tv_attn_sublayers=[0, 2], vt_attn_sublayers=[0, 2],
                  vv_attn_sublayers=[0, 2], t_ff_sublayers=[1, 3], v_ff_sublayers=[1, 3],
                  shared_sublayers=[0, 1, 2, 3], single_ln_sublayers=[0, 1, 2, 3],
                  bert_layer2attn_sublayer={"0": 0, "1": 2}, bert_layer2ff_sublayer={"0": 1, "1": 3})
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(config, indent=1))
    return out


def build_checkpoint(config_file: Path, task_config: dict, task_id: str, out: Path, seed: int = 0,
                     force_class: int | None = None, head_gain: float = 1.0) -> Path:
    """A fine-tuned-style checkpoint (`bert.*` + `clfs_dict.TASK<n>.*`); `force_class` makes the head
    predict that class for every input (final layer weight 0, bias 5 on the class); `head_gain` scales the
    final layer so a random model's outputs differ clearly between inputs."""
    from volta_ml.models import build_model, load_config

    torch.manual_seed(seed)
    model = build_model(load_config(str(config_file)), task_config, [task_id], kind="tasks")
    state = model.state_dict()
    prefix = f"clfs_dict.{task_id}."
    final = [k for k in state if k.startswith(prefix) and k.endswith("bias")][-1]
    state[final[: -len("bias")] + "weight"].mul_(head_gain)
    if force_class is not None:
        state[final[: -len("bias")] + "weight"].zero_()
        state[final].zero_()
        state[final][force_class] = 5.0
    out.parent.mkdir(parents=True, exist_ok=True)
    torch.save(state, out)
    return out


def link(src: Path, dst: Path) -> Path:
    dst.parent.mkdir(parents=True, exist_ok=True)
    if not dst.exists():
        dst.symlink_to(src)
    return dst


def build_data_root(root: Path, iglue: Path) -> Path:
    """An IGLUE-like data directory: real annotation files (linked) and generated feature stores at the
    paths the IGLUE test task configs name."""
    import json as _json
    from helpers_tasks import make_store, read_jsonl

    for lang in ("en", "ar"):
        link(iglue / f"XVNLI/annotations/{lang}/test.jsonl", root / f"XVNLI/annotations/{lang}/test.jsonl")
    ve_ids = {int(r["Flikr30kID"]) for lang in ("en", "ar")
              for r in read_jsonl(iglue / f"XVNLI/annotations/{lang}/test.jsonl")}
    make_store(root / "flickr30k/features/flickr30k_boxes36.lmdb", sorted(ve_ids), FEATURE_DIM)

    for name in ("trainval_ans2label.json", "trainval_label2ans.json"):
        link(iglue / f"gqa/annotations/{name}", root / f"gqa/annotations/{name}")
    # xGQA test.json is not public: the German 5-shot file has the same GQA-dict format
    link(iglue / "xGQA/annotations/few_shot/de/train_5.json", root / "xGQA/annotations/few_shot/de/test.json")
    questions = _json.loads((iglue / "xGQA/annotations/few_shot/de/train_5.json").read_text(encoding="utf-8"))
    make_store(root / "gqa/features/vg-gqa_boxes36.lmdb", [q["imageId"] for q in questions.values()], FEATURE_DIM)

    marvl = link(iglue / "marvl/zero_shot/annotations/marvl-id.jsonl", root / "marvl/zero_shot/annotations/marvl-id.jsonl")
    make_store(root / "marvl/zero_shot/features/marvl-id_boxes36.lmdb",
               [r[k].split(".")[0] for r in read_jsonl(marvl) for k in ("left_img", "right_img")], FEATURE_DIM)

    nlvr = link(iglue / "nlvr2/annotations/dev.jsonl", root / "nlvr2/annotations/test.jsonl")
    make_store(root / "nlvr2/features/nlvr2_boxes36.lmdb",
               ["-".join(r["identifier"].split("-")[:-1]) + f"-img{i}" for r in read_jsonl(nlvr) for i in (0, 1)],
               FEATURE_DIM)

    xf = link(iglue / "xFlickrCO/annotations/de/train_100.jsonl", root / "xFlickrCO/annotations/de/dev_100.jsonl")
    make_store(root / "xFlickrCO/features/xflickrco-test_boxes36.lmdb", [r["img_path"] for r in read_jsonl(xf)],
               FEATURE_DIM)
    return root
