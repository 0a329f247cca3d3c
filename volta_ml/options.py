"""Options: the keyword options of the Python entry points (`run_cvqa`, `run_backend`, `run_iglue_hf`: defaults
filled in, unknown and missing names refused in one line) and the argparse types that bound every numeric flag of
every command line (`int_at_least`, `float_in`, `SEED`, `json_object`; a value out of range is a usage error,
exit code 2, one line naming the flag: `OneLineParser`). Imports nothing from the package, so every layer's command line may use it."""
from __future__ import annotations

import argparse
import difflib
import json
import math
import sys
import warnings


def complete_options(name: str, given: dict, defaults: dict, required) -> dict:
    """`{**defaults, **given}` after checking that every key of `given` is known and every required one set."""
    unknown = set(given) - set(defaults) - set(required)
    if unknown:
        raise KeyError(f"{name}: unknown argument(s) {sorted(unknown)}; known: {sorted(defaults) + list(required)}")
    missing = [key for key in required if not given.get(key)]
    if missing:
        raise KeyError(f"{name}: missing required argument(s) {missing}")
    return {**defaults, **given}


class OneLineParser(argparse.ArgumentParser):
    """argparse whose usage errors (a bad or missing flag, a value out of range) are one stderr line,
    `<prog>: error: <message>`, exit code 2, as every other bad input (docs/errors.md): no usage block before it
    (`--help` prints that). Subcommand parsers inherit the class (`add_subparsers` makes parsers of its type)."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message}\n")


class VoltaArgumentParser(OneLineParser):
    """argparse with VOLTA-friendly errors. Also usable as a `volta-ml` subcommand parser: set
    `sub.__class__ = VoltaArgumentParser` after `add_parser` (argparse offers no other hook)."""

    def parse_known_args(self, args=None, namespace=None):
        args = list(sys.argv[1:] if args is None else args)
        if args and args[-1] == "deactivate":
            warnings.warn("ignoring the trailing bare 'deactivate' argument (a shell line-continuation slip in "
                          "the IGLUE scripts)", stacklevel=2)
            args = args[:-1]
        parsed, unknown = super().parse_known_args(args, namespace)
        if unknown:
            self.error(self._explain_unknown(unknown))
        return parsed, unknown

    def _explain_unknown(self, unknown: list[str]) -> str:
        options = [o for action in self._actions for o in action.option_strings if o.startswith("--")]
        parts = []
        for token in unknown:
            flag = token.split("=", 1)[0]
            if flag.startswith("-"):
                close = difflib.get_close_matches(flag, options, n=1, cutoff=0.5)
                parts.append(f"{flag} (did you mean {close[0]}?)" if close else flag)
            else:
                parts.append(repr(token))
        return "unrecognized arguments: " + ", ".join(parts)


def int_at_least(minimum: int, maximum: int | None = None):
    """argparse `type`: an integer >= minimum (and <= maximum when given); a usage error (exit code 2) otherwise."""
    bound = f">= {minimum}" if maximum is None else f"in {minimum}..{maximum}"

    def parse(text: str) -> int:
        value = int(text)
        if value < minimum or (maximum is not None and value > maximum):
            raise argparse.ArgumentTypeError(f"must be an integer {bound}, got {text}")
        return value
    parse.__name__ = f"integer {bound}"
    return parse


def float_in(low: float | None = None, high: float | None = None, *, open_low: bool = False,
             open_high: bool = False):
    """argparse `type`: a finite number in the interval from `low` to `high` (None: unbounded; `open_low` /
    `open_high`: the end itself excluded); a usage error (exit code 2) otherwise. `nan` and `inf` are refused
    everywhere: no flag of volta-ml means anything by them."""
    if low is not None and high is not None:
        bound = f"in {'(' if open_low else '['}{low:g}, {high:g}{')' if open_high else ']'}"
    elif low is not None:
        bound = f"{'>' if open_low else '>='} {low:g}"
    elif high is not None:
        bound = f"{'<' if open_high else '<='} {high:g}"
    else:
        bound = ""
    what = f"a number {bound}" if bound else "a finite number"

    def parse(text: str) -> float:
        value = float(text)
        too_low = low is not None and (value <= low if open_low else value < low)
        too_high = high is not None and (value >= high if open_high else value > high)
        if not math.isfinite(value) or too_low or too_high:
            raise argparse.ArgumentTypeError(f"must be {what}, got {text}")
        return value
    parse.__name__ = what.removeprefix("a ")
    return parse


SEED = int_at_least(0, 2**32 - 1)   # what numpy's and torch's seeding accept


def json_object(text: str) -> dict:
    """argparse `type`: a JSON object (`--extra`, `--hf_extra`)."""
    try:
        value = json.loads(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(f"not JSON: {err}") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError("expected a JSON object")
    return value
