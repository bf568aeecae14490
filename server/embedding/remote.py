"""An OpenAI-compatible ``/embeddings`` endpoint (Ollama, vLLM, TEI, hosted APIs) as the embedder.

Texts go ``batch_size`` to a request; the requests of one call go out side by side, up to
``concurrency`` at a time (one pool of threads per embedder, so concurrent creates share the
limit). A request that timed out, could not connect, or was answered 5xx or 429 is tried again
after an exponential backoff with jitter (429's ``Retry-After`` when it gives seconds), up to
``attempts`` tries, within the call's time budget (``total_timeout``, by default ``timeout``: a
call never waits longer than that, so a request that timed out is tried again only when the
budget is larger than one request's ``timeout``). A circuit breaker (``breaker.py``) stops calling
an endpoint that failed ``breaker_failures`` calls in a row for ``breaker_cooldown_seconds``.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import logging
import random
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from email.message import Message

import numpy as np

from tiermem.server.embedding.base import Embedded, EmbedderError, EmbedderSettingError, one
from tiermem.server.embedding.breaker import CircuitBreaker

logger = logging.getLogger(__name__)

# Answers that blame the input, not the endpoint: the call fails, the breaker counts it as an answer.
_INPUT_ERRORS = frozenset({400, 413, 422})
_MIN_ATTEMPT_SECONDS = 0.05  # no retry when less than this would be left for it


class _Failed(Exception):
    """One request failed: whether trying again may help, whether the endpoint answered sensibly
    (the breaker then counts a success), and the wait the endpoint asked for."""

    def __init__(
        self, why: str, retryable: bool, endpoint_ok: bool = False, retry_after: float | None = None
    ) -> None:
        super().__init__(why)
        self.retryable, self.endpoint_ok, self.retry_after = retryable, endpoint_ok, retry_after


class OpenAIEmbedder:
    """POSTs {"model", "input": [texts]} to ``<url>/embeddings`` and reads ``data[i].embedding``
    (ordered by ``data[i].index`` when given)."""

    def __init__(
        self,
        url: str,
        model: str,
        api_key: str = "",
        timeout: float = 10.0,
        *,
        batch_size: int = 64,
        concurrency: int = 4,
        attempts: int = 3,
        backoff_seconds: float = 0.25,
        max_backoff_seconds: float = 4.0,
        total_timeout: float | None = None,
        breaker_failures: int = 3,
        breaker_cooldown_seconds: float = 30.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if not url or not model:
            raise EmbedderSettingError("the openai embedder needs embedder_url and embedder_model")
        if not timeout > 0 or (total_timeout is not None and not total_timeout > 0):
            raise EmbedderSettingError("the openai embedder needs timeouts > 0")
        if batch_size < 1 or concurrency < 1 or attempts < 1:
            raise EmbedderSettingError("the openai embedder needs batch_size, concurrency and attempts >= 1")
        self.url = url.rstrip("/") + ("" if url.rstrip("/").endswith("/embeddings") else "/embeddings")
        self.model = model
        self.api_key = api_key
        self.timeout = timeout
        self.total_timeout = timeout if total_timeout is None else total_timeout
        self.batch_size = batch_size
        self.concurrency = concurrency
        self.attempts = attempts
        self.backoff_seconds = backoff_seconds
        self.max_backoff_seconds = max_backoff_seconds
        self.clock = clock
        self.breaker = CircuitBreaker(self.url, breaker_failures, breaker_cooldown_seconds, clock)
        self._pool: ThreadPoolExecutor | None = None
        self._pool_lock = threading.Lock()

    def embed(self, text: str) -> np.ndarray:
        return one(self.embed_many([text])[0])

    def embed_many(self, texts: Sequence[str]) -> list[Embedded]:
        """Each text's vector, or the error of the request its batch was in."""
        if not texts:
            return []
        deadline = self.clock() + self.total_timeout
        batches = [list(texts[i : i + self.batch_size]) for i in range(0, len(texts), self.batch_size)]
        if len(batches) == 1:
            answers = [self._batch(batches[0], deadline)]
        else:
            pool = self._threads()
            answers = [f.result() for f in [pool.submit(self._batch, b, deadline) for b in batches]]
        out: list[Embedded] = []
        for batch, answer in zip(batches, answers, strict=True):
            out += [answer] * len(batch) if isinstance(answer, EmbedderError) else answer
        return out

    def close(self) -> None:
        """Stop the request threads (the embedder still works: they start again when needed)."""
        with self._pool_lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=False, cancel_futures=True)

    def _threads(self) -> ThreadPoolExecutor:
        with self._pool_lock:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(self.concurrency, thread_name_prefix="tiermem-embed")
            return self._pool

    def _batch(self, texts: list[str], deadline: float) -> list[Embedded] | EmbedderError:
        """One batch's vectors (through the breaker, with retries), or why there are none."""
        if self.clock() >= deadline:  # (it waited that long for a free request thread)
            return EmbedderError(f"embedding endpoint {self.url}: no time left to send the request")
        wait = self.breaker.wait_left()
        if wait is not None:
            when = f"for {wait:.1f} s more" if wait > 0 else "while a trial request is under way"
            return EmbedderError(
                f"embedding endpoint {self.url} failed {self.breaker.failed_in_a_row} times in a row: "
                f"not called {when}"
            )
        endpoint_ok = False
        try:
            vectors = self._with_retries(texts, deadline)
            endpoint_ok = True
            return list(vectors)
        except _Failed as e:
            endpoint_ok = e.endpoint_ok
            return EmbedderError(f"embedding endpoint {self.url} failed: {e}")
        finally:
            self.breaker.record(endpoint_ok)

    def _with_retries(self, texts: list[str], deadline: float) -> list[np.ndarray]:
        attempt = 0
        while True:
            attempt += 1
            left = deadline - self.clock()
            if left <= 0:
                raise _Failed(f"no time left after {attempt - 1} attempts", retryable=False)
            try:
                return self._post(texts, min(self.timeout, left))
            except _Failed as e:
                if not e.retryable or attempt >= self.attempts:
                    raise
                delay = self._backoff(attempt, e.retry_after)
                if self.clock() + delay + _MIN_ATTEMPT_SECONDS > deadline:
                    raise
                logger.debug("embedding request failed (%s), trying again in %.2f s", e, delay)
                time.sleep(delay)

    def _backoff(self, attempt: int, retry_after: float | None) -> float:
        if retry_after is not None:
            return retry_after
        backoff = min(self.max_backoff_seconds, self.backoff_seconds * 2 ** (attempt - 1))
        return backoff * random.uniform(0.5, 1.0)  # (jitter: concurrent callers spread out)

    def _post(self, texts: list[str], timeout: float) -> list[np.ndarray]:
        body = json.dumps({"model": self.model, "input": texts}).encode()
        headers = {"Content-Type": "application/json"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        request = urllib.request.Request(self.url, data=body, headers=headers, method="POST")
        try:
            with urllib.request.urlopen(request, timeout=timeout) as response:
                raw = response.read()
        except urllib.error.HTTPError as e:
            with contextlib.closing(e):
                status = e.code
                raise _Failed(
                    f"HTTP {status}",
                    retryable=status == 429 or status >= 500,
                    endpoint_ok=status in _INPUT_ERRORS,
                    retry_after=_retry_after(e.headers) if status == 429 else None,
                ) from e
        except TimeoutError as e:
            raise _Failed(f"no answer within {timeout:.2f} s", retryable=True) from e
        except urllib.error.URLError as e:  # (connecting: refused, unreachable, timed out)
            raise _Failed(str(e.reason), retryable=True) from e
        except (http.client.HTTPException, OSError) as e:  # (the connection broke mid-answer)
            raise _Failed(f"{type(e).__name__}: {e}", retryable=True) from e
        return _vectors(raw, len(texts))


def _vectors(raw: bytes, count: int) -> list[np.ndarray]:
    """The vectors of an /embeddings answer, in input order; a nonsense answer raises _Failed."""
    try:
        data = json.loads(raw)["data"]
        if not isinstance(data, list) or len(data) != count:
            raise ValueError(f"{count} embeddings asked for, {len(data)} returned")
        if all(isinstance(d, dict) and "index" in d for d in data):
            data = sorted(data, key=lambda d: int(d["index"]))
        vectors = [np.asarray(d["embedding"], dtype=np.float32) for d in data]
    except (ValueError, KeyError, IndexError, TypeError) as e:
        raise _Failed(f"an unreadable answer: {e}", retryable=False) from e
    dim = vectors[0].shape[0] if vectors and vectors[0].ndim == 1 else 0
    for v in vectors:
        if v.ndim != 1 or v.shape[0] == 0 or v.shape[0] != dim or not np.all(np.isfinite(v)):
            raise _Failed("an invalid vector (empty, not finite, or of another dimension)", retryable=False)
    return vectors


def _retry_after(headers: Message | None) -> float | None:
    """The seconds of a Retry-After header (its HTTP-date form is ignored)."""
    value = headers.get("Retry-After") if headers is not None else None
    try:
        seconds = float(value) if value is not None else None
    except ValueError:
        return None
    return max(0.0, seconds) if seconds is not None and seconds == seconds else None
