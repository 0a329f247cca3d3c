"""Hugging Face models in a sweep grid: a model with an `hf:` block instead of config/checkpoints.

    models:
      llava-1.5-7b:
        hf: {backend: mllm, model: llava-hf/llava-1.5-7b-hf, dtype: bf16, device: cuda,
             rules: {xvnli: letter, xgqa: generate}, extra: {max_images: 1}, batch_size: 16, flags: [],
             train: {lr: 2e-4, epochs: 1, batch_size: 32, flags: [--amp, bf16]}}

Such a model gets, for each grid task its backend kind can do (dual encoders: retrieval; generative: XVNLI,
xGQA, MaRVL), zero-shot and translate-test cells that run `volta-ml iglue-hf` on the model as published. With
`train:` it also gets IGLUE's training protocols, on the same stages as the zoo's models (runners.py):
`finetune` runs `volta-ml train --hf_model` on the task's English training data (xFlickr&CO: Flickr30k, task 8;
WIT: 20; XVNLI: SNLI-VE, 19; MaRVL: NLVR2, 12; xGQA: GQA, 15) and links the run's `hf_best/` export; the
zero-shot (and translate-test) cells then evaluate that export in every language (zero-shot transfer) and
`few_shot` trains from it on each few-shot file with IGLUE's learning rates and schedules, picks the rate on
the dev score with the zoo's selection step and evaluates it. Rows of the fine-tuned model are recorded with
`variant: fine-tuned` (the report's `<model> (fine-tuned)` rows); a dual encoder's export is a model folder
(`--hf_model` / `--model`), a generative model's is a peft adapter on the base model (`--hf_adapter` / `--adapter`),
or with `train: {finetune: full}` a model folder too. `train: {sharding: fsdp, processes: 8}` trains with FSDP2
over 8 processes of one node (`torchrun --standalone`; the Slurm stage's `gres` must give them their GPUs); with
`nodes: 2` too, over 2 nodes of 8 processes each, launched by `srun` (one task per GPU; the stage's Slurm resources
give `nodes: 2, ntasks_per_node: 8`, and its script sets the rendezvous on the allocation's first node, slurm.py).

That command prints the zoo's score lines, so the cell's `record` step and `volta-ml report` treat the rows like
the zoo's. Images come from the grid's top-level `images: {task: root}` (and optional `image_templates`); the
English training images from `train_images` / `train_image_templates` (default: the same as `images`).
"""
from __future__ import annotations

import json
from pathlib import Path

from .errors import GridError
from .hf_kinds import BACKEND_KINDS, tasks_for_backend
from .iglue import ADAM_FLAGS, TASKS

HF_KEYS = {"backend", "model", "revision", "dtype", "device", "device_map", "rules", "batch_size", "flags", "extra",
           "train", "engine", "serve"}
IN_PROCESS = ("clip", "mclip", "mllm")   # transformers in the cell's own process
SERVED = ("openai",)               # backends that reach a server: `engine` options, and `serve` to start one
SERVE_KEYS = {"model", "tensor_parallel", "dtype", "args", "command", "health_timeout"}
TRAIN_KEYS = {"lr": "--lr", "epochs": "--num_epoch", "batch_size": "--batch_size", "flags": None,
              "finetune": "--finetune", "sharding": "--sharding", "processes": None, "nodes": None}
TRAIN_CHOICES = {"finetune": ("lora", "full"), "sharding": ("ddp", "fsdp")}
HF_PROTOCOLS = ("zero_shot", "translate_test", "few_shot")
EXPORT = "hf_best"                 # the folder `volta-ml train --hf_model` writes in its run directory
FINE_TUNED = "fine-tuned"          # the `variant` of the rows of a model fine-tuned by the sweep
# few-shot files the zoo reads in a preprocessed form; HF models read IGLUE's own files
HF_FEW_SHOT_FILES = {"xgqa": {"few_shot_train_file": "xGQA/annotations/few_shot/{lang}/train_{shot}.json",
                              "few_shot_val_file": "xGQA/annotations/few_shot/{lang}/dev.json"}}


def load_hf(spec: dict, where: str, str_list) -> dict:
    """The checked `hf:` block of a grid model."""
    hf = spec["hf"]
    if not isinstance(hf, dict) or not {"backend", "model"} <= set(hf):
        raise GridError(f"{where}.hf: expected a mapping with at least 'backend' (clip, mclip, mllm, vllm) and 'model'")
    unknown = set(hf) - HF_KEYS
    if unknown:
        raise GridError(f"{where}.hf: unknown key(s) {sorted(unknown)}; valid keys: {sorted(HF_KEYS)}")
    if set(spec) - {"hf"}:
        raise GridError(f"{where}: a Hugging Face model takes only 'hf', not {sorted(set(spec) - {'hf'})}")
    rules = hf.get("rules") or {}
    if not isinstance(rules, dict) or any(t not in TASKS for t in rules):
        raise GridError(f"{where}.hf.rules: expected a mapping task -> rule")
    train = _load_train(hf, where, str_list) if "train" in hf else None
    engine, serve = load_engine(hf, f"{where}.hf", str_list)
    return dict(hf, rules=rules, flags=str_list(hf.get("flags") or [], f"{where}.hf.flags"), train=train,
                engine=engine, serve=serve)


def load_engine(hf: dict, where: str, str_list) -> tuple[dict, dict | None]:
    """`hf.engine`: the server options of `--backend openai` (the SERVER_FLAGS of hf/base.py, as flags); `hf.serve`:
    the server the cell starts itself (`protocols/serving.py`; then no `base_url`)."""
    from volta_ml.hf.base import SERVER_FLAGS

    engine, serve = hf.get("engine") or {}, hf.get("serve")
    if (engine or serve is not None) and hf["backend"] not in SERVED:
        raise GridError(f"{where}: 'engine' and 'serve' are options of the {', '.join(SERVED)} backend, not "
                        f"{hf['backend']!r}")
    if not isinstance(engine, dict) or set(engine) - set(SERVER_FLAGS):
        raise GridError(f"{where}.engine: expected a mapping with any of {list(SERVER_FLAGS)}")
    engine = {key: str_list(value, f"{where}.engine.{key}")[0] for key, value in engine.items()}
    if serve is None:
        if hf["backend"] in SERVED and "base_url" not in engine:
            raise GridError(f"{where}: the {hf['backend']} backend needs engine.base_url (a running server) or "
                            "serve (the cell starts one)")
        return engine, None
    serve = {} if serve is True else serve
    if not isinstance(serve, dict) or set(serve) - SERVE_KEYS:
        raise GridError(f"{where}.serve: expected a mapping with any of {sorted(SERVE_KEYS)}")
    if "base_url" in engine:
        raise GridError(f"{where}: serve starts the server; engine.base_url cannot be given too")
    parallel = serve.get("tensor_parallel", "auto")
    if parallel != "auto" and not (isinstance(parallel, int) and parallel >= 1):
        raise GridError(f"{where}.serve.tensor_parallel: {parallel!r}; expected auto or a number of GPUs >= 1")
    out = {"model": str(serve.get("model") or hf["model"]), "name": str(hf["model"]), "tensor_parallel": parallel}
    for key in ("args", "command"):
        if key in serve:
            out[key] = str_list(serve[key], f"{where}.serve.{key}")
    for key in ("dtype", "health_timeout"):
        if serve.get(key) is not None:
            out[key] = serve[key]
    return engine, out


def engine_name(hf: dict) -> str:
    """The engine a model's rows come from, recorded in the plan and in every result: transformers in the cell's
    process, or the server backend (`openai`; `openai/vllm-serve` when the cell starts vLLM's server)."""
    name = "transformers" if hf["backend"] in IN_PROCESS else hf["backend"]
    serve = hf.get("serve")
    return name + ("" if not serve else "/served" if serve.get("command") else "/vllm-serve")


def _load_train(hf: dict, where: str, str_list) -> dict:
    """`hf.train`: the English fine-tuning's hyperparameters (unset ones: the task config's) and flags for every
    training run of the model (English and few-shot), e.g. `[--amp, bf16, --gradient_checkpointing]`."""
    train = hf["train"] if hf["train"] is not None else {}
    if not isinstance(train, dict):
        raise GridError(f"{where}.hf.train: expected a mapping with any of {sorted(TRAIN_KEYS)}")
    unknown = set(train) - set(TRAIN_KEYS)
    if unknown:
        raise GridError(f"{where}.hf.train: unknown key(s) {sorted(unknown)}; valid keys: {sorted(TRAIN_KEYS)}")
    if BACKEND_KINDS.get(hf["backend"]) is None:
        raise GridError(f"{where}.hf.train: backend {hf['backend']!r} cannot be trained (known: "
                        f"{', '.join(BACKEND_KINDS)})")
    out = {"flags": str_list(train.get("flags") or [], f"{where}.hf.train.flags")}
    for key in ("lr", "epochs", "batch_size", "finetune", "sharding", "processes", "nodes"):
        if train.get(key) is not None:
            (value,) = str_list(train[key], f"{where}.hf.train.{key}")
            out[key] = value
    for key, choices in TRAIN_CHOICES.items():
        if key in out and out[key] not in choices:
            raise GridError(f"{where}.hf.train.{key}: {out[key]!r}; expected one of {', '.join(choices)}")
    if "finetune" in out and BACKEND_KINDS[hf["backend"]] != "generative":
        raise GridError(f"{where}.hf.train.finetune: generative models only (a dual encoder trains all its weights)")
    if "processes" in out and not (out["processes"].isdigit() and int(out["processes"]) >= 1):
        raise GridError(f"{where}.hf.train.processes: {out['processes']!r}; expected a number of processes >= 1")
    if "nodes" in out and not (out["nodes"].isdigit() and int(out["nodes"]) >= 1):
        raise GridError(f"{where}.hf.train.nodes: {out['nodes']!r}; expected a number of nodes >= 1")
    return out


def task_map(raw, where: str) -> dict[str, str]:
    """`images:` / `image_templates:`: task -> string."""
    if raw is None:
        return {}
    if not isinstance(raw, dict) or any(t not in TASKS for t in raw):
        raise GridError(f"{where}: expected a mapping task -> path (tasks: {sorted(TASKS)})")
    return {t: str(v) for t, v in raw.items()}


def hf_tasks(model, grid) -> list[str]:
    """The grid tasks this HF model can do; refuses translate-train, and few-shot without `train`."""
    other = [p for p in grid.protocols if p not in HF_PROTOCOLS]
    if other:
        raise GridError(f"{grid.path}: models.{model.name}: Hugging Face models run {', '.join(HF_PROTOCOLS)}, "
                        f"not {', '.join(other)} (give them their own grid)")
    if "few_shot" in grid.protocols and not model.hf["train"]:
        raise GridError(f"{grid.path}: models.{model.name}.hf: few_shot starts from the English fine-tuned model; "
                        f"give hf.train (an empty mapping takes the task configs' settings)")
    return tasks_for_backend(model.hf["backend"], grid.tasks)


def has_english(task: str) -> bool:
    """IGLUE's English MaRVL row is NLVR2 through the zoo's features; HF models have no such file to read."""
    return TASKS[task].english_test is None


def generative(model) -> bool:
    return BACKEND_KINDS.get(model.hf["backend"]) == "generative"


def adapter_export(model) -> bool:
    """The English export is a peft adapter on the base model (LoRA), not a model folder (full fine-tuning, dual
    encoders)."""
    return generative(model) and (model.hf["train"] or {}).get("finetune", "lora") == "lora"


def train_launch(grid, model) -> list[str]:
    """The training command: `volta-ml train`, or with `hf.train.processes` N > 1 one process per GPU of the node
    (`torchrun --standalone --nproc_per_node N --no-python <the train command>`), or with `hf.train.nodes` M > 1 one
    Slurm task per GPU of M nodes (`srun --nodes M --ntasks-per-node N --kill-on-bad-exit=1 <the train command>`:
    each process reads its rank from Slurm's variables, engine/distributed.py)."""
    processes = int((model.hf["train"] or {}).get("processes") or 1)
    nodes = int((model.hf["train"] or {}).get("nodes") or 1)
    if nodes > 1:
        return ["srun", "--nodes", str(nodes), "--ntasks-per-node", str(processes), "--kill-on-bad-exit=1",
                *grid.commands["train"]]
    if processes == 1:
        return list(grid.commands["train"])
    return [grid.python, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(processes),
            "--no-python", *grid.commands["train"]]


def _images(grid, task: str, training: bool) -> list[str]:
    roots, templates = (grid.train_images, grid.train_image_templates) if training else ({}, {})
    root, template = roots.get(task) or grid.images.get(task), templates.get(task) or grid.image_templates.get(task)
    if root is None:
        raise GridError(f"{grid.path}: images.{task}: the image root is needed for Hugging Face models")
    return ["--images", root] + (["--image_template", template] if template else [])


def hf_argv(grid, model, task: str, lang: str, mt: bool, cell_dir: Path, tuned: str | None = None) -> list[str]:
    """`volta-ml iglue-hf` on the model as published, or on `tuned`, the export of a training cell (a model folder,
    or a generative model's adapter on the base model)."""
    hf = model.hf
    target = ["--model", hf["model"]]
    if tuned and not adapter_export(model):
        target = ["--model", tuned]
    elif tuned:
        target += ["--adapter", tuned]
    argv = grid.commands["iglue_hf"] + [
        "--task", task, "--backend", hf["backend"], *target, "--lang", lang,
        "--protocol", "translate-test" if mt else "zero-shot", "--data_root", str(grid.data_root),
        *_images(grid, task, training=False), "--name", model.name, "--output_dir", str(cell_dir / "eval"),
        "--no_result_json", "--no_progress"]
    for key in ("revision", "dtype", "device", "device_map", "batch_size"):
        if hf.get(key) is not None and not (key == "revision" and tuned and not adapter_export(model)):
            argv += [f"--{key}", str(hf[key])]
    if hf.get("extra"):
        argv += ["--extra", json.dumps(hf["extra"], sort_keys=True)]
    if task in hf["rules"]:
        argv += ["--rule", str(hf["rules"][task])]
    return engine_argv(grid, hf, argv + list(hf["flags"]) + grid.extra_flags.get("iglue_hf", []), cell_dir)


def engine_argv(grid, hf: dict, argv: list[str], cell_dir: Path) -> list[str]:
    """A cell's command with its model's server flags (`hf.engine`), run by the serving step when the cell starts
    its own server (`hf.serve`: start it, run against it, stop it); IGLUE's and the suite's cells."""
    argv = list(argv) + [a for key, value in (hf.get("engine") or {}).items() for a in (f"--{key}", value)]
    if not hf.get("serve"):
        return argv
    return [grid.python, "-m", "volta_ml.protocols.serving", "--spec", json.dumps(hf["serve"], sort_keys=True),
            "--log", str(cell_dir / "serve.log"), "--"] + argv


def hf_train_argv(grid, model, task: str, start: str | None, settings: list[str], seed: int, cell_dir: Path,
                  stage: str) -> list[str]:
    """`volta-ml train --hf_model` for a training cell: from the published model (`start` None, the English
    fine-tuning) or from the English export `start` (few-shot). `settings` are the stage's data and schedule
    flags; the model's `hf.train` flags, then the grid's `extra_flags` come last (argparse keeps the last value)."""
    hf = model.hf
    base = hf["model"] + (f"@{hf['revision']}" if hf.get("revision") else "")
    if start is None:
        origin = ["--hf_model", base]
    elif adapter_export(model):
        origin = ["--hf_model", base, "--hf_adapter", start]
    else:
        origin = ["--hf_model", start]
    english = []                      # hf.train's hyperparameters are the English fine-tuning's
    for key in ("lr", "epochs", "batch_size"):
        if start is None and key in hf["train"]:
            english += [TRAIN_KEYS[key], hf["train"][key]]
    how = [a for key in ("finetune", "sharding") if key in hf["train"] for a in (TRAIN_KEYS[key], hf["train"][key])]
    # English: the training task's id (19: SNLI-VE, 12: NLVR2 and its images, ...); few-shot: IGLUE's task name,
    # whose files (MaRVL's rows and image folders, ...) the trainer then reads as iglue-hf does
    task_flag = TASKS[task].task_id if start is None else task
    return (train_launch(grid, model) + origin + ["--hf_backend", hf["backend"], "--task", task_flag,
                                                  "--data_root", str(grid.data_root),
                                                  *_images(grid, task, training=start is None), "--seed", str(seed)]
            + ADAM_FLAGS + english + how + settings + list(hf["train"]["flags"])
            + ["--output_dir", str(cell_dir / "ckpt"), "--logdir", str(cell_dir / "tb")]
            + grid.extra_flags.get("train", []) + grid.extra_flags.get(stage, []))
