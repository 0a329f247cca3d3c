"""IGLUE's transfer protocols as sweeps of train/eval commands, and the paper's tables.

grid.py (the YAML grid) -> runners.py (cells of argv commands with IGLUE's settings, iglue.py) ->
local.py (run here) or slurm.py (job arrays); steps.py runs inside cells (record, select);
results.py reads scores from logs; report.py and plots.py make the tables and figures, uncertainty.py each
cell's interval, seeds, format errors and paired comparisons (volta_ml/stats.py), compare.py `volta-ml compare`'s
IGLUE half; cli.py has `volta-ml sweep`, `volta-ml run` and `volta-ml report`. See docs/protocols.md.
"""
