"""Keyword options of the Python entry points (`run_cvqa`, `run_backend`, `run_iglue_hf`): defaults filled in,
unknown and missing names refused in one line. Imports nothing from the package."""
from __future__ import annotations


def complete_options(name: str, given: dict, defaults: dict, required) -> dict:
    """`{**defaults, **given}` after checking that every key of `given` is known and every required one set."""
    unknown = set(given) - set(defaults) - set(required)
    if unknown:
        raise KeyError(f"{name}: unknown argument(s) {sorted(unknown)}; known: {sorted(defaults) + list(required)}")
    missing = [key for key in required if not given.get(key)]
    if missing:
        raise KeyError(f"{name}: missing required argument(s) {missing}")
    return {**defaults, **given}
