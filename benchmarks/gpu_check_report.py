"""gpu_check.py's report: the goals judged from the measured rows, and the Markdown rendering of report.json."""
from __future__ import annotations

STEP_RATIO_GOAL = 3.0  # bf16 step samples/s over the VOLTA-scheme fp32 step
MFU_GOAL = 0.35  # bf16, base models, batch 64
VLLM_QPS_GOAL = 30.0  # CVQA questions/s with --backend vllm, LLaVA-1.5-7B shapes, one H200


def goal_results(report: dict) -> list[dict]:
    """One entry per (goal, config): measured value, goal, pass / FAIL / not measured."""
    rows = report.get("checks", {}).get("train_step", {}).get("rows", [])
    by_key = {(r.get("config"), r.get("precision")): r for r in rows if r.get("config")}
    results = []
    for config in dict.fromkeys(r.get("config") for r in rows if r.get("config")):
        fp32, bf16 = by_key.get((config, "fp32"), {}), by_key.get((config, "bf16"), {})
        volta = fp32.get("volta_scheme_samples_per_s")
        ratio = bf16["samples_per_s"] / volta if volta and bf16.get("samples_per_s") else None
        results.append(_judge(config, f"bf16 step / VOLTA-scheme fp32 step >= {STEP_RATIO_GOAL:g}x", ratio,
                              STEP_RATIO_GOAL, "x"))
        results.append(_judge(config, f"bf16 MFU >= {MFU_GOAL:.0%}", bf16.get("mfu"), MFU_GOAL, "%"))
    for row in report.get("checks", {}).get("cvqa_vllm", {}).get("rows", []):   # --backend vllm, real shapes
        if row.get("goal"):
            value = None if report.get("quick") else row.get("questions_per_s")
            results.append(_judge(row["item"], row["goal"], value, VLLM_QPS_GOAL, "q/s"))
    return results


def _judge(config, goal, value, target, unit) -> dict:
    if value is None:
        status = "not measured"
    else:
        status = "pass" if value >= target else "FAIL"
    shown = None if value is None else {"x": f"{value:.2f}x", "q/s": f"{value:.1f} q/s"}.get(unit, f"{value:.1%}")
    return {"config": config, "goal": goal, "value": value, "shown": shown, "status": status}


def _cell(value) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, (list, dict)):
        text = str(value)
        return text if len(text) <= 80 else text[:77] + "..."
    return str(value).replace("|", "\\|").replace("\n", " ")


def _table(rows: list[dict]) -> list[str]:
    keys = list(dict.fromkeys(k for r in rows for k in r))
    lines = ["| " + " | ".join(keys) + " |", "|" + "---|" * len(keys)]
    lines += ["| " + " | ".join(_cell(r.get(k)) for k in keys) + " |" for r in rows]
    return lines


def markdown(report: dict) -> str:
    lines = ["# volta-ml GPU check", "",
             f"device `{report.get('device')}`; {'--quick (tiny sizes: figures not meaningful)' if report.get('quick') else 'full sizes'}; "
             f"{report.get('elapsed_s', 0)} s of {report.get('total_budget_s')} s budget", "",
             f"Goals: {report.get('goals')}", ""]
    goals = report.get("goal_results")
    if goals:
        lines += ["## Goals", "", "| config | goal | measured | result |", "|---|---|---|---|"]
        lines += [f"| {g['config']} | {g['goal']} | {g['shown'] or '-'} | {g['status']} |" for g in goals]
        lines.append("")
    lines += ["## Checks", "", "| check | status | seconds | budget s | what |", "|---|---|---:|---:|---|"]
    for name, entry in report.get("checks", {}).items():
        lines.append(f"| {name} | {entry['status']} | {entry.get('seconds', 0)} | {entry.get('budget_s', 0):.0f} | "
                     f"{entry.get('what', '')} |")
    for name, entry in report.get("checks", {}).items():
        lines += ["", f"### {name}: {entry['status']}", ""]
        if entry.get("detail"):
            lines += ["```", entry["detail"].strip()[-2000:], "```", ""]
        if entry.get("rows"):
            lines += _table(entry["rows"])
    return "\n".join(lines) + "\n"
