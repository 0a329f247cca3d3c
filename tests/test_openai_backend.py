"""`--backend openai` against a small OpenAI-compatible server of the tests (tests/helpers_openai_server.py) on
127.0.0.1: the letter and generate rules equal a one-at-a-time computation from the photos; faults are retried
or end in one line naming the item; a killed or failed run resumes without asking again what was answered; bad
inputs are one line, exit 2, within 60 s; the key never appears in any file or output."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from conftest import REPO
from helpers_iglue_hf import make_images
from helpers_openai_server import FakeServer, fake_answer, letter_logprob
from volta_ml.cli import main
from volta_ml.hf import EngineError, ModelSpec, load_backend
from volta_ml.iglue_hf.data import read_task
from volta_ml.iglue_hf.images import DEFAULT_TEMPLATES, ImageSource
from volta_ml.iglue_hf.prompts import OPTIONS, letter_choices, user_turn
from volta_ml.iglue_hf.scoring import normalise_answer
from volta_ml.hf.mllm import parse_choice

KEY_ENV, KEY = "VOLTA_ML_TEST_OPENAI_KEY", "sk-test-not-a-real-key-5f3a9c"
LABELS = ("entailment", "neutral", "contradiction")
FAST = {"retry_backoff": 0.01, "request_timeout": 10.0}


@pytest.fixture(scope="module")
def task(tmp_path_factory):
    """A 12-line XVNLI file in IGLUE's format and a photo per image it names."""
    tmp = tmp_path_factory.mktemp("openai_task")
    lines = [{"gold_label": LABELS[i % 3], "sentence1": "x", "sentence2": f"a hypothesis number {i}",
              "captionID": f"{100 + i // 2}.jpg#0", "pairID": f"{100 + i // 2}.jpg#0r{i}", "Flikr30kID": str(100 + i // 2)}
             for i in range(12)]
    annotation = tmp / "test.jsonl"
    annotation.write_text("".join(json.dumps(l) + "\n" for l in lines), encoding="utf-8")
    make_images("xvnli", annotation, "ar", tmp / "images")
    return {"annotation": annotation, "images": tmp / "images", "examples": read_task("xvnli", str(annotation), "ar")}


@pytest.fixture
def server():
    srv = FakeServer(key=KEY)
    yield srv
    srv.release.set()
    srv.stop()


@pytest.fixture(autouse=True)
def key_env(monkeypatch):
    monkeypatch.setenv(KEY_ENV, KEY)


def argv(task, server, out, *more, rule="letter"):
    return ["iglue-hf", "--task", "xvnli", "--backend", "openai", "--model", "fake-vlm", "--lang", "ar",
            "--annotations", str(task["annotation"]), "--images", str(task["images"]), "--output_dir", str(out),
            "--rule", rule, "--base_url", server.base_url, "--api_key_env", KEY_ENV, "--batch_size", "4",
            "--chunk_size", "4", "--no_progress", "--extra", json.dumps(FAST), *more]


def expected_predictions(task, rule: str) -> list[str]:
    """One example at a time, from the fake model's own rule on the photo as read from disk."""
    source = ImageSource(str(task["images"]), DEFAULT_TEMPLATES["xvnli"])
    out = []
    for example in task["examples"]:
        images = [source.load(ref) for ref in example.images]
        prompt = user_turn("xvnli", rule, example)
        if rule == "letter":
            scores = [letter_logprob(prompt, images, letter) for letter in letter_choices("xvnli")]
            out.append(OPTIONS["xvnli"][int(np.argmax(scores))])
        else:
            answer = fake_answer(prompt, images, 10)[0]
            choice = parse_choice(answer, letter_choices("xvnli"), OPTIONS["xvnli"])
            out.append("" if choice is None else OPTIONS["xvnli"][choice])
    return out


def predictions(out: Path) -> list[str]:
    return [json.loads(l)["prediction"] for l in (out / "predictions.jsonl").read_text().splitlines()]


def assert_no_key(*texts, folder: Path | None = None):
    for text in texts:
        assert KEY not in text
    for path in (folder.rglob("*") if folder else []):
        if path.is_file():
            assert KEY.encode() not in path.read_bytes(), path


def one_line(err: str) -> str:
    lines = [l for l in err.splitlines() if l.strip()]
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


@pytest.mark.parametrize("rule", ["letter", "generate"])
def test_rules_through_the_server_equal_one_at_a_time(task, server, tmp_path, capsys, rule):
    out = tmp_path / rule
    assert main(argv(task, server, out, "--max_concurrency", "3", rule=rule)) == 0
    assert predictions(out) == expected_predictions(task, rule)
    results = json.loads((out / "iglue_hf_results.json").read_text())
    engine = results["engine"]
    assert engine["engine"] == "openai" and engine["server"]["model_reported"] == ["fake-vlm-served"]
    assert engine["temperature"] == 0 and engine["seed"] == 0 and engine["server"]["api_key_env"] == KEY_ENV
    assert "PNG" in engine["images"] and results["prompt_format"].startswith("server")
    assert json.loads((out / "result.json").read_text())["engine"] == "openai"
    n = len(task["examples"])
    assert server.answered == n and sum(server.items.values()) == n and set(server.items.values()) == {1}
    assert all(b["temperature"] == 0 and "seed" in b for b in server.bodies)
    assert all(f"Bearer {KEY}" in h for h in server.seen_headers)
    captured = capsys.readouterr()
    assert_no_key(captured.out, captured.err, folder=out)


def test_a_batch_goes_out_concurrently_and_bounded(server):
    server.faults = ["slow"] * 8
    server.slow_seconds = 0.5
    backend = load_backend("openai", ModelSpec("fake-vlm", extra={"base_url": server.base_url, "api_key_env": KEY_ENV,
                                                                   "max_concurrency": 4, **FAST}))
    started = time.time()
    answers = backend.generate([[None]] * 8, [f"question {i}" for i in range(8)], 5)
    took = time.time() - started
    assert [str(a) for a in answers] == [fake_answer(f"question {i}", [], 5)[0] for i in range(8)]
    assert 0.95 < took < 3.0        # two waves of four: not one by one (4 s), not all at once (0.5 s)


@pytest.mark.parametrize("fault", ["429", "500", "slow", "drop", "bad_json"])
def test_each_fault_is_retried(server, fault):
    server.faults = [fault, fault]
    server.slow_seconds = 3.0          # longer than this test's 1 s request timeout
    image = Image.new("RGB", (9, 7), (200, 10, 30))
    backend = load_backend("openai", ModelSpec("fake-vlm", extra={"base_url": server.base_url, "api_key_env": KEY_ENV,
                                                                   **FAST, "request_timeout": 1.0}))
    logits = backend.choice_logits([[image]], ["q"], ["A", "B"])
    assert logits.tolist() == [[pytest.approx(letter_logprob("q", [image], l)) for l in "AB"]]
    assert server.chat_requests >= 3          # the two faults, then the answer (a loaded machine may time out more)


def test_retries_spent_is_one_line_naming_the_item(task, server, tmp_path, capsys):
    server.faults = ["500"] * 100
    assert main(argv(task, server, tmp_path, "--retries", "2")) == 2
    line = one_line(capsys.readouterr().err)
    assert "item 0" in line and "HTTP 500" in line and "after 3 tries" in line and server.base_url in line


def test_a_server_that_echoes_the_key_does_not_print_it(task, server, tmp_path, capsys):
    server.faults = ["echo_400"]
    assert main(argv(task, server, tmp_path)) == 2
    line = one_line(capsys.readouterr().err)
    assert "HTTP 400" in line and "bad request from Bearer <the key>" in line
    assert_no_key(line, folder=tmp_path)


def test_the_letter_rule_is_refused_without_logprobs(task, server, tmp_path, capsys):
    for mode, words in (("none", "returned no log-probabilities"), ("missing", "' C' is not among")):
        server.logprobs = mode
        assert main(argv(task, server, tmp_path / mode)) == 2
        line = one_line(capsys.readouterr().err)
        assert words in line and "--rule generate" in line


def test_continuation_rules_are_refused(task, server, tmp_path, capsys):
    assert main(argv(task, server, tmp_path, rule="likelihood")) == 2
    line = one_line(capsys.readouterr().err)
    assert "cannot score continuations" in line and "--rule letter or --rule generate" in line
    assert server.chat_requests == 0


def test_bad_inputs_are_one_line_within_a_minute(task, server, tmp_path, capsys, monkeypatch):
    closed = FakeServer()
    closed_url = closed.base_url
    closed.stop()
    cases = [(["--base_url", closed_url], "no OpenAI-compatible server answers there"),
             (["--model", "other-model"], "does not serve model 'other-model'; it serves: fake-vlm"),
             ([], "refused the key (HTTP 401)")]
    for i, (flags, words) in enumerate(cases):
        if i == 2:
            monkeypatch.setenv(KEY_ENV, "sk-wrong")
        started = time.time()
        assert main(argv(task, server, tmp_path / str(i)) + flags) == 2
        line = one_line(capsys.readouterr().err)
        assert words in line and time.time() - started < 60
        assert_no_key(line)
    monkeypatch.delenv(KEY_ENV)
    assert main(argv(task, server, tmp_path / "unset")) == 2
    assert "--api_key_env VOLTA_ML_TEST_OPENAI_KEY: that environment variable is not set" in \
        one_line(capsys.readouterr().err)
    with pytest.raises(SystemExit) as usage:
        main(argv(task, server, tmp_path / "flag", "--max_concurrency", "0"))
    assert usage.value.code == 2
    assert "--max_concurrency: 'max_concurrency' must be an integer >= 1" in one_line(capsys.readouterr().err)


def _cli(task, server, out, *more):
    env = dict(os.environ, PYTHONPATH=f"{REPO}{os.pathsep}{REPO / 'tests'}", OMP_NUM_THREADS="1")
    return [sys.executable, "-m", "volta_ml.cli", *argv(task, server, out, *more)], env


def test_a_killed_run_resumes_without_asking_again(task, server, tmp_path):
    server.hang_after = 6
    cmd, env = _cli(task, server, tmp_path, "--max_concurrency", "2")
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 60
    journal = tmp_path / "test_ar_chunks" / "answers.jsonl"

    def on_disk() -> int:
        return len(journal.read_text().splitlines()) if journal.exists() else 0

    # the 6th answer is sent by the server a moment before the client has journalled it: wait for the client
    while (server.chat_requests < 7 or on_disk() < 6) and time.time() < deadline and proc.poll() is None:
        time.sleep(0.05)
    assert server.answered == 6
    proc.send_signal(signal.SIGKILL)
    proc.communicate(timeout=30)
    server.hang_after = None
    server.release.set()
    assert on_disk() == 6         # every answer that had arrived was on disk before the kill, and no other
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    n = len(task["examples"])
    assert server.answered == n and set(server.items.values()) == {1}    # nothing answered was asked again
    assert predictions(tmp_path) == expected_predictions(task, "letter")
    assert_no_key(done.stdout, done.stderr, folder=tmp_path)


def test_a_server_that_stops_mid_run_resumes_after_a_restart(task, server, tmp_path, capsys):
    server.stop_after = 5
    assert main(argv(task, server, tmp_path, "--retries", "2", "--keep_chunks")) == 2
    line = one_line(capsys.readouterr().err)
    assert "connection failed" in line and "item" in line
    answered = server.answered              # 5, and what the batch had in flight when it stopped
    server.restart()
    assert main(argv(task, server, tmp_path)) == 0      # other --retries: not a resume key
    assert "recomputing" not in capsys.readouterr().err
    assert server.answered == len(task["examples"]) > answered >= 5 and set(server.items.values()) == {1}
    assert predictions(tmp_path) == expected_predictions(task, "letter")


def test_a_torn_journal_line_is_asked_again(server, tmp_path):
    backend = load_backend("openai", ModelSpec("fake-vlm", extra={"base_url": server.base_url, "api_key_env": KEY_ENV,
                                                                   **FAST}))
    backend.journal_in(tmp_path)
    first = backend.generate([[None], [None]], ["one", "two"], 4)
    journal = tmp_path / "answers.jsonl"
    lines = journal.read_text().splitlines()
    journal.write_text(lines[0] + "\n" + lines[1][:20])          # the second line cut by a kill
    again = load_backend("openai", ModelSpec("fake-vlm", extra={"base_url": server.base_url, "api_key_env": KEY_ENV,
                                                                 **FAST}))
    again.journal_in(tmp_path)
    assert again.generate([[None], [None]], ["one", "two"], 4) == first
    assert server.answered == 3 and again.asked == 2          # GET /models and the torn one
    with pytest.raises(EngineError, match="cannot score continuations"):
        again.continuation_logprobs([[None]], ["one"], [[" yes"]])


def test_cvqa_letter_rule_through_the_server(server, tmp_path, capsys):
    """`cvqa score --backend openai`: the letter scores are the server's log-probabilities of each photo's
    request, one question at a time; the engine is recorded; the open rule is refused in one line."""
    from helpers_cvqa import image_png, write_release
    from volta_ml.cvqa.data import load_cvqa
    from volta_ml.cvqa.prompts import LETTERS, generative_prompt

    release = write_release(tmp_path / "release", "latest")
    out = tmp_path / "out"
    common = ["cvqa", "score", "--data", str(release), "--device", "cpu", "--no-progress", "--backend", "openai",
              "--model", "fake-vlm", "--base_url", server.base_url, "--api_key_env", KEY_ENV, "--conditions",
              "loc-aware", "--batch-size", "4"]
    assert main(common + ["--output_dir", str(out), "--rule", "letter"]) == 0
    results = json.loads((out / "cvqa_results.json").read_text())
    assert results["backend"] == "openai" and results["engine"]["server"]["model_reported"] == ["fake-vlm-served"]
    chunks = sorted((out / "chunks" / "loc-aware").glob("*.npz"))
    got = np.concatenate([np.load(p)["score"] for p in chunks])
    for k, q in enumerate(load_cvqa(release).questions):
        image = Image.open(__import__("io").BytesIO(image_png(q.image_id)))
        want = [letter_logprob(generative_prompt(q, "loc-aware", "letter"), [image], l) for l in LETTERS]
        np.testing.assert_allclose(got[k], want, rtol=1e-6)
    assert (out / "chunks" / "answers.jsonl").is_file()
    first = capsys.readouterr()
    assert main(common + ["--output_dir", str(tmp_path / "open"), "--rule", "open"]) == 2
    captured = capsys.readouterr()
    assert "cannot score continuations" in one_line(captured.err)
    assert_no_key(first.out, first.err, captured.out, captured.err, folder=tmp_path)


@pytest.mark.parametrize("command", [["iglue-hf", "--task", "xvnli", "--lang", "ar", "--images", "i"],
                                     ["suite", "--task", "maxm", "--lang", "en", "--data", "d"]])
def test_server_flags_are_extra_keys_in_any_order(command):
    from volta_ml.cli import build_parser

    common = command + ["--backend", "openai", "--model", "m", "--output_dir", "o"]
    for flags in (["--base_url", "http://h/v1", "--extra", '{"seed": 3}', "--retries", "0"],
                  ["--extra", '{"seed": 3}', "--retries", "0", "--base_url", "http://h/v1"]):
        args = build_parser().parse_args(common + flags)
        assert args.extra == {"base_url": "http://h/v1", "seed": 3, "retries": 0}


def test_an_item_of_a_sub_batch_is_named_by_its_place_in_the_batch():
    error = EngineError("no answer", item=1).within([4, 7, 9])
    assert error.item == 7 and str(error) == "no answer" and EngineError("x").within([3]).item is None
