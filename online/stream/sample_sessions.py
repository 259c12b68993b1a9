"""Generated shopping sessions as JSON records, with planted co-purchases: the item2vec demo.

``livevec up --demo sessions`` streams these (``LIVEVEC_RECORD_FORMAT=json``, ``LIVEVEC_RECORD_FIELD=items``,
``LIVEVEC_TOKENIZER=tokens``) to show a stream that is not prose: each record is an event such as
``{"user": "u-1042", "ts": 1764745200, "items": ["sku-10417", "sku-tent-2p", "sku-camp-stove"]}``. Items are
drawn from a catalogue with Zipf popularity; ``PLANTED_BUNDLES`` are bought together (two or three of a
bundle side by side in a session), so each item of a bundle has the others as nearest neighbours once
trained, and their IDs come back byte for byte. Deterministic for a given seed, like
``online.stream.sample_corpus``.
"""
from __future__ import annotations

import random
from collections.abc import Iterator

import orjson

PLANTED_BUNDLES: list[tuple[str, ...]] = [
    ("sku-tent-2p", "sku-sleeping-bag", "sku-camp-stove"),
    ("sku-espresso-machine", "sku-coffee-grinder", "sku-milk-jug"),
    ("sku-phone-x12", "sku-case-x12", "sku-charger-usb-c"),
    ("sku-yoga-mat", "sku-yoga-block", "sku-water-bottle"),
    ("sku-printer-p300", "sku-ink-p300-black", "sku-ink-p300-color"),
    ("sku-kids-bike", "sku-kids-helmet", "sku-bike-bell"),
]
CATALOGUE_SIZE = 2000


def catalogue_item(rank: int) -> str:
    return f"sku-{10000 + rank}"


def iter_sessions(seed: int = 1) -> Iterator[dict]:
    """An endless stream of sessions (dicts with ``user``, ``ts`` and ``items``)."""
    rng = random.Random(seed)
    weights = [1.0 / (rank + 1) for rank in range(CATALOGUE_SIZE)]
    ts = 1_764_745_200
    while True:
        items = [catalogue_item(r) for r in rng.choices(range(CATALOGUE_SIZE), weights, k=rng.randint(2, 6))]
        if rng.random() < 0.4:
            bundle = list(rng.choice(PLANTED_BUNDLES))
            rng.shuffle(bundle)
            at = rng.randint(0, len(items))
            items[at:at] = bundle[:rng.randint(2, 3)]
        ts += rng.randint(1, 30)
        yield {"user": f"u-{rng.randint(1000, 9999)}", "ts": ts, "items": items}


def generate_session_records(n: int, seed: int = 1) -> list[str]:
    """``n`` sessions as JSON lines (records)."""
    out: list[str] = []
    for session in iter_sessions(seed):
        if len(out) >= n:
            break
        out.append(orjson.dumps(session).decode())
    return out
