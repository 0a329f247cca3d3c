"""The sweep grid file (YAML): what to run. See docs/protocols.md for the schema with an example.

Loading checks every key and names the offending one in the error; unknown keys are rejected (a typo
must not silently fall back to a default and run the wrong experiment).
"""
from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from .cvqa import CVQASection, load_section
from .errors import GridError
from .hf_cells import load_hf, task_map
from .iglue import FEW_SHOT_EPOCHS, FEW_SHOT_LRS, TASKS
from .suite import SuiteSection, load_section as load_suite_section

PROTOCOLS = ("zero_shot", "translate_test", "few_shot", "translate_train")
COMMAND_KINDS = ("pretrain", "train", "eval", "eval_retrieval", "gqa_score", "cvqa_score", "iglue_hf", "suite")
TOP_KEYS = {"name", "data_root", "output_dir", "task_configs", "checkpoint_root", "models", "tasks", "protocols",
            "languages", "few_shot_languages", "shots", "learning_rates", "seeds", "include_english",
            "num_epoch", "commands", "extra_flags", "paths", "env", "pass_data_root", "slurm", "python", "cvqa", "suite",
            "images", "image_templates", "train_images", "train_image_templates",   # Hugging Face models (hf_cells.py)
            "baseline"}                                 # `volta-ml report --grid`: the row the others are compared with
MODEL_KEYS = {"config", "bert_model", "do_lower_case", "is_m3p", "features", "finetuned", "pretrained", "hf",
              "pretrain"}
# a model pretrained by the sweep itself (the `pretrain` stage, `volta-ml pretrain`)
PRETRAIN_KEYS = {"annotations_path", "features_path", "num_train_epochs", "from_pretrained", "flags"}
EXTRA_FLAG_KINDS = set(COMMAND_KINDS) | {"finetune", "few_shot_train", "translate_train"}


@dataclass
class ModelSpec:
    name: str
    config: str
    bert_model: str | None = None
    do_lower_case: bool = False
    is_m3p: bool = False
    features: str = "boxes36"
    finetuned: dict[str, str] = field(default_factory=dict)   # task -> English fine-tuned checkpoint
    pretrained: str | None = None                              # fine-tune on English first when no `finetuned`
    hf: dict | None = None                                     # a Hugging Face model (hf_cells.py); no checkpoints
    pretrain: dict | None = None                               # pretrain first (PRETRAIN_KEYS); then `pretrained`


@dataclass
class Grid:
    path: Path
    name: str
    data_root: Path
    output_dir: Path
    task_configs: Path
    models: dict[str, ModelSpec]
    tasks: list[str]
    protocols: list[str]
    languages: dict[str, list[str]]
    few_shot_languages: dict[str, list[str]]
    shots: dict[str, list[str]]
    learning_rates: list[str]
    seeds: list[int]
    include_english: bool
    num_epoch: int
    commands: dict[str, list[str]]
    extra_flags: dict[str, list[str]]
    paths: dict[str, dict[str, str]]
    env: dict[str, str]
    pass_data_root: bool
    slurm: dict
    checkpoint_root: str = ""
    python: str = sys.executable
    cvqa: CVQASection | None = None        # CVQA cells (volta_ml/protocols/cvqa.py)
    suite: SuiteSection | None = None      # the multilingual suite's cells (volta_ml/protocols/suite.py)
    images: dict[str, str] = field(default_factory=dict)            # task -> image root (HF models)
    image_templates: dict[str, str] = field(default_factory=dict)   # task -> path template under it
    train_images: dict[str, str] = field(default_factory=dict)      # task -> English training images (default: images)
    train_image_templates: dict[str, str] = field(default_factory=dict)
    baseline: str | None = None            # the report's baseline row (`volta-ml report --grid`)

    def step(self) -> list[str]:
        """argv prefix of the in-cell helper steps (record, select)."""
        return [self.python, "-m", "volta_ml.protocols.steps"]

    def task_configs_file(self, kind: str, model: ModelSpec) -> str:
        """IGLUE's task config of a kind (trainval, test, fewshot) for the model's features."""
        return str(self.task_configs / f"iglue_{kind}_tasks_{model.features}.yml")


def default_commands(python: str = sys.executable) -> dict[str, list[str]]:
    """The volta-ml entry points (same flags as train_task.py & co), run with `python` (default: the
    interpreter running the sweep, which also suits Slurm nodes sharing its environment)."""
    base = [python, "-m", "volta_ml.cli"]
    return {"pretrain": base + ["pretrain"], "train": base + ["train"], "eval": base + ["eval"],
            "eval_retrieval": base + ["eval-retrieval"],
            "gqa_score": base + ["gqa-score"], "cvqa_score": base + ["cvqa", "score"],
            "iglue_hf": base + ["iglue-hf"], "suite": base + ["suite"]}


def _default_task_configs() -> Path:
    from volta_ml.tasks.config import SHIPPED_DIR   # the portable IGLUE task configs shipped in the package
    return SHIPPED_DIR


def _str_list(value, where: str) -> list[str]:
    if isinstance(value, (str, int, float)):
        value = [value]
    if not isinstance(value, list) or not all(isinstance(v, (str, int, float)) for v in value):
        raise GridError(f"{where}: expected a list of strings, got {value!r}")
    return [v if isinstance(v, str) else _number_text(v) for v in value]


def _number_text(v) -> str:
    # YAML reads 1e-4 as a string but 0.0001 as a float; keep the user's spelling where we can
    return repr(v) if isinstance(v, float) else str(v)


def _per_task(raw, tasks: list[str], default, where: str) -> dict[str, list[str]]:
    """A list for every task, or a mapping task -> list (missing tasks get the default)."""
    out = {t: list(default(t)) for t in tasks}
    if raw is None:
        return out
    if isinstance(raw, dict):
        for task, value in raw.items():
            if task not in TASKS:      # settings for a known task that is not run now are fine (and ignored)
                raise GridError(f"{where}.{task}: unknown task (known: {sorted(TASKS)})")
            if task in tasks:
                out[task] = _str_list(value, f"{where}.{task}")
        return out
    values = _str_list(raw, where)
    return {t: list(values) for t in tasks}


def _resolve(base: Path, value: str) -> Path:
    p = Path(str(value)).expanduser()
    return p if p.is_absolute() else (base / p).resolve()


def load_grid(path: str | Path) -> Grid:
    path = Path(path).resolve()
    try:
        raw = yaml.safe_load(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise GridError(f"{path}: grid file not found")
    except yaml.YAMLError as error:
        raise GridError(f"{path}: not valid YAML ({error})")
    if not isinstance(raw, dict):
        raise GridError(f"{path}: the grid must be a YAML mapping")
    unknown = set(raw) - TOP_KEYS
    if unknown:
        raise GridError(f"{path}: unknown key(s) {sorted(unknown)}; valid keys: {sorted(TOP_KEYS)}")
    for key in ("data_root", "models", "tasks"):
        if key not in raw and "cvqa" not in raw and "suite" not in raw:   # a CVQA / suite grid needs no IGLUE keys
            raise GridError(f"{path}: missing required key '{key}'")
    base = path.parent
    where = lambda key: f"{path}: {key}"  # noqa: E731

    tasks = _str_list(raw.get("tasks", []), where("tasks"))
    for task in tasks:
        if task not in TASKS:
            raise GridError(f"{where('tasks')}: unknown task '{task}' (known: {sorted(TASKS)})")
    protocols = _str_list(raw.get("protocols", ["zero_shot"]), where("protocols"))
    for p in protocols:
        if p not in PROTOCOLS:
            raise GridError(f"{where('protocols')}: unknown protocol '{p}' (known: {list(PROTOCOLS)})")

    raw_models = raw.get("models", {})
    if not isinstance(raw_models, dict) or not (raw_models or "cvqa" in raw or "suite" in raw):
        raise GridError(f"{where('models')}: expected a mapping model-name -> settings")
    models = {name: _model(name, spec, base, tasks, where(f"models.{name}"))
              for name, spec in raw_models.items()}

    python = str(raw.get("python") or sys.executable)
    commands = default_commands(python)
    for kind, argv in (raw.get("commands") or {}).items():
        if kind not in COMMAND_KINDS:
            raise GridError(f"{where('commands')}: unknown command kind '{kind}' (known: {list(COMMAND_KINDS)})")
        commands[kind] = _str_list(argv, where(f"commands.{kind}"))
    extra = {}
    for kind, flags in (raw.get("extra_flags") or {}).items():
        if kind not in EXTRA_FLAG_KINDS:
            raise GridError(f"{where('extra_flags')}: unknown kind '{kind}' (known: {sorted(EXTRA_FLAG_KINDS)})")
        extra[kind] = _str_list(flags, where(f"extra_flags.{kind}"))
    paths = raw.get("paths") or {}
    for task, overrides in paths.items():
        if task not in TASKS or not isinstance(overrides, dict):
            raise GridError(f"{where('paths')}.{task}: expected a known task with a mapping of path templates")
        fields = set(TASKS[task].__dataclass_fields__)
        bad = set(overrides) - fields
        if bad:
            raise GridError(f"{where('paths')}.{task}: unknown setting(s) {sorted(bad)}")

    seeds = raw.get("seeds", [0])
    if not isinstance(seeds, list) or not all(isinstance(s, int) for s in seeds) or not seeds:
        raise GridError(f"{where('seeds')}: expected a non-empty list of integers")
    name = str(raw.get("name") or path.stem)
    suite = load_suite_section(raw["suite"], base, where("suite"), _str_list, GridError) if "suite" in raw else None
    return Grid(
        path=path, name=name,
        data_root=_resolve(base, raw.get("data_root", ".")),
        output_dir=_resolve(base, raw.get("output_dir", f"runs/{name}")),
        task_configs=_resolve(base, raw["task_configs"]) if raw.get("task_configs") else _default_task_configs(),
        checkpoint_root=str(_resolve(base, raw["checkpoint_root"])) if raw.get("checkpoint_root") else "",
        models=models, tasks=tasks, protocols=protocols,
        languages=_per_task(raw.get("languages"), tasks, lambda t: TASKS[t].languages, where("languages")),
        few_shot_languages=_per_task(raw.get("few_shot_languages"), tasks,
                                     lambda t: TASKS[t].few_shot_languages, where("few_shot_languages")),
        shots=_per_task(raw.get("shots"), tasks, lambda t: TASKS[t].shots, where("shots")),
        learning_rates=_str_list(raw.get("learning_rates", FEW_SHOT_LRS), where("learning_rates")),
        seeds=seeds,
        include_english=bool(raw.get("include_english", True)),
        num_epoch=int(raw.get("num_epoch", FEW_SHOT_EPOCHS)),
        commands=commands, extra_flags=extra, paths=paths,
        env={str(k): str(v) for k, v in (raw.get("env") or {}).items()},
        pass_data_root=bool(raw.get("pass_data_root", True)),
        slurm=raw.get("slurm") or {}, python=python,
        cvqa=load_section(raw["cvqa"], base, where("cvqa"), _str_list, GridError) if "cvqa" in raw else None,
        suite=suite,
        images={t: str(_resolve(base, v)) for t, v in task_map(raw.get("images"), where("images")).items()},
        image_templates=task_map(raw.get("image_templates"), where("image_templates")),
        train_images={t: str(_resolve(base, v)) for t, v in task_map(raw.get("train_images"),
                                                                    where("train_images")).items()},
        train_image_templates=task_map(raw.get("train_image_templates"), where("train_image_templates")),
        baseline=_baseline(raw.get("baseline"), [*models, *(suite.models if suite else [])], where("baseline")),
    )


def _baseline(value, models: list[str], where: str) -> str | None:
    """A row name of the report: a model of the grid (its IGLUE `models:` or its `suite:` models), or such a model
    with a suffix (`<model> (fine-tuned)`, `<model> (<rule>)`)."""
    if value is None:
        return None
    if not isinstance(value, str) or not any(value == m or value.startswith(f"{m} (") for m in models):
        raise GridError(f"{where}: expected the report row of one of the grid's models ({', '.join(models)}), "
                        f"got {value!r}")
    return value


def _model(name: str, spec, base: Path, tasks: list[str], where: str) -> ModelSpec:
    if not isinstance(spec, dict):
        raise GridError(f"{where}: expected a mapping with at least 'config'")
    unknown = set(spec) - MODEL_KEYS
    if unknown:
        raise GridError(f"{where}: unknown key(s) {sorted(unknown)}; valid keys: {sorted(MODEL_KEYS)}")
    if "hf" in spec:
        return ModelSpec(name=name, config="", hf=load_hf(spec, where, _str_list))
    if "config" not in spec:
        raise GridError(f"{where}: missing 'config' (the model config JSON)")
    finetuned = spec.get("finetuned") or {}
    if isinstance(finetuned, str):
        finetuned = {t: finetuned for t in tasks}     # a template with {task} / {name}
    if not isinstance(finetuned, dict):
        raise GridError(f"{where}.finetuned: expected a path template or a mapping task -> checkpoint")
    pretrain = _pretrain(spec.get("pretrain"), base, f"{where}.pretrain") if "pretrain" in spec else None
    if pretrain and spec.get("pretrained"):
        raise GridError(f"{where}: give 'pretrain' (the sweep pretrains) or 'pretrained' (a checkpoint), not both")
    if not spec.get("pretrained") and not pretrain:
        missing = [t for t in tasks if t not in finetuned]
        if missing:
            raise GridError(f"{where}: no English fine-tuned checkpoint for task(s) {missing}; give "
                            f"'finetuned' (path or mapping), 'pretrained' or 'pretrain' to fine-tune on English "
                            f"first")
    config = str(spec["config"])
    return ModelSpec(
        name=name, config=str(_resolve(base, config)) if ("/" in config or config.endswith(".json")) else config,
        bert_model=str(spec["bert_model"]) if spec.get("bert_model") else None,
        do_lower_case=bool(spec.get("do_lower_case", False)), is_m3p=bool(spec.get("is_m3p", name == "m3p")),
        features=str(spec.get("features", "X101" if name == "m3p" else "boxes36")),
        finetuned={t: str(v) for t, v in finetuned.items()},
        pretrained=str(spec["pretrained"]) if spec.get("pretrained") else None,
        pretrain=pretrain,
    )


def _pretrain(raw, base: Path, where: str) -> dict:
    """`models.<m>.pretrain`: Conceptual Captions folders (VOLTA's layout), epochs, text initialisation, flags."""
    if not isinstance(raw, dict):
        raise GridError(f"{where}: expected a mapping with annotations_path and features_path")
    unknown = set(raw) - PRETRAIN_KEYS
    if unknown:
        raise GridError(f"{where}: unknown key(s) {sorted(unknown)}; valid keys: {sorted(PRETRAIN_KEYS)}")
    for key in ("annotations_path", "features_path"):
        if not raw.get(key):
            raise GridError(f"{where}: missing '{key}'")
    epochs = raw.get("num_train_epochs", 10)
    if not isinstance(epochs, (int, float)) or epochs < 1:
        raise GridError(f"{where}.num_train_epochs: expected a number >= 1, got {epochs!r}")
    out = {"annotations_path": str(_resolve(base, raw["annotations_path"])),
           "features_path": str(_resolve(base, raw["features_path"])), "num_train_epochs": epochs,
           "flags": _str_list(raw.get("flags", []), f"{where}.flags")}
    if "from_pretrained" in raw:
        value = str(raw["from_pretrained"] or "")
        out["from_pretrained"] = str(_resolve(base, value)) if value and ("/" in value or
                                                                        Path(value).suffix) else value
    return out
