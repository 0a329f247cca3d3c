"""Plain, one-at-a-time computations the statistics are checked against (written the obvious way, no shortcut)."""
from __future__ import annotations


def plain_holm(p: list[float]) -> list[float]:
    """Holm's step-down procedure written out: visit the p-values from the smallest, multiply the k-th smallest by
    (m - k + 1), never below the previous adjusted value, never above 1."""
    m = len(p)
    order = sorted(range(m), key=lambda i: p[i])
    adjusted, running = [0.0] * m, 0.0
    for k, i in enumerate(order, start=1):
        running = max(running, min(1.0, (m - k + 1) * p[i]))
        adjusted[i] = running
    return adjusted
