"""``AsyncLiveKeyedVectors``: the same reads as ``LiveKeyedVectors``, as coroutines on aiohttp.

Why a twin and not ``asyncio.to_thread`` around the blocking client: an asyncio service (an
aiohttp handler, a Kafka consumer) asking for many words at once should not need a thread
per request, and aiohttp's connector already pools kept-alive connections. The operations
are the same objects as the blocking client's (``online.client.operations``), so the two
cannot disagree; only this file's transport differs. Calls that need several vectors are
sent concurrently (at most ``pool_size`` connections at a time).

Spelling: every method is awaited (``await kv.most_similar("paris")``, ``await kv["paris"]``),
and so are the attributes that need the network (``await kv.index_to_key``,
``await kv.vector_size``). ``in`` and ``len()`` cannot wait, so they are
``await kv.has_index_for(word)`` and ``await kv.vocab_size``.
"""
from __future__ import annotations

import asyncio
import ssl
from collections.abc import Awaitable
from typing import Any

import aiohttp
import numpy as np
from yarl import URL

from online.client import evaluation, operations as ops
from online.client.errors import IncompleteExport, RequestTimeout, ServiceUnavailable, error_for
from online.client.protocol import RETRY_STATUSES, Call, Endpoint, Operation, Reply, RetryPolicy, request_headers
from online.client.word2vec_stream import require_gensim, to_gensim

_READ_CHUNK = 1 << 16
# aiohttp's connect failures, a peer that went away, a body cut short; a read timeout is not here
_BROKEN = (aiohttp.ClientConnectorError, aiohttp.ConnectionTimeoutError, aiohttp.ServerDisconnectedError,
           aiohttp.ClientOSError, aiohttp.ClientPayloadError, IncompleteExport, ConnectionError)


class AsyncLiveKeyedVectors:
    """See ``LiveKeyedVectors`` for the arguments; use ``async with`` or ``await kv.close()``."""

    def __init__(self, url: str, timeout: float = 10.0, retries: int = 3, token: str | None = None, *,
                 backoff: float = 0.1, max_backoff: float = 5.0, pool_size: int = 8, batch_words: int = 500,
                 ssl_context: ssl.SSLContext | None = None):
        self.endpoint = Endpoint.parse(url)
        self.retry = RetryPolicy(retries, backoff, max_backoff)
        self.batch_words = batch_words
        self.retries_made = 0
        self.timeout = timeout
        self._token = token
        self._pool_size, self._ssl = pool_size, ssl_context
        self._session: aiohttp.ClientSession | None = None
        self._vocab: ops.Vocabulary | None = None

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.endpoint.url!r})"

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def __aenter__(self) -> "AsyncLiveKeyedVectors":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.close()

    # ------------------------------------------------------------ transport
    def _client(self) -> aiohttp.ClientSession:
        """Made on first use: a session belongs to the running loop, which ``__init__`` may not have."""
        if self._session is None:
            connector = aiohttp.TCPConnector(limit=self._pool_size, ssl=self._ssl if self._ssl else True)
            self._session = aiohttp.ClientSession(
                connector=connector, timeout=aiohttp.ClientTimeout(total=None, sock_connect=self.timeout,
                                                                   sock_read=self.timeout))
        return self._session

    async def _run(self, op: Operation) -> Any:
        try:
            call = next(op)
            while True:
                if isinstance(call, list):
                    try:
                        async with asyncio.TaskGroup() as group:       # one failure cancels the rest
                            tasks = [group.create_task(self._call(c)) for c in call]
                    except BaseExceptionGroup as failed:   # the caller expects the error itself, as from one call
                        raise failed.exceptions[0] from None
                    call = op.send([t.result() for t in tasks])
                else:
                    call = op.send(await self._call(call))
        except StopIteration as done:
            return done.value

    async def _call(self, call: Call) -> Reply:
        failure: BaseException | Reply | None = None
        for attempt in range(self.retry.retries + 1):
            if attempt:
                self.retries_made += 1
                hint = failure.headers.get("retry-after") if isinstance(failure, Reply) else None
                await asyncio.sleep(self.retry.delay(attempt - 1, hint))
            try:
                reply = await self._attempt(call)
            except _BROKEN as exc:
                failure = exc
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

    async def _attempt(self, call: Call) -> Reply:
        url = URL(self.endpoint.url + call.path, encoded=True)    # as encoded: '..' is a word, not a step up
        try:
            async with self._client().request(call.method, url, data=call.body,
                                              headers=request_headers(self._token, call.body)) as response:
                headers = {k.lower(): v for k, v in response.headers.items()}
                if call.sink is not None and response.status == 200:
                    sink = call.sink(headers)
                    async for data in response.content.iter_chunked(_READ_CHUNK):
                        sink.feed(data)
                    body = sink.finish()
                else:
                    body = await response.read()
                return Reply(response.status, headers, body)
        except aiohttp.SocketTimeoutError as exc:
            raise RequestTimeout(f"{self.endpoint.url + call.path}: no answer within {self.timeout:g} s") from exc

    # ---------------------------------------------------- KeyedVectors reads
    async def most_similar(self, positive: Any = None, negative: Any = None, topn: int | None = 10,
                           clip_start: int = 0, clip_end: int | None = None, restrict_vocab: int | None = None,
                           indexer: Any = None) -> list[tuple[str, float]]:
        return await self._run(ops.most_similar(positive, negative, topn, clip_start, clip_end, restrict_vocab,
                                                indexer))

    async def similar_by_word(self, word: str, topn: int = 10,
                              restrict_vocab: int | None = None) -> list[tuple[str, float]]:
        return await self.most_similar(word, topn=topn, restrict_vocab=restrict_vocab)

    similar_by_key = similar_by_word

    async def similar_by_vector(self, vector: np.ndarray, topn: int = 10,
                                restrict_vocab: int | None = None) -> list[tuple[str, float]]:
        return await self.most_similar(positive=[vector], topn=topn, restrict_vocab=restrict_vocab)

    async def most_similar_cosmul(self, positive: Any = None, negative: Any = None, topn: int | None = 10,
                                  restrict_vocab: int | None = None) -> list[tuple[str, float]]:
        return await self._run(ops.most_similar_cosmul(positive, negative, topn, restrict_vocab))

    async def closer_than(self, key1: str, key2: str) -> list[str]:
        return await self._run(ops.closer_than(key1, key2))

    async def words_closer_than(self, word1: str, word2: str) -> list[str]:
        return await self.closer_than(word1, word2)

    async def rank(self, key1: str, key2: str) -> int:
        return len(await self.closer_than(key1, key2)) + 1

    async def n_similarity(self, ws1: list[str], ws2: list[str]) -> np.float32:
        return await self._run(ops.n_similarity(ws1, ws2))

    async def distance(self, w1: str, w2: str) -> np.float32:
        return await self._run(ops.distance(w1, w2))

    async def distances(self, word_or_vector: Any, other_words: Any = ()) -> np.ndarray:
        return await self._run(ops.distances(word_or_vector, other_words))

    async def evaluate_word_analogies(self, analogies: str, restrict_vocab: int = 300000,
                                      case_insensitive: bool = True, dummy4unknown: bool = False,
                                      similarity_function: str = "most_similar") -> tuple:
        return await self._run(evaluation.evaluate_word_analogies(
            await self._vocabulary(), analogies, restrict_vocab, case_insensitive, dummy4unknown,
            similarity_function))

    async def evaluate_word_pairs(self, pairs: str, delimiter: str = "\t", encoding: str = "utf8",
                                  restrict_vocab: int = 300000, case_insensitive: bool = True,
                                  dummy4unknown: bool = False) -> tuple:
        return await self._run(evaluation.evaluate_word_pairs(await self._vocabulary(), pairs, delimiter, encoding,
                                                              restrict_vocab, case_insensitive, dummy4unknown))

    async def most_similar_many(self, words: list[str], topn: int = 10, strict: bool = True) -> list:
        return await self._run(ops.most_similar_many(words, topn, self.batch_words, strict))

    async def similarity(self, w1: str, w2: str) -> np.float32:
        return await self._run(ops.similarity(w1, w2))

    async def doesnt_match(self, words: list[str]) -> str:
        return await self._run(ops.doesnt_match(words))

    async def get_vector(self, key: str, norm: bool = False) -> np.ndarray:
        return await self._run(ops.get_vector(key, norm))

    def __getitem__(self, key_or_keys: Any) -> Awaitable[np.ndarray]:
        if isinstance(key_or_keys, str):
            return self.get_vector(key_or_keys)
        return self._run(ops.get_vectors(list(key_or_keys)))

    async def has_index_for(self, key: Any) -> bool:
        return await self._run(ops.has_index_for(key))

    def __contains__(self, key: Any) -> bool:
        raise TypeError("'in' cannot wait for the network: use 'await kv.has_index_for(word)'")

    def __len__(self) -> int:
        raise TypeError("len() cannot wait for the network: use 'await kv.vocab_size'")

    async def _vocabulary(self) -> ops.Vocabulary:
        self._vocab = await self._run(ops.vocabulary(self._vocab))
        return self._vocab

    async def _index_to_key(self) -> list[str]:
        return (await self._vocabulary()).index_to_key

    async def _key_to_index(self) -> dict[str, int]:
        return (await self._vocabulary()).key_to_index

    async def _shape(self, i: int) -> int:
        return (await self._run(ops.model_shape()))[i]

    @property
    def index_to_key(self) -> Awaitable[list[str]]:
        return self._index_to_key()

    @property
    def key_to_index(self) -> Awaitable[dict[str, int]]:
        return self._key_to_index()

    @property
    def vector_size(self) -> Awaitable[int]:
        return self._shape(1)

    @property
    def vocab_size(self) -> Awaitable[int]:
        return self._shape(0)

    async def to_keyed_vectors(self):
        """As ``LiveKeyedVectors.to_keyed_vectors``; building the gensim object runs in a thread."""
        require_gensim()
        snap = await self._run(ops.snapshot())
        return await asyncio.to_thread(to_gensim, snap, self.endpoint.url)
