"""VOLTA task-config YAMLs (`TASK<n>` entries) and portable paths.

Shipped configs (`config_tasks/*.yml`) write data paths as `{data_root}/...`; the root comes from
`--data_root` or the `VOLTA_ML_DATA_ROOT` environment variable. VOLTA's own YAMLs with absolute cluster paths
load unchanged; `--path_map OLD=NEW` (or `VOLTA_ML_PATH_MAP`, `;`-separated) rewrites their prefixes, and
every path can still be overridden by the VOLTA CLI flags.
"""
from __future__ import annotations

import os
from pathlib import Path

import yaml

DATA_ROOT_ENV = "VOLTA_ML_DATA_ROOT"
PATH_MAP_ENV = "VOLTA_ML_PATH_MAP"
DATA_ROOT_TOKEN = "{data_root}"
# shipped inside the package; the repository's top-level config_tasks/ holds the same files for users
SHIPPED_DIR = Path(__file__).resolve().parents[1] / "resources" / "config_tasks"
PATH_KEYS = (
    "dataroot", "features_h5path1", "features_h5path2", "train_annotations_jsonpath", "val_annotations_jsonpath",
)
TASK_TYPES = (
    "VL-classifier", "VL-classifier-GQA", "VL-logit", "V-logit", "V-logit-mc", "VL-binary-classifier",
    "VL-tri-classifier",
)


class TaskConfigError(ValueError):
    pass


def find_task_config(path: str | Path) -> Path:
    """The YAML at `path`; if it does not exist, the shipped config of the same name.

    IGLUE scripts pass `config_tasks/iglue_test_tasks_boxes36.dtu.yml` relative to VOLTA's folder; the shipped
    portable twin is `config_tasks/iglue_test_tasks_boxes36.yml`.
    """
    path = Path(path)
    if path.is_file():
        return path
    names = [path.name]
    if path.name.endswith(".dtu.yml"):
        names.append(path.name[: -len(".dtu.yml")] + ".yml")
    for name in names:
        if (SHIPPED_DIR / name).is_file():
            return SHIPPED_DIR / name
    shipped = ", ".join(sorted(p.name for p in SHIPPED_DIR.glob("*.yml"))) if SHIPPED_DIR.is_dir() else "none"
    raise FileNotFoundError(f"task config {path} not found (shipped configs: {shipped})")


def load_task_config(yaml_path: str | Path) -> dict[str, dict]:
    """Read a VOLTA task YAML into `{"TASK<n>": {...}}`, checking the keys every task needs."""
    path = find_task_config(yaml_path)
    with open(path, encoding="utf-8") as handle:
        try:
            data = yaml.safe_load(handle)
        except yaml.YAMLError as err:
            raise TaskConfigError(f"{path}: invalid YAML: {err}") from None
    if not isinstance(data, dict) or not data:
        raise TaskConfigError(f"{path}: expected a mapping of TASK<n> entries")
    for key, entry in data.items():
        if not isinstance(entry, dict):
            raise TaskConfigError(f"{path}: entry {key} is not a mapping")
        for needed in ("name", "type"):
            if needed not in entry:
                raise TaskConfigError(f"{path}: {key} has no {needed!r} key")
        if entry["type"] not in TASK_TYPES:
            raise TaskConfigError(f"{path}: {key}.type {entry['type']!r} is not one of {', '.join(TASK_TYPES)}")
        entry.setdefault("_source", str(path))
    return data


def task_key(task: str | int) -> str:
    task = str(task).strip()
    return task if task.upper().startswith("TASK") else f"TASK{task}"


def get_task_entry(config: dict[str, dict], task: str | int) -> tuple[str, dict]:
    key = task_key(task)
    if key not in config:
        source = next(iter(config.values())).get("_source", "the task config")
        raise TaskConfigError(f"--task {task}: {key} is not in {source} (available: {', '.join(config)})")
    return key, dict(config[key])


def parse_path_map(spec: str | None) -> list[tuple[str, str]]:
    pairs = []
    for item in (spec or "").split(";"):
        if not item.strip():
            continue
        if "=" not in item:
            raise TaskConfigError(f"path map entry {item!r} must look like OLD_PREFIX=NEW_PREFIX")
        old, new = item.split("=", 1)
        pairs.append((old.rstrip("/"), new.rstrip("/")))
    return pairs


class PathResolver:
    """Turns YAML path values into usable paths (data root token, prefix maps)."""

    def __init__(self, data_root: str | None = None, path_map: str | None = None):
        self.data_root = data_root or os.environ.get(DATA_ROOT_ENV) or None
        self.path_map = parse_path_map(path_map) + parse_path_map(os.environ.get(PATH_MAP_ENV))

    def __call__(self, value: str | None, key: str = "path", source: str = "") -> str | None:
        if value is None or str(value).strip() == "":
            return None
        value = str(value)
        if DATA_ROOT_TOKEN in value:
            if not self.data_root:
                raise TaskConfigError(
                    f"{source}: {key} = {value!r} needs the data root: pass --data_root DIR or set {DATA_ROOT_ENV}")
            value = value.replace(DATA_ROOT_TOKEN, self.data_root.rstrip("/"))
        for old, new in self.path_map:
            if value == old or value.startswith(old + "/"):
                value = new + value[len(old):]
                break
        return os.path.expanduser(value)

    def resolve_entry(self, entry: dict) -> dict:
        """A copy of `entry` whose path keys are resolved (unresolvable ones raise only when used)."""
        resolved = dict(entry)
        for key in PATH_KEYS:
            if key in entry:
                resolved[key] = _LazyPath(self, entry.get(key), key, entry.get("_source", ""))
        return resolved


class _LazyPath:
    """Defer errors for paths a run never touches (e.g. the train file of an eval-only run)."""

    def __init__(self, resolver: PathResolver, raw, key: str, source: str):
        self.resolver, self.raw, self.key, self.source = resolver, raw, key, source

    def get(self) -> str | None:
        return self.resolver(self.raw, self.key, self.source)

    # so code that treats the entry's values as paths (os.path.join, open, str) keeps working
    def __fspath__(self) -> str:
        return self.get() or ""

    __str__ = __fspath__

    def __repr__(self) -> str:
        return f"<path {self.raw!r} ({self.key})>"


def entry_path(entry: dict, key: str, override: str | None = None) -> str | None:
    """The path for `key`: the CLI override if given, else the (resolved) config value; None when empty."""
    if override:
        return os.path.expanduser(override)
    value = entry.get(key)
    if isinstance(value, _LazyPath):
        return value.get()
    if value is None or str(value).strip() == "":
        return None
    return str(value)
