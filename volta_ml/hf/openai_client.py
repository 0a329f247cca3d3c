"""`--backend openai`: any OpenAI-compatible chat-completions server (vLLM's and SGLang's servers, LMDeploy,
llama.cpp's server, hosted APIs) behind the `Generative` contract of `hf/base.py`.

`spec.model` is the model name the server serves; `spec.extra` holds the server options (`EXTRA_OPTIONS`):
`base_url` (required, e.g. `http://127.0.0.1:8000/v1`), `api_key_env` (the environment variable the key is read
from: the key itself is never printed, logged or written), `max_concurrency` (requests in flight, default 8),
`request_timeout` (seconds, default 60), `retries` (default 4) and `retry_backoff` (the first wait, default 0.5 s,
doubled each time, at most 8 s; a server's `Retry-After` is honoured up to 30 s), `seed` (default 0),
`server_fields` (a JSON object merged into every request: vLLM's `{"add_special_tokens": true}`), `max_images`
(default 1), `top_logprobs` (default 20, OpenAI's most; a vLLM server started with a larger `--max-logprobs`
takes more).

Each request is one user turn: the images first, as PNG data URLs of the decoded RGB photo (lossless: the pixels
every backend sees), then the prompt; no image part for a blind (`None`) image. The server renders the prompt
through its own chat template (`render` says so; what the client controls is `record`). Temperature 0 and the
seed in every request. A batch of the scoring loop goes out as concurrent requests (an httpx `AsyncClient`, at
most `max_concurrency` at once). 429, 5xx, timeouts, dropped connections and malformed answers are retried with
backoff; then one `EngineError` line naming the server, the item and the last reason. A wrong key (401/403), a
model the server does not serve, or a URL nothing answers are refused at load with one line.

The answers journal (`journal_in(folder)`, called by the runs beside their chunk store: `answers.jsonl`): every
answer is appended as it arrives, fsynced, keyed by the sha256 of the request body (model name, messages with
their images, options; not the URL, so a server restarted elsewhere is not asked again); a resumed run reads it
and never asks (or pays) again for what was answered. A line cut by a kill is skipped.

Rules: `generate` (the answer text; `truncated` when the server's `finish_reason` is `length`); `letter` through
the first answer token's `top_logprobs` (one request per item, `max_tokens` 1): a choice's score is the
log-probability of the letter in one spelling for every choice and item, as the HF backend scores (`letter_lead`:
`" "` for `" A"`, `""` for `"A"`; `auto`: as the best-ranked choice token of the run's first answer spells it,
recorded as `letter_lead_used`); `letter_spellings: "all"`: logsumexp of both spellings. Scores are
log-probabilities (the same argmax as the logits). A server that returns no log-probabilities, or a choice
missing from `top_logprobs`, refuses the run naming `--rule generate`: the rule is never changed silently.
Continuation log-probabilities are not available from chat servers: the likelihood / closed / open rules refuse.
"""
from __future__ import annotations

import asyncio
import base64
import hashlib
import io
import json
import logging
import os
import random
from pathlib import Path
from typing import Sequence

import torch
from PIL import Image

from .base import LETTER_SPELLINGS, Answer, EngineError, ModelSpec
from .loading import photo_rgb

JOURNAL = "answers.jsonl"
DEFAULTS = {"max_concurrency": 8, "request_timeout": 60.0, "retries": 4, "retry_backoff": 0.5, "seed": 0,
            "server_fields": {}, "max_images": 1,
            "top_logprobs": 20,           # the most OpenAI's API (and vLLM's default --max-logprobs) returns
            "letter_lead": "auto"}
MAX_WAIT = 8.0                    # longest backoff between two tries
MAX_RETRY_AFTER = 30.0            # longest wait a server's Retry-After header may ask for
RETRIED = (429, 500, 502, 503, 504)
CONTINUATIONS = ("the openai backend cannot score continuations: chat servers return no log-probabilities of "
                 "given text; rules that can run: letter (where the server returns top_logprobs) and generate "
                 "(--rule letter or --rule generate)")


class _Retry(Exception):
    """A try that failed in a way worth trying again (status, timeout, dropped connection, malformed answer)."""

    def __init__(self, reason: str, wait: float | None = None):
        super().__init__(reason)
        self.wait = wait


def image_url(image: Image.Image) -> str:
    """The decoded photo as a PNG data URL (lossless, deterministic bytes for the same pixels)."""
    buffer = io.BytesIO()
    photo_rgb(image).save(buffer, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode("ascii")


def request_key(body: dict) -> str:
    return hashlib.sha256(json.dumps(body, sort_keys=True, ensure_ascii=False).encode("utf-8")).hexdigest()


class Journal:
    """Append-only answers, one JSON line each `{"key": request digest, ...answer}`, fsynced as written."""

    def __init__(self, path: Path):
        self.path = path
        self.answers: dict[str, dict] = {}
        if path.is_file():
            for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
                try:
                    entry = json.loads(line)
                    self.answers[entry["key"]] = entry
                except (ValueError, KeyError, TypeError):    # a line cut by a kill: asked again
                    continue
        path.parent.mkdir(parents=True, exist_ok=True)
        self._handle = open(path, "a", encoding="utf-8")

    def add(self, entry: dict) -> None:
        self.answers[entry["key"]] = entry
        self._handle.write(json.dumps(entry, ensure_ascii=False) + "\n")
        self._handle.flush()
        os.fsync(self._handle.fileno())


class OpenAIBackend:
    """A chat-completions server as a `Generative` backend (module docstring)."""

    def __init__(self, spec: ModelSpec):
        import httpx

        for name in ("httpx", "httpcore"):     # not a log line per request where a caller logs at INFO
            logging.getLogger(name).setLevel(logging.WARNING)
        self.httpx = httpx
        self.spec = spec
        options = {**DEFAULTS, **spec.extra}
        if not spec.extra.get("base_url"):
            raise EngineError(f"--backend openai needs --base_url (the server's OpenAI API root, e.g. "
                              f"http://127.0.0.1:8000/v1) for model {spec.model!r}")
        self.base_url = str(options["base_url"]).rstrip("/")
        self.max_concurrency = options["max_concurrency"]
        self.timeout = float(options["request_timeout"])
        self.retries = options["retries"]
        self.backoff = float(options["retry_backoff"])
        self.seed = options["seed"]
        self.server_fields = dict(options["server_fields"])
        self.max_images = options["max_images"]
        self.top_logprobs = options["top_logprobs"]
        self.letter_lead = options["letter_lead"]
        self.lead_used: str | None = None if self.letter_lead == "auto" else self.letter_lead
        self.letter_spellings = options.get("letter_spellings", "natural")
        if self.letter_spellings not in LETTER_SPELLINGS:
            raise EngineError(f"letter_spellings {self.letter_spellings!r}: expected one of {LETTER_SPELLINGS}")
        self.key_env = options.get("api_key_env")
        self._headers = {"Content-Type": "application/json"}
        if self.key_env:
            key = os.environ.get(self.key_env)
            if not key:
                raise EngineError(f"--api_key_env {self.key_env}: that environment variable is not set")
            self._headers["Authorization"] = f"Bearer {key}"
        self.journal: Journal | None = None
        self.asked = 0                      # requests sent (answers from the journal are not counted)
        self.served_ids: list[str] = []     # the model ids the server reported
        self.prompt_format = "server: the server's own chat template renders the prompt"
        self.template_options: dict = {}
        self.vqa_frame = None
        self.engine = self._engine()
        self.score_conventions = {"letter": "log-probability of the letter in the server's top_logprobs of the first "
                                            f"answer token ({self.letter_spellings} spelling)"}
        self._check_server()

    # ---- the record ------------------------------------------------------------------------------------------
    def _engine(self) -> dict:
        """What the answers depend on, the same for every run of these settings (recorded; a resume key)."""
        return {"engine": "openai", "model": self.spec.model, "temperature": 0, "seed": self.seed,
                "server_fields": self.server_fields, "top_logprobs": self.top_logprobs,
                "letter_spellings": self.letter_spellings, "letter_lead": self.letter_lead,
                "images": "PNG data URLs of the decoded RGB photos (lossless), before the text in the user turn; "
                          "no image part for a blind prompt",
                "prompt": "rendered by the server's chat template (the client sends the user turn only)"}

    @property
    def server(self) -> dict:
        """How this run reached the server, and what it reported (recorded beside `engine`, never a resume key)."""
        return {"base_url": self.base_url, "model_reported": sorted(set(self.served_ids)),
                "max_concurrency": self.max_concurrency, "request_timeout": self.timeout, "retries": self.retries,
                "api_key_env": self.key_env,   # the variable's name, never its value
                "journal": str(self.journal.path) if self.journal else None, "requests_sent": self.asked,
                "letter_lead_used": self.lead_used}

    def journal_in(self, folder) -> None:
        self.journal = Journal(Path(folder) / JOURNAL)

    # ---- HTTP ------------------------------------------------------------------------------------------------
    def _client(self):
        timeout = self.httpx.Timeout(self.timeout, connect=min(self.timeout, 10.0))
        return self.httpx.AsyncClient(timeout=timeout, headers=self._headers,
                                      limits=self.httpx.Limits(max_connections=self.max_concurrency))

    async def _try(self, client, method: str, path: str, body: dict | None) -> dict:
        httpx = self.httpx
        try:
            reply = await client.request(method, self.base_url + path, json=body)
        except httpx.TimeoutException:
            raise _Retry(f"no answer within {self.timeout:g} s") from None
        except httpx.TransportError as err:
            raise _Retry(f"connection failed ({type(err).__name__}: {' '.join(str(err).split()) or 'dropped'})") \
                from None
        if reply.status_code in (401, 403):
            raise EngineError(f"{self.base_url}: the server refused the key (HTTP {reply.status_code}); it was read "
                              f"from ${self.key_env}" if self.key_env else
                              f"{self.base_url}: the server wants a key (HTTP {reply.status_code}); give "
                              "--api_key_env NAME, the environment variable holding it")
        if reply.status_code in RETRIED:
            raise _Retry(f"HTTP {reply.status_code}", _retry_after(reply.headers.get("retry-after")))
        if reply.status_code != 200:
            message = _server_message(reply)
            key = self._headers.get("Authorization", "")[len("Bearer "):]
            if key:                              # a server that echoes the key: never printed
                message = message.replace(key, "<the key>")
            raise EngineError(f"{self.base_url}{path}: HTTP {reply.status_code} for model {self.spec.model!r}: "
                              f"{message}")
        try:
            payload = reply.json()
        except ValueError:
            raise _Retry("malformed JSON in the answer") from None
        if not isinstance(payload, dict):
            raise _Retry("malformed JSON in the answer (not an object)")
        return payload

    async def _with_retries(self, client, method: str, path: str, body: dict | None, check) -> dict:
        reason = ""
        for attempt in range(self.retries + 1):
            if attempt:
                wait = min(MAX_WAIT, self.backoff * 2 ** (attempt - 1))
                await asyncio.sleep(reason.wait if reason.wait is not None else wait * (0.5 + random.random() / 2))
            try:
                self.asked += 1
                return check(await self._try(client, method, path, body))
            except _Retry as err:
                reason = err
        raise _Retry(f"{reason} (after {self.retries + 1} tries)")

    def _check_server(self) -> None:
        """The server answers, takes the key, and serves the model (GET /models; a server without that route is
        checked by its first answer)."""
        async def ask():
            async with self._client() as client:
                return await self._with_retries(client, "GET", "/models", None, lambda payload: payload)

        try:
            payload = asyncio.run(ask())
        except _Retry as err:
            raise EngineError(f"{self.base_url}: no OpenAI-compatible server answers there: {err}") from None
        except EngineError as err:
            if "HTTP 404" in str(err) or "HTTP 405" in str(err):
                return
            raise
        served = [m.get("id") for m in payload.get("data") or [] if isinstance(m, dict)]
        if served and self.spec.model not in served:
            raise EngineError(f"{self.base_url}: the server does not serve model {self.spec.model!r}; it serves: "
                              f"{', '.join(map(str, served[:10]))}")

    def _answer(self, key: str, payload: dict) -> dict:
        try:
            choice = payload["choices"][0]
            content = choice["message"].get("content") or ""
        except (KeyError, IndexError, TypeError, AttributeError):
            raise _Retry("malformed answer (no choices[0].message)") from None
        top = None
        logprobs = choice.get("logprobs")
        if isinstance(logprobs, dict) and logprobs.get("content"):
            first = logprobs["content"][0]
            top = [[t.get("token"), float(t.get("logprob"))] for t in first.get("top_logprobs") or []
                   if isinstance(t, dict) and t.get("logprob") is not None]
        return {"key": key, "model": payload.get("model"), "content": content,
                "finish_reason": choice.get("finish_reason"), "top_logprobs": top}

    async def _one(self, client, gate, index: int, body: dict) -> dict:
        key = request_key(body)
        if self.journal is not None and key in self.journal.answers:
            return self.journal.answers[key]
        async with gate:
            try:
                entry = await self._with_retries(client, "POST", "/chat/completions", body,
                                                 lambda payload: self._answer(key, payload))
            except _Retry as err:
                raise EngineError(f"{self.base_url}: no answer for this item ({err})", item=index) from None
            except EngineError as err:
                raise EngineError(str(err), item=index) from None
        if self.journal is not None:
            self.journal.add(entry)
        return entry

    def _ask(self, bodies: list[dict]) -> list[dict]:
        """Every request of a batch concurrently (at most max_concurrency in flight); all answers that arrive are
        journaled before the first failure is raised."""
        async def run():
            gate = asyncio.Semaphore(self.max_concurrency)
            async with self._client() as client:
                return await asyncio.gather(*(self._one(client, gate, i, b) for i, b in enumerate(bodies)),
                                            return_exceptions=True)

        answers = asyncio.run(run())
        for answer in answers:
            if isinstance(answer, BaseException):
                raise answer
        self.served_ids.extend(a["model"] for a in answers if a.get("model"))
        return answers

    # ---- requests --------------------------------------------------------------------------------------------
    def _messages(self, images: Sequence[Image.Image | None], prompt: str) -> list[dict]:
        photos = [im for im in images if im is not None]
        if self.max_images is not None and len(photos) > self.max_images:
            from .base import BackendInputError
            raise BackendInputError(f"{self.spec.model}: {len(photos)} images in one prompt, the backend sends at "
                                    f"most {self.max_images} (extra max_images for a multi-image model)")
        content = [{"type": "image_url", "image_url": {"url": image_url(im)}} for im in photos]
        return [{"role": "user", "content": content + [{"type": "text", "text": prompt}]}]

    def _body(self, images, prompt: str, max_tokens: int, logprobs: bool) -> dict:
        body = {"model": self.spec.model, "messages": self._messages(images, prompt), "temperature": 0,
                "seed": self.seed, "max_tokens": max_tokens, **self.server_fields}
        if logprobs:
            body.update(logprobs=True, top_logprobs=self.top_logprobs)
        return body

    def render(self, prompt: str, num_images: int) -> str:
        """The user turn as sent (images as placeholders); the server's chat template renders it."""
        parts = [{"type": "image_url"}] * num_images + [{"type": "text", "text": prompt}]
        return "server-rendered chat template; user turn: " + json.dumps(parts, ensure_ascii=False)

    # ---- the contract ----------------------------------------------------------------------------------------
    def generate(self, images, prompts, max_new_tokens: int) -> list[str]:
        answers = self._ask([self._body(im, p, max_new_tokens, False) for im, p in zip(images, prompts)])
        return [Answer(a["content"].strip(), a["finish_reason"] == "length") for a in answers]

    def choice_logits(self, images, prompts, choices) -> torch.Tensor:
        answers = self._ask([self._body(im, p, 1, True) for im, p in zip(images, prompts)])
        return torch.tensor([self._letter_scores(a, choices, i) for i, a in enumerate(answers)], dtype=torch.float32)

    def _letter_scores(self, answer: dict, choices: Sequence[str], index: int) -> list[float]:
        top = answer["top_logprobs"]
        if not top:
            raise EngineError(f"{self.base_url}: model {self.spec.model!r} returned no log-probabilities, so the "
                              "letter rule cannot run; run --rule generate", item=index)
        found = {token: logprob for token, logprob in reversed(top)}     # the first (highest) entry wins
        if self.letter_spellings == "all":
            spellings = [[c, " " + c] for c in choices]
        else:
            if self.lead_used is None:      # auto: as the best-ranked choice token of the run's first answer
                first = next((token for token, _ in top if token is not None and token.strip() in choices), None)
                self.lead_used = " " if first is not None and first.startswith(" ") else ""
            spellings = [[self.lead_used + c] for c in choices]
        scores = []
        for choice, forms in zip(choices, spellings):
            present = [found[f] for f in forms if f in found]
            if not present:
                raise EngineError(f"{self.base_url}: the choice {forms[0]!r} is not among the {len(top)} "
                                  f"top_logprobs of model {self.spec.model!r}, so the letter rule cannot run; "
                                  "run --rule generate", item=index)
            scores.append(float(torch.logsumexp(torch.tensor(present, dtype=torch.float64), 0)))
        return scores

    def continuation_logprobs(self, images, prompts, continuations, *, reuse_cache: bool = True):
        raise EngineError(CONTINUATIONS)


def _retry_after(value: str | None) -> float | None:
    try:
        return min(MAX_RETRY_AFTER, max(0.0, float(value))) if value is not None else None
    except ValueError:
        return None


def _server_message(reply) -> str:
    try:
        payload = reply.json()
        error = payload.get("error", payload) if isinstance(payload, dict) else payload
        text = error.get("message", error) if isinstance(error, dict) else error
    except ValueError:
        text = reply.text
    return " ".join(str(text).split())[:200] or "(no message)"
