"""`--sharding fsdp` at the sizes it is for (docs/hf_models.md, "Models larger than one GPU"): the ranks but 0 build
the model on the meta device and receive rank 0's tensors unit by unit as each is sharded (engine/sharding.py,
`take_from_rank0`), and a model fine-tuned in full is exported one FSDP unit at a time (hf/export.py,
`save_by_unit`). One 2-process launch (tests/helpers_fsdp_load.py) builds a tiny Qwen2-VL both ways, LoRA with the
projector trained and full fine-tuning, and exports it both ways.
"""
import subprocess
import sys

import pytest
import torch

from helpers_hf_train import REPO, make_xvnli_root, train_env
from helpers_train import free_port
from helpers_vlm_families import build_family, shared_root

HELPER = str(REPO / "tests" / "helpers_fsdp_load.py")


@pytest.fixture(scope="module")
def launched(tmp_path_factory):
    root = tmp_path_factory.mktemp("fsdp_load")
    data, images = make_xvnli_root(root / "xvnli", 8, 4)
    model = build_family("qwen2-vl", shared_root())
    out = root / "out"
    out.mkdir()
    flags = ["--hf_model", str(model), "--task", "xvnli", "--sharding", "fsdp", "--lora_r", "4", "--num_workers",
             "0", "--num_val_workers", "0", "--data_root", str(data), "--images", str(images)]
    for attempt in range(2):    # a port taken meanwhile: once more
        done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
                               "--master_port", str(free_port()), HELPER, str(out), *flags], cwd=root,
                              env=train_env(), capture_output=True, text=True, timeout=600)
        if done.returncode == 0 or "Address already in use" not in done.stderr:
            break
    assert done.returncode == 0, done.stderr[-4000:]
    return out


@pytest.mark.parametrize("finetune", ["projector", "full"])
def test_meta_build_gives_every_rank_the_same_shards_as_loading_everywhere(launched, finetune):
    for rank in (0, 1):
        today = torch.load(launched / f"{finetune}_today_rank{rank}.pt", weights_only=True)
        meta = torch.load(launched / f"{finetune}_meta_rank{rank}.pt", weights_only=True)
        assert not today.pop("built_on_meta") and bool(meta.pop("built_on_meta")) == (rank == 1)
        assert today.keys() == meta.keys()
        assert any(k.startswith("buffer:") and k.endswith("inv_freq") for k in meta)   # non-persistent, rebuilt
        if finetune == "projector":
            assert any(".lora_A." in k for k in meta) and any(".modules_to_save." in k for k in meta)
        for key in today:
            assert today[key].dtype == meta[key].dtype and torch.equal(today[key], meta[key]), (rank, key)


def test_export_by_unit_is_save_pretrained_bit_for_bit(launched):
    import json

    from safetensors import safe_open
    from transformers import AutoModelForImageTextToText
    units, today = launched / "units_export", launched / "today_export"
    index = json.loads((units / "model.safetensors.index.json").read_text())
    files = sorted(p.name for p in units.glob("*.safetensors"))
    assert len(files) == 6 and sorted(set(index["weight_map"].values())) == files   # 3 units, the root in 3 runs
    written = {}
    for name in files:
        with safe_open(units / name, "pt") as f:
            assert f.metadata() == {"format": "pt"}
            written.update({key: f.get_tensor(key) for key in f.keys()})
    assert set(index["weight_map"]) == set(written)
    assert index["metadata"]["total_size"] == sum(t.numel() * t.element_size() for t in written.values())
    with safe_open(today / "model.safetensors", "pt") as f:
        reference = {key: f.get_tensor(key) for key in f.keys()}
    assert written.keys() == reference.keys()
    assert all(written[k].dtype == reference[k].dtype and torch.equal(written[k], reference[k]) for k in reference)
    assert (units / "config.json").read_text() == (today / "config.json").read_text()
    loaded = AutoModelForImageTextToText.from_pretrained(units).state_dict()
    plain = AutoModelForImageTextToText.from_pretrained(today).state_dict()
    assert loaded.keys() == plain.keys() and all(torch.equal(loaded[k], plain[k]) for k in plain)
