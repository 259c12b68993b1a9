"""Generated shopping sessions as JSON records, with planted co-purchases: the item2vec demo.

``livevec up --demo sessions`` streams these (``LIVEVEC_RECORD_FORMAT=json``, ``LIVEVEC_RECORD_FIELD=items``,
``LIVEVEC_TOKENIZER=tokens``) to show a stream that is not prose: each record is an event such as
``{"user": "u-1042", "ts": 1764745200, "items": ["sku-10417", "sku-tent-2p", "sku-camp-stove"]}``. Items are
drawn from a catalogue with Zipf popularity; ``PLANTED_BUNDLES`` are bought together (three or four of a
bundle's five items in a session), so each item of a bundle has the others as nearest neighbours once
trained, and their IDs come back byte for byte. Deterministic for a given seed, like
``online.stream.sample_corpus``.
"""
from __future__ import annotations

import random
from collections.abc import Iterator

import orjson

# Items bought together. A session with a bundle holds three or four of its five items, so any two of them
# share the others as contexts: that, not co-occurrence alone, is what makes SGNS put them side by side.
PLANTED_BUNDLES: list[tuple[str, ...]] = [
    ("sku-tent-2p", "sku-sleeping-bag", "sku-camp-stove", "sku-headlamp", "sku-tent-pegs"),
    ("sku-espresso-machine", "sku-coffee-grinder", "sku-milk-jug", "sku-tamper", "sku-descaler"),
    ("sku-phone-x12", "sku-case-x12", "sku-charger-usb-c", "sku-screen-guard-x12", "sku-cable-usb-c"),
    ("sku-yoga-mat", "sku-yoga-block", "sku-water-bottle", "sku-yoga-strap", "sku-gym-towel"),
    ("sku-printer-p300", "sku-ink-p300-black", "sku-ink-p300-color", "sku-photo-paper", "sku-usb-cable-b"),
    ("sku-kids-bike", "sku-kids-helmet", "sku-bike-bell", "sku-knee-pads", "sku-bike-lock"),
]
CATALOGUE_SIZE = 500


def catalogue_item(rank: int) -> str:
    return f"sku-{10000 + rank}"


def iter_sessions(seed: int = 1) -> Iterator[dict]:
    """An endless stream of sessions (dicts with ``user``, ``ts`` and ``items``)."""
    rng = random.Random(seed)
    weights = [1.0 / (rank + 1) for rank in range(CATALOGUE_SIZE)]
    ts = 1_764_745_200
    while True:
        if rng.random() < 0.4:
            bundle = list(rng.choice(PLANTED_BUNDLES))
            rng.shuffle(bundle)
            items = [catalogue_item(r) for r in rng.choices(range(CATALOGUE_SIZE), weights, k=rng.randint(0, 2))]
            at = rng.randint(0, len(items))
            items[at:at] = bundle[:rng.randint(3, 4)]
        else:
            items = [catalogue_item(r) for r in rng.choices(range(CATALOGUE_SIZE), weights, k=rng.randint(2, 6))]
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
