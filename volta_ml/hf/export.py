"""The `hf_best/` export of a training run (`volta-ml train --hf_model`): what it records, and the check every
loader of a model or adapter folder runs (`volta_ml.hf.load_backend`: iglue-hf, cvqa score; `train --hf_model /
--hf_adapter`).

A run writes `pytorch_model_best.bin`, then exports the same weights into `hf_best/` (save_pretrained, swapped in
whole by `volta_ml.atomic.replace_folder`). The export carries `volta_ml_export.json` (`RECORD`): the epoch,
optimizer step and validation score of its weights and the sha256 of the `pytorch_model_best.bin` it was made
with. If the export failed after the checkpoint was written (a full disk), the run's best checkpoint is newer than
its export; `check` then says so on stderr, once per folder, and `status` gives what is recorded in results.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

from volta_ml.digest import cached_file_digests

RECORD = "volta_ml_export.json"
FORMAT = "volta-ml-export/1"
_WARNED: set[str] = set()


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
