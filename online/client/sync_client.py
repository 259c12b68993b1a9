"""``LiveKeyedVectors``: gensim's ``KeyedVectors`` read methods, answered by a running front end.

Why ``http.client`` and a pool of our own: the client must not pull in a dependency the
project does not have (requests, urllib3), and a new TCP connection per call would cost
more than most calls (a neighbour query is answered in well under a millisecond). Idle
connections are kept (LIFO, so the warm ones are reused) up to ``pool_size``; one that the
server closed while idle (its keep-alive timeout) is noticed on the next use and that call
is sent again at once on a new connection, without counting as a retry. The object is safe
to share between threads: each call takes its own connection from the pool.
"""
from __future__ import annotations

import http.client
import ssl
import threading
import time
from typing import Any

import numpy as np

from online.client import evaluation, operations as ops
from online.client.errors import RequestTimeout, ServiceUnavailable, error_for
from online.client.protocol import RETRY_STATUSES, Call, Endpoint, Operation, Reply, RetryPolicy, request_headers
from online.client.word2vec_stream import require_gensim, to_gensim

_READ_CHUNK = 1 << 16
_STALE = (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError)
_BROKEN = (ConnectionError, http.client.IncompleteRead)   # the exchange broke off: worth sending again


class _Unreachable(Exception):
    """Connecting failed (refused, reset, no route, DNS, connect timeout): always worth a retry."""


class _Pool:
    def __init__(self, endpoint: Endpoint, timeout: float, size: int, ssl_context: ssl.SSLContext | None):
        self.endpoint, self.timeout, self.size, self.ssl_context = endpoint, timeout, size, ssl_context
        self._idle: list[http.client.HTTPConnection] = []
        self._lock = threading.Lock()

    def take(self) -> tuple[http.client.HTTPConnection, bool]:
        with self._lock:
            if self._idle:
                return self._idle.pop(), True
        e = self.endpoint
        if e.scheme == "https":
            conn = http.client.HTTPSConnection(e.host, e.port, timeout=self.timeout, context=self.ssl_context)
        else:
            conn = http.client.HTTPConnection(e.host, e.port, timeout=self.timeout)
        try:
            conn.connect()
        except OSError as exc:
            conn.close()
            raise _Unreachable(exc) from exc
        return conn, False

    def give_back(self, conn: http.client.HTTPConnection) -> None:
        with self._lock:
            if len(self._idle) < self.size:
                self._idle.append(conn)
                return
        conn.close()

    def close(self) -> None:
        with self._lock:
            idle, self._idle = self._idle, []
        for conn in idle:
            conn.close()


class LiveKeyedVectors:
    """A read-only ``KeyedVectors`` over HTTP. ``url`` is the front end's base URL; ``token`` its
    bearer token when it has one. Every call is retried ``retries`` times on connection errors and
    502/503/504 (backoff from ``backoff`` doubling to ``max_backoff`` seconds, or the server's
    Retry-After); ``timeout`` bounds connecting and each wait for bytes. Unknown words raise
    ``KeyError``; the other failures are in ``online.client.errors``."""

    def __init__(self, url: str, timeout: float = 10.0, retries: int = 3, token: str | None = None, *,
                 backoff: float = 0.1, max_backoff: float = 5.0, pool_size: int = 8, batch_words: int = 500,
                 ssl_context: ssl.SSLContext | None = None):
        self.endpoint = Endpoint.parse(url)
        self.retry = RetryPolicy(retries, backoff, max_backoff)
        self.batch_words = batch_words
        self.retries_made = 0                    # calls sent again after a failure, for whoever is curious
        self._token = token
        self._pool = _Pool(self.endpoint, timeout, pool_size, ssl_context)
        self._vocab: ops.Vocabulary | None = None

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.endpoint.url!r})"

    def close(self) -> None:
        self._pool.close()

    def __enter__(self) -> "LiveKeyedVectors":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # ------------------------------------------------------------ transport
    def _run(self, op: Operation) -> Any:
        try:
            call = next(op)
            while True:
                call = op.send([self._call(c) for c in call] if isinstance(call, list) else self._call(call))
        except StopIteration as done:
            return done.value

    def _call(self, call: Call) -> Reply:
        failure: BaseException | Reply | None = None
        for attempt in range(self.retry.retries + 1):
            if attempt:
                self.retries_made += 1
                hint = failure.headers.get("retry-after") if isinstance(failure, Reply) else None
                time.sleep(self.retry.delay(attempt - 1, hint))
            try:
                reply = self._attempt(call)
            except (_Unreachable, *_BROKEN) as exc:
                failure = exc.__cause__ if isinstance(exc, _Unreachable) else exc
                continue
            if reply.status in RETRY_STATUSES:
                failure = reply
                continue
            if reply.status not in call.accept:
                raise error_for(self.endpoint.url + call.path, reply.status, reply.body, self._token is not None)
            return reply
        url = self.endpoint.url + call.path
        if isinstance(failure, Reply):
            raise error_for(url, failure.status, failure.body, self._token is not None)
        raise ServiceUnavailable(f"{url}: no answer after {self.retry.retries + 1} attempts: {failure!r}") \
            from failure

    def _attempt(self, call: Call) -> Reply:
        headers = request_headers(self._token, call.body)
        path = self.endpoint.prefix + call.path
        while True:                             # ends: each stale connection leaves the pool for good
            conn, reused = self._pool.take()
            try:
                conn.request(call.method, path, body=call.body, headers=headers)
                response = conn.getresponse()
            except _STALE:
                conn.close()
                if reused:                      # closed by the server while idle: again, on the next one
                    continue
                raise
            except TimeoutError as exc:
                conn.close()
                raise RequestTimeout(f"{self.endpoint.url + call.path}: no answer within "
                                     f"{self._pool.timeout:g} s") from exc
            except BaseException:
                conn.close()
                raise
            return self._read(conn, call, response)

    def _read(self, conn: http.client.HTTPConnection, call: Call, response: http.client.HTTPResponse) -> Reply:
        headers = {k.lower(): v for k, v in response.getheaders()}
        try:
            if call.sink is not None and response.status == 200:
                sink = call.sink(headers)
                while data := response.read(_READ_CHUNK):
                    sink.feed(data)
                body = sink.finish()
            else:
                body = response.read()
        except TimeoutError as exc:
            conn.close()
            raise RequestTimeout(f"{self.endpoint.url + call.path}: the answer stalled for "
                                 f"{self._pool.timeout:g} s") from exc
        except BaseException:
            conn.close()
            raise
        if response.will_close:
            conn.close()
        else:
            self._pool.give_back(conn)
        return Reply(response.status, headers, body)

    # ---------------------------------------------------- KeyedVectors reads
    def most_similar(self, positive: Any = None, negative: Any = None, topn: int | None = 10, clip_start: int = 0,
                     clip_end: int | None = None, restrict_vocab: int | None = None,
                     indexer: Any = None) -> list[tuple[str, float]]:
        """gensim's: words nearest to the weighted sum of the positive terms minus the negative ones
        (words as unit vectors, numpy vectors as given, ``(term, weight)`` tuples), inputs left out
        (3CosAdd). The terms travel in a JSON body, so a word may hold any character."""
        return self._run(ops.most_similar(positive, negative, topn, clip_start, clip_end, restrict_vocab, indexer))

    def similar_by_word(self, word: str, topn: int = 10, restrict_vocab: int | None = None) -> list[tuple[str, float]]:
        return self.most_similar(word, topn=topn, restrict_vocab=restrict_vocab)

    similar_by_key = similar_by_word

    def similar_by_vector(self, vector: np.ndarray, topn: int = 10,
                          restrict_vocab: int | None = None) -> list[tuple[str, float]]:
        return self.most_similar(positive=[vector], topn=topn, restrict_vocab=restrict_vocab)

    def most_similar_cosmul(self, positive: Any = None, negative: Any = None, topn: int | None = 10,
                            restrict_vocab: int | None = None) -> list[tuple[str, float]]:
        """gensim's 3CosMul (Levy and Goldberg), computed exactly over the live vocabulary."""
        return self._run(ops.most_similar_cosmul(positive, negative, topn, restrict_vocab))

    def closer_than(self, key1: str, key2: str) -> list[str]:
        return self._run(ops.closer_than(key1, key2))

    def words_closer_than(self, word1: str, word2: str) -> list[str]:
        return self.closer_than(word1, word2)

    def rank(self, key1: str, key2: str) -> int:
        return len(self.closer_than(key1, key2)) + 1

    def n_similarity(self, ws1: list[str], ws2: list[str]) -> np.float32:
        return self._run(ops.n_similarity(ws1, ws2))

    def distance(self, w1: str, w2: str) -> np.float32:
        return self._run(ops.distance(w1, w2))

    def distances(self, word_or_vector: Any, other_words: Any = ()) -> np.ndarray:
        """gensim's; without ``other_words`` it streams the whole model (/v1/export) to have every distance."""
        return self._run(ops.distances(word_or_vector, other_words))

    def evaluate_word_analogies(self, analogies: str, restrict_vocab: int = 300000, case_insensitive: bool = True,
                                dummy4unknown: bool = False, similarity_function: str = "most_similar") -> tuple:
        """gensim's, on the live model (``online.client.evaluation`` says how it is kept to gensim's rules)."""
        return self._run(evaluation.evaluate_word_analogies(self._vocabulary(), analogies, restrict_vocab,
                                                            case_insensitive, dummy4unknown, similarity_function))

    def evaluate_word_pairs(self, pairs: str, delimiter: str = "\t", encoding: str = "utf8",
                            restrict_vocab: int = 300000, case_insensitive: bool = True,
                            dummy4unknown: bool = False) -> tuple:
        return self._run(evaluation.evaluate_word_pairs(self._vocabulary(), pairs, delimiter, encoding,
                                                        restrict_vocab, case_insensitive, dummy4unknown))

    def most_similar_many(self, words: list[str], topn: int = 10, strict: bool = True) -> list:
        """``[most_similar(w, topn=topn) for w in words]`` in one POST per ``batch_words`` words, which
        the front end answers with shared matrix products. ``strict=False``: None for unknown words."""
        return self._run(ops.most_similar_many(words, topn, self.batch_words, strict))

    def similarity(self, w1: str, w2: str) -> np.float32:
        return self._run(ops.similarity(w1, w2))

    def doesnt_match(self, words: list[str]) -> str:
        return self._run(ops.doesnt_match(words))

    def get_vector(self, key: str, norm: bool = False) -> np.ndarray:
        return self._run(ops.get_vector(key, norm))

    def __getitem__(self, key_or_keys: Any) -> np.ndarray:
        if isinstance(key_or_keys, str):
            return self.get_vector(key_or_keys)
        return self._run(ops.get_vectors(list(key_or_keys)))

    def has_index_for(self, key: Any) -> bool:
        return self._run(ops.has_index_for(key))

    def __contains__(self, key: Any) -> bool:
        return self.has_index_for(key)

    def _vocabulary(self) -> ops.Vocabulary:
        self._vocab = self._run(ops.vocabulary(self._vocab))
        return self._vocab

    @property
    def index_to_key(self) -> list[str]:
        """The words, most frequent first; fetched again only when the model version has changed."""
        return self._vocabulary().index_to_key

    @property
    def key_to_index(self) -> dict[str, int]:
        return self._vocabulary().key_to_index

    @property
    def vector_size(self) -> int:
        return self._run(ops.model_shape())[1]

    @property
    def vocab_size(self) -> int:
        return self._run(ops.model_shape())[0]

    def __len__(self) -> int:
        return self.vocab_size

    def to_keyed_vectors(self):
        """A real ``gensim.models.KeyedVectors`` of one model version (streamed from /v1/export; needs gensim)."""
        require_gensim()
        return to_gensim(self._run(ops.snapshot()), self.endpoint.url)
