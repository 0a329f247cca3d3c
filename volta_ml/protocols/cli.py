"""`volta-ml sweep GRID --local|--slurm` and `volta-ml report RESULTS_DIR`."""
from __future__ import annotations

import json
import sys
from pathlib import Path

from volta_ml.engine.failures import UsageError
from volta_ml.options import SEED, OneLineParser, float_in, int_at_least


def register(subparsers) -> None:
    p = subparsers.add_parser("sweep", help="run an IGLUE protocol grid here or as Slurm job arrays",
                              description="Expand a grid file (YAML) into cells of train/eval commands and run "
                                          "them here (--local, finished cells are skipped) or write sbatch job "
                                          "arrays (--slurm). See docs/protocols.md.")
    p.add_argument("grid", help="grid YAML file")
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--local", action="store_true", help="run the unfinished cells on this machine")
    mode.add_argument("--slurm", action="store_true", help="write sbatch job arrays and print the submit command")
    mode.add_argument("--list", action="store_true", help="list the cells and whether each is finished")
    p.add_argument("--only", action="append", default=[], metavar="PREFIX",
                   help="restrict to cells whose id starts with PREFIX (repeatable), e.g. zero_shot/uc2")
    p.add_argument("--max_cells", type=int_at_least(1), default=None, help="--local: stop after running this many cells")
    p.add_argument("--slurm_dir", default=None, help="where to write the scripts (default: <output_dir>/slurm)")
    p.set_defaults(func=cmd_sweep)

    q = subparsers.add_parser("run", help="run IGLUE protocols for one model without writing a grid file",
                              description="Shorthand for a one-model grid: writes <output_dir>/grid.yml from the "
                                          "flags and sweeps it (same cells, skipping and Slurm support).")
    q.add_argument("protocols", nargs="+", choices=["zero_shot", "translate_test", "few_shot", "translate_train"])
    q.add_argument("--task", action="append", required=True, help="xvnli, xgqa, marvl, xflickrco, wit (repeatable)")
    q.add_argument("--model", required=True, help="model name (rows of the tables), e.g. ctrl_xuniter")
    q.add_argument("--config", required=True, help="model config JSON or shipped name")
    q.add_argument("--bert_model", default=None)
    q.add_argument("--do_lower_case", action="store_true")
    q.add_argument("--is_m3p", action="store_true", default=None)
    q.add_argument("--features", default=None, help="boxes36 (default) or X101")
    start = q.add_mutually_exclusive_group(required=True)
    start.add_argument("--finetuned", help="English fine-tuned checkpoint (template with {task} for several tasks)")
    start.add_argument("--pretrained", help="pretrained checkpoint: fine-tune on English first")
    q.add_argument("--data_root", required=True)
    q.add_argument("--output_dir", required=True)
    q.add_argument("--languages", nargs="+", default=None, help="target languages (zero-shot and few-shot)")
    q.add_argument("--shots", nargs="+", default=None)
    q.add_argument("--learning_rates", nargs="+", default=None)
    q.add_argument("--seeds", nargs="+", type=SEED, default=None)
    q.add_argument("--no_english", action="store_true", help="skip the English test")
    how = q.add_mutually_exclusive_group()
    how.add_argument("--local", action="store_true", help="run here (default)")
    how.add_argument("--slurm", action="store_true", help="write sbatch job arrays")
    q.set_defaults(func=cmd_run)

    r = subparsers.add_parser("report", help="IGLUE tables (CSV/Markdown/LaTeX) and plots from results and logs",
                              description="Tabulate sweep results (result.json) and IGLUE/VOLTA experiment logs "
                                          "(<model>/<task>/test.<lang>[_mt].err|out, "
                                          "<model>/<task>/<lang>/<shot>/test.err|out) under RESULTS_DIR.")
    r.add_argument("results_dir", nargs="?", default=None,
                   help="folder of sweep results / IGLUE logs (default with --grid: the grid's output_dir)")
    r.add_argument("--grid", default=None, help="a grid file: its output_dir is the results folder and its "
                   "`baseline:` row the baseline")
    r.add_argument("--out", default=None, help="output folder (default: RESULTS_DIR/report)")
    r.add_argument("--digits", type=int_at_least(0), default=2, help="decimals in Markdown/LaTeX tables")
    r.add_argument("--no_plots", action="store_true")
    r.add_argument("--baseline", default=None, metavar="ROW",
                   help="compare every other row with this one (baseline.csv/md/tex); overrides the grid's")
    add_stat_flags(r)
    r.set_defaults(func=cmd_report)


def add_stat_flags(parser) -> None:
    """The uncertainty flags of `report` and `compare` (volta_ml/stats.py)."""
    from volta_ml import stats

    g = parser.add_argument_group("uncertainty (bootstrap intervals, paired permutation tests)")
    g.add_argument("--intervals", choices=("pm", "brackets", "none"), default="pm",
                   help="Markdown/LaTeX cells: pm = `56.30 ± 1.20` (half the interval), brackets = "
                   "`56.30 [55.10, 57.50]`, none = the value only")
    g.add_argument("--confidence", type=float_in(), default=stats.CONFIDENCE, help="interval level (default 0.95)")
    g.add_argument("--resamples", type=int_at_least(1), default=stats.N_RESAMPLES, help="bootstrap resamples (default %(default)s)")
    g.add_argument("--permutations", type=int_at_least(1), default=stats.N_PERMUTATIONS,
                   help="sign patterns of the paired permutation test (default %(default)s; exact below 2^n)")
    g.add_argument("--bootstrap_seed", type=SEED, default=stats.SEED, help="seed of the resampling (default 0)")
    g.add_argument("--method", choices=("percentile", "BCa"), default="percentile",
                   help="scipy.stats.bootstrap's interval method (default percentile)")
    g.add_argument("--resample", choices=("images", "items"), default="images",
                   help="images (default): resample the images the items name, within each language (the cluster "
                   "bootstrap; items without one are resampled one by one); items: every item on its own")


def stat_options(args):
    from volta_ml.stats import Options

    if not 0 < args.confidence < 1:
        raise UsageError(f"--confidence {args.confidence}: expected a level between 0 and 1, e.g. 0.95")
    for flag in ("resamples", "permutations"):
        if getattr(args, flag) < 1:
            raise UsageError(f"--{flag} {getattr(args, flag)}: expected a positive number")
    return Options(confidence=args.confidence, n_resamples=args.resamples, n_permutations=args.permutations,
                   seed=args.bootstrap_seed, method=args.method, style=args.intervals,
                   cluster=args.resample == "images")


def _plan(args, write: bool):
    from .cell import CELL_FILE, write_json_atomic
    from .errors import GridError
    from .grid import load_grid
    from .runners import plan_cells

    try:  # a grid the planner cannot turn into cells is a usage error too (exit 2, one line)
        grid = load_grid(args.grid)
        cells = plan_cells(grid)
    except GridError as error:
        raise UsageError(str(error)) from None
    if args.only:
        wanted = {c.id for c in cells if any(c.id.startswith(p) for p in args.only)}
        # keep what the chosen cells need, so their dependencies are not reported as blocked forever
        by_id = {c.id: c for c in cells}
        stack = list(wanted)
        while stack:
            for dep in by_id[stack.pop()].depends_on:
                if dep in by_id and dep not in wanted:
                    wanted.add(dep)
                    stack.append(dep)
        cells = [c for c in cells if c.id in wanted]
    for cell in cells if write else []:
        write_json_atomic(Path(cell.dir) / CELL_FILE, cell.to_json())
    return grid, cells


def cmd_sweep(args) -> int:
    from .cell import is_done

    grid, cells = _plan(args, write=args.local or args.slurm)
    if not cells:
        print("the grid has no cells (check tasks, protocols and languages)", file=sys.stderr)
        return 1
    if args.list or not (args.local or args.slurm):
        for cell in cells:
            print(f"{'done ' if is_done(cell.path) else 'todo '} {cell.id}")
        done = sum(is_done(c.path) for c in cells)
        print(f"{done}/{len(cells)} cells finished; output under {grid.output_dir}")
        return 0
    if args.slurm:
        from .errors import GridError
        from .slurm import write_slurm
        out = Path(args.slurm_dir).resolve() if args.slurm_dir else grid.output_dir / "slurm"
        try:  # the grid's slurm block is checked here
            submit = write_slurm(grid.name, cells, out, grid.slurm, grid.env, grid.step())
        except GridError as error:
            raise UsageError(f"{grid.path}: {error}") from None
        print(f"wrote {len(list(out.glob('*.sbatch')))} job arrays ({len(cells)} cells) to {out}")
        print(f"submit with:\n  bash {submit}")
        return 0

    from .local import Interrupted, LocalRunner
    runner = LocalRunner(env=grid.env)
    try:
        summary = runner.run(cells, max_cells=args.max_cells)
    except Interrupted as stop:
        print(f"\nsweep interrupted (signal {stop.signum}); run the same command again to resume", file=sys.stderr)
        return 128 + stop.signum
    print(f"sweep {grid.name}: {len(summary['done'])} ran, {len(summary['skipped'])} already finished, "
          f"{len(summary['failed'])} failed, {len(summary['blocked'])} blocked by unfinished dependencies")
    for key in ("failed", "blocked"):
        for cell_id in summary[key]:
            print(f"  {key}: {cell_id}")
    return 1 if summary["failed"] or summary["blocked"] else 0


def cmd_run(args) -> int:
    import argparse

    import yaml

    out = Path(args.output_dir).resolve()
    model = {"config": str(Path(args.config).resolve()) if args.config.endswith(".json") else args.config}
    for key in ("bert_model", "features", "finetuned", "pretrained"):
        if getattr(args, key):
            model[key] = getattr(args, key)
    if args.do_lower_case:
        model["do_lower_case"] = True
    if args.is_m3p is not None:
        model["is_m3p"] = args.is_m3p
    grid = {"name": f"{args.model}-{'-'.join(args.protocols)}", "data_root": str(Path(args.data_root).resolve()),
            "output_dir": str(out), "tasks": args.task, "protocols": args.protocols, "models": {args.model: model},
            "include_english": not args.no_english}
    for key in ("languages", "shots", "learning_rates", "seeds"):
        if getattr(args, key):
            grid[key] = getattr(args, key)
    if args.languages:
        grid["few_shot_languages"] = args.languages
    out.mkdir(parents=True, exist_ok=True)
    path = out / "grid.yml"
    path.write_text(yaml.safe_dump(grid, sort_keys=False), encoding="utf-8")
    print(f"grid written to {path}")
    return cmd_sweep(argparse.Namespace(grid=str(path), local=not args.slurm, slurm=args.slurm, list=False,
                                        only=[], max_cells=None, slurm_dir=None))


def cmd_report(args) -> int:
    from .report import write_report
    from .results import collect

    baseline = args.baseline
    if args.grid:
        from .errors import GridError
        from .grid import load_grid
        try:
            grid = load_grid(args.grid)
        except GridError as error:
            raise UsageError(str(error)) from None
        baseline = baseline or grid.baseline
        args.results_dir = args.results_dir or str(grid.output_dir)
    if not args.results_dir:
        raise UsageError("give RESULTS_DIR or --grid GRID")
    root = Path(args.results_dir)
    if not root.is_dir():
        raise UsageError(f"{root}: not a directory")
    records = collect(root)
    if not records:
        print(f"{root}: no finished results (result.json) or IGLUE test logs with a score found", file=sys.stderr)
        return 1
    from .suite_report import build_suite_tables, write_suite_report
    if baseline is not None:
        from .report import build_tables
        rows = {m for _, t in build_tables(records) for m in t.models} | \
            {m for _, t in build_suite_tables(records) for m in t.sources}
        if baseline not in rows:
            raise UsageError(f"baseline {baseline!r} is not a row of any table (rows: {', '.join(sorted(rows))})")
    out = Path(args.out) if args.out else root / "report"
    options = stat_options(args)
    files = write_report(records, out, digits=args.digits, options=options, baseline=baseline)
    files += write_suite_report(records, out, digits=args.digits, options=options, baseline=baseline)
    (out / "records.json").write_text(json.dumps(records, indent=1), encoding="utf-8")
    if not args.no_plots:
        from .plots import write_plots
        files += write_plots(records, out / "plots")
    print(f"{len(records)} results -> {len(files)} files in {out}")
    for md in sorted(p for p in files if p.suffix == ".md" and ("_summary" in p.name or p.stem.endswith("baseline"))):
        print(md.read_text(encoding="utf-8"))
    return 0


def main(argv: list[str] | None = None) -> int:
    """`python -m volta_ml.protocols.cli sweep|report ...`: the same commands without loading the other
    areas' subcommands (quick to start, handy in job scripts)."""
    parser = OneLineParser(prog="python -m volta_ml.protocols.cli")
    register(parser.add_subparsers(dest="command", metavar="COMMAND", required=True))
    args = parser.parse_args(argv)
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
