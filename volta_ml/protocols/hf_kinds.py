"""Which Hugging Face backend kind each IGLUE task needs: the sweep planner plans HF cells with it and
`volta_ml/iglue_hf/tasks.py` checks a loaded backend against it (no heavy imports)."""
from __future__ import annotations

NEEDS = {"xflickrco": "dual encoder", "wit": "dual encoder", "xvnli": "generative", "xgqa": "generative",
         "marvl": "generative"}
# the kinds of volta_ml.hf.BACKENDS; a backend registered under another name is checked when it is loaded
BACKEND_KINDS = {"clip": "dual encoder", "mclip": "dual encoder", "mllm": "generative", "vllm": "generative",
                 "openai": "generative"}


def tasks_for_backend(backend: str, tasks: list[str], needs: dict | None = None) -> list[str]:
    """The tasks of `tasks` a backend of this name can do (all of them for an unknown name); `needs`: the kind
    each task needs (default `NEEDS`; the multilingual suite's come from `protocols/suite.py`)."""
    kind = BACKEND_KINDS.get(backend)
    return [t for t in tasks if kind is None or (NEEDS if needs is None else needs).get(t) == kind]
