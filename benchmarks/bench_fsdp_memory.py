#!/usr/bin/env python
"""Per-rank memory of parameters + gradients + optimizer state, `--sharding ddp` against `--sharding fsdp`
(docs/hf_models.md, "Models larger than one GPU"). A benchmark, not a test: it takes minutes.

    python benchmarks/bench_fsdp_memory.py                      # 2 and 4 gloo ranks on the CPU, every part
    python benchmarks/bench_fsdp_memory.py --ranks 2 --json fsdp_memory.json
    python benchmarks/bench_fsdp_memory.py --part host --ranks 2 4 --host_divisor 8 --host_layers 8
    python benchmarks/bench_fsdp_memory.py --part options --ranks 2

Three parts:
- `host`: peak host memory (RSS) per rank and for the node (the largest sum of the ranks' simultaneous RSS,
  sampled every 5 ms) while the model is loaded and sharded, and while a full fine-tuning's `hf_best/` is
  written, each way: before (every rank reads the checkpoint; the whole state gathered on rank 0, then
  save_pretrained) and now (ranks > 0 on the meta device, rank 0 sending each its rows; `hf.export.save_by_unit`),
  for a bf16 checkpoint (in files of 2.3 decoder layers, as the published 72B's) loaded in bf16 and in fp32;
- `options`: what bf16 mixed precision, `--fsdp_offload` and activation checkpointing save in memory and cost in
  time (states per process, the peak RSS of a training step, the step's time);
- `states` (below): parameters + gradients + optimizer state per rank, DDP against FSDP.

Measured: Qwen2.5-VL-72B-Instruct's architecture (its published config below: GQA with 8 key/value heads, SwiGLU
MLP 3.6 x wide, untied 152k-token embeddings and LM head, the window-attention vision tower and its merger) at
reduced depth, 2 decoder layers and 2 vision blocks, built from the transformers config class with random weights.
Its widths are divided by --divisor (default 8: hidden 1024, MLP 3696, vocabulary 19008, vision 160): at full
width two decoder layers plus the embeddings are 4.3 B parameters, 69 GB of parameters + gradients + Adam state
per DDP rank, which this 24 GiB machine cannot hold even once. Each of N gloo processes (CPU) builds the model in
bf16, then the engine itself (`engine/sharding.py`: `Replicated` = DDP, `FullySharded` = FSDP2, `--amp bf16`,
trained tensors kept in fp32 as `--hf_dtype bf16 --amp bf16` does) places it, `engine.optim.build_optimizer` makes
volta-ml's AdamW, and one training step runs (a Qwen2.5-VL image + text batch, next-token loss). Then every rank
counts the bytes of the storages it holds: parameters (local shards under FSDP), gradients, optimizer state
(DDP's gradient buckets, another gradient-sized buffer, are not in this count). Two trainings: LoRA (r 16 on
q_proj / v_proj, everything else frozen) and full fine-tuning (language model + projector; vision tower frozen).

The same count computed from the parameter shapes (a parameter's shard holds ceil(rows / N) of its rows, as FSDP2
pads them; gradient and master weight fp32 for trained tensors, Adam two fp32 tensors) is printed beside the
measurement; where they agree, the formula gives the per-layer figures at full width (built on the meta device:
shapes only), from which docs/hf_models.md's table of GPUs per model size is computed.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
import tempfile
from pathlib import Path
from types import SimpleNamespace

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

# published configs (config.json of the Hugging Face repositories): text / vision widths, layer counts
QWEN25_VL = {
    "Qwen2.5-VL-7B": dict(hidden_size=3584, intermediate_size=18944, num_hidden_layers=28, num_attention_heads=28,
                          num_key_value_heads=4, vocab_size=152064),
    "Qwen2.5-VL-32B": dict(hidden_size=5120, intermediate_size=27648, num_hidden_layers=64, num_attention_heads=40,
                           num_key_value_heads=8, vocab_size=152064),
    "Qwen2.5-VL-72B": dict(hidden_size=8192, intermediate_size=29568, num_hidden_layers=80, num_attention_heads=64,
                           num_key_value_heads=8, vocab_size=152064),
}
QWEN25_VISION = dict(depth=32, hidden_size=1280, intermediate_size=3420, num_heads=16, patch_size=14,
                     spatial_merge_size=2, temporal_patch_size=2, window_size=112,
                     fullatt_block_indexes=[7, 15, 23, 31])
LORA_R, LORA_TARGETS = 16, ("q_proj", "v_proj")
GIB = 2 ** 30


def qwen25_vl_config(size: str = "Qwen2.5-VL-72B", layers: int = 2, blocks: int = 2, divisor: int = 1):
    """The config of `size` with `layers` decoder layers and `blocks` vision blocks, widths divided by `divisor`
    (through the number of heads: head sizes kept, 128 text, 80 vision; at least one head)."""
    from transformers import Qwen2_5_VLConfig
    text = dict(QWEN25_VL[size])
    heads = max(1, text["num_attention_heads"] // divisor)
    text.update(num_hidden_layers=layers, hidden_size=heads * 128, num_attention_heads=heads,
                intermediate_size=text["intermediate_size"] // divisor,
                num_key_value_heads=max(1, text["num_key_value_heads"] // divisor),
                vocab_size=text["vocab_size"] // divisor, max_position_embeddings=4096, tie_word_embeddings=False,
                bos_token_id=None, eos_token_id=None,
                rope_parameters={"rope_type": "default", "rope_theta": 1e6, "mrope_section": [16, 24, 24]})
    vision_heads = max(1, QWEN25_VISION["num_heads"] // divisor)
    vision = dict(QWEN25_VISION, depth=blocks, hidden_size=vision_heads * 80, num_heads=vision_heads,
                  intermediate_size=QWEN25_VISION["intermediate_size"] // divisor, out_hidden_size=text["hidden_size"],
                  fullatt_block_indexes=[blocks - 1])
    vocab = text["vocab_size"]
    return Qwen2_5_VLConfig(text_config=text, vision_config=vision, image_token_id=vocab - 3, video_token_id=vocab - 2,
                            vision_start_token_id=vocab - 4, vision_end_token_id=vocab - 5)


def trainable_setup(model, mode: str):
    """LoRA (peft, the language model's q_proj / v_proj) or full fine-tuning (language model + projector) as
    `volta-ml train --finetune lora|full` sets them up; returns the module to train."""
    from volta_ml.hf.families import FAMILIES
    from volta_ml.iglue_hf import finetune
    modules = finetune.part_modules(model, FAMILIES["qwen2_5_vl"].projector, "qwen2.5-vl")
    if mode == "lora":
        from peft import LoraConfig, get_peft_model
        from volta_ml.iglue_hf.lora import lora_targets
        return get_peft_model(model, LoraConfig(r=LORA_R, lora_alpha=32, lora_dropout=0.0,
                                                target_modules=lora_targets(model, list(LORA_TARGETS), "qwen")))
    finetune.freeze_full(model, modules, frozenset({"language", "projector"}))
    return model


class Step(torch.nn.Module):
    """The trained module: the model's logits for a batch (the engine's root unit under FSDP)."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, batch):
        return self.model(**batch).logits


def synthetic_batch(config, batch: int = 2, text: int = 64):
    """A Qwen2.5-VL batch: one 56x56 image per example (16 patches, 4 merged image tokens) and text."""
    v = config.vision_config
    grid = torch.tensor([[1, 4, 4]] * batch)
    patch = 3 * v.temporal_patch_size * v.patch_size ** 2
    pixels = torch.randn(int(grid.prod(-1).sum()), patch)
    ids = torch.randint(10, config.text_config.vocab_size - 10, (batch, 6 + text))
    ids[:, 0], ids[:, 5] = config.vision_start_token_id, config.vision_end_token_id
    ids[:, 1:5] = config.image_token_id
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "pixel_values": pixels.to(torch.bfloat16),
            "image_grid_thw": grid}


def held_bytes(model, optimizer) -> dict:
    """Bytes of the storages this rank holds for parameters, gradients and optimizer state (each storage once)."""
    from torch.distributed.tensor import DTensor
    seen: set = set()

    def size(tensor) -> int:
        if tensor is None:
            return 0
        local = tensor.to_local() if isinstance(tensor, DTensor) else tensor
        storage = local.untyped_storage()
        if storage.data_ptr() in seen:
            return 0
        seen.add(storage.data_ptr())
        return storage.nbytes()
    params = list(model.parameters())
    out = {"params": sum(size(p) for p in params), "grads": sum(size(p.grad) for p in params)}
    out["optimizer"] = sum(size(v) for state in optimizer.state.values() for v in state.values()
                           if isinstance(v, torch.Tensor))
    out["total"] = out["params"] + out["grads"] + out["optimizer"]
    return out


def predicted_bytes(named_params, world: int, sharded: bool) -> dict:
    """The same count from shapes: a shard holds ceil(rows / world) rows (FSDP2's padding); trained tensors have an
    fp32 master, an fp32 gradient and Adam's two fp32 moments; frozen ones their own dtype."""
    out = {"params": 0, "grads": 0, "optimizer": 0}
    for shape, elsize, trained in named_params:
        rows = math.ceil(shape[0] / world) if sharded and shape else (shape[0] if shape else 1)
        numel = rows * math.prod(shape[1:]) if shape else 1
        out["params"] += numel * (4 if trained else elsize)
        if trained:
            out["grads"] += numel * 4
            out["optimizer"] += numel * 8
    out["total"] = out["params"] + out["grads"] + out["optimizer"]
    return out


def shapes(module) -> list[tuple]:
    return [(tuple(p.shape), p.element_size(), p.requires_grad) for p in module.parameters()]


def _worker(rank: int, world: int, store: str, divisor: int, results: str) -> None:
    import torch.distributed as dist
    from transformers import Qwen2_5_VLForConditionalGeneration
    from volta_ml.engine import sharding
    from volta_ml.engine.distributed import DistInfo
    from volta_ml.engine.optim import build_optimizer
    from volta_ml.engine.train_support import Precision
    from volta_ml.iglue_hf.finetune import shard_units
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)
    info = DistInfo(rank=rank, world_size=world, device=torch.device("cpu"), initialized=True)
    args = SimpleNamespace(amp="bf16", fsdp_offload=False, compile=False, sharding="fsdp", optim="AdamW",
                           adam_impl="volta", lr=1e-4, weight_decay=0.01, adam_epsilon=1e-6, adam_betas=[0.9, 0.999],
                           adam_correct_bias=True)
    job = SimpleNamespace(shard_units=shard_units, train_dtype=torch.float32, interleaved=None)
    config = qwen25_vl_config(divisor=divisor)
    rows = []
    for mode in ("lora", "full"):
        for name in ("ddp", "fsdp"):
            torch.manual_seed(0)
            model = Step(trainable_setup(Qwen2_5_VLForConditionalGeneration(config).to(torch.bfloat16), mode))
            sharding.cast_trainable(model, torch.float32)
            expected = predicted_bytes(shapes(model), world, sharded=name == "fsdp")
            strategy = sharding.SHARDINGS[name](args, job, info)
            model = strategy.place(model)
            optimizer = build_optimizer(model, args, info.device)
            model = strategy.wrap(model)
            batch = synthetic_batch(config, batch=1, text=8)   # the states do not depend on the batch
            with Precision("bf16", info.device).autocast():
                logits = model(batch)
            loss = torch.nn.functional.cross_entropy(logits[:, :-1].float().flatten(0, 1),
                                                     batch["input_ids"][:, 1:].flatten())
            loss.backward()
            optimizer.step()
            measured = held_bytes(model, optimizer)
            rows.append({"mode": mode, "sharding": name, "world": world, "rank": rank, "measured": measured,
                         "predicted": expected, "loss": float(loss)})
            del model, optimizer, logits, loss
    Path(results, f"rank{rank}.json").write_text(json.dumps(rows))
    dist.destroy_process_group()


# --- host memory at load and at export ---------------------------------------------------------------------------
def rss_bytes(field: str = "VmRSS") -> int:
    """This process's resident memory (VmRSS) or its peak since the last `reset_peak` (VmHWM), in bytes."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"no {field} in /proc/self/status")


def private_bytes() -> int:
    """This process's RSS less its file-backed and shared pages (/proc/self/statm), in bytes."""
    fields = Path("/proc/self/statm").read_text().split()
    return (int(fields[1]) - int(fields[2])) * os.sysconf("SC_PAGE_SIZE")


def reset_peak() -> None:
    """VmHWM back to the current RSS (Linux: `5` into /proc/self/clear_refs)."""
    Path("/proc/self/clear_refs").write_text("5")


def save_checkpoint(folder: str, divisor: int, layers: int, blocks: int) -> int:
    """A bf16 safetensors checkpoint of Qwen2.5-VL-72B's architecture (`layers` decoder layers, `blocks` vision
    blocks, widths / `divisor`, random weights) in `folder`, in files of 2.3 decoder layers each as the published
    checkpoint's (38 files of ~4 GB, a layer being 1.75 GB); its size in bytes."""
    from transformers import Qwen2_5_VLForConditionalGeneration
    torch.manual_seed(0)
    model = Qwen2_5_VLForConditionalGeneration(qwen25_vl_config(layers=layers, blocks=blocks, divisor=divisor))
    model = model.to(torch.bfloat16)
    layer = sum(p.numel() * p.element_size() for p in model.model.language_model.layers[0].parameters())
    model.save_pretrained(folder, max_shard_size=int(2.3 * layer))
    return sum(f.stat().st_size for f in Path(folder).glob("*.safetensors"))


def _host_worker(rank: int, world: int, store: str, folders: list[str], dtype: str, way: str, results: str) -> None:
    """One rank: the model loaded (`every`: each rank reads the checkpoint, as before; `rank0`: the ranks but 0 on
    the meta device, rank 0's tensors received unit by unit) and sharded by the engine, then the full fine-tuning's
    export (`every`: the whole state gathered on rank 0, then save_pretrained; `rank0`: hf.export.save_by_unit).
    Peak RSS of each phase above the RSS before it. `folders`: a tiny checkpoint first (a warm-up: the imports and
    allocator pools the phases need are in the baseline), then the one measured."""
    import time

    import torch.distributed as dist
    from transformers import AutoModelForImageTextToText
    from volta_ml.engine import sharding
    from volta_ml.engine.distributed import DistInfo
    from volta_ml.hf.base import ModelSpec
    from volta_ml.hf.export import save_by_unit
    from volta_ml.hf.loading import load_model
    from volta_ml.iglue_hf.finetune import shard_units
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)
    info = DistInfo(rank=rank, world_size=world, device=torch.device("cpu"), initialized=True)
    args = SimpleNamespace(amp="none", fsdp_offload=False, compile=False, sharding="fsdp")
    # trained tensors kept in the loaded dtype (no fp32 master): the figures are the load's and the export's alone
    job = SimpleNamespace(shard_units=shard_units, train_dtype=None, interleaved=None)
    for index, folder in enumerate(folders):
        row = {"rank": rank, "world": world, "dtype": dtype, "way": way}
        dist.barrier()
        before, private0, start, began = rss_bytes(), private_bytes(), time.perf_counter(), time.time()
        reset_peak()
        spec = ModelSpec(model=folder, dtype=dtype, device="meta" if way == "rank0" and rank > 0 else "cpu")
        model = Step(trainable_setup(load_model(AutoModelForImageTextToText, spec, "qwen2.5-vl"), "full"))
        model = sharding.FullySharded(args, job, info).place(model)
        dist.barrier()
        row.update(load_s=time.perf_counter() - start, load_peak=rss_bytes("VmHWM") - before,
                   after_load=rss_bytes() - before, load_window=[began, time.time()], load_baseline=before,
                   load_private0=private0)
        out = Path(results, f"export_{way}_{dtype}_{world}_{index}")
        before, private0, start, began = rss_bytes(), private_bytes(), time.perf_counter(), time.time()
        reset_peak()
        if way == "rank0":
            save_by_unit(model.model, out if rank == 0 else None)
        else:
            state = sharding.gather_full_state(model.model)
            if rank == 0:
                model.model.save_pretrained(out, state_dict=state)
            del state
        dist.barrier()
        row.update(export_s=time.perf_counter() - start, export_peak=rss_bytes("VmHWM") - before,
                   export_window=[began, time.time()], export_baseline=before, export_private0=private0)
        del model
    Path(results, f"host_{way}_{dtype}_{world}_rank{rank}.json").write_text(json.dumps(row))
    dist.destroy_process_group()


def measure_host(worlds: list[int], divisor: int, layers: int, blocks: int) -> dict:
    """Per-rank peak RSS at load and at export, both ways, a bf16 checkpoint loaded in bf16 and in fp32."""
    import shutil

    import torch.multiprocessing as mp
    # glibc returns a freed block to the system only when it was mmapped; its threshold rises (to 32 MiB) after the
    # first such free, so this scale's tensors (a few MiB) would stay in the heap where a 72B model's (hundreds of
    # MiB) are mmapped and returned: a fixed threshold makes the small model behave as the large one
    os.environ.setdefault("MALLOC_MMAP_THRESHOLD_", str(1 << 20))
    with tempfile.TemporaryDirectory() as tmp:
        folder, tiny = os.path.join(tmp, "model"), os.path.join(tmp, "warm-up")
        size = save_checkpoint(folder, divisor, layers, blocks)
        save_checkpoint(tiny, 64, 2, 2)
        rows = []
        for world in worlds:
            for dtype in ("bf16", "fp32"):
                for way in ("every", "rank0"):
                    store = os.path.join(tmp, f"store_{way}_{dtype}_{world}")
                    context = mp.start_processes(_host_worker, args=(world, store, [tiny, folder], dtype, way, tmp),
                                                 nprocs=world, join=False)
                    samples = sample_rss([proc.pid for proc in context.processes], context)
                    ranks = [json.loads(Path(tmp, f"host_{way}_{dtype}_{world}_rank{r}.json").read_text())
                             for r in range(world)]
                    for phase in ("load", "export"):   # the node's total: the largest sum of simultaneous RSS
                        start = min(r[f"{phase}_window"][0] for r in ranks)
                        end = max(r[f"{phase}_window"][1] for r in ranks)
                        inside = [(total, private) for t, total, private in samples if start <= t <= end]
                        node = max([total for total, _ in inside] or [0]) - sum(r[f"{phase}_baseline"] for r in ranks)
                        private = max([p for _, p in inside] or [0]) - sum(r[f"{phase}_private0"] for r in ranks)
                        for r in ranks:
                            r[f"{phase}_node"], r[f"{phase}_node_private"] = node, private
                    rows += ranks
                    for index in (0, 1):
                        shutil.rmtree(os.path.join(tmp, f"export_{way}_{dtype}_{world}_{index}"), ignore_errors=True)
        return {"checkpoint_bytes": size, "rows": rows}


def sample_rss(pids: list[int], context, every: float = 0.005) -> list[tuple[float, int, int]]:
    """(time, sum of the processes' RSS, sum of their private RSS: RSS less file-backed and shared pages) every
    `every` seconds until the processes of `context` have ended."""
    import time
    page = os.sysconf("SC_PAGE_SIZE")
    samples = []
    while not context.join(timeout=every):
        total = private = 0
        for pid in pids:
            try:
                fields = Path(f"/proc/{pid}/statm").read_text().split()
                total, private = total + int(fields[1]) * page, private + (int(fields[1]) - int(fields[2])) * page
            except (OSError, IndexError, ValueError):
                pass
        samples.append((time.time(), total, private))
    return samples


def host_table(report: dict) -> list[dict]:
    """Per (world, dtype, way): the node's total of the per-rank load peaks against one copy of the model in the
    loaded dtype, rank 0's export peak against it, and the times."""
    size = report["checkpoint_bytes"]
    table = []
    keys = sorted({(r["world"], r["dtype"], r["way"]) for r in report["rows"]}, key=lambda k: (k[0], k[1], k[2] != "every"))
    for world, dtype, way in keys:
        rows = [r for r in report["rows"] if (r["world"], r["dtype"], r["way"]) == (world, dtype, way)]
        copy = size * (2 if dtype == "fp32" else 1)
        rank0 = next(r for r in rows if r["rank"] == 0)
        table.append({"world": world, "dtype": dtype, "way": way, "copy": copy,
                      "load_node": rank0["load_node"], "load_sum_of_peaks": sum(r["load_peak"] for r in rows),
                      "load_rank0": rank0["load_peak"], "export_node": rank0["export_node"],
                      "load_node_private": rank0["load_node_private"],
                      "export_node_private": rank0["export_node_private"],
                      "load_other": max((r["load_peak"] for r in rows if r["rank"]), default=0),
                      "export_rank0": rank0["export_peak"], "load_s": max(r["load_s"] for r in rows),
                      "export_s": max(r["export_s"] for r in rows)})
    return table


# --- what bf16, offload and activation checkpointing save and cost ------------------------------------------------
OPTIONS = {"plain": {}, "bf16": {"amp": "bf16"}, "offload": {"fsdp_offload": True}, "checkpointing": {}}


def _options_worker(rank: int, world: int, store: str, divisor: int, text: int, option: str, results: str) -> None:
    """Full fine-tuning (fp32 weights) under FSDP with one option (a fresh process each: no heap left by another):
    4 training steps; the states this rank holds and where, the peak RSS of the steps above the RSS before them
    (optimizer state created, activations, gathered units, gradients before their reduce-scatter), the mean time of
    steps 2-4."""
    import time

    import torch.distributed as dist
    from transformers import Qwen2_5_VLForConditionalGeneration
    from volta_ml.engine import sharding
    from volta_ml.engine.distributed import DistInfo
    from volta_ml.engine.optim import build_optimizer
    from volta_ml.engine.train_support import Precision
    from volta_ml.iglue_hf.contrastive import checkpoint_activations
    from volta_ml.iglue_hf.finetune import shard_units
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)
    info = DistInfo(rank=rank, world_size=world, device=torch.device("cpu"), initialized=True)
    job = SimpleNamespace(shard_units=shard_units, train_dtype=None, interleaved=None)
    config = qwen25_vl_config(divisor=divisor)
    rows = []
    for flags in [OPTIONS[option]]:
        args = SimpleNamespace(**{"amp": "none", "fsdp_offload": False, **flags}, compile=False, sharding="fsdp",
                               optim="AdamW", adam_impl="volta", lr=1e-4, weight_decay=0.01, adam_epsilon=1e-6,
                               adam_betas=[0.9, 0.999], adam_correct_bias=True)
        torch.manual_seed(0)
        hf = trainable_setup(Qwen2_5_VLForConditionalGeneration(config), "full")
        if option == "checkpointing":
            checkpoint_activations(hf)
        model = sharding.FullySharded(args, job, info).place(Step(hf.train()))
        optimizer = build_optimizer(model, args, info.device)
        batch = synthetic_batch(config, batch=2, text=text)
        batch["pixel_values"] = batch["pixel_values"].float()
        times = []
        dist.barrier()
        before = rss_bytes()
        reset_peak()
        for _ in range(4):
            start = time.perf_counter()
            with Precision(args.amp, info.device).autocast():
                logits = model(batch)
            loss = torch.nn.functional.cross_entropy(logits[:, :-1].float().flatten(0, 1),
                                                     batch["input_ids"][:, 1:].flatten())
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            del logits
            times.append(time.perf_counter() - start)
        rows.append({"option": option, "rank": rank, "states": held_bytes(model, optimizer)["total"],
                     "states_device": str(next(model.parameters()).device), "step_peak": rss_bytes("VmHWM") - before,
                     "step_s": sum(times[1:]) / len(times[1:]), "loss": float(loss.detach())})
        del model, optimizer, hf, loss
    Path(results, f"options_{option}_rank{rank}.json").write_text(json.dumps(rows))
    dist.destroy_process_group()


def measure_options(world: int, divisor: int, text: int) -> list[dict]:
    import torch.multiprocessing as mp
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for option in OPTIONS:
            mp.spawn(_options_worker, args=(world, os.path.join(tmp, f"store_{option}"), divisor, text, option, tmp),
                     nprocs=world, join=True)
            rows += [row for r in range(world)
                     for row in json.loads(Path(tmp, f"options_{option}_rank{r}.json").read_text())]
    return rows


def options_report(args) -> dict:
    world = args.ranks[0]
    print(f"Options: full fine-tuning (fp32 weights, AdamW), Qwen2.5-VL-72B architecture, 2 decoder layers + 2 vision "
          f"blocks, widths / {args.divisor}, FSDP over {world} gloo processes, batch 2 x {args.options_text} text tokens "
          f"+ one 56x56 image; max over ranks\n")
    rows = measure_options(world, args.divisor, args.options_text)
    print("| option | states per process (MiB) | held in | peak RSS of a step above before (MiB) | step s | x plain time |")
    print("|---|---:|---|---:|---:|---:|")
    plain = max(r["step_s"] for r in rows if r["option"] == "plain")
    table = []
    for option in OPTIONS:
        mine = [r for r in rows if r["option"] == option]
        row = {"option": option, "states": max(r["states"] for r in mine), "held_in": mine[0]["states_device"],
               "step_peak": max(r["step_peak"] for r in mine), "step_s": max(r["step_s"] for r in mine)}
        table.append(row)
        place = "CPU memory" + (" (offloaded: on a GPU run, none of it on the GPU)" if option == "offload" else "")
        print(f"| {option} | {row['states'] / 2**20:.1f} | {place} | {row['step_peak'] / 2**20:.0f} | "
              f"{row['step_s']:.2f} | {row['step_s'] / plain:.2f} |")
    print()
    return {"rows": rows, "table": table}


def measure(world: int, divisor: int) -> list[dict]:
    import torch.multiprocessing as mp
    with tempfile.TemporaryDirectory() as tmp:
        mp.spawn(_worker, args=(world, os.path.join(tmp, "store"), divisor, tmp), nprocs=world, join=True)
        return [row for r in range(world) for row in json.loads(Path(tmp, f"rank{r}.json").read_text())]


def per_layer(size: str) -> dict:
    """Per-unit parameter shapes at full width (meta device): the root (embeddings, LM head, norms, the vision patch
    embedding and merger), one decoder layer, one vision block, for LoRA and full fine-tuning."""
    from transformers import Qwen2_5_VLForConditionalGeneration
    from volta_ml.iglue_hf.finetune import shard_units
    out = {}
    for mode in ("lora", "full"):
        with torch.device("meta"):
            model = trainable_setup(Qwen2_5_VLForConditionalGeneration(qwen25_vl_config(size, 1, 1)).to(torch.bfloat16),
                                    mode)
        units = shard_units(model)
        layer = next(u for u in units if "DecoderLayer" in type(u).__name__)
        block = next(u for u in units if "VisionBlock" in type(u).__name__)
        inside = {id(p) for u in (layer, block) for p in u.parameters()}
        root = [(tuple(p.shape), p.element_size(), p.requires_grad) for p in model.parameters() if id(p) not in inside]
        out[mode] = {"root": root, "layer": shapes(layer), "block": shapes(block),
                     "largest_unit_params": max(sum(p.numel() for p in u.parameters()) for u in (layer, block)),
                     "largest_unit_trained": max(sum(p.numel() for p in u.parameters() if p.requires_grad)
                                                 for u in (layer, block))}
    return out


def per_rank_states(size: str, world: int, mode: str, layers: dict) -> dict:
    """Parameters + gradients + optimizer state per rank (bytes) of the whole model at full depth, FSDP over `world`
    processes (world 1: one process holding everything, i.e. DDP's per-rank figure)."""
    text = QWEN25_VL[size]
    total = {"params": 0, "grads": 0, "optimizer": 0, "total": 0}
    for unit, count in (("root", 1), ("layer", text["num_hidden_layers"]), ("block", QWEN25_VISION["depth"])):
        part = predicted_bytes(layers[mode][unit], world, sharded=True)
        for key in total:
            total[key] += part[key] * count
    return total


def gpus_needed(size: str, mode: str, layers: dict, gpu_gib: float = 80.0, usable: float = 0.75) -> tuple[int, float]:
    """The fewest GPUs (1, 2, 4, ..., 64) whose per-GPU states + working set (the root unit and two decoder layers
    gathered in bf16, one layer's fp32 gradient before its reduce-scatter) fit in `usable` of `gpu_gib` (the rest:
    activations, CUDA context, fragmentation; activations are not counted here)."""
    root = sum(math.prod(s) for s, _, _ in layers[mode]["root"])
    working = (root + 2 * layers[mode]["largest_unit_params"]) * 2 + layers[mode]["largest_unit_trained"] * 4
    for world in (1, 2, 4, 8, 16, 32, 64):
        need = per_rank_states(size, world, mode, layers)["total"] + working
        if need <= usable * gpu_gib * GIB:
            return world, need / GIB
    return 0, float("nan")


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ranks", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--divisor", type=int, default=8, help="widths divided by this for the measured step")
    parser.add_argument("--json", default=None, help="write the results here")
    parser.add_argument("--part", choices=("states", "host", "options", "all"), default="all",
                        help="states: parameters + gradients + optimizer state per rank; host: peak host memory at "
                             "load and at export; options: what bf16, --fsdp_offload and activation checkpointing "
                             "save and cost")
    parser.add_argument("--options_text", type=int, default=512, help="text tokens per example for --part options")
    parser.add_argument("--host_divisor", type=int, default=4, help="widths divided by this for --part host")
    parser.add_argument("--host_layers", type=int, default=6, help="decoder layers for --part host")
    args = parser.parse_args(argv)
    report = {}
    if args.part in ("host", "all"):
        report["host"] = host_report(args)
    if args.part in ("options", "all"):
        report["options"] = options_report(args)
    if args.part in ("states", "all"):
        report.update(states_report(args))
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1))
    return report


def host_report(args) -> dict:
    blocks = 2
    print(f"Host memory: Qwen2.5-VL-72B architecture, {args.host_layers} decoder layers + {blocks} vision blocks, "
          f"widths / {args.host_divisor}, a bf16 safetensors checkpoint; per-rank peak RSS above the RSS before the "
          f"phase (gloo, CPU); node: the largest sum of the ranks' simultaneous RSS (sampled every 5 ms) above their sum "
          f"before the phase\n")
    report = measure_host(args.ranks, args.host_divisor, args.host_layers, blocks)
    print(f"checkpoint: {report['checkpoint_bytes'] / 2**20:.0f} MiB\n")
    print("| ranks | loaded as | load | node at load (MiB) | x one copy | node private | rank 0 peak | other ranks' "
          "peak | load s | rank 0 peak at export (MiB) | x one copy | node at export | export s |")
    print("|---:|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    report["table"] = host_table(report)
    for row in report["table"]:
        way = "every rank reads" if row["way"] == "every" else "rank 0 reads, meta elsewhere"
        print(f"| {row['world']} | {row['dtype']} | {way} | {row['load_node'] / 2**20:.0f} | "
              f"{row['load_node'] / row['copy']:.2f} | {row['load_node_private'] / row['copy']:.2f} | "
              f"{row['load_rank0'] / 2**20:.0f} | "
              f"{row['load_other'] / 2**20:.0f} | {row['load_s']:.1f} | {row['export_rank0'] / 2**20:.0f} | "
              f"{row['export_rank0'] / row['copy']:.2f} | {row['export_node'] / 2**20:.0f} | {row['export_s']:.1f} |")
    print()
    return report


def states_report(args) -> dict:
    report = {"divisor": args.divisor, "measured": {}, "sizes": {}}
    print(f"Qwen2.5-VL-72B architecture, 2 decoder layers + 2 vision blocks, widths / {args.divisor}; per-rank bytes "
          f"of parameters + gradients + optimizer state after one training step (max over ranks)\n")
    print("| training | ranks | DDP (MiB) | FSDP (MiB) | FSDP / DDP | bound 1/N + 0.10 | formula FSDP (MiB) |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    ok = True
    for world in args.ranks:
        rows = measure(world, args.divisor)
        for mode in ("lora", "full"):
            held = {s: max(r["measured"]["total"] for r in rows if r["mode"] == mode and r["sharding"] == s)
                    for s in ("ddp", "fsdp")}
            formula = max(r["predicted"]["total"] for r in rows if r["mode"] == mode and r["sharding"] == "fsdp")
            ratio = held["fsdp"] / held["ddp"]
            bound = 1 / world + 0.10
            ok &= ratio <= bound
            report["measured"][f"{mode}/{world}"] = {"ddp": held["ddp"], "fsdp": held["fsdp"], "ratio": ratio,
                                                     "bound": bound, "formula_fsdp": formula, "rows": rows}
            print(f"| {mode} | {world} | {held['ddp'] / 2**20:.1f} | {held['fsdp'] / 2**20:.1f} | {ratio:.3f} | "
                  f"{bound:.3f} | {formula / 2**20:.1f} |")
    print(f"\nFSDP <= 1/N + 10% of DDP on every row: {'yes' if ok else 'NO'}\n")
    print("Computed from the per-layer figures at full width (parameters + gradients + Adam state per GPU, GiB; "
          "activations not included):\n")
    print("| model | training | 1 GPU (DDP) | 2 | 4 | 8 | 16 | GPUs of 80 GB needed | per GPU then (GiB) |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|")
    for size in QWEN25_VL:
        layers = per_layer(size)
        for mode in ("lora", "full"):
            states = [per_rank_states(size, n, mode, layers)["total"] / GIB for n in (1, 2, 4, 8, 16)]
            need, gib = gpus_needed(size, mode, layers)
            report["sizes"][f"{size}/{mode}"] = {"states_gib": states, "gpus": need, "per_gpu_gib": gib}
            print(f"| {size} | {mode} | " + " | ".join(f"{v:.1f}" for v in states) + f" | {need} | {gib:.1f} |")
    report["bound_met"] = ok
    return report


if __name__ == "__main__":
    main()
