"""The one table of the tasks Hugging Face backends run: IGLUE's tasks and the multilingual suite, one row each
(reader, prompt, rules, default rule, metric and aggregation). A new benchmark is a row here, its reader
(`readers.py`), its rules (`rules.py`), its prompt (`prompts.py`) and its planner-side spec
(`protocols/suite.py`: title, languages, backend kind, aggregate); the loop that scores it is the one every row
shares (`iglue_hf.tasks.score_items`, through the chunk store).

IGLUE's rows are run by `volta-ml iglue-hf` (IGLUE's file layout, translate-test, MaRVL's image layouts); the
suite's by `volta-ml suite`.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from volta_ml.iglue_hf import prompts as iglue_prompts
from volta_ml.iglue_hf.data import READERS as IGLUE_READERS
from volta_ml.iglue_hf.scoring import DEFAULT_RULES as IGLUE_DEFAULTS, RULES as IGLUE_RULES
from volta_ml.protocols.hf_kinds import NEEDS
from volta_ml.protocols.suite import SUITE

from . import prompts, readers, rules


@dataclass(frozen=True)
class TaskRow:
    name: str
    command: str                  # the command line that runs it: "suite" | "iglue-hf"
    kind: str                     # the backend kind it needs: "generative" | "dual encoder"
    reader: Callable              # (data path, language, options) -> TaskData (IGLUE: (file, language))
    prompt: Callable | None       # (item, rule kind, the backend's VQA frame) -> user turn (IGLUE: prompts.user_turn)
    rules: dict                   # rule name -> Rule
    default_rule: str
    metric: str                   # what the score is
    aggregate: str                # how the languages are summarised: mul | all | avg (IGLUE's avg over targets)
    max_new_tokens: int = 16      # generation rules: the answer length limit (--max_new_tokens overrides)


def _iglue(name: str) -> TaskRow:
    retrieval = NEEDS[name] == "dual encoder"
    return TaskRow(name, "iglue-hf", NEEDS[name], IGLUE_READERS[name], iglue_prompts.user_turn,
                   IGLUE_RULES.get(name, {}), IGLUE_DEFAULTS[name], "recall@1" if retrieval else "accuracy", "avg",
                   max_new_tokens=10)


def _suite(name: str, reader, prompt, task_rules: dict, default: str, max_new_tokens: int = 16) -> TaskRow:
    spec = SUITE[name]
    return TaskRow(name, "suite", spec.kind, reader, prompt, task_rules, default, spec.metric_name, spec.aggregate,
                   max_new_tokens)


RETRIEVAL = {"embedding": None}     # dual encoders: cosine similarities (iglue_hf.tasks.run_retrieval)

TASKS: dict[str, TaskRow] = {row.name: row for row in (
    *(_iglue(name) for name in ("xvnli", "xgqa", "marvl", "xflickrco", "wit")),
    _suite("maxm", readers.read_maxm, prompts.maxm, rules.MAXM_RULES, "exact"),
    _suite("xm3600", readers.read_xm3600, prompts.caption, rules.CIDER_RULES, "cider", 64),
    _suite("xm100", readers.read_xm100, prompts.caption, rules.CIDER_RULES, "cider", 64),
    _suite("xm3600_retrieval", readers.read_xm3600_retrieval, None, RETRIEVAL, "embedding"),
    _suite("mtvqa", readers.read_mtvqa, prompts.mtvqa, rules.MTVQA_RULES, "mtvqa", 32),
    _suite("xmmmu", readers.read_xmmmu, prompts.xmmmu, rules.XMMMU_RULES, "generate", 16),
    _suite("m3exam", readers.read_m3exam, prompts.m3exam, rules.M3EXAM_RULES, "generate", 16),
    _suite("kaleidoscope", readers.read_kaleidoscope, prompts.kaleidoscope, rules.KALEIDOSCOPE_RULES, "generate", 32),
    _suite("kaleidoscope_multimodal", readers.read_kaleidoscope_multimodal, prompts.kaleidoscope,
           rules.KALEIDOSCOPE_RULES, "generate", 32),
    _suite("mmmb", readers.read_mmmb, prompts.vlmevalkit_mcq, rules.VLMEVALKIT_RULES, "vlmevalkit", 32),
    _suite("vlmevalkit_mcq", readers.read_vlmevalkit_mcq, prompts.vlmevalkit_mcq, rules.VLMEVALKIT_RULES,
           "vlmevalkit", 32),
)}
