"""The uncertainty of the report's cells: a bootstrap interval over the items that produced each number, the spread
over seeds, the generate rule's format-error rate, and paired comparisons of two rows (a `baseline`, or
`volta-ml compare`). `volta_ml/stats.py` computes; this module finds each cell's items and lays out the rows.

A cell (one table row, one language) holds the result records of its seeds. Its items are the per-item values of
the metric (`<split>_items.jsonl` named by each record's `items`), averaged over the seeds item by item, so the
interval's estimate is the mean over seeds of the cell's score; a cell whose seeds scored different items, or
any of whose records has no per-item file (old IGLUE logs), has no interval. An aggregate column's interval
(IGLUE's `avg` over the target languages; the suite's `mul` and `avg`) resamples each language's items within the
language and averages the languages' means. Item ids are prefixed with their language there (`ar/<id>`), so the
same question in two languages stays two items.

A table here is anything with `models`, `columns`, `sources` (row -> language -> records), `metric`,
`aggregate_columns()` ([(name, languages)]) and `aggregate_value(row, name)`: the report's IGLUE `Table` and the
suite's `SuiteTable`.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from volta_ml.engine.failures import UsageError

from volta_ml.stats import (
    TRUNCATED, UNKNOWN, Comparison, Interval, ItemsError, Options, SeedSpread, fixed, format_estimate, holm,
    item_clusters, metric_values, read_items, seed_spread,
)

FORMAT_ERRORS = "parse_failure_rate"   # the generate rule's unparsed answers (% of items), iglue-hf's metric
AVG = "avg"


class ItemFiles:
    """Reads each per-item file once. A record that names no per-item file (old IGLUE logs) has none; a named file
    that is damaged or empty stops the report (`UsageError`: the file, the line and the cause), so that a cell never
    shows a bare number as if it had never had per-item scores."""

    def __init__(self):
        self.cache: dict[str, dict] = {}

    def of(self, record: dict) -> dict | None:
        path = record.get("items")
        if not path:
            return None
        if path not in self.cache:
            try:
                self.cache[path] = read_items(path)
            except ItemsError as error:
                raise UsageError(str(error)) from None
        return self.cache[path]


def seed_items(records: list[dict], metric: str, files: ItemFiles) -> tuple[dict[str, float] | None, str]:
    """The cell's {item id: value averaged over its seeds}, or (None, why not)."""
    per_seed = []
    for record in records:
        items = files.of(record)
        if items is None:
            return None, "no per-item file"
        values = metric_values(items, metric)
        if not values:
            return None, f"{record['items']}: no {metric} items"
        per_seed.append(values)
    first = per_seed[0]
    if any(set(v) != set(first) for v in per_seed[1:]):
        return None, "the seeds scored different items"
    return {i: sum(v[i] for v in per_seed) / len(per_seed) for i in first}, ""


def seed_clusters(records: list[dict], files: ItemFiles) -> dict[str, str] | None:
    """The cell's {item id: cluster key} (the image each item asks about) from its per-item files, or None when a
    file names no cluster for some item (then its intervals resample items one by one, and record that)."""
    found = None
    for record in records:
        items = files.of(record)
        clusters = item_clusters(items) if items else None
        if clusters is None:
            return None
        found = {**clusters, **(found or {})}
    return found


def cluster_list(items: dict[str, float], clusters: dict[str, str] | None) -> list[str] | None:
    """The cluster of each of `items` in order, or None when one has none."""
    if clusters is None or any(i not in clusters for i in items):
        return None
    return [clusters[i] for i in items]


@dataclass
class CellStats:
    value: float | None
    interval: Interval | None = None
    seeds: SeedSpread | None = None
    format_errors: float | None = None           # mean over seeds of the rate (%)
    format_interval: Interval | None = None
    note: str = ""                               # why there is no interval
    items: int | None = None
    truncated: float | None = None               # generation: mean over seeds of the truncated rate (%)
    truncated_interval: Interval | None = None
    truncated_unknown: bool = False              # a seed's backend does not say (imported answers)


def metric_seeds(records: list[dict], metric: str) -> SeedSpread | None:
    values = [r["metrics"][metric] for r in records if r.get("metrics", {}).get(metric) is not None]
    return seed_spread(values) if values else None


def cell_stats(records: list[dict], metric: str, files: ItemFiles, options: Options) -> CellStats:
    seeds = metric_seeds(records, metric)
    stats = CellStats(seeds.mean if seeds else None, seeds=seeds)
    items, stats.note = seed_items(records, metric, files)
    if items:
        stats.interval = options.interval(list(items.values()),
                                          clusters=cluster_list(items, seed_clusters(records, files)))
        stats.items = len(items)
    stats.format_errors, stats.format_interval = rate_stats(records, FORMAT_ERRORS, files, options)
    stats.truncated_unknown = truncation_unknown(records)
    if not stats.truncated_unknown:
        stats.truncated, stats.truncated_interval = rate_stats(records, TRUNCATED, files, options)
    return stats


def rate_stats(records: list[dict], key: str, files: ItemFiles, options: Options) -> tuple[float | None,
                                                                                        Interval | None]:
    """A cell's rate (format errors, truncated answers: % of its items): the mean over seeds, and the interval over
    its items where the per-item files carry them."""
    seeds = metric_seeds(records, key)
    if seeds is None:
        return None, None
    items, _ = seed_items(records, key, files)
    if not items:
        return seeds.mean, None
    clusters = cluster_list(items, seed_clusters(records, files))
    return seeds.mean, options.interval(list(items.values()), clusters=clusters)


def truncation_unknown(records: list[dict]) -> bool:
    """A generation run whose backend does not say which answers were cut (`truncated_rate` recorded as null)."""
    return any(TRUNCATED in r.get("metrics", {}) and r["metrics"][TRUNCATED] is None for r in records)


def truncation_text(stats: "CellStats | None", digits: int) -> str | None:
    """A cell's truncated rate as the tables show it (`12.50 [3.10, 25.00]`), "unknown", or None (no generation)."""
    if stats is None:
        return None
    if stats.truncated_unknown:
        return UNKNOWN
    if stats.truncated is None:
        return None
    return rate_text(stats.truncated, stats.truncated_interval, digits)


def rate_text(rate: float, interval: Interval | None, digits: int) -> str:
    """A rate with its interval, as the format-error and truncation tables show it: `12.50 [3.10, 25.00]`."""
    return fixed(rate, digits) + (f" [{fixed(interval.low, digits)}, {fixed(interval.high, digits)}]"
                                  if interval else "")


def language_items(sources: dict[str, list[dict]], langs: list[str], metric: str,
                   files: ItemFiles) -> tuple[dict[str, float] | None, dict[str, str], str]:
    """Items of several languages as one stratified sample: ({"<lang>/<id>": value}, {key: lang}, why not)."""
    values, groups = {}, {}
    for lang in langs:
        items, why = seed_items(sources.get(lang, []), metric, files) if sources.get(lang) else (None, "missing")
        if items is None:
            return None, {}, f"{lang}: {why}"
        for item, value in items.items():
            values[f"{lang}/{item}"] = value
            groups[f"{lang}/{item}"] = lang
    return values, groups, ""


def language_clusters(sources: dict[str, list[dict]], langs: list[str], files: ItemFiles) -> dict[str, str] | None:
    """{"<lang>/<id>": "<lang>/<cluster>"} over several languages (an image is a cluster within its language), or
    None when a language's items name no cluster."""
    out = {}
    for lang in langs:
        clusters = seed_clusters(sources.get(lang, []), files) if sources.get(lang) else None
        if clusters is None:
            return None
        out.update({f"{lang}/{i}": f"{lang}/{c}" for i, c in clusters.items()})
    return out


def average_seeds(sources: dict[str, list[dict]], langs: list[str], metric: str) -> SeedSpread | None:
    """The spread over seeds of the average over `langs`, where every language was run with the same seeds."""
    per_lang = [{r.get("seed"): r["metrics"][metric] for r in sources.get(lang, [])} for lang in langs]
    seeds = set(per_lang[0]) if per_lang else set()
    if len(seeds) < 2 or any(set(s) != seeds or len(s) != len(sources[l]) for s, l in zip(per_lang, langs)):
        return None
    return seed_spread([sum(s[k] for s in per_lang) / len(per_lang) for k in sorted(seeds, key=str)])


def table_stats(table, metric: str, files: ItemFiles, options: Options) -> dict[tuple[str, str], CellStats]:
    """(row, column) -> CellStats for every cell of a table with record sources (languages and aggregates)."""
    out = {}
    for model in table.models:
        sources = table.sources.get(model, {})
        if not sources:
            continue
        for lang in table.columns:
            if sources.get(lang):
                out[(model, lang)] = cell_stats(sources[lang], metric, files, options)
        for name, langs in table.aggregate_columns():
            value = table.aggregate_value(model, name)
            if value is None:
                continue
            stats = CellStats(value, seeds=average_seeds(sources, langs, metric))
            values, groups, stats.note = language_items(sources, langs, metric, files)
            if values:
                stats.interval = options.interval(list(values.values()), list(groups.values()), average="macro",
                                                  clusters=cluster_list(values, language_clusters(sources, langs,
                                                                                                  files)))
                stats.items = len(values)
            out[(model, name)] = stats
    return out


def cell_text(value: float | None, stats: CellStats | None, digits: int, style: str) -> str:
    """A table cell: the mean of its items with their interval (`56.30 ± 1.20`), or the table's value alone, or "–".
    With items the estimate is theirs, not the table's value: a logged score is already rounded (eval_task's 3
    decimals: 2 of 17 items, 11.7647..., logged 11.765), and rounding it again would show another number (11.77)
    than the comparisons of the same cell, which are computed from the items (11.76)."""
    if value is None:
        return "–"
    if stats is None or stats.interval is None:
        return fixed(value, digits)
    return stats.interval.text(digits, style)


UNCERTAINTY_HEADER = ["model", "column", "value", "ci_low", "ci_high", "items", "seeds", "seed_mean", "seed_std",
                      "per_seed", "format_error_rate", "format_error_low", "format_error_high", "note", "method",
                      "confidence", "n_resamples", "bootstrap_seed", "truncated_rate", "truncated_low",
                      "truncated_high", "resampling"]


def _num(value) -> str:
    return "" if value is None else repr(float(value))


def uncertainty_rows(table, stats: dict[tuple[str, str], CellStats], options: Options) -> list[list[str]]:
    """The long-format rows of `uncertainty/<stem>.csv` (UNCERTAINTY_HEADER), one per cell with a value."""
    rows = []
    for model in table.models:
        for column in table.columns + [name for name, _ in table.aggregate_columns()]:
            s = stats.get((model, column))
            if s is None or s.value is None:
                continue
            iv, seeds, fe, tr = s.interval, s.seeds, s.format_interval, s.truncated_interval
            rows.append([model, column, _num(s.value), _num(iv and iv.low), _num(iv and iv.high),
                         "" if s.items is None else str(s.items), "" if seeds is None else str(seeds.n),
                         _num(seeds and seeds.mean), _num(seeds and seeds.std),
                         " ".join(repr(v) for v in seeds.values) if seeds else "",
                         _num(s.format_errors), _num(fe and fe.low), _num(fe and fe.high), s.note,
                         options.method, repr(options.confidence), str(options.n_resamples), str(options.seed),
                         UNKNOWN if s.truncated_unknown else _num(s.truncated), _num(tr and tr.low),
                         _num(tr and tr.high), iv.resampling if iv else ""])
    return rows


# --- comparisons of two rows ---------------------------------------------------------------------------------------
COMPARE_HEADER = ["table", "column", "A", "B", "A_value", "B_value", "difference", "ci_low", "ci_high", "p_value",
                  "p_holm", "exact", "paired_items", "only_in_A", "only_in_B", "note", "A_ci_low", "A_ci_high",
                  "B_ci_low", "B_ci_high", "A_truncated_rate", "B_truncated_rate", "resampling"]
TRUNCATED_SIDES = ("A_truncated_rate", "B_truncated_rate")


@dataclass
class CellComparison:
    table: str
    column: str
    a: str
    b: str
    result: Comparison | None = None
    note: str = ""
    extra: dict = field(default_factory=dict)
    p_holm: float | None = None      # Holm-adjusted across the cells of its table with p-values (holm_adjust)

    def csv_row(self) -> list[str]:
        r = self.result
        cut = [self.extra.get(side, "") for side in TRUNCATED_SIDES]
        if r is None:
            return [self.table, self.column, self.a, self.b] + [""] * 11 + [self.note] + [""] * 4 + cut + [""]
        return [self.table, self.column, self.a, self.b, repr(r.a), repr(r.b), repr(r.difference), repr(r.low),
                repr(r.high), repr(r.p_value), _num(self.p_holm), str(r.exact).lower(), str(r.n), " ".join(r.only_a),
                " ".join(r.only_b), self.note] + [_num(v) for v in (r.a_low, r.a_high, r.b_low, r.b_high)] + cut + \
            [r.resampling]

    def truncation_note(self, digits: int) -> str:
        """`truncated: A 12.50%, B unknown` where a side's answers were generated, else ""."""
        cut = {side[0]: self.extra.get(side, "") for side in TRUNCATED_SIDES}
        if not any(cut.values()):
            return ""
        shown = lambda v: "–" if not v else v if v == UNKNOWN else f"{fixed(float(v), digits)}%"  # noqa: E731
        return f"truncated: A {shown(cut['A'])}, B {shown(cut['B'])}"

    def markdown_row(self, digits: int, style: str = "pm") -> list[str]:
        """A and B with their own intervals over the paired items (`style`), the difference with its paired one."""
        r = self.result
        note = "; ".join(x for x in (self.note, self.truncation_note(digits)) if x)
        if r is None:
            return [self.table, self.column, self.a, self.b, "–", "–", "–", "–", "–", "–", note]
        return [self.table, self.column, self.a, self.b, r.side_text("A", digits, style),
                r.side_text("B", digits, style),
                format_estimate(r.difference, r.low, r.high, digits, "brackets", signed=True), f"{r.p_value:.4f}",
                "–" if self.p_holm is None else f"{self.p_holm:.4f}", str(r.n),
                "; ".join(x for x in (r.missing_text(), note) if x)]


def compare_md_header(options: Options) -> list[str]:
    return ["table", "column", "A", "B", "A value", "B value", f"A − B [{options.confidence:.0%} CI]", "p",
            HOLM_COLUMN, "paired items", "missing items / note"]


HOLM_COLUMN = "p (Holm)"


def holm_adjust(cells: list[CellComparison]) -> list[CellComparison]:
    """Set each cell's `p_holm`: Holm's adjustment (stats.holm) across the cells of one table for one pair of rows
    that have a p-value (its languages and aggregates: a 20-language table at alpha 0.05 shows about one
    "significant" raw p by chance, not by Holm's). Returns `cells`."""
    tested = [c for c in cells if c.result is not None]
    for cell, adjusted in zip(tested, holm([c.result.p_value for c in tested])):
        cell.p_holm = adjusted
    return cells


NO_SCORE = "no score"


def row_items(table, row: str, metric: str, files: ItemFiles) -> dict[str, tuple[dict[str, float] | None, str]]:
    """Language column -> (the cell's items averaged over its seeds, why none) for one row of a table."""
    sources = table.sources.get(row, {})
    return {c: seed_items(sources[c], metric, files) if sources.get(c) else (None, NO_SCORE) for c in table.columns}


def compare_rows(stem: str, table_a, row_a: str, table_b, row_b: str, metric: str, files: ItemFiles,
                 options: Options) -> list[CellComparison]:
    """Row `row_a` of `table_a` minus row `row_b` of `table_b` (compare_items), with each side's truncated rate."""
    sources_a = table_a.sources.get(row_a, {})
    clusters = {c: seed_clusters(sources_a[c], files) if sources_a.get(c) else None for c in table_a.columns}
    cells = compare_items(stem, row_a, row_b, row_items(table_a, row_a, metric, files),
                          row_items(table_b, row_b, metric, files), table_a.aggregate_columns(),
                          table_b.aggregate_columns(), options, clusters)
    aggregates = dict(table_a.aggregate_columns())
    for cell in cells:
        for side, table, row in zip(TRUNCATED_SIDES, (table_a, table_b), (row_a, row_b)):
            sources = table.sources.get(row, {})
            langs = aggregates.get(cell.column, [cell.column])
            cell.extra[side] = truncated_rate_text([sources.get(lang, []) for lang in langs])
    return cells


def truncated_rate_text(cells: list[list[dict]]) -> str:
    """The truncated rate of one cell (or the mean over an aggregate's languages) from its records, as the CSV
    writes it: repr of the %, "unknown", or "" (not a generation rule, or a language missing)."""
    rates = []
    for records in cells:
        if truncation_unknown(records):
            return UNKNOWN
        seeds = metric_seeds(records, TRUNCATED) if records else None
        if seeds is None:
            return ""
        rates.append(seeds.mean)
    return repr(sum(rates) / len(rates)) if rates else ""


def compare_items(stem: str, row_a: str, row_b: str, items_a: dict, items_b: dict, aggregates_a: list,
                  aggregates_b: list, options: Options, clusters: dict | None = None) -> list[CellComparison]:
    """A minus B per language column both sides have (`items_*`: column -> (items, why none), as row_items gives
    them) and per aggregate (`avg`, `mul`: (name, languages)) over its languages both have: the paired difference
    on the items both scored (those on one side only are named), its paired bootstrap interval (an aggregate's
    resampled within each language; `clusters`: column -> A's {item id: cluster}, the images resampled and
    sign-flipped as wholes where every paired item names one) and the permutation p-value."""
    clusters = clusters or {}
    out = []
    for column in [c for c in items_a if c in items_b]:
        cell = CellComparison(stem, column, row_a, row_b)
        (a, why_a), (b, why_b) = items_a[column], items_b[column]
        if a is None or b is None:
            side, why = ("A", why_a) if a is None else ("B", why_b)
            cell.note = f"no score for {side}" if why == NO_SCORE else f"{side}: {why}"
        elif not set(a) & set(b):
            cell.note = f"no item in common ({len(a)} in A, {len(b)} in B)"
        else:
            cell.result = options.compare(a, b, clusters=clusters.get(column))
        out.append(cell)
    for name, langs in aggregates_a:
        targets = [t for t in langs if t in dict(aggregates_b).get(name, ())]
        if not targets:
            continue
        cell = CellComparison(stem, name, row_a, row_b)
        sides = []
        for side, items in (("A", items_a), ("B", items_b)):
            missing = next((lang for lang in targets if items.get(lang, (None,))[0] is None), None)
            if missing is not None:
                why = items.get(missing, (None, "missing"))[1]
                cell.note = cell.note or f"{side}: {missing}: {'missing' if why == NO_SCORE else why}"
            else:
                sides.append({f"{lang}/{i}": v for lang in targets for i, v in items[lang][0].items()})
        if len(sides) == 2:
            a, b = sides
            if not set(a) & set(b):
                cell.note = "no item in common"
            else:
                per_lang = [clusters.get(lang) for lang in targets]
                keyed = None if None in per_lang else {f"{lang}/{i}": f"{lang}/{c}" for lang, found in
                                                       zip(targets, per_lang) for i, c in found.items()}
                cell.result = options.compare(a, b, {key: key.split("/", 1)[0] for key in a}, average="macro",
                                              clusters=keyed)
        out.append(cell)
    return holm_adjust(out)


def row_pairs(stem: str, rows_a: list[str], rows_b: list[str], row_a: str | None,
              row_b: str | None) -> list[tuple[str, str]]:
    """Which rows of table `stem` two runs compare: the chosen ones (`--row_a` / `--row_b`), else the rows of the
    same name, else the only row of each side; a choice is needed (UsageError) where that leaves several."""
    if row_a or row_b:
        a = row_a if row_a else (rows_a[0] if len(rows_a) == 1 else None)
        b = row_b if row_b else (rows_b[0] if len(rows_b) == 1 else None)
        return [(a, b)] if a in rows_a and b in rows_b else []
    shared = [r for r in rows_a if r in rows_b]
    if shared:
        return [(r, r) for r in shared]
    if len(rows_a) == 1 and len(rows_b) == 1:
        return [(rows_a[0], rows_b[0])]
    raise UsageError(f"{stem}: A has rows {', '.join(rows_a)} and B has rows {', '.join(rows_b)}; choose with "
                     f"--row_a / --row_b")
