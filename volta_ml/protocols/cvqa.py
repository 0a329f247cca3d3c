"""CVQA cells in a sweep grid: one cell per (model, rule, condition), each one `volta-ml cvqa score` run whose
output folder is the cell folder, so `volta-ml cvqa report <output_dir>` tabulates the whole sweep.

The grid's `cvqa:` section (see docs/cvqa.md and examples/grids/cvqa_paper.yml):

    cvqa:
      data: /data/cvqa/data              # the parquet shards (required)
      conditions: [en-aware, loc-aware]  # default: all four
      flags: [--batch_size, "8"]         # appended to every CVQA cell
      models:
        llava-1.5-7b:                    # the cell-id name of the model
          backend: mllm                  # required: the scoring backend (`volta-ml cvqa score --backend`)
          model: llava-hf/llava-1.5-7b-hf
          revision: <commit>             # pins the checkpoint: --model-revision (optional)
          rules: [letter, open]          # one cell per rule; omitted: the backend's only rule
          flags: [--dtype, bf16]         # this model's extra flags

Cell ids: `cvqa/<model>/<rule>/<condition>` (`cvqa/<model>/<condition>` without rules).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from volta_ml.cvqa.prompts import CONDITIONS

from .cell import Cell, Command

SECTION_KEYS = {"data", "conditions", "flags", "models"}
MODEL_KEYS = {"backend", "model", "revision", "rules", "flags"}
# cell flag -> the model setting it carries (a setting that is not given adds no flag)
MODEL_FLAGS = {"--backend": "backend", "--model": "model", "--model-revision": "revision"}


@dataclass
class CVQAModel:
    name: str
    backend: str
    model: str | None = None
    revision: str | None = None
    rules: list[str] = field(default_factory=list)
    flags: list[str] = field(default_factory=list)


@dataclass
class CVQASection:
    data: str
    conditions: list[str]
    models: dict[str, CVQAModel]
    flags: list[str] = field(default_factory=list)


def load_section(raw, base: Path, where: str, str_list, error) -> CVQASection:
    """Parse and check the grid's `cvqa:` mapping; `str_list`/`error` are the grid loader's list reader and
    error class, so messages look the same as for the rest of the grid."""
    if not isinstance(raw, dict):
        raise error(f"{where}: expected a mapping with data, models (and conditions, flags)")
    unknown = set(raw) - SECTION_KEYS
    if unknown:
        raise error(f"{where}: unknown key(s) {sorted(unknown)}; valid keys: {sorted(SECTION_KEYS)}")
    for key in ("data", "models"):
        if not raw.get(key):
            raise error(f"{where}: missing required key '{key}'")
    conditions = str_list(raw.get("conditions", list(CONDITIONS)), f"{where}.conditions")
    bad = [c for c in conditions if c not in CONDITIONS]
    if bad:
        raise error(f"{where}.conditions: unknown condition(s) {bad} (known: {list(CONDITIONS)})")
    if not isinstance(raw["models"], dict):
        raise error(f"{where}.models: expected a mapping model-name -> settings")
    models = {}
    for name, spec in raw["models"].items():
        at = f"{where}.models.{name}"
        if not isinstance(spec, dict) or "backend" not in spec:
            raise error(f"{at}: expected a mapping with at least 'backend'")
        unknown = set(spec) - MODEL_KEYS
        if unknown:
            raise error(f"{at}: unknown key(s) {sorted(unknown)}; valid keys: {sorted(MODEL_KEYS)}")
        models[str(name)] = CVQAModel(
            name=str(name), backend=str(spec["backend"]),
            model=str(spec["model"]) if spec.get("model") else None,
            revision=str(spec["revision"]) if spec.get("revision") else None,
            rules=str_list(spec.get("rules", []), f"{at}.rules"), flags=str_list(spec.get("flags", []), f"{at}.flags"))
    data = Path(str(raw["data"])).expanduser()
    return CVQASection(data=str(data if data.is_absolute() else (base / data).resolve()), conditions=conditions,
                       models=models, flags=str_list(raw.get("flags", []), f"{where}.flags"))


def cvqa_cells(planner) -> None:
    """Add the grid's CVQA cells to `planner` (a runners.Planner)."""
    grid, section = planner.grid, planner.grid.cvqa
    for spec in section.models.values():
        for rule in spec.rules or [None]:
            for condition in section.conditions:
                cell_id = "/".join(p for p in ("cvqa", spec.name, rule, condition) if p)
                d = planner.cell_dir(cell_id)
                argv = list(grid.commands["cvqa_score"])
                for flag, key in MODEL_FLAGS.items():
                    if getattr(spec, key):
                        argv += [flag, getattr(spec, key)]
                argv += (["--rule", rule] if rule else []) + ["--data", section.data, "--conditions", condition,
                                                               "--output_dir", str(d)]
                argv += spec.flags + section.flags + grid.extra_flags.get("cvqa_score", [])
                out, err = str(d / "test.out"), str(d / "test.err")
                planner.add(Cell(id=cell_id, stage="cvqa", protocol="cvqa", model=spec.name, task="cvqa",
                                 lang=condition, scorer="cvqa", commands=[Command(argv, out, err), planner.record(d)],
                                 logs=[out, err], extra={"backend": spec.backend, "rule": rule,
                                                         "condition": condition}))
