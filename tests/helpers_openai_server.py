"""A tiny OpenAI-compatible chat-completions server on 127.0.0.1 for the `--backend openai` tests: a deterministic
fake model and switchable faults, and it counts what it is asked.

The fake model reads the user turn's text and the pixels of its images (the PNG data URLs decoded), so a test
computes every answer one item at a time from the photo it gave (`letter_logprob`, `fake_answer`), never through
the client's code. `/v1/models` lists `models`; with `key` set every request needs `Authorization: Bearer <key>`;
`/health` answers 200. `python tests/helpers_openai_server.py --port P --served-model-name NAME` runs it alone
(the stand-in for `vllm serve` in the sweep's serving tests).

Faults: `faults` is a list consumed one per chat request, each one of `429`, `500`, `slow` (answers after
`slow_seconds`), `drop` (closes the connection without an answer), `bad_json`, `echo_400` (a 400 whose message repeats the
`Authorization` header); `hang_after` (answer that many
chat requests, then hold every later one until `release` is set); `stop_after` (answer that many, then close
the listening socket: a server that stops mid-run); `logprobs`: "full", "none" (no log-probabilities) or
"missing" (the letter C never among top_logprobs).
"""
from __future__ import annotations

import base64
import io
import json
import threading
import time
import zlib
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import numpy as np
from PIL import Image

LETTERS = "ABCDEFGH"
ANSWERS = ("yes", "no", "entailment", "contradiction", "neutral", "a red car", "B", "two dogs on the left side")


def image_key(image) -> str:
    return str(np.asarray(image.convert("RGB"), dtype=np.int64).sum()) + f"x{image.size}"


def _hash(*parts) -> int:
    return zlib.crc32("|".join(map(str, parts)).encode())


def letter_logprob(text: str, images: list, letter: str) -> float:
    """The fake model's log-probability of the answer token " <letter>"."""
    keys = ",".join(image_key(im) for im in images)
    return -0.01 - (_hash("lp", text, keys, letter) % 10000) / 1000.0


def fake_answer(text: str, images: list, max_tokens: int) -> tuple[str, str]:
    """(answer, finish_reason): words of a fixed answer, cut at max_tokens words ("length")."""
    keys = ",".join(image_key(im) for im in images)
    words = ANSWERS[_hash("gen", text, keys) % len(ANSWERS)].split()
    return " ".join(words[:max_tokens]), "length" if len(words) > max_tokens else "stop"


def _decode(url: str) -> Image.Image:
    head, _, data = url.partition(",")
    assert head == "data:image/png;base64", head
    return Image.open(io.BytesIO(base64.b64decode(data)))


class _Quiet(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request, client_address):     # a client that hung up: counted, not printed
        pass


class FakeServer:
    def __init__(self, models=("fake-vlm",), key: str | None = None, port: int = 0):
        self.models, self.key = list(models), key
        self.faults: list[str] = []
        self.slow_seconds = 2.0
        self.logprobs = "full"
        self.hang_after: int | None = None
        self.stop_after: int | None = None
        self.release = threading.Event()
        self.chat_requests = 0            # chat requests received (faulted ones too)
        self.answered = 0                 # chat answers sent
        self.items = Counter()            # answers sent per (text, image keys)
        self.bodies: list[dict] = []
        self.seen_headers: list[str] = []
        self._lock = threading.Lock()
        self._start(port)

    def _start(self, port: int) -> None:
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def _send(self, status: int, payload, raw: bytes | None = None, headers=()):
                data = raw if raw is not None else json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                for name, value in headers:
                    self.send_header(name, value)
                self.end_headers()
                self.wfile.write(data)

            def _authorised(self) -> bool:
                server.seen_headers.append(" ".join(f"{k}: {v}" for k, v in self.headers.items()))
                if server.key is None or self.headers.get("Authorization") == f"Bearer {server.key}":
                    return True
                self._send(401, {"error": {"message": "Incorrect API key provided", "code": "invalid_api_key"}})
                return False

            def do_GET(self):
                if self.path == "/health":
                    self._send(200, {})
                    return
                if not self._authorised():
                    return
                if self.path.rstrip("/") == "/v1/models":
                    self._send(200, {"object": "list", "data": [{"id": m, "object": "model"} for m in server.models]})
                else:
                    self._send(404, {"error": {"message": f"no route {self.path}"}})

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))))
                if not self._authorised():
                    return
                with server._lock:
                    server.chat_requests += 1
                    fault = server.faults.pop(0) if server.faults else None
                    hang = server.hang_after is not None and server.answered >= server.hang_after
                if hang:
                    server.release.wait(30)
                    self.close_connection = True
                    return
                if fault == "drop":
                    self.close_connection = True
                    self.connection.shutdown(2)
                    return
                if fault == "slow":
                    time.sleep(server.slow_seconds)
                if fault in ("429", "500"):
                    self._send(int(fault), {"error": {"message": "busy"}}, headers=[("Retry-After", "0")])
                    return
                if fault == "echo_400":        # a server that repeats the request's header in its error
                    self._send(400, {"error": {"message": f"bad request from {self.headers.get('Authorization')}"}})
                    return
                if fault == "bad_json":
                    self._send(200, None, raw=b'{"choices": [{"message": ')
                    return
                if body.get("model") not in server.models:
                    self._send(404, {"error": {"message": f"The model `{body.get('model')}` does not exist."}})
                    return
                payload, item = server.answer(body)
                try:
                    self._send(200, payload)
                except OSError:              # the client gave up (timeout): not delivered, not counted
                    return
                server.delivered(body, item)

        self.httpd = _Quiet(("127.0.0.1", port), Handler)
        self.httpd.daemon_threads = True
        self.port = self.httpd.server_address[1]
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def answer(self, body: dict) -> dict:
        content = body["messages"][0]["content"]
        text = "".join(part["text"] for part in content if part["type"] == "text")
        images = [_decode(part["image_url"]["url"]) for part in content if part["type"] == "image_url"]
        choice = {"index": 0, "message": {"role": "assistant"}}
        if body.get("logprobs"):
            top = [{"token": " " + letter, "logprob": letter_logprob(text, images, letter)} for letter in LETTERS]
            top += [{"token": word, "logprob": -20.0 - i} for i, word in enumerate((" the", "\n", " is"))]
            if self.logprobs == "missing":
                top = [t for t in top if t["token"] != " C"]
            top.sort(key=lambda t: -t["logprob"])
            top = top[:body.get("top_logprobs", 0)]
            choice["message"]["content"] = top[0]["token"]
            choice["finish_reason"] = "length"
            if self.logprobs != "none":
                choice["logprobs"] = {"content": [{"token": top[0]["token"], "logprob": top[0]["logprob"],
                                                   "top_logprobs": top}]}
        else:
            answer, finish = fake_answer(text, images, body["max_tokens"])
            choice["message"]["content"] = " " + answer
            choice["finish_reason"] = finish
        item = (text, tuple(image_key(im) for im in images), bool(body.get("logprobs")))
        return {"id": "cmpl-1", "object": "chat.completion", "model": body["model"] + "-served",
                "choices": [choice]}, item

    def delivered(self, body: dict, item) -> None:
        with self._lock:
            self.answered += 1
            self.items[item] += 1
            self.bodies.append(body)
            stop = self.stop_after is not None and self.answered >= self.stop_after
        if stop:
            threading.Thread(target=self.stop, daemon=True).start()

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()

    def restart(self) -> None:
        """The same server (counts kept) listening again on the same port."""
        self.stop_after = None
        self._start(self.port)


if __name__ == "__main__":      # as a server command: `... --served-model-name NAME --port P` (other flags ignored)
    import argparse

    parser = argparse.ArgumentParser()
    parser.add_argument("--served-model-name", default="fake-vlm")
    parser.add_argument("--port", type=int, required=True)
    known, _ = parser.parse_known_args()
    FakeServer(models=[known.served_model_name], port=known.port).thread.join()
