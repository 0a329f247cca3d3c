"""Hugging Face models in a sweep grid: a model with an `hf:` block instead of config/checkpoints.

    models:
      llava-1.5-7b:
        hf: {backend: mllm, model: llava-hf/llava-1.5-7b-hf, dtype: bf16, device: cuda,
             rules: {xvnli: letter, xgqa: generate}, extra: {max_images: 1}, batch_size: 16, flags: []}

Such a model gets, for each grid task its backend kind can do (dual encoders: retrieval; generative: XVNLI,
xGQA, MaRVL), zero-shot and translate-test cells that run `volta-ml iglue-hf`. That command prints the zoo's
score lines, so the cell's `record` step and `volta-ml report` treat the rows like the zoo's. Images come from
the grid's top-level `images: {task: root}` (and optional `image_templates: {task: template}`).
"""
from __future__ import annotations

import json
from pathlib import Path

from .errors import GridError
from .hf_kinds import tasks_for_backend
from .iglue import TASKS

HF_KEYS = {"backend", "model", "revision", "dtype", "device", "device_map", "rules", "batch_size", "flags", "extra"}
HF_PROTOCOLS = ("zero_shot", "translate_test")


def load_hf(spec: dict, where: str, str_list) -> dict:
    """The checked `hf:` block of a grid model."""
    hf = spec["hf"]
    if not isinstance(hf, dict) or not {"backend", "model"} <= set(hf):
        raise GridError(f"{where}.hf: expected a mapping with at least 'backend' (clip, mclip, mllm) and 'model'")
    unknown = set(hf) - HF_KEYS
    if unknown:
        raise GridError(f"{where}.hf: unknown key(s) {sorted(unknown)}; valid keys: {sorted(HF_KEYS)}")
    if set(spec) - {"hf"}:
        raise GridError(f"{where}: a Hugging Face model takes only 'hf', not {sorted(set(spec) - {'hf'})}")
    rules = hf.get("rules") or {}
    if not isinstance(rules, dict) or any(t not in TASKS for t in rules):
        raise GridError(f"{where}.hf.rules: expected a mapping task -> rule")
    return dict(hf, rules=rules, flags=str_list(hf.get("flags") or [], f"{where}.hf.flags"))


def task_map(raw, where: str) -> dict[str, str]:
    """`images:` / `image_templates:`: task -> string."""
    if raw is None:
        return {}
    if not isinstance(raw, dict) or any(t not in TASKS for t in raw):
        raise GridError(f"{where}: expected a mapping task -> path (tasks: {sorted(TASKS)})")
    return {t: str(v) for t, v in raw.items()}


def hf_tasks(model, grid) -> list[str]:
    """The grid tasks this HF model can do; refuses the training protocols."""
    other = [p for p in grid.protocols if p not in HF_PROTOCOLS]
    if other:
        raise GridError(f"{grid.path}: models.{model.name}: Hugging Face models run zero_shot and translate_test "
                         f"only, not {', '.join(other)} (give them their own grid)")
    return tasks_for_backend(model.hf["backend"], grid.tasks)


def has_english(task: str) -> bool:
    """IGLUE's English MaRVL row is NLVR2 through the zoo's features; HF models have no such file to read."""
    return TASKS[task].english_test is None


def hf_argv(grid, model, task: str, lang: str, mt: bool, cell_dir: Path) -> list[str]:
    hf = model.hf
    if task not in grid.images:
        raise GridError(f"{grid.path}: images.{task}: the image root is needed for Hugging Face models")
    argv = grid.commands["iglue_hf"] + [
        "--task", task, "--backend", hf["backend"], "--model", hf["model"], "--lang", lang,
        "--protocol", "translate-test" if mt else "zero-shot", "--data_root", str(grid.data_root),
        "--images", grid.images[task], "--name", model.name, "--output_dir", str(cell_dir / "eval"),
        "--no_result_json", "--no_progress"]
    for key in ("revision", "dtype", "device", "device_map", "batch_size"):
        if hf.get(key) is not None:
            argv += [f"--{key}", str(hf[key])]
    if hf.get("extra"):
        argv += ["--extra", json.dumps(hf["extra"], sort_keys=True)]
    if task in hf["rules"]:
        argv += ["--rule", str(hf["rules"][task])]
    if task in grid.image_templates:
        argv += ["--image_template", grid.image_templates[task]]
    return argv + list(hf["flags"]) + grid.extra_flags.get("iglue_hf", [])
