"""The limits of a request's query parameters: the handlers refuse what exceeds them with a 400, and the
OpenAPI document (``openapi``) states them, so a client can know them before it asks."""
from __future__ import annotations

MAX_WORD_LENGTH = 1000
MAX_PREFIX_LENGTH = 200
MAX_VOCAB_LIMIT = 1000
MAX_ANALOGY_PARAM_LENGTH = 4000
MAX_SINCE = 1e11                 # unix seconds (year 5138): later is a typo, not a time
MAX_CHECKPOINT_LENGTH = 40
