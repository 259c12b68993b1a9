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

# Pairs that always occur together; each is the other's nearest neighbour after training.
PLANTED_PAIRS: list[tuple[str, str]] = [
    ("paris", "france"), ("berlin", "germany"), ("tokyo", "japan"), ("rome", "italy"),
    ("madrid", "spain"), ("lisbon", "portugal"), ("oslo", "norway"), ("cairo", "egypt"),
]

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
            city, country = rng.choice(PLANTED_PAIRS)
            words = rng.choices(FUNCTION_WORDS, fw_weights, k=rng.randint(3, 7))
            at = rng.randint(0, len(words))
            words[at:at] = [city, country] if rng.random() < 0.5 else [country, city]
        else:
            topic = rng.choice(topics)
            content = rng.sample(topic, rng.randint(2, 4))
            filler = rng.choices(FUNCTION_WORDS, fw_weights, k=rng.randint(3, 8))
            words = content + filler
            rng.shuffle(words)
        yield " ".join(words)


def generate_lines(n: int, seed: int = 1) -> list[str]:
    it = iter_sentences(seed)
    return [next(it) for _ in range(n)]


def write_corpus(path: str, n_lines: int, seed: int = 1) -> str:
    with open(path, "w", encoding="utf-8") as fh:
        for line in generate_lines(n_lines, seed):
            fh.write(line + "\n")
    return path
