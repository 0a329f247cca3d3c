"""A cell of a sweep: one unit of work (a training run, an evaluation) as a list of argv commands.

A cell owns a directory. `cell.json` describes it (written when the sweep is planned), the commands write
their logs there, and the last command records `result.json`, atomically, once the cell's outputs were
checked. A cell is finished exactly when a complete `result.json` exists, so re-running a sweep never
repeats finished work and an interrupted cell simply runs again.
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

from volta_ml.atomic import atomic_write_json

CELL_FILE = "cell.json"
RESULT_FILE = "result.json"
PRETRAINED = "pytorch_model_pretrained.bin"   # a pretrain cell's link to its last epoch's weights


@dataclass
class Command:
    """One subprocess: argv, and where its output goes (IGLUE keeps stdout and stderr apart for eval jobs
    and combines them for few-shot training logs; `stdout == stderr` means combined)."""
    argv: list[str]
    stdout: str
    stderr: str

    @property
    def combined(self) -> bool:
        return self.stdout == self.stderr


@dataclass
class Cell:
    id: str                         # also the cell directory relative to the sweep output dir
    stage: str                      # finetune, zero_shot, translate_test, few_shot_train, few_shot_test, ...
    protocol: str                   # the table it feeds: zero_shot, translate_test, few_shot, translate_train, finetune
    model: str
    task: str
    lang: str | None = None
    shot: str | None = None
    lr: str | None = None
    seed: int | None = None
    scorer: str = "eval_task"       # how result metrics are read: eval_task | gqa | retrieval | iglue_hf | train | select
    dir: str = ""                   # absolute cell directory
    commands: list[Command] = field(default_factory=list)
    depends_on: list[str] = field(default_factory=list)   # cell ids that must be finished first
    logs: list[str] = field(default_factory=list)         # log files truncated when the cell (re)starts
    extra: dict = field(default_factory=dict)             # stage-specific data for the record/select steps

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict) -> "Cell":
        data = dict(data)
        data["commands"] = [Command(**c) for c in data.get("commands", [])]
        return cls(**data)

    @property
    def path(self) -> Path:
        return Path(self.dir)


def write_json_atomic(path: Path, data) -> None:
    """Write JSON through a temporary file and a rename, so a reader never sees half a file."""
    atomic_write_json(path, data, indent=1, sort_keys=True)


def read_result(cell_dir: Path) -> dict | None:
    """The cell's result if it is complete, else None (missing, unreadable or unfinished)."""
    path = Path(cell_dir) / RESULT_FILE
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict) or data.get("status") != "done" or not isinstance(data.get("metrics"), dict):
        return None
    return data


def is_done(cell_dir: Path) -> bool:
    return read_result(cell_dir) is not None


def load_cell(cell_dir: Path) -> Cell:
    path = Path(cell_dir) / CELL_FILE
    try:
        return Cell.from_json(json.loads(path.read_text(encoding="utf-8")))
    except FileNotFoundError:
        raise SystemExit(f"{path}: no cell description here (plan the sweep first: volta-ml sweep GRID ...)")
    except (ValueError, TypeError) as error:
        raise SystemExit(f"{path}: not a valid cell description ({error})")
