"""A generated English-like corpus with planted structure, for ``livevec up`` and tests.

The main job must stream something meaningful on a fresh machine that has neither
``../shared`` nor network access, and the tests need corpora whose right answers are
known. So sentences are drawn from topics: each sentence mixes a few words of one
topic with Zipf-distributed function words. Words of a topic co-occur and become
nearest neighbours; ``PLANTED_PAIRS`` always appear side by side (``paris france``), so
they are each other's nearest neighbour once trained. Deterministic for a given seed.
"""
from __future__ import annotations

import random
from collections.abc import Iterator

TOPICS: dict[str, list[str]] = {
    "royalty": ["king", "queen", "prince", "princess", "throne", "crown", "palace", "royal", "reign", "duke"],
    "animals": ["cat", "dog", "puppy", "kitten", "horse", "pony", "cow", "calf", "sheep", "lamb"],
    "weather": ["rain", "snow", "storm", "wind", "cloud", "thunder", "sunny", "forecast", "humid", "fog"],
    "computing": ["kafka", "broker", "partition", "offset", "consumer", "producer", "topic", "cluster",
                  "server", "latency"],
    "music": ["guitar", "piano", "violin", "drums", "melody", "chord", "concert", "orchestra", "song", "album"],
    "food": ["bread", "butter", "cheese", "pasta", "tomato", "garlic", "soup", "salad", "kitchen", "recipe"],
    "sport": ["football", "goal", "striker", "referee", "stadium", "league", "match", "coach", "team", "score"],
    "space": ["planet", "orbit", "rocket", "astronaut", "galaxy", "comet", "telescope", "moon", "mars", "nasa"],
}

# Pairs that always occur together, each with context words of its own: the two words of
# a pair predict the same contexts, so each is the other's nearest neighbour after training.
PLANTED_CONTEXTS: dict[tuple[str, str], list[str]] = {
    ("paris", "france"): ["seine", "louvre", "eiffel"],
    ("berlin", "germany"): ["spree", "bundestag", "brandenburg"],
    ("tokyo", "japan"): ["shinjuku", "sumida", "yen"],
    ("rome", "italy"): ["tiber", "colosseum", "vatican"],
    ("madrid", "spain"): ["prado", "castile", "peseta"],
    ("lisbon", "portugal"): ["tagus", "alfama", "escudo"],
    ("oslo", "norway"): ["fjord", "krone", "storting"],
    ("cairo", "egypt"): ["nile", "giza", "pharaoh"],
}
PLANTED_PAIRS: list[tuple[str, str]] = list(PLANTED_CONTEXTS)

FUNCTION_WORDS = ["the", "of", "and", "to", "in", "a", "is", "that", "for", "it", "as", "was", "with", "on",
                  "by", "at", "from", "this", "be", "are", "or", "an", "which", "one", "two", "three", "new",
                  "has", "had", "were", "not", "but", "also", "its", "after", "first", "their", "his", "her",
                  "they", "can", "more", "some", "about", "when", "there", "been", "would", "many", "other"]


def _zipf_weights(n: int) -> list[float]:
    return [1.0 / (rank + 1) for rank in range(n)]


def iter_sentences(seed: int = 1) -> Iterator[str]:
    """An endless stream of sentences (one line each)."""
    rng = random.Random(seed)
    topics = list(TOPICS.values())
    fw_weights = _zipf_weights(len(FUNCTION_WORDS))
    while True:
        if rng.random() < 0.25:
            pair = rng.choice(PLANTED_PAIRS)
            words = rng.choices(FUNCTION_WORDS, fw_weights, k=rng.randint(2, 5))
            at = rng.randint(0, len(words))
            words[at:at] = [pair[0], pair[1]] if rng.random() < 0.5 else [pair[1], pair[0]]
            for context in rng.sample(PLANTED_CONTEXTS[pair], 2):
                words.insert(rng.randint(0, len(words)), context)
        else:
            topic = rng.choice(topics)
            content = rng.sample(topic, rng.randint(2, 4))
            filler = rng.choices(FUNCTION_WORDS, fw_weights, k=rng.randint(3, 8))
            words = content + filler
            rng.shuffle(words)
        yield " ".join(words)


def planted_groups() -> list[list[str]]:
    """Each planted pair with its context words: after training, a word's nearest
    neighbours are the other members of its group."""
    return [[a, b, *ctx] for (a, b), ctx in PLANTED_CONTEXTS.items()]


def planting_sentences(new_word: str, anchor: str, n: int, rng: random.Random) -> list[str]:
    """``n`` sentences like the corpus's sentences about ``anchor`` (a word of a planted
    pair), with ``new_word`` in its place: the two then share every context, so a learner
    that has seen only these sentences of ``new_word`` should put it next to ``anchor``.
    The freshness benchmark and the learner's burst test plant words this way."""
    (a, b), contexts = next((pair, ctx) for pair, ctx in PLANTED_CONTEXTS.items() if anchor in pair)
    partner = b if anchor == a else a
    lines = []
    for _ in range(n):
        words = rng.choices(FUNCTION_WORDS, k=rng.randint(2, 5))
        at = rng.randint(0, len(words))
        words[at:at] = [new_word, partner] if rng.random() < 0.5 else [partner, new_word]
        for context in rng.sample(contexts, 2):
            words.insert(rng.randint(0, len(words)), context)
        lines.append(" ".join(words))
    return lines


def generate_lines(n: int, seed: int = 1) -> list[str]:
    it = iter_sentences(seed)
    return [next(it) for _ in range(n)]


def write_corpus(path: str, n_lines: int, seed: int = 1) -> str:
    with open(path, "w", encoding="utf-8") as fh:
        for line in generate_lines(n_lines, seed):
            fh.write(line + "\n")
    return path
