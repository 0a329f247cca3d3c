"""The planner's error class, in a module of its own so that every planning module can raise it."""
from __future__ import annotations


class GridError(ValueError):
    """A problem in the grid file; the message names the file and the key (one line, exit code 2)."""
