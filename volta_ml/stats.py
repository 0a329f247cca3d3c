"""Every number with its uncertainty: bootstrap intervals, paired comparisons, seed spread, and the per-item file
they are computed from. Serves every layer (it imports only `atomic.py`): the entry points write per-item files,
`volta-ml report`, `volta-ml cvqa report` and `volta-ml compare` read them.

The per-item record format (`<split>_items.jsonl`, beside the files an entry point already writes)
------------------------------------------------------------------------------------------------------
JSON Lines, one object per item: `{"id": "<item id>", "<metric>": value, ...}`, optionally `"group": "<key>"` and
`"cluster": "<key>"` (the image the item asks about: the intervals resample images).
`id` names the item (a question id, `caption:<n>`, `image:<key>`) so that two runs can be paired item by item;
every other key but `group` and `cluster` is a metric, and the cell's number for that metric is the mean of its
items' values on the same scale (accuracy: 100 for a correct item, 0 for a wrong one; recall@k per retrieval query;
a per-image caption score). An item may carry only some metrics (retrieval: a caption has the image-retrieval
ones, an image the text-retrieval ones). `write_items` / `read_items` / `metric_values` read and write it.

Intervals (`interval`)
----------------------
`scipy.stats.bootstrap`, the **percentile** method by default (`method="BCa"` on request), `n_resamples`
resamples drawn by `numpy.random.default_rng(seed)`: reproducible, and exactly what a plain numpy bootstrap
draws: for each batch of resamples, for each group in sorted order, `rng.integers(0, n_group, (batch, n_group))`
(one batch unless `n_resamples x items` exceeds `BATCH_ELEMENTS`). With `groups` (languages, country-language
pairs) the resampling is stratified: each group's items are resampled within the group, so every resample has the
same number of items per group. `average="micro"` is the mean over all items, `average="macro"` the unweighted
mean of the groups' means (IGLUE's `avg` over languages, CVQA's macro over pairs). A group with one item is a
constant of every resample; a cell whose items are all equal has the interval [value, value].

With `clusters` (one key per item: the image it asks about, the per-item file's `cluster`) the bootstrap is the
cluster bootstrap: scipy's bootstrap over each group's cluster indices (clusters in the order of their first item,
drawn as items are: `rng.integers(0, n_clusters, (batch, n_clusters))`), a resample's group mean being the summed
values of its drawn clusters over their number of items; a group with one cluster is a constant. With one item per
cluster it is the item bootstrap, draw for draw. The Interval records it (`clusters`, `cluster_key`, `resampling`).

Paired comparisons (`paired_test`, `compare_items`)
---------------------------------------------------
The difference `a - b` of the same statistic on the same items (each side's value with its own `interval` over
those items, as a table cell shows it), with a paired (stratified) bootstrap interval of the difference (the
bootstrap of the per-item differences, drawn as `interval` draws; for a mean the same as resampling the pairs)
and a two-sided p-value from a paired permutation test: under the null hypothesis each
item's two values are exchangeable, so the sign of its difference flips (`sign_flip_p_value`): exact over all 2^n
sign patterns when 2^n <= `n_permutations`, otherwise approximate randomisation with `n_permutations` random
patterns and p = (k + 1) / (n_permutations + 1); with clusters each cluster's summed contribution flips as
one. Many cells tested at once (a table's languages) also get Holm's adjusted p-values (`holm`), which keep the
family-wise error rate across them. (`scipy.stats.permutation_test(permutation_type="samples")` is the same test,
but it loops over the items in Python: 26 s for 9,000 items x 9,999 patterns on one core, 1.7 s here.)
`compare_items` pairs two {id: value} mappings and names the items found on one side only: they are listed in the
result, never dropped silently.

Seeds (`seed_spread`): the mean, the sample standard deviation (ddof=1; None for one seed) and n over seeds.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Mapping, Sequence

import numpy as np

from volta_ml.atomic import atomic_open

ITEMS_SUFFIX = "_items.jsonl"
CONFIDENCE = 0.95
N_RESAMPLES = 2000          # bootstrap resamples of an interval
N_PERMUTATIONS = 9999       # sign patterns of a permutation test (exact below 2^13 items ... 14 items)
SEED = 0
METHODS = {"percentile": "percentile", "bca": "BCa"}   # accepted spellings -> scipy's names
AVERAGES = ("micro", "macro")
BATCH_ELEMENTS = 2 ** 23    # resampled values held at once (memory bound of one bootstrap batch)
CLUSTER_KEY = "image"       # what a per-item file's `cluster` names: the image (or images) the item asks about
RESERVED = ("id", "group", "cluster")   # not metrics: the item, its stratum, its cluster (the image it asks about)


class ItemsError(ValueError):
    """A per-item file that cannot be read; the message names the file and line."""


# --- the per-item file -------------------------------------------------------------------------------------------
def items_path(result_path: str | Path) -> Path:
    """The per-item file beside `<split>_result.json` (or beside any file: `<stem>_items.jsonl`)."""
    path = Path(result_path)
    stem = path.name[: -len("_result.json")] if path.name.endswith("_result.json") else path.stem
    return path.with_name(stem + ITEMS_SUFFIX)


def unique_ids(ids: Iterable) -> list[str]:
    """Item ids as strings, a repeated one numbered by its occurrence (`q7`, `q7#2`), so a file with repeated ids
    still pairs item by item with another run of the same file."""
    seen: dict[str, int] = {}
    out = []
    for item in map(str, ids):
        seen[item] = seen.get(item, 0) + 1
        out.append(item if seen[item] == 1 else f"{item}#{seen[item]}")
    return out


def write_items(path: str | Path, rows: Iterable[Mapping]) -> Path:
    """Write per-item rows (`{"id": ..., metric: value, ...}`) atomically; ids must be unique."""
    seen: set[str] = set()
    lines = []
    for row in rows:
        item = str(row["id"])
        if item in seen:
            raise ValueError(f"{path}: item id {item!r} appears twice")
        seen.add(item)
        out = {"id": item}
        for key in ("group", "cluster"):
            if row.get(key) is not None:
                out[key] = str(row[key])
        out.update({k: float(v) for k, v in row.items() if k not in RESERVED})
        lines.append(json.dumps(out, ensure_ascii=False))
    path = Path(path)
    with atomic_open(path, "w", encoding="utf-8") as handle:
        handle.write("".join(line + "\n" for line in lines))
    return path


def read_items(path: str | Path) -> dict[str, dict]:
    """{id: {metric: value, ("group": key), ("cluster": key)}} in file order. A file that cannot be read, a line
    that is not an item record (the error names the file and the line) and a file with no record at all are
    `ItemsError`s."""
    items: dict[str, dict] = {}
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as error:
        raise ItemsError(f"{path}: cannot read the per-item file ({error})") from None
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            item = str(row["id"])
            values = {k: (str(v) if k in RESERVED else float(v)) for k, v in row.items() if k != "id"}
        except (ValueError, KeyError, TypeError) as error:
            raise ItemsError(f"{path} line {number}: not an item record {{\"id\": ..., metric: number}} "
                             f"({error})") from None
        if item in items:
            raise ItemsError(f"{path} line {number}: item id {item!r} appears twice")
        items[item] = values
    if not items:
        raise ItemsError(f"{path}: an empty per-item file (no item record; the run that wrote it scored nothing "
                         f"or was cut short)")
    return items


def metric_values(items: Mapping[str, Mapping], metric: str) -> dict[str, float]:
    """{id: value} of the items that carry `metric`."""
    return {item: float(values[metric]) for item, values in items.items() if metric in values}


def item_clusters(items: Mapping[str, Mapping]) -> dict[str, str] | None:
    """{id: cluster key} (the image an item asks about), or None when any item has none (then intervals resample
    items, and say so)."""
    clusters = {item: values.get("cluster") for item, values in items.items()}
    return None if not clusters or any(c is None for c in clusters.values()) else clusters


# --- intervals ---------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Interval:
    estimate: float
    low: float
    high: float
    n: int                      # items
    groups: int                 # strata (1 without groups)
    confidence: float = CONFIDENCE
    method: str = "percentile"
    n_resamples: int = N_RESAMPLES
    seed: int = SEED
    clusters: int | None = None         # clusters resampled (None: items resampled one by one)
    cluster_key: str | None = None      # what a cluster is ("image"); None: no cluster key, per-item resampling

    @property
    def resampling(self) -> str:
        """What was resampled, as the CSVs record it: `items`, or `image clusters (<n>)`."""
        return resampling_text(self.cluster_key, self.clusters)

    @property
    def half_width(self) -> float:
        return (self.high - self.low) / 2

    def text(self, digits: int = 2, style: str = "pm") -> str:
        """`56.30 ± 1.20` (half the interval's width; style "pm") or `56.30 [55.10, 57.50]` (style "brackets")."""
        return format_estimate(self.estimate, self.low, self.high, digits, style)


def fixed(value: float, digits: int = 2, signed: bool = False) -> str:
    """`value` with `digits` decimals (`signed`: always with its sign, `+1.20`), never a negative zero: a value that
    rounds to zero prints `0.00` (`+0.00`), not `-0.00`."""
    text = f"{value:+.{digits}f}" if signed else f"{value:.{digits}f}"
    if text.startswith("-") and float(text) == 0:
        text = ("+" if signed else "") + text[1:]
    return text


def format_estimate(estimate: float, low: float, high: float, digits: int = 2, style: str = "pm",
                    signed: bool = False) -> str:
    """`56.30 ± 1.20` (pm: half the interval's width), `56.30 [55.10, 57.50]` (brackets) or `56.30` (none);
    `signed`: the estimate and bounds with their signs (a difference). Never a negative zero (`fixed`)."""
    if style == "none":
        return fixed(estimate, digits, signed)
    if style == "brackets":
        return f"{fixed(estimate, digits, signed)} [{fixed(low, digits, signed)}, {fixed(high, digits, signed)}]"
    if style == "pm":
        return f"{fixed(estimate, digits, signed)} ± {fixed((high - low) / 2, digits)}"
    raise ValueError(f"unknown interval style {style!r} (pm, brackets, none)")


LATEX_ESCAPES = (("\\", r"\textbackslash{}"), ("&", r"\&"), ("%", r"\%"), ("_", r"\_"), ("#", r"\#"), ("$", r"\$"),
                 ("{", r"\{"), ("}", r"\}"), ("±", r"$\pm$"), ("−", "$-$"), ("–", "--"))


def latex_text(text: str) -> str:
    """A table cell, header or caption as LaTeX: special characters escaped, `±` as `$\\pm$`, the minus sign `−` as
    `$-$`, the dash `–` (a missing value) as `--`; one form for every table (IGLUE's, the suite's, CVQA's)."""
    for char, escaped in LATEX_ESCAPES:
        text = text.replace(char, escaped)
    return text


def _method(method: str) -> str:
    try:
        return METHODS[method.lower()]
    except KeyError:
        raise ValueError(f"unknown bootstrap method {method!r} (percentile, BCa)") from None


def _strata(values, groups) -> tuple[list[str], list[np.ndarray]]:
    values = np.asarray(values, dtype=np.float64).reshape(-1)
    if values.size == 0:
        raise ValueError("no items: an interval needs at least one value")
    if not np.all(np.isfinite(values)):
        raise ValueError("item values must be finite numbers")
    if groups is None:
        return [""], [values]
    groups = [str(g) for g in groups]
    if len(groups) != values.size:
        raise ValueError(f"{values.size} values but {len(groups)} group keys")
    keys = sorted(set(groups))
    index = {k: i for i, k in enumerate(keys)}
    codes = np.array([index[g] for g in groups])
    return keys, [values[codes == i] for i in range(len(keys))]


def _weights(samples: list[np.ndarray], average: str) -> list[float]:
    """Weight of each group's mean in the statistic."""
    if average not in AVERAGES:
        raise ValueError(f"unknown average {average!r} (micro, macro)")
    total = sum(s.size for s in samples)
    if average == "macro":
        return [1.0 / len(samples)] * len(samples)
    return [s.size / total for s in samples]


def _statistic(samples: list[np.ndarray], average: str):
    """(resampled arrays, statistic over them, its value on the data): groups of one item are constants."""
    weights = _weights(samples, average)
    constant = sum(w * float(s.mean()) for w, s in zip(weights, samples) if s.size < 2)
    varying = [(w, s) for w, s in zip(weights, samples) if s.size >= 2]
    resampled_weights = [w for w, _ in varying]

    def statistic(*arrays, axis=-1):
        return constant + sum(w * np.mean(a, axis=axis) for w, a in zip(resampled_weights, arrays))

    estimate = constant + sum(w * float(s.mean()) for w, s in varying)
    return [s for _, s in varying], statistic, estimate


def _batch(samples: list[np.ndarray], n_resamples: int) -> int:
    return max(1, min(n_resamples, BATCH_ELEMENTS // max(1, sum(s.size for s in samples))))


def interval(values: Sequence[float], groups: Sequence[str] | None = None, *, average: str = "micro",
             confidence: float = CONFIDENCE, n_resamples: int = N_RESAMPLES, seed: int = SEED,
             method: str = "percentile", clusters: Sequence[str] | None = None,
             cluster_key: str = CLUSTER_KEY) -> Interval:
    """The bootstrap interval of the mean of `values` (micro) or of the mean of the groups' means (macro), items
    resampled within their `groups` (see the module docstring for the exact draws); with `clusters` (one key per
    value: the image it asks about) whole clusters are resampled within each group instead (`cluster_key` names
    what a cluster is, recorded in the Interval)."""
    from scipy.stats import bootstrap

    method = _method(method)
    keys, samples = _strata(values, groups)
    if average == "macro" and groups is None:
        raise ValueError("average='macro' needs groups")
    n = sum(s.size for s in samples)
    common = dict(n=n, groups=len(keys), confidence=confidence, method=method, n_resamples=n_resamples, seed=seed)
    if clusters is None:
        resampled, statistic, estimate = _statistic(samples, average)
        data = resampled
    else:
        parts = _cluster_parts(values, groups, clusters, keys)
        resampled, statistic, estimate, data = _cluster_statistic(samples, parts, average)
        common.update(clusters=sum(sums.size for sums, _ in parts), cluster_key=cluster_key)
    if not resampled or all(np.all(s == s[0]) for s in resampled):      # nothing varies: a point
        return Interval(estimate, estimate, estimate, **common)
    result = bootstrap(tuple(data), statistic, n_resamples=n_resamples, confidence_level=confidence,
                       method=method, rng=np.random.default_rng(seed), vectorized=True, axis=-1,
                       batch=_batch(data, n_resamples))
    ci = result.confidence_interval
    return Interval(estimate, float(ci.low), float(ci.high), **common)


def resampling_text(cluster_key: str | None, clusters: int | None) -> str:
    return "items" if cluster_key is None else f"{cluster_key} clusters ({clusters})"


def _cluster_parts(values, groups, clusters, keys: list[str]) -> list[tuple[np.ndarray, np.ndarray]]:
    """Per group (in `keys` order): the sum of each cluster's values and its number of items, clusters in the order
    of their first item (so that with one item per cluster the sums are the group's values in order)."""
    values = np.asarray(values, dtype=np.float64).reshape(-1)
    clusters = [str(c) for c in clusters]
    if len(clusters) != values.size:
        raise ValueError(f"{values.size} values but {len(clusters)} cluster keys")
    groups = [""] * values.size if groups is None else [str(g) for g in groups]
    parts = []
    for key in keys:
        index: dict[str, int] = {}
        sums: list[float] = []
        counts: list[float] = []
        for value, group, cluster in zip(values, groups, clusters):
            if group != key:
                continue
            if cluster not in index:
                index[cluster] = len(sums)
                sums.append(0.0)
                counts.append(0.0)
            sums[index[cluster]] += value
            counts[index[cluster]] += 1.0
        parts.append((np.array(sums), np.array(counts)))
    return parts


def _cluster_statistic(samples: list[np.ndarray], parts: list[tuple[np.ndarray, np.ndarray]], average: str):
    """The cluster bootstrap as scipy's bootstrap over cluster indices: each group's data are the indices of its
    clusters, a resample draws as many indices with replacement (`rng.integers(0, n_clusters, ...)`, as
    `interval` draws items), and the group's mean of a resample is the sum of the drawn clusters' values over
    their number of items. Groups with one cluster are constants. Returns (the varying groups' item values, the
    statistic, its value on the data, the index arrays scipy resamples)."""
    weights = _weights(samples, average)
    constant = sum(w * float(s.mean()) for w, s, (sums, _) in zip(weights, samples, parts) if sums.size < 2)
    varying = [(w, s, sums, counts) for w, s, (sums, counts) in zip(weights, samples, parts) if sums.size >= 2]

    def statistic(*indices, axis=-1):
        return constant + sum(w * sums[k].sum(axis=axis) / counts[k].sum(axis=axis)
                              for (w, _, sums, counts), k in zip(varying, (i.astype(np.intp) for i in indices)))

    estimate = constant + sum(w * float(s.mean()) for w, s, _, _ in varying)
    data = [np.arange(sums.size, dtype=np.float64) for _, _, sums, _ in varying]
    return [s for _, s, _, _ in varying], statistic, estimate, data


# --- paired comparisons ------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Comparison:
    a: float                    # the statistic on side A's items (the paired ones)
    b: float
    difference: float           # a - b
    low: float                  # paired bootstrap interval of the difference
    high: float
    p_value: float              # two-sided paired permutation test
    n: int                      # paired items
    exact: bool                 # all 2^n sign patterns enumerated
    only_a: tuple[str, ...] = ()     # item ids found on side A only (not in the difference)
    only_b: tuple[str, ...] = ()
    confidence: float = CONFIDENCE
    method: str = "percentile"
    n_resamples: int = N_RESAMPLES
    n_permutations: int = N_PERMUTATIONS
    seed: int = SEED
    groups: int = 1
    a_low: float | None = None      # each side's own (unpaired) bootstrap interval over the paired items
    a_high: float | None = None
    b_low: float | None = None
    b_high: float | None = None
    clusters: int | None = None         # clusters resampled and sign-flipped (None: items)
    cluster_key: str | None = None

    @property
    def resampling(self) -> str:
        return resampling_text(self.cluster_key, self.clusters)

    def text(self, digits: int = 2, style: str = "pm") -> str:
        return format_estimate(self.difference, self.low, self.high, digits, style)

    def side_text(self, side: str, digits: int = 2, style: str = "pm") -> str:
        """Side A's (or B's) value over the paired items with its own interval, as a table cell shows it."""
        value, low, high = (self.a, self.a_low, self.a_high) if side == "A" else (self.b, self.b_low, self.b_high)
        if low is None:
            return fixed(value, digits)
        return format_estimate(value, low, high, digits, style)

    def missing_text(self, limit: int = 5) -> str:
        """`2 only in A (q1, q7); 1 only in B (q9)`, or "" when both sides have the same items."""
        parts = []
        for side, ids in (("A", self.only_a), ("B", self.only_b)):
            if ids:
                shown = ", ".join(ids[:limit]) + (", ..." if len(ids) > limit else "")
                parts.append(f"{len(ids)} only in {side} ({shown})")
        return "; ".join(parts)


def paired_test(a: Sequence[float], b: Sequence[float], groups: Sequence[str] | None = None, *,
                average: str = "micro", confidence: float = CONFIDENCE, n_resamples: int = N_RESAMPLES,
                n_permutations: int = N_PERMUTATIONS, seed: int = SEED, method: str = "percentile",
                only_a: Sequence[str] = (), only_b: Sequence[str] = (), clusters: Sequence[str] | None = None,
                cluster_key: str = CLUSTER_KEY) -> Comparison:
    """`a[i]` and `b[i]` are the same item's values in two runs (aligned). The difference of the statistic
    (micro / macro over `groups`), its paired bootstrap interval and the permutation p-value. With `clusters` (one
    key per item: its image) the bootstrap resamples clusters within each group and the permutation test flips the
    sign of each cluster's summed contribution (the items of one image swap sides together)."""
    a = np.asarray(a, dtype=np.float64).reshape(-1)
    b = np.asarray(b, dtype=np.float64).reshape(-1)
    if a.shape != b.shape:
        raise ValueError(f"paired values of different lengths ({a.size} and {b.size})")
    if a.size == 0:
        raise ValueError("no paired items: the two runs share no item")
    side = dict(average=average, confidence=confidence, n_resamples=n_resamples, seed=seed, method=method,
                clusters=clusters, cluster_key=cluster_key)
    diff = interval(a - b, groups, **side)
    keys, samples = _strata(a - b, groups)
    weights = np.concatenate([np.full(s.size, w / s.size) for w, s in zip(_weights(samples, average), samples)])
    ordered = np.concatenate(samples)             # the differences, grouped as the weights are
    contributions = ordered * weights
    if clusters is not None:                      # one sign per cluster: its items' contributions summed
        contributions = np.concatenate([_sums_by_cluster(part, np.asarray(clusters, dtype=object)[mask])
                                        for part, mask in zip(np.split(contributions, np.cumsum(
                                            [s.size for s in samples])[:-1]), _group_masks(groups, keys, a.size))])
    p_value, exact = sign_flip_p_value(contributions, n_permutations, seed)
    stat_a = interval_estimate(a, groups, average)
    stat_b = interval_estimate(b, groups, average)
    iv_a, iv_b = interval(a, groups, **side), interval(b, groups, **side)
    return Comparison(stat_a, stat_b, diff.estimate, diff.low, diff.high, p_value, int(a.size), exact,
                      tuple(only_a), tuple(only_b), confidence, diff.method, n_resamples, n_permutations, seed,
                      len(keys), iv_a.low, iv_a.high, iv_b.low, iv_b.high, diff.clusters, diff.cluster_key)


def _group_masks(groups, keys: list[str], n: int) -> list[np.ndarray]:
    if groups is None:
        return [np.ones(n, dtype=bool)]
    groups = np.array([str(g) for g in groups], dtype=object)
    return [groups == key for key in keys]


def _sums_by_cluster(values: np.ndarray, clusters: np.ndarray) -> np.ndarray:
    """The sum of `values` per cluster, clusters in the order of their first item (one item each: `values`)."""
    index: dict[str, int] = {}
    sums: list[float] = []
    for value, cluster in zip(values, clusters):
        key = str(cluster)
        if key not in index:
            index[key] = len(sums)
            sums.append(0.0)
        sums[index[key]] += float(value)
    return np.array(sums, dtype=np.float64)


def sign_flip_p_value(contributions: np.ndarray, n_permutations: int = N_PERMUTATIONS,
                      seed: int = SEED) -> tuple[float, bool]:
    """Two-sided p-value of the statistic T = sum(contributions) under random sign flips of the contributions
    (each item's two values swap sides): the share of sign patterns with |T*| >= |T| (the null distribution is
    symmetric, so this is also twice the smaller one-sided p-value). Exact over all 2^n patterns when
    2^n <= n_permutations (the observed pattern is one of them); otherwise `n_permutations` patterns drawn by
    `default_rng(seed)` as `rng.integers(0, 2, (batch, n))` (1 = flip) and p = (k + 1) / (n_permutations + 1).
    Returns (p, exact)."""
    contributions = np.asarray(contributions, dtype=np.float64).reshape(-1)
    n = contributions.size
    observed = abs(float(contributions.sum()))
    threshold = observed - 1e-9 * max(observed, float(np.abs(contributions).sum()), 1e-300)
    if not np.any(contributions):
        return 1.0, True
    if n < 63 and 2 ** n <= n_permutations:
        flips = (np.arange(2 ** n)[:, None] >> np.arange(n)[None, :]) & 1
        null = (1 - 2 * flips) @ contributions
        return float(np.count_nonzero(np.abs(null) >= threshold) / 2 ** n), True
    rng = np.random.default_rng(seed)
    batch, count = _batch([contributions], n_permutations), 0
    for start in range(0, n_permutations, batch):
        flips = rng.integers(0, 2, (min(batch, n_permutations - start), n), dtype=np.int8)
        null = contributions.sum() - 2.0 * (flips @ contributions)
        count += int(np.count_nonzero(np.abs(null) >= threshold))
    return (count + 1) / (n_permutations + 1), False


def holm(p_values: Sequence[float]) -> list[float]:
    """Holm's step-down adjusted p-values, in the order given: with the m p-values sorted ascending,
    p_(1) <= ... <= p_(m), the adjusted p_(i) is max over j <= i of min(1, (m - j + 1) * p_(j)). A cell is
    significant at level alpha with the family-wise error rate kept at alpha across the m cells when its adjusted
    p-value is <= alpha (Holm 1979; valid under any dependence between the tests)."""
    p = np.asarray(p_values, dtype=np.float64).reshape(-1)
    if np.any((p < 0) | (p > 1)) or not np.all(np.isfinite(p)):
        raise ValueError("p-values must lie in [0, 1]")
    m = p.size
    order = np.argsort(p, kind="stable")
    stepped = np.minimum(1.0, np.maximum.accumulate((m - np.arange(m)) * p[order]))
    adjusted = np.empty(m)
    adjusted[order] = stepped
    return [float(v) for v in adjusted]


def interval_estimate(values: Sequence[float], groups: Sequence[str] | None = None, average: str = "micro") -> float:
    """The point value `interval` reports (micro: mean; macro: mean of the groups' means)."""
    _, samples = _strata(values, groups)
    return float(sum(w * s.mean() for w, s in zip(_weights(samples, average), samples)))


def compare_items(a: Mapping[str, float], b: Mapping[str, float], groups: Mapping[str, str] | None = None,
                  clusters: Mapping[str, str] | None = None, **options) -> Comparison:
    """Pair two {item id: value} mappings by id (in A's order) and test them (`paired_test`'s options); the ids on
    one side only are named in `only_a` / `only_b`. `groups` maps an id to its stratum (e.g. its language),
    `clusters` to its cluster (its image; None, or an id without one: items are resampled one by one)."""
    shared = [i for i in a if i in b]
    only_a = [i for i in a if i not in b]
    only_b = [i for i in b if i not in a]
    keys = [clusters.get(i) for i in shared] if clusters is not None else None
    return paired_test([a[i] for i in shared], [b[i] for i in shared],
                       [groups[i] for i in shared] if groups is not None else None,
                       only_a=only_a, only_b=only_b, clusters=None if keys is None or None in keys else keys,
                       **options)


@dataclass(frozen=True)
class Options:
    """How intervals and tests are computed and shown: one object for a report's settings (its flags)."""
    confidence: float = CONFIDENCE
    n_resamples: int = N_RESAMPLES
    n_permutations: int = N_PERMUTATIONS
    seed: int = SEED
    method: str = "percentile"
    style: str = "pm"                 # pm: `56.30 ± 1.20`; brackets: `56.30 [55.10, 57.50]`; none: the value only
    cluster: bool = True              # resample the clusters (images) the items name; False: items one by one

    def interval(self, values, groups=None, average="micro", clusters=None) -> Interval:
        return interval(values, groups, average=average, confidence=self.confidence, n_resamples=self.n_resamples,
                        seed=self.seed, method=self.method, clusters=clusters if self.cluster else None)

    def compare(self, a: dict, b: dict, groups=None, average="micro", clusters=None) -> Comparison:
        return compare_items(a, b, groups, clusters if self.cluster else None, average=average,
                             confidence=self.confidence, n_resamples=self.n_resamples,
                             n_permutations=self.n_permutations, seed=self.seed, method=self.method)


# --- truncated answers -------------------------------------------------------------------------------------------
TRUNCATED = "truncated_rate"     # the metric and per-item key: % of generated answers cut at max_new_tokens
TRUNCATION_WARN = 5.0            # above this rate (%) a run prints one warning line
UNKNOWN = "unknown"


def truncation(answers: Sequence) -> np.ndarray:
    """Per generated answer: 100.0 when it stopped at max_new_tokens (`answer.truncated` True), 0.0 when it ended at
    a stop token (False), NaN when the backend does not say (a plain `str`, `truncated` None: imported answers)."""
    flags = [getattr(answer, "truncated", None) for answer in answers]
    return np.array([np.nan if f is None else 100.0 * bool(f) for f in flags], dtype=np.float64)


@dataclass(frozen=True)
class Truncation:
    """The truncated answers of a generation rule's run: `rate` (% of its answers) and `items` (their ids), both
    None when any answer's truncation is unknown (recorded as "unknown", never as 0)."""
    rate: float | None
    items: tuple[str, ...] | None
    flags: tuple[float, ...] | None       # per item 100 / 0, in item order

    @classmethod
    def of(cls, ids: Sequence[str], flags: Sequence[float] | None) -> "Truncation":
        if flags is None or len(flags) != len(ids) or not len(ids) or np.isnan(np.asarray(flags, float)).any():
            return cls(None, None, None)
        flags = tuple(float(f) for f in flags)
        return cls(float(np.mean(flags)), tuple(i for i, f in zip(ids, flags) if f), flags)

    def record(self) -> dict:
        """The result file's fields: `truncated`: the ids of the truncated answers, or "unknown"."""
        return {"truncated": UNKNOWN if self.items is None else list(self.items)}

    def item(self, k: int) -> dict:
        """The per-item file's field of item `k` (`truncated_rate`: 100 or 0), none when unknown."""
        return {} if self.flags is None else {TRUNCATED: self.flags[k]}

    def warning(self, where: str) -> str | None:
        """One line when more than TRUNCATION_WARN % of the answers were cut at max_new_tokens."""
        if self.rate is None or self.rate <= TRUNCATION_WARN:
            return None
        shown = ", ".join(self.items[:3]) + (", ..." if len(self.items) > 3 else "")
        return (f"warning: {where}: {len(self.items)} of {len(self.flags)} answers ({self.rate:.1f}%) stopped at "
                f"max_new_tokens, not at an end token ({shown}); they are cut short (a larger max_new_tokens lets "
                f"them finish)")


# --- seeds -------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class SeedSpread:
    mean: float
    std: float | None           # sample standard deviation (ddof=1); None for one seed
    n: int
    values: tuple[float, ...] = field(default=())

    def text(self, digits: int = 2) -> str:
        spread = "–" if self.std is None else fixed(self.std, digits)
        return f"{fixed(self.mean, digits)} ± {spread} (n={self.n})"


def seed_spread(values: Sequence[float]) -> SeedSpread:
    values = [float(v) for v in values]
    if not values:
        raise ValueError("no seeds")
    std = float(np.std(values, ddof=1)) if len(values) > 1 else None
    return SeedSpread(float(np.mean(values)), std, len(values), tuple(values))


