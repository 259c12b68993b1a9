"""A gensim-compatible client of the front end: ``KeyedVectors`` reads answered over HTTP.

Owns ``LiveKeyedVectors`` (blocking, ``http.client`` with a keep-alive pool) and its twin
``AsyncLiveKeyedVectors`` (aiohttp), the operations both run (``operations``, written once,
without I/O), the retry policy, the errors, and the reader of the ``/v1/export`` stream that
``to_keyed_vectors()`` turns into a real ``gensim.models.KeyedVectors``.

May import: nothing from ``online`` or ``ps_bridge``. It speaks to the front end only over
HTTP, so it can be installed and used where none of the server side is (numpy, orjson and
aiohttp are its only dependencies; gensim only for ``to_keyed_vectors``).
"""
from online.client.errors import (AuthenticationError, LiveVecError, RequestError, RequestTimeout,
                                  ServiceUnavailable)
from online.client.sync_client import LiveKeyedVectors

__all__ = ["LiveKeyedVectors", "AsyncLiveKeyedVectors", "LiveVecError", "AuthenticationError",
           "ServiceUnavailable", "RequestError", "RequestTimeout"]


def __getattr__(name: str):
    # aiohttp takes 0.4 s to import; a script using the blocking client does not pay for it
    if name == "AsyncLiveKeyedVectors":
        from online.client.async_client import AsyncLiveKeyedVectors
        return AsyncLiveKeyedVectors
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
