"""Reading scores: from VOLTA/IGLUE log lines (the rules of IGLUE's `results/get_*.py`, results spec
"How each score is read") and from the sweep's own `result.json` files.

A result record is a dict with protocol, model, task, lang, shot, seed and metrics
(`score`, or `ir_r1`/`tr_r1`/... for retrieval), and `items`: the cell's per-item file (volta_ml/stats.py) when
the entry point wrote one (relative to the cell folder in `result.json`; absolute once collected).
"""
from __future__ import annotations

import json
import re
from pathlib import Path

from .cell import CELL_FILE, RESULT_FILE, read_result
from .iglue import TASKS

VALIDATION = re.compile(r"Validation \[[^\]]*\]: loss (\S+) score (\S+)")
CONSISTENCY = re.compile(r"Consistency: (\S+)")
FINAL = re.compile(r"Final r1:\s*([-\d.eE+]+), r5:\s*([-\d.eE+]+), r10:\s*([-\d.eE+]+), "
                   r"mder:\s*([-\d.eE+]+), meanr:\s*([-\d.eE+]+)")
BEST = "Best Validation score:"


class LogError(ValueError):
    """A log file lacks the line its score is read from; the message names the file."""


def _lines(path: Path) -> list[str]:
    try:
        return Path(path).read_text(encoding="utf-8", errors="replace").splitlines()
    except FileNotFoundError:
        raise LogError(f"{path}: log file not found")


def eval_task_metrics(err_log: Path, first: bool = False) -> dict:
    """eval_task's score: the last `Validation [...]` line of the .err log (XVNLI few-shot CSVs take the
    first; each of those logs has exactly one). The following `Consistency:` line is kept too."""
    hits = [(i, m) for i, line in enumerate(_lines(err_log)) if "Validation" in line
            for m in [VALIDATION.search(line)] if m]
    if not hits:
        raise LogError(f"{err_log}: no 'Validation [<Name>]: loss L score S' line")
    _, match = hits[0] if first else hits[-1]
    metrics = {"loss": float(match.group(1)), "score": float(match.group(2))}
    consistency = [m for line in _lines(err_log) for m in [CONSISTENCY.search(line)] if m]
    if consistency:
        metrics["consistency"] = float(consistency[-1].group(1))
    return metrics


def gqa_metrics(out_log: Path) -> dict:
    """xGQA: the last line of .out is GQA_score's bare float (accuracy x 100)."""
    lines = [l.strip() for l in _lines(out_log) if l.strip()]
    try:
        return {"score": float(lines[-1])}
    except (IndexError, ValueError):
        raise LogError(f"{out_log}: the last line is not GQA_score's accuracy float")


def retrieval_metrics(out_log: Path) -> dict:
    """eval_retrieval: the last two stdout lines starting with `Final` are image retrieval (text->image)
    then text retrieval (image->text)."""
    finals = [l.strip() for l in _lines(out_log) if l.startswith("Final")]
    if len(finals) < 2:
        raise LogError(f"{out_log}: expected two 'Final r1:...' lines (image then text retrieval), "
                       f"found {len(finals)}")
    metrics = {}
    for prefix, line in (("ir", finals[-2]), ("tr", finals[-1])):
        match = FINAL.search(line)
        if not match:
            raise LogError(f"{out_log}: cannot read recalls from {line!r}")
        for name, value in zip(("r1", "r5", "r10", "medr", "meanr"), match.groups()):
            metrics[f"{prefix}_{name}"] = float(value)
    return metrics


def best_validation(train_log: Path) -> float:
    """The few-shot selection rule: field 4 of the LAST line of the training log (`tail -n1 | cut -d' ' -f4`),
    which must be `Best Validation score: X `."""
    lines = _lines(train_log)
    last = lines[-1] if lines else ""
    if not last.startswith(BEST):
        raise LogError(f"{train_log}: the last line is not 'Best Validation score: X' (training did not finish?)")
    return float(last.split(" ")[3])


PRETRAIN_VALIDATION = re.compile(r"Validation \[[^\]]*\]: masked_t ([-\d.naif]+) masked_v ([-\d.naif]+) "
                                 r"NSP ([-\d.naif]+)")


def pretrain_validation(train_log: Path) -> dict:
    """A pretraining run (train_concap.py): the three losses of its last `Validation [...]: masked_t a masked_v b
    NSP c` line."""
    found = [m for m in map(PRETRAIN_VALIDATION.search, _lines(train_log)) if m]
    if not found:
        raise LogError(f"{train_log}: no 'Validation [...]: masked_t ... masked_v ... NSP ...' line (pretraining "
                       f"did not finish an epoch?)")
    return {name: float(value) for name, value in zip(("masked_t", "masked_v", "NSP"), found[-1].groups())}


def cvqa_metrics(cell_dir: Path) -> dict:
    """A CVQA cell (one condition): micro and macro accuracy from the `cvqa_results.json` it wrote (None when
    the labels are hidden), and the condition."""
    path = Path(cell_dir) / "cvqa_results.json"
    try:
        runs = json.loads(path.read_text(encoding="utf-8"))["runs"]
    except FileNotFoundError:
        raise LogError(f"{path}: not written (the CVQA run did not finish)")
    except (ValueError, KeyError, TypeError) as error:
        raise LogError(f"{path}: no 'runs' ({error})")
    if len(runs) != 1:
        raise LogError(f"{path}: expected one condition in 'runs', found {sorted(runs)}")
    (condition, summary), = runs.items()
    return {"score": summary.get("micro"), "macro": summary.get("macro"), "condition": condition}


def iglue_hf_metrics(cell_dir: Path) -> dict:
    """A Hugging Face model's IGLUE cell: the metrics `volta-ml iglue-hf` wrote to `eval/iglue_hf_results.json`,
    at full precision, so the sweep records the same numbers as a standalone run (not the logs' 3 decimals)."""
    return dict(iglue_hf_results(cell_dir)["metrics"])


HF_RESULTS = {"iglue_hf": ("iglue_hf_results.json", "iglue-hf"), "suite": ("suite_results.json", "suite")}


def iglue_hf_results(cell_dir: Path, scorer: str = "iglue_hf") -> dict:
    """The metrics, rule and backend a Hugging Face cell's run wrote to `eval/` (`volta-ml iglue-hf`'s
    iglue_hf_results.json, `volta-ml suite`'s suite_results.json)."""
    name, command = HF_RESULTS[scorer]
    path = Path(cell_dir) / "eval" / name
    try:
        results = json.loads(path.read_text(encoding="utf-8"))
        return {"metrics": dict(results["metrics"]), "rule": results.get("rule"), "backend": results.get("backend"),
                "engine": (results.get("engine") or {}).get("engine", "transformers")}
    except FileNotFoundError:
        raise LogError(f"{path}: not written (the {command} run did not finish)")
    except (ValueError, KeyError, TypeError) as error:
        raise LogError(f"{path}: no 'metrics' ({error})")


SCORERS = {  # scorer -> metrics from (stdout log, stderr log, first validation line?)
    "eval_task": lambda out, err, first: eval_task_metrics(err, first=first),
    "gqa": lambda out, err, first: gqa_metrics(out),
    "retrieval": lambda out, err, first: retrieval_metrics(out),
    "cvqa": lambda out, err, first: cvqa_metrics(Path(out).parent),
    "iglue_hf": lambda out, err, first: iglue_hf_metrics(Path(out).parent),
    "suite": lambda out, err, first: dict(iglue_hf_results(Path(out).parent, "suite")["metrics"]),
}


def scorer_metrics(scorer: str, out_log: Path, err_log: Path, first_validation: bool = False) -> dict:
    if scorer not in SCORERS:
        raise ValueError(f"unknown scorer {scorer!r}")
    return SCORERS[scorer](out_log, err_log, first_validation)


ITEMS_TOLERANCE = 6e-4     # the logs print 3 decimals


def cell_items(cell_dir: Path, metrics: dict) -> tuple[str | None, str]:
    """The per-item file the cell's entry point wrote (`*_items.jsonl` in the cell folder, `eval/` or
    `eval/<checkpoint>-/`; the newest if several) as a path relative to the cell, when the mean of its items equals
    every metric it shares with `metrics` (the logs' 3 decimals); else (None, why)."""
    from volta_ml.stats import ITEMS_SUFFIX, ItemsError, metric_values, read_items

    cell_dir = Path(cell_dir)
    found = [p for pattern in (f"*{ITEMS_SUFFIX}", f"eval/*{ITEMS_SUFFIX}", f"eval/*/*{ITEMS_SUFFIX}")
             for p in cell_dir.glob(pattern)]
    if not found:
        return None, "no per-item file"
    path = max(found, key=lambda p: p.stat().st_mtime)
    try:
        items = read_items(path)
    except ItemsError as error:
        return None, str(error)
    for metric, value in metrics.items():
        values = metric_values(items, metric)
        if values and value is not None and abs(sum(values.values()) / len(values) - float(value)) > ITEMS_TOLERANCE:
            return None, (f"{path}: the mean of its {metric} items, {sum(values.values()) / len(values):.4f}, is not "
                          f"the logged {value} (a file of another run?)")
    return str(path.relative_to(cell_dir)), ""


def item_file(record: dict, folder: Path) -> dict:
    """The record with its `items` path made absolute (relative paths are relative to the result's folder)."""
    if record.get("items"):
        record = dict(record, items=str((Path(folder) / record["items"]).resolve()))
    return record


# --- collecting records ----------------------------------------------------------------
TASK_DIRS = {key: key for key in TASKS}          # IGLUE's experiments/<model>/<task>/ folder names
ZERO_SHOT_LOG = re.compile(r"^test\.([A-Za-z-]+?)(_mt)?\.(err|out)$")


def sweep_records(root: Path) -> list[dict]:
    """Every finished cell's result under `root` (test cells only: training cells feed no table)."""
    records = []
    for path in sorted(Path(root).rglob(RESULT_FILE)):
        result = read_result(path.parent)
        if result and result.get("protocol") in ("zero_shot", "translate_test", "few_shot", "translate_train"):
            records.append(item_file(result, path.parent))
    return records


def iglue_log_records(root: Path) -> list[dict]:
    """Scores from an IGLUE `experiments/` tree (or one of its zero_shot / few_shot folders):
    `<model>/<task>/test.<lang>[_mt].{err,out}` (zero-shot, translate-test) and
    `<model>/<task>/<lang>/<shot>/test.{err,out}` (few-shot). Logs without a score are skipped, like
    IGLUE's scrapers do (they record -1.0, which the tables do for missing cells)."""
    root = Path(root)
    records: list[dict] = []
    seen = set()
    for log in sorted(root.rglob("test*.err")) + sorted(root.rglob("test*.out")):
        if (log.parent / CELL_FILE).exists() or (log.parent / RESULT_FILE).exists():
            continue                                      # a sweep cell: read through its result.json
        key = _iglue_key(log)
        if key is None or key in seen:
            continue
        model, task, lang, shot, protocol = key
        scorer = TASKS[task].scorer
        base = log.parent / log.name[: -len(log.suffix)]          # test.de_mt (not Path.with_suffix: ".de_mt")
        try:
            metrics = scorer_metrics(scorer, Path(f"{base}.out"), Path(f"{base}.err"),
                                     first_validation=(protocol == "few_shot" and task == "xvnli"))
        except LogError:
            continue
        seen.add(key)
        records.append({"protocol": protocol, "model": model, "task": task, "lang": lang, "shot": shot,
                        "seed": None, "metrics": metrics, "source": str(base)})
    return records


def _iglue_key(log: Path):
    parts = log.parts
    match = ZERO_SHOT_LOG.match(log.name)
    if match and len(parts) >= 3 and parts[-2] in TASK_DIRS:
        lang, mt = match.group(1), match.group(2)
        protocol = "translate_test" if mt else "zero_shot"
        return parts[-3], parts[-2], lang, None, protocol
    if log.name in ("test.err", "test.out") and len(parts) >= 5 and parts[-4] in TASK_DIRS:
        return parts[-5], parts[-4], parts[-3], parts[-2], "few_shot"
    return None


def collect(root: Path) -> list[dict]:
    """Sweep results and old IGLUE/VOLTA logs under `root`, together."""
    return sweep_records(root) + iglue_log_records(root)


def write_records(records: list[dict], path: Path) -> None:
    Path(path).write_text(json.dumps(records, indent=1), encoding="utf-8")
