"""The multilingual suite beyond IGLUE and CVQA, as the planner and the report see it (no heavy imports).

`SUITE` holds, per benchmark task, what the sweep and `volta-ml report` need: its title, the backend kind,
its languages, the metric keys of its tables and how its languages are aggregated. The executable half of each
row (reader, prompts, rules) is `volta_ml/suite/table.py`, keyed by the same names (a test keeps the two in
step); the planner knows that pipeline only through the `volta-ml suite` command line.

Aggregates: `mul` is the unweighted mean over the non-English languages (mBLIP, Centurio and PangeaBench tables);
`all` is the unweighted mean over every language, English included (Kaleidoscope's per-language macro average;
MTVQA's AVG., which has no English). `PUBLISHED` holds numbers reported by the benchmarks' authors (with their
source), printed beside ours by `volta-ml report`.

The grid's `suite:` section (docs/suite.md, examples/grids/suite.yml):

    suite:
      tasks: [maxm, xm3600, mtvqa, xmmmu, m3exam, kaleidoscope]
      data: {maxm: /data/maxm_v1_release, xm3600: /data/xm3600/captions.jsonl, mtvqa: ByteDance/MTVQA, ...}
      images: {maxm: /data/xm3600/images, xm3600: /data/xm3600/images}   # where the task reads image files
      languages: {maxm: [en, fr, zh]}    # default: every language of the benchmark
      task_flags: {xm100: [--subset, /data/xm100_ids.txt]}
      flags: [--batch_size, "8"]         # appended to every suite cell
      models:
        qwen2-vl-7b:
          backend: mllm                  # mllm (generative tasks) or clip / mclip (xm3600_retrieval)
          model: Qwen/Qwen2-VL-7B-Instruct
          revision: <commit>             # optional
          adapter: /runs/lora/hf_best    # optional: a LoRA adapter (mllm)
          rules: {m3exam: [generate, letter]}   # one cell per rule; omitted: the task's default rule
          flags: [--dtype, bf16]

Cell ids: `suite/<model>/<task>/<lang>`, and `suite/<model>/<task>/<rule>/<lang>` for a task given rules.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from .cell import Cell, Command
from .hf_cells import engine_argv, engine_name, load_engine
from .hf_kinds import tasks_for_backend

XM3600_LANGUAGES = ("en", "ar", "bn", "cs", "da", "de", "el", "es", "fa", "fi", "fil", "fr", "he", "hi", "hr",
                    "hu", "id", "it", "ja", "ko", "mi", "nl", "no", "pl", "pt", "quz", "ro", "ru", "sv", "sw", "te",
                    "th", "tr", "uk", "vi", "zh")
KALEIDOSCOPE_LANGUAGES = ("en", "ar", "bn", "de", "es", "fa", "fr", "hi", "hr", "hu", "lt", "ne", "nl", "pt", "ru",
                          "sr", "te", "uk")


@dataclass(frozen=True)
class SuiteSpec:
    key: str
    title: str                      # table / file prefix
    kind: str                       # "generative" | "dual encoder" (protocols/hf_kinds.py)
    languages: tuple[str, ...]      # English first where the benchmark has it; () any code (a generic format)
    metrics: tuple[str, ...] = ("score",)   # result metric keys tabulated (one table each)
    aggregate: str = "mul"          # mul | all (see the module docstring)
    metric_name: str = "accuracy"


SUITE = {spec.key: spec for spec in (
    SuiteSpec("maxm", "MaXM", "generative", ("en", "fr", "hi", "iw", "ro", "th", "zh")),
    SuiteSpec("xm3600", "XM3600", "generative", XM3600_LANGUAGES, metric_name="CIDEr x 100"),
    SuiteSpec("xm100", "XM100", "generative", XM3600_LANGUAGES, metric_name="CIDEr x 100"),
    SuiteSpec("xm3600_retrieval", "XM3600_retrieval", "dual encoder", XM3600_LANGUAGES,
              metrics=("ir_r1", "tr_r1"), metric_name="recall@1"),
    SuiteSpec("mtvqa", "MTVQA", "generative", ("ar", "de", "fr", "it", "ja", "ko", "ru", "th", "vi"), aggregate="all"),
    SuiteSpec("xmmmu", "xMMMU", "generative", ("en", "ar", "fr", "hi", "id", "ja", "pt")),
    SuiteSpec("m3exam", "M3Exam", "generative", ("en", "af", "it", "pt", "th", "vi", "zh")),
    SuiteSpec("kaleidoscope", "Kaleidoscope", "generative", KALEIDOSCOPE_LANGUAGES, aggregate="all"),
    SuiteSpec("kaleidoscope_multimodal", "Kaleidoscope_multimodal", "generative", KALEIDOSCOPE_LANGUAGES,
              aggregate="all"),
    SuiteSpec("mmmb", "MMMB", "generative", ("en", "zh", "pt", "ar", "tr", "ru")),
    SuiteSpec("vlmevalkit_mcq", "VLMEvalKit_MCQ", "generative", ()),
)}
LANGUAGE_CODE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,15}")


def language_problem(task: str, lang: str) -> str | None:
    """Why `lang` is no language of `task` (None when it is one): a benchmark's own codes; a format without
    languages of its own (`languages` empty: vlmevalkit_mcq) takes any code, a label of the user's files."""
    spec = SUITE[task]
    if spec.languages:
        return None if lang in spec.languages else (f"{spec.title} has no language {lang!r}; its languages: "
                                                    f"{', '.join(spec.languages)}")
    return None if LANGUAGE_CODE.fullmatch(lang) else (f"{spec.title}: language {lang!r} is not a code (letters, "
                                                       "digits, - and _, at most 16)")

MTVQA_README = "github.com/bytedance/MTVQA README leaderboard (test set)"
KALEIDOSCOPE_APPENDIX = ("Kaleidoscope paper (arXiv 2504.07072) appendix table complete_lang_acc, multimodal split, "
                         "total accuracy; quoted in EvolvingLMMs-Lab/lmms-eval tasks/kaleidoscope/RESULTS.md")
CENTURIO_T5 = ("Centurio paper (arXiv 2501.05122) Table 5 (en, mul; CIDEr for XM3600), as extracted in "
               "deep-diver/ai-paper-reviewer content/paper-reviews/2501.05122/tables.json (commit af83434)")
PANGEA_T1 = ("Pangea paper (arXiv 2410.16153) Table 1 (en, mul), as extracted in deep-diver/ai-paper-reviewer "
             "content/paper-reviews/2410.16153/index.md (commit 0fd39f4)")
PANGEA_LANGS = ("Pangea paper (arXiv 2410.16153) appendix per-language table (the same en / Multi as its Table 1), "
                "as extracted in deep-diver/ai-paper-reviewer content/paper-reviews/2410.16153/index.md (commit 0fd39f4)")
_MTVQA = ("ar", "de", "fr", "it", "ja", "ko", "ru", "th", "vi")
_KALEIDOSCOPE = ("en", "fr", "de", "nl", "pt", "es", "ar", "bn", "hr", "hi", "hu", "lt", "ne", "fa", "ru", "sr", "te",
                 "uk")
_MAXM = ("en", "fr", "hi", "iw", "ro", "th", "zh")            # the per-language table's English, French, ..., Chinese
_XMMMU = ("en", "ar", "fr", "hi", "id", "ja", "pt")
_M3EXAM = ("en", "af", "zh", "it", "pt", "th", "vi")


def _en_mul(source: str, rows) -> dict:
    """Rows a source gives as English and the mean over the non-English languages only."""
    return {name: (source, {"en": en}, {"mul": mul}) for name, en, mul in rows}


def _per_language(source: str, langs: tuple, rows) -> dict:
    """Rows a source gives per language (English first), with its own mean over the others (Multi)."""
    return {name: (source, dict(zip(langs, scores)), {"mul": mul}) for name, scores, mul in rows}


# task -> published row name -> (source, language -> score, the source's own aggregates: kind -> score). The
# report shows the source's mul / avg where the row lacks languages and the table has all of the benchmark's
# (then both span the same languages; other kinds are kept for the record: MTVQA's README AVG. is not the
# unweighted mean of its languages); scores as the sources print them. Row names end in the source's tag.
PUBLISHED = {
    "mtvqa": {
        **{name: (MTVQA_README, dict(zip(_MTVQA, scores)), {"README AVG.": avg}) for name, scores, avg in (
            ("InternVL2.5 78B", (15.9, 39.0, 45.6, 42.9, 21.1, 33.9, 12.2, 23.8, 41.5), 31.9),
            ("Qwen2-VL 72B", (20.7, 36.5, 44.1, 42.8, 21.6, 37.4, 15.6, 17.7, 41.6), 30.9),
            ("GPT-4o", (20.2, 34.2, 41.2, 32.7, 20.0, 33.9, 11.5, 22.5, 34.2), 27.8),
            ("Qwen2-VL 7B", (15.5, 32.1, 41.6, 38.9, 17.8, 30.6, 13.0, 10.8, 30.0), 25.6))},
        **{name: (CENTURIO_T5, {}, {"mul": score, "avg": score}) for name, score in (
            ("Centurio Qwen [Centurio]", 11.9), ("Centurio Aya [Centurio]", 11.1))},
    },
    "kaleidoscope_multimodal": {
        "Qwen2.5-VL-3B": (KALEIDOSCOPE_APPENDIX, dict(zip(_KALEIDOSCOPE, (
            35.0, 32.3, 21.1, 41.8, 52.2, 53.3, 33.5, 32.8, 25.9, 31.3, 28.2, 35.6, 23.8, 30.3, 29.0, 27.8, 31.8,
            40.1))), {"avg": 33.7}),
    },
    "xm3600": _en_mul(CENTURIO_T5, (
        ("Centurio Qwen [Centurio]", 79.1, 34.4), ("Centurio Aya [Centurio]", 78.4, 39.2),
        ("Pangea [Centurio]", 70.1, 34.6), ("Qwen2VL 7B [Centurio]", 50.3, 24.6),
        ("InternVL 2.5 8B [Centurio]", 38.3, 15.7))),
    "xm100": _en_mul(PANGEA_T1, (
        ("PANGEA-7B [Pangea]", 30.4, 14.2), ("GPT4o [Pangea]", 27.7, 19.1), ("Gemini-1.5-Pro [Pangea]", 27.6, 19.1),
        ("Llava-OV-7B [Pangea]", 30.6, 7.0))),
    "maxm": {
        **_en_mul(CENTURIO_T5, (("Centurio Qwen [Centurio]", 60.1, 47.7), ("Centurio Aya [Centurio]", 55.7, 49.3),
                                ("Qwen2VL 7B [Centurio]", 54.7, 31.2))),
        **_en_mul(PANGEA_T1, (("PANGEA-7B [Pangea]", 55.3, 53.2),)),
        **_per_language(PANGEA_LANGS, _MAXM, (
            ("GPT4o [Pangea]", (60.7, 59.8, 68.8, 70.0, 61.3, 76.5, 56.3), 65.4),
            ("Gemini-1.5-Pro [Pangea]", (56.4, 60.2, 66.5, 65.7, 57.4, 73.9, 57.4), 63.5),
            ("Llava-OV-7B [Pangea]", (54.9, 37.9, 31.9, 17.8, 30.2, 53.0, 37.9), 34.8))),
    },
    "xmmmu": {
        **_en_mul(CENTURIO_T5, (("Centurio Qwen [Centurio]", 46.4, 43.0), ("Centurio Aya [Centurio]", 37.6, 37.2),
                                ("Qwen2VL 7B [Centurio]", 43.0, 40.7))),
        **_per_language(PANGEA_LANGS, _XMMMU, (
            ("PANGEA-7B [Pangea]", (45.7, 42.3, 45.3, 41.6, 46.5, 40.5, 46.1), 43.7),
            ("GPT4o (0513) [Pangea]", (69.1, 56.7, 58.1, 58.1, 59.9, 58.0, 58.9), 58.3),
            ("Gemini-1.5-Pro (0801) [Pangea]", (65.8, 57.7, 58.1, 55.5, 60.2, 55.0, 59.6), 57.7),
            ("Llava-OV-7B [Pangea]", (46.3, 41.6, 43.0, 34.7, 43.4, 40.1, 43.4), 41.0))),
    },
    "m3exam": {
        **_en_mul(CENTURIO_T5, (("Centurio Qwen [Centurio]", 61.2, 46.9), ("Centurio Aya [Centurio]", 53.0, 41.2),
                                ("Qwen2VL 7B [Centurio]", 56.1, 49.7))),
        **_per_language(PANGEA_LANGS, _M3EXAM, (
            ("PANGEA-7B [Pangea]", (61.4, 52.1, 49.2, 54.9, 43.3, 32.9, 19.8), 42.1),
            ("GPT4o [Pangea]", (68.0, 73.0, 68.0, 67.0, 58.0, 52.0, 48.3), 61.0),
            ("Gemini-1.5-Pro [Pangea]", (77.4, 80.4, 74.1, 76.3, 61.8, 49.9, 46.0), 64.7),
            ("Llava-OV-7B [Pangea]", (60.4, 50.3, 58.0, 57.2, 43.8, 30.9, 34.5), 45.8))),
    },
}

# --- the grid's `suite:` section ------------------------------------------------------------------------
SECTION_KEYS = {"tasks", "data", "images", "languages", "task_flags", "flags", "models"}
MODEL_KEYS = {"backend", "model", "revision", "adapter", "rules", "flags", "engine", "serve"}   # engine, serve: hf_cells
MODEL_FLAGS = {"--backend": "backend", "--model": "model", "--revision": "revision", "--adapter": "adapter"}


@dataclass
class SuiteModel:
    name: str
    backend: str
    model: str
    revision: str | None = None
    adapter: str | None = None
    rules: dict[str, list[str]] = field(default_factory=dict)
    flags: list[str] = field(default_factory=list)
    engine: dict = field(default_factory=dict)     # the server flags of the openai backend (hf_cells.load_engine)
    serve: dict | None = None                      # the cell starts its server (protocols/serving.py)


@dataclass
class SuiteSection:
    tasks: list[str]
    data: dict[str, str]
    images: dict[str, str]
    languages: dict[str, list[str]]
    task_flags: dict[str, list[str]]
    models: dict[str, SuiteModel]
    flags: list[str] = field(default_factory=list)


def _task_mapping(raw, where: str, error, tasks=None) -> dict:
    if raw is None:
        return {}
    if not isinstance(raw, dict) or any(t not in SUITE for t in raw):
        bad = sorted(t for t in raw if t not in SUITE) if isinstance(raw, dict) else raw
        raise error(f"{where}: expected a mapping task -> value for suite tasks ({', '.join(SUITE)}); got {bad!r}")
    return dict(raw)


def _path(value, base: Path) -> str:
    """A local path relative to the grid file; a hub dataset id (`owner/name` that is no path here) as given."""
    text = str(value)
    path = Path(text).expanduser()
    if path.is_absolute():
        return text
    resolved = (base / path).resolve()
    return str(resolved) if resolved.exists() or text.startswith(".") else text


def load_section(raw, base: Path, where: str, str_list, error) -> SuiteSection:
    """Parse and check the grid's `suite:` mapping (`str_list`/`error`: the grid loader's list reader and error)."""
    if not isinstance(raw, dict):
        raise error(f"{where}: expected a mapping with tasks, data, models (and images, languages, flags)")
    unknown = set(raw) - SECTION_KEYS
    if unknown:
        raise error(f"{where}: unknown key(s) {sorted(unknown)}; valid keys: {sorted(SECTION_KEYS)}")
    for key in ("tasks", "data", "models"):
        if not raw.get(key):
            raise error(f"{where}: missing required key '{key}'")
    tasks = str_list(raw["tasks"], f"{where}.tasks")
    bad = [t for t in tasks if t not in SUITE]
    if bad:
        raise error(f"{where}.tasks: unknown task(s) {bad} (known: {', '.join(SUITE)})")
    data = {t: _path(v, base) for t, v in _task_mapping(raw["data"], f"{where}.data", error).items()}
    missing = [t for t in tasks if t not in data]
    if missing:
        raise error(f"{where}.data: no data for task(s) {missing} (a folder, file or cached hub dataset id)")
    images = {t: _path(v, base) for t, v in _task_mapping(raw.get("images"), f"{where}.images", error).items()}
    languages = {}
    for task, langs in _task_mapping(raw.get("languages"), f"{where}.languages", error).items():
        langs = str_list(langs, f"{where}.languages.{task}")
        bad = [problem for problem in (language_problem(task, l) for l in langs) if problem]
        if bad:
            raise error(f"{where}.languages.{task}: {bad[0]}")
        languages[task] = langs
    unnamed = [t for t in tasks if not SUITE[t].languages and t not in languages]
    if unnamed:
        raise error(f"{where}.languages: give the languages of {unnamed} (a format without languages of its own: "
                    "the codes its --data files are named by)")
    task_flags = {t: str_list(v, f"{where}.task_flags.{t}")
                  for t, v in _task_mapping(raw.get("task_flags"), f"{where}.task_flags", error).items()}
    if not isinstance(raw["models"], dict):
        raise error(f"{where}.models: expected a mapping model-name -> settings")
    models = {}
    for name, spec in raw["models"].items():
        at = f"{where}.models.{name}"
        if not isinstance(spec, dict) or not {"backend", "model"} <= set(spec):
            raise error(f"{at}: expected a mapping with at least 'backend' and 'model'")
        unknown = set(spec) - MODEL_KEYS
        if unknown:
            raise error(f"{at}: unknown key(s) {sorted(unknown)}; valid keys: {sorted(MODEL_KEYS)}")
        rules = {t: str_list(v, f"{at}.rules.{t}")
                 for t, v in _task_mapping(spec.get("rules"), f"{at}.rules", error).items()}
        engine, serve = load_engine({**spec, "backend": str(spec["backend"]), "model": str(spec["model"])}, at, str_list)
        models[str(name)] = SuiteModel(
            name=str(name), backend=str(spec["backend"]), model=str(spec["model"]),
            revision=str(spec["revision"]) if spec.get("revision") else None,
            adapter=_path(spec["adapter"], base) if spec.get("adapter") else None,
            rules=rules, flags=str_list(spec.get("flags", []), f"{at}.flags"), engine=engine, serve=serve)
    return SuiteSection(tasks=tasks, data=data, images=images, languages=languages, task_flags=task_flags,
                        models=models, flags=str_list(raw.get("flags", []), f"{where}.flags"))


def suite_cells(planner) -> None:
    """Add the grid's suite cells to `planner` (a runners.Planner): per model, each task its backend kind can do,
    each rule asked for (or the default) and language."""
    grid, section = planner.grid, planner.grid.suite
    for spec in section.models.values():
        for task in tasks_for_backend(spec.backend, section.tasks, {t: s.kind for t, s in SUITE.items()}):
            for rule in spec.rules.get(task) or [None]:
                for lang in section.languages.get(task) or SUITE[task].languages:
                    cell_id = "/".join(p for p in ("suite", spec.name, task, rule, lang) if p)
                    d = planner.cell_dir(cell_id)
                    argv = list(grid.commands["suite"]) + ["--task", task, "--lang", lang,
                                                           "--data", section.data[task]]
                    if task in section.images:
                        argv += ["--images", section.images[task]]
                    for flag, key in MODEL_FLAGS.items():
                        if getattr(spec, key):
                            argv += [flag, getattr(spec, key)]
                    argv += (["--rule", rule] if rule else []) + ["--name", spec.name, "--output_dir",
                                                                  str(d / "eval"), "--no_result_json", "--no_progress"]
                    argv += section.task_flags.get(task, []) + spec.flags + section.flags
                    argv += grid.extra_flags.get("suite", [])
                    served = {"backend": spec.backend, "engine": spec.engine, "serve": spec.serve}
                    argv = engine_argv(grid, served, argv, d)
                    out, err = str(d / "test.out"), str(d / "test.err")
                    planner.add(Cell(id=cell_id, stage="suite", protocol="zero_shot", model=spec.name, task=task,
                                     lang=lang, scorer="suite", commands=[Command(argv, out, err), planner.record(d)],
                                     logs=[out, err], extra={"backend": spec.backend, "rule": rule,
                                                             "engine": engine_name(served)}))
