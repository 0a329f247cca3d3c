"""The `hf_best/` export of a training run (`volta-ml train --hf_model`): what it records, and the check every
loader of a model or adapter folder runs (`volta_ml.hf.load_backend`: iglue-hf, cvqa score; `train --hf_model /
--hf_adapter`).

A run writes `pytorch_model_best.bin`, then exports the same weights into `hf_best/` (save_pretrained, swapped in
whole by `volta_ml.atomic.replace_folder`). The export carries `volta_ml_export.json` (`RECORD`): the epoch,
optimizer step and validation score of its weights and the sha256 of the `pytorch_model_best.bin` it was made
with. If the export failed after the checkpoint was written (a full disk), the run's best checkpoint is newer than
its export; `check` then says so on stderr, once per folder, and `status` gives what is recorded in results.

A model fine-tuned in full under `--sharding fsdp` is written by `save_by_unit`: sharded safetensors files, one
per FSDP unit, and their index, which `from_pretrained` loads as any sharded checkpoint; no rank ever holds the
whole model.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

from volta_ml.digest import cached_file_digests

RECORD = "volta_ml_export.json"
FORMAT = "volta-ml-export/1"
INDEX = "model.safetensors.index.json"    # transformers' name for the index of a sharded checkpoint
_WARNED: set[str] = set()


def _unit_runs(model, keys: list[str]) -> list[list[str]]:
    """`keys` (state_dict order) cut into runs of consecutive keys held by the same FSDP unit (the innermost
    `FSDPModule` whose name prefixes the key; the root unit for the rest)."""
    from torch.distributed.fsdp import FSDPModule
    units = sorted((name for name, m in model.named_modules() if isinstance(m, FSDPModule) and name),
                   key=len, reverse=True)

    def unit(key: str) -> str:
        return next((name for name in units if key.startswith(name + ".")), "")
    runs: list[list[str]] = []
    last = None
    for key in keys:
        owner = unit(key)
        if owner != last or not runs:
            runs.append([])
            last = owner
        runs[-1].append(key)
    return runs


def save_by_unit(model, folder: Path | None) -> None:
    """The `save_pretrained` folder of a transformers model whose parameters are FSDP-sharded, written one FSDP unit
    at a time: each unit's tensors are all-gathered (collective: every rank calls this, in step; `folder` is None
    on the ranks other than 0) and written by rank 0 as one `model-0000i-of-0000n.safetensors` file, then freed, so
    rank 0 holds one unit's whole tensors at most beyond its shards; then the index (`model.safetensors.index.json`)
    and transformers' own config files. The tensors and their names are those `save_pretrained` writes: tied
    weights once, transformers' weight-name conversion reverted (per unit: a conversion that merges tensors of two
    units is not supported), the state dict's dtypes."""
    import torch
    from safetensors.torch import save_file
    from torch.distributed.tensor import DTensor
    from transformers.core_model_loading import revert_weight_conversion
    from transformers.modeling_utils import remove_tied_weights_from_state_dict

    state = model.state_dict()
    for key in getattr(model, "_keys_to_ignore_on_save", None) or ():
        state.pop(key, None)
    probe = {key: torch.empty(value.shape, dtype=value.dtype, device="meta") for key, value in state.items()}
    kept = remove_tied_weights_from_state_dict(probe, model)
    runs = _unit_runs(model, [key for key in state if key in kept])
    if folder is not None:   # first: save_pretrained removes the model-*-of-* files it did not write itself
        model.save_pretrained(folder, state_dict={})    # config.json, generation_config.json: no tensors
    weight_map, total = {}, 0
    for number, run in enumerate(runs, 1):
        tensors = {}
        for key in run:
            value = state[key]
            value = value.full_tensor() if isinstance(value, DTensor) else value
            if folder is not None:
                tensors[key] = value.detach().to("cpu").contiguous()
            del value
        if folder is None:
            continue
        tensors = revert_weight_conversion(model, tensors)
        name = f"model-{number:05d}-of-{len(runs):05d}.safetensors"
        save_file(tensors, str(Path(folder) / name), metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(tensors, name))
        total += sum(t.numel() * t.element_size() for t in tensors.values())
        del tensors
    if folder is None:
        return
    index = {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
    (Path(folder) / INDEX).write_text(json.dumps(index, indent=2) + "\n", encoding="utf-8")


def write_record(folder: Path, checkpoint: Path, epoch: int, global_step: int, score: float) -> None:
    """`<folder>/volta_ml_export.json`: which best weights the export holds (written into the new export before
    it is swapped in)."""
    record = {"format": FORMAT, "epoch": int(epoch), "global_step": int(global_step), "score": float(score),
              "checkpoint": checkpoint.name, "checkpoint_sha256": cached_file_digests([checkpoint])[str(checkpoint)]}
    (Path(folder) / RECORD).write_text(json.dumps(record, indent=1) + "\n", encoding="utf-8")


def status(folder: str | None) -> dict | None:
    """What an export folder records (None for a folder that is not one), with `older_than_best`: True when the
    run's best checkpoint beside it is not the one the export was made from."""
    if not folder:
        return None
    path = Path(folder).expanduser()
    try:
        record = json.loads((path / RECORD).read_text(encoding="utf-8"))
        checkpoint = path.parent / record["checkpoint"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    found = {key: record.get(key) for key in ("epoch", "global_step", "score")}
    found["checkpoint"] = str(checkpoint)
    try:
        digest = cached_file_digests([checkpoint])[str(checkpoint)]
    except OSError:       # an export copied away from its run: nothing to compare with
        return found
    return {**found, "older_than_best": digest != record.get("checkpoint_sha256")}


def check(folder: str | None) -> dict | None:
    """`status(folder)`, and one warning line on stderr when the export is older than its run's best."""
    found = status(folder)
    if found and found.get("older_than_best") and str(folder) not in _WARNED:
        _WARNED.add(str(folder))
        print(f"warning: {folder} is older than its run's best: it holds the weights of epoch {found['epoch']} "
              f"(step {found['global_step']}, validation score {found['score']:.4f}), but {found['checkpoint']} "
              f"has changed since (a later export failed); resume the run to export its best again",
              file=sys.stderr, flush=True)
    return found
