"""volta_ml/stats.py: the intervals are the plain bootstrap written out here with the same draws, the paired test's
p-value is the brute-force enumeration, intervals shrink with more items, and the per-item file round-trips."""
from __future__ import annotations

import itertools

import numpy as np
import pytest

from volta_ml import stats

from helpers_stats import plain_holm

SAMPLE = np.array([100, 0, 100, 100, 0, 100, 0, 100, 100, 100, 0, 100], dtype=float)


def plain_bootstrap(groups: list[np.ndarray], statistic, n_resamples: int, seed: int, confidence=0.95):
    """The obvious percentile bootstrap: per group (in sorted-key order) `n_resamples` rows of indices drawn with
    replacement, the statistic of each resample, the two percentiles."""
    rng = np.random.default_rng(seed)
    draws = [g[rng.integers(0, len(g), (n_resamples, len(g)))] for g in groups]
    values = [statistic([d[k] for d in draws]) for k in range(n_resamples)]
    alpha = (1 - confidence) / 2
    return np.percentile(values, [100 * alpha, 100 * (1 - alpha)])


@pytest.mark.parametrize("seed,n_resamples,confidence", [(0, 999, 0.95), (7, 500, 0.9)])
def test_interval_is_the_plain_numpy_bootstrap(seed, n_resamples, confidence):
    iv = stats.interval(SAMPLE, n_resamples=n_resamples, seed=seed, confidence=confidence)
    low, high = plain_bootstrap([SAMPLE], lambda s: s[0].mean(), n_resamples, seed, confidence)
    assert (iv.low, iv.high) == (pytest.approx(low, abs=1e-9), pytest.approx(high, abs=1e-9))
    assert iv.estimate == SAMPLE.mean() and iv.n == len(SAMPLE) and iv.method == "percentile"
    assert stats.interval(SAMPLE, n_resamples=n_resamples, seed=seed, confidence=confidence) == iv   # reproducible


def test_stratified_interval_resamples_within_each_language():
    groups = ["fr"] * 5 + ["ar"] * 7            # drawn in sorted key order: ar, then fr
    ar, fr = SAMPLE[5:], SAMPLE[:5]
    macro = stats.interval(SAMPLE, groups, average="macro", n_resamples=400, seed=3)
    low, high = plain_bootstrap([ar, fr], lambda s: (s[0].mean() + s[1].mean()) / 2, 400, 3)
    assert (macro.low, macro.high) == (pytest.approx(low), pytest.approx(high))
    assert macro.estimate == pytest.approx((ar.mean() + fr.mean()) / 2) and macro.groups == 2
    micro = stats.interval(SAMPLE, groups, n_resamples=400, seed=3)
    low, high = plain_bootstrap([ar, fr], lambda s: (s[0].sum() + s[1].sum()) / 12, 400, 3)
    assert (micro.low, micro.high) == (pytest.approx(low), pytest.approx(high))
    # a language with one item is the same in every resample; all-equal items have a point interval
    one = stats.interval([100.0, 0.0, 100.0, 50.0], ["a", "a", "a", "b"], average="macro", n_resamples=300, seed=1)
    low, high = plain_bootstrap([np.array([100.0, 0.0, 100.0])], lambda s: (s[0].mean() + 50.0) / 2, 300, 1)
    assert (one.low, one.high) == (pytest.approx(low), pytest.approx(high))
    assert stats.interval([1.0, 1.0, 1.0]).low == stats.interval([1.0, 1.0, 1.0]).high == 1.0


def brute_force_p(a, b, weights) -> float:
    """Every assignment of each item's two values to the two sides, one at a time."""
    observed = abs(sum(w * (x - y) for w, x, y in zip(weights, a, b)))
    extreme = total = 0
    for swap in itertools.product((False, True), repeat=len(a)):
        t = sum(w * ((y - x) if s else (x - y)) for w, x, y, s in zip(weights, a, b, swap))
        extreme += abs(t) >= observed - 1e-9
        total += 1
    return extreme / total


def test_paired_p_value_is_the_brute_force_enumeration():
    a = [100, 100, 0, 100, 100, 0, 100, 100, 0, 100]
    b = [0, 100, 0, 0, 100, 100, 0, 0, 0, 100]
    result = stats.paired_test(a, b)
    assert result.exact and result.p_value == pytest.approx(brute_force_p(a, b, [0.1] * 10))
    assert result.difference == pytest.approx(30.0) and (result.a, result.b) == (70.0, 40.0)
    groups = ["x"] * 4 + ["y"] * 6                     # macro: each language weighs the same
    weights = [1 / 8] * 4 + [1 / 12] * 6
    macro = stats.paired_test(a, b, groups, average="macro")
    assert macro.p_value == pytest.approx(brute_force_p(a, b, weights))
    assert macro.difference == pytest.approx(np.mean([75 - 25, 50 - 33.333333333333336]))
    values = [3.5, -1.0, 2.0, 0.5, 4.0, -2.5, 1.5]      # any per-item metric, not only accuracy
    assert stats.paired_test(values, [0.0] * 7).p_value == pytest.approx(brute_force_p(values, [0.0] * 7, [1 / 7] * 7))


def test_approximate_randomisation_with_the_documented_draws():
    rng = np.random.default_rng(5)
    a, b = (rng.random(40) < 0.7) * 100.0, (rng.random(40) < 0.5) * 100.0
    result = stats.paired_test(a, b, n_permutations=999, seed=11)
    contributions = (a - b) / 40
    flips = np.random.default_rng(11).integers(0, 2, (999, 40), dtype=np.int8)
    null = contributions.sum() - 2 * (flips @ contributions)
    k = np.count_nonzero(np.abs(null) >= abs(contributions.sum()) - 1e-9)
    assert not result.exact and result.p_value == (k + 1) / 1000
    # the interval of the difference is the bootstrap of the per-item differences
    iv = stats.interval(a - b, seed=0)
    assert (result.low, result.high) == (iv.low, iv.high)


def test_intervals_shrink_as_items_grow():
    widths = [stats.interval(np.tile([100.0, 100.0, 100.0, 0.0, 0.0], n)).half_width for n in (10, 100, 1000)]
    assert widths[0] > widths[1] > widths[2] > 0
    assert widths[0] / widths[2] == pytest.approx(10, rel=0.25)      # ~ 1 / sqrt(n)


def test_compare_items_names_the_items_of_one_side():
    a = {"q1": 100.0, "q2": 0.0, "q3": 100.0, "q4": 100.0}
    b = {"q2": 0.0, "q3": 0.0, "q4": 100.0, "q9": 100.0}
    result = stats.compare_items(a, b)
    assert result.n == 3 and result.only_a == ("q1",) and result.only_b == ("q9",)
    assert result.difference == pytest.approx(100 / 3)
    assert result.missing_text() == "1 only in A (q1); 1 only in B (q9)"
    with pytest.raises(ValueError, match="no paired items"):
        stats.compare_items({"a": 1.0}, {"b": 1.0})


def test_item_file_round_trip_and_errors(tmp_path):
    path = stats.write_items(tmp_path / "test_items.jsonl", [{"id": 7, "score": 100, "group": "ar"},
                                                             {"id": "x", "ir_r1": 0.0}])
    assert stats.read_items(path) == {"7": {"group": "ar", "score": 100.0}, "x": {"ir_r1": 0.0}}
    assert stats.metric_values(stats.read_items(path), "score") == {"7": 100.0}
    assert stats.items_path(tmp_path / "test_de_result.json") == tmp_path / "test_de_items.jsonl"
    assert stats.unique_ids(["a", "b", "a", "a"]) == ["a", "b", "a#2", "a#3"]
    with pytest.raises(ValueError, match="appears twice"):
        stats.write_items(tmp_path / "dup.jsonl", [{"id": 1, "score": 0}, {"id": 1, "score": 100}])
    bad = tmp_path / "bad_items.jsonl"
    bad.write_text('{"id": "a", "score": 1}\n{"score": 2}\n')
    with pytest.raises(stats.ItemsError, match=r"bad_items.jsonl line 2: not an item record"):
        stats.read_items(bad)


def test_seed_spread_and_formatting():
    spread = stats.seed_spread([50.0, 52.0, 54.0])
    assert (spread.mean, spread.std, spread.n) == (52.0, 2.0, 3) and spread.text(1) == "52.0 ± 2.0 (n=3)"
    assert stats.seed_spread([50.0]).std is None
    assert stats.format_estimate(56.3, 55.1, 57.5, 1) == "56.3 ± 1.2"
    assert stats.format_estimate(56.3, 55.1, 57.5, 1, "brackets") == "56.3 [55.1, 57.5]"


def test_no_negative_zero_and_one_latex_form():
    """(#42.6) a bound that rounds to zero printed `-0.00`; IGLUE's LaTeX wrote a bare `±`, CVQA's `$\\pm$`."""
    assert stats.fixed(-0.001) == "0.00" and stats.fixed(-0.001, signed=True) == "+0.00"
    assert stats.fixed(-0.005001) == "-0.01" and stats.fixed(0.0, signed=True) == "+0.00"
    assert stats.format_estimate(-0.001, -0.004, 0.8, style="brackets") == "0.00 [0.00, 0.80]"
    assert stats.format_estimate(-0.001, -0.004, 0.8, style="brackets", signed=True) == "+0.00 [+0.00, +0.80]"
    assert stats.format_estimate(-0.001, -0.002, 0.002) == "0.00 ± 0.00"
    assert stats.latex_text("56.30 ± 1.20") == r"56.30 $\pm$ 1.20"
    assert stats.latex_text("A − B [95% CI] – x_y & #1") == r"A $-$ B [95\% CI] -- x\_y \& \#1"


def test_holm_equals_the_plain_step_down():
    rng = np.random.default_rng(3)
    for p in ([0.01, 0.04, 0.03, 0.005], [0.5], [0.2, 0.2, 0.01], list(rng.random(20) ** 3), [0.0, 1.0, 0.3]):
        assert stats.holm(p) == pytest.approx(plain_holm(p), abs=1e-15)
    assert stats.holm([0.01, 0.04, 0.03, 0.005]) == pytest.approx([0.03, 0.06, 0.06, 0.02])
    assert stats.holm([]) == []
    with pytest.raises(ValueError, match="p-values must lie in"):
        stats.holm([1.5])


def plain_cluster_bootstrap(values, groups, clusters, n_resamples: int, seed: int, average="micro",
                            confidence=0.95):
    """The cluster bootstrap written out, one resample at a time: per group (sorted keys) its clusters (in the order
    of their first item); each resample draws, group by group, as many clusters with replacement
    (`rng.integers(0, n_clusters, n_clusters)` rows, all of a group's rows first) and takes every item of every
    drawn cluster; the group's mean is over those items; micro weighs the groups by their items, macro equally."""
    rng = np.random.default_rng(seed)
    keys = sorted(set(groups))
    per_group = []
    for key in keys:
        found: dict[str, list[float]] = {}
        for v, g, c in zip(values, groups, clusters):
            if g == key:
                found.setdefault(c, []).append(v)
        per_group.append(list(found.values()))
    n = len(values)
    weights = [sum(map(len, cl)) / n if average == "micro" else 1 / len(keys) for cl in per_group]
    varying = [k for k, cl in enumerate(per_group) if len(cl) >= 2]
    draws = {k: rng.integers(0, len(per_group[k]), (n_resamples, len(per_group[k]))) for k in varying}
    estimates = []
    for r in range(n_resamples):
        total = 0.0
        for k, cl in enumerate(per_group):
            chosen = [cl[j] for j in draws[k][r]] if k in varying else cl
            items = [v for c in chosen for v in c]
            total += weights[k] * sum(items) / len(items)
        estimates.append(total)
    alpha = (1 - confidence) / 2
    return np.percentile(estimates, [100 * alpha, 100 * (1 - alpha)])


CLUSTERED = np.array([100, 100, 0, 100, 0, 0, 100, 100, 100, 0, 100, 0, 0, 100, 100, 100, 0, 0], dtype=float)
LANG = ["ar"] * 10 + ["fr"] * 8
IMAGE = ["i1", "i1", "i2", "i3", "i2", "i4", "i4", "i4", "i5", "i5",      # several questions per image
         "i1", "j1", "j1", "j2", "j3", "j3", "j3", "j4"]                 # i1 in fr is another cluster than in ar


@pytest.mark.parametrize("average", ["micro", "macro"])
def test_cluster_bootstrap_is_the_plain_numpy_one(average):
    """(#44) images resampled within each language: equal to the resampling of clusters written out above."""
    iv = stats.interval(CLUSTERED, LANG, average=average, clusters=IMAGE, n_resamples=700, seed=5)
    low, high = plain_cluster_bootstrap(CLUSTERED, LANG, IMAGE, 700, 5, average)
    assert (iv.low, iv.high) == (pytest.approx(low, abs=1e-9), pytest.approx(high, abs=1e-9))
    assert iv.estimate == pytest.approx(stats.interval(CLUSTERED, LANG, average=average).estimate, abs=1e-12)
    assert (iv.clusters, iv.cluster_key, iv.resampling) == (10, "image", "image clusters (10)")
    plain = stats.interval(CLUSTERED, LANG, average=average, n_resamples=700, seed=5)
    assert plain.resampling == "items" and plain.clusters is None


@pytest.mark.parametrize("method", ["percentile", "BCa"])
def test_one_question_per_image_equals_the_item_bootstrap(method):
    """(#44) with one item per cluster the cluster bootstrap is today's item bootstrap, draw for draw; so is the
    paired test (interval and p-value)."""
    singletons = [f"q{i}" for i in range(len(CLUSTERED))]
    for average in ("micro", "macro"):
        a = stats.interval(CLUSTERED, LANG, average=average, method=method, n_resamples=500, seed=2)
        b = stats.interval(CLUSTERED, LANG, average=average, method=method, n_resamples=500, seed=2,
                           clusters=singletons)
        assert (b.low, b.high, b.estimate) == (pytest.approx(a.low, abs=1e-12), pytest.approx(a.high, abs=1e-12),
                                               a.estimate)
    other = CLUSTERED[::-1].copy()
    plain = stats.paired_test(CLUSTERED, other, LANG, n_resamples=400, n_permutations=999, seed=1, method=method)
    clustered = stats.paired_test(CLUSTERED, other, LANG, n_resamples=400, n_permutations=999, seed=1,
                                  method=method, clusters=singletons)
    assert (clustered.low, clustered.high, clustered.p_value) == \
        (pytest.approx(plain.low, abs=1e-12), pytest.approx(plain.high, abs=1e-12), plain.p_value)
    assert plain.resampling == "items" and clustered.resampling == f"image clusters ({len(CLUSTERED)})"


def test_paired_cluster_test_flips_each_image_as_a_whole():
    """The paired permutation test with clusters: each image's summed difference flips sign as one (brute force
    over the 2^10 cluster sign patterns, written out); its interval is the cluster bootstrap of the differences."""
    other = np.array([0, 100, 0, 0, 0, 0, 100, 0, 100, 0, 0, 0, 0, 100, 0, 100, 0, 0], dtype=float)
    result = stats.paired_test(CLUSTERED, other, LANG, clusters=IMAGE, n_resamples=300, seed=4)
    diff = CLUSTERED - other
    weight = {"ar": 1 / len(CLUSTERED), "fr": 1 / len(CLUSTERED)}
    sums: dict[tuple, float] = {}
    for d, g, c in zip(diff, LANG, IMAGE):
        sums[(g, c)] = sums.get((g, c), 0.0) + weight[g] * d
    parts = list(sums.values())
    observed = abs(sum(parts))
    extreme = sum(abs(sum(s * p for s, p in zip(signs, parts))) >= observed - 1e-9
                  for signs in itertools.product((1, -1), repeat=len(parts)))
    assert result.exact and result.p_value == pytest.approx(extreme / 2 ** len(parts), abs=1e-12)
    low, high = plain_cluster_bootstrap(list(diff), LANG, IMAGE, 300, 4)
    assert (result.low, result.high) == (pytest.approx(low, abs=1e-9), pytest.approx(high, abs=1e-9))
    assert result.resampling == "image clusters (10)"
