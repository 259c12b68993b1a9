"""The words held once (``WordArena``) and the alphabetical index that reads through it, against
plain lists and brute force on random vocabularies in several scripts."""
from __future__ import annotations

import random

import numpy as np
import pytest

from online.search import word_lookup
from online.search.word_lookup import AlphaIndex, WordArena, WordsView

ALPHABETS = ["abcxyz", "äöüß", "日本語中文", "🙂🚀", "-_/,#% ", "\u05d0\u05d1"]


def _word(rng: random.Random) -> str:
    return "".join(rng.choice(rng.choice(ALPHABETS)) for _ in range(rng.randint(0, 6)))


@pytest.mark.parametrize("seed", range(4))
def test_the_arena_names_the_rows_whose_word_differs_as_string_comparison_does(seed):
    """``unequal`` compares UTF-8 bytes in numpy; it must agree with ``!=`` on the strings in every
    script, on lengths that differ and on equal lengths whose bytes differ, and the arena still grows."""
    rng = random.Random(seed)
    words = [_word(rng) for _ in range(2000)] + ["\ud800lone"]
    arena = WordArena(words)
    rows = np.array(rng.sample(range(len(words)), 600) + [0, 0], np.int64)
    given = []
    for r in rows.tolist():
        w = words[r]
        roll = rng.random()
        if roll < 0.2 and w:                                   # same length, one character changed
            i = rng.randrange(len(w))
            given.append(w[:i] + ("x" if w[i] != "x" else "y") + w[i + 1:])
        elif roll < 0.3:
            given.append(w + rng.choice("a日🙂"))               # longer
        else:
            given.append(w)
    expected = [i for i, (r, w) in enumerate(zip(rows.tolist(), given)) if words[r] != w]
    assert expected and arena.unequal(rows, given).tolist() == expected
    assert arena.unequal(np.zeros(0, np.int64), []).tolist() == []
    arena.extend(["after"])                                    # no buffer export outlived the call
    assert arena[len(words)] == "after"


def test_a_key_that_comes_back_with_another_word_is_served_under_it():
    """A delta may carry a known key with another spelling (a hash collision, a source's fix-up): the
    sync finds it among the changed rows and serves the new word, by row and by prefix."""
    from online.learner.keys import word_keys
    from online.search.delta import ModelDelta
    from online.search.model_index import ModelIndex

    words = [f"w{i}" for i in range(50)] + ["東京"]
    keys = word_keys(words)
    vectors = np.random.default_rng(0).standard_normal((len(words), 8)).astype(np.float32)
    index = ModelIndex.from_arrays(1, keys, words, vectors)
    changed = [3, 17, 50]
    delta = ModelDelta(keys[changed], ["w3", "renamed", "大阪"], vectors[changed] * 2, np.ones(3, np.int64), 2)
    index = index.apply(delta)
    assert index.words[17] == "renamed" and index.words[50] == "大阪" and index.words[3] == "w3"
    assert [w for w, _ in index.prefix("ren", 5)] == ["renamed"]
    assert [w for w, _ in index.prefix("大", 5)] == ["大阪"] and index.prefix("東", 5) == []


@pytest.mark.parametrize("seed", range(5))
def test_the_arena_gives_back_every_word_as_a_list_would(seed):
    rng = random.Random(seed)
    words = [_word(rng) for _ in range(3000)] + ["\ud800lone"]      # a lone surrogate passes through
    arena = WordArena(words[:1000])
    arena.extend(words[1000:])
    assert len(arena) == len(words) and [arena[r] for r in range(len(words))] == words
    assert arena.tolist() == words and arena.tolist(17) == words[:17]
    ascii_words = [w.encode("ascii", "ignore").decode() for w in words]
    assert WordArena(ascii_words).tolist() == ascii_words               # the one-pass ASCII path
    view = WordsView(arena, 2000)
    assert len(view) == 2000 and list(view) == words[:2000] and view[-1] == words[1999] and view[5:9] == words[5:9]
    with pytest.raises(IndexError):
        view[2000]
    arena.truncate(1500)                                                  # the head drops rows beyond its n
    arena.extend(["new"])
    assert arena.tolist() == words[:1500] + ["new"] and view[1499] == words[1499]


@pytest.mark.parametrize("seed", range(4))
def test_prefix_search_through_the_arena_matches_brute_force_across_merges(seed, monkeypatch):
    monkeypatch.setattr(word_lookup, "MERGE_MIN", 50)            # merge the recent level often
    monkeypatch.setattr(word_lookup, "MERGE_FRACTION", 4)
    rng = random.Random(seed)
    words = list(dict.fromkeys(_word(rng) for _ in range(800)))
    arena = WordArena(words[:300])
    alpha = AlphaIndex.build(words[:300], WordsView(arena, 300))
    n = 300
    counts = np.array([rng.randint(0, 5) for _ in words], np.int64)
    while n < len(words):
        fresh = words[n:n + rng.randint(1, 90)]
        arena.extend(fresh)
        rows = np.arange(n, n + len(fresh))
        n += len(fresh)
        alpha = alpha.with_rows(fresh, rows, WordsView(arena, n))
        assert alpha.words() == sorted(words[:n])
        assert [words[r] for r in alpha.rows().tolist()] == sorted(words[:n])
        view = WordsView(arena, n)
        for prefix in ["", "a", "ä", "日", "🙂", "-", words[rng.randrange(n)][:2]]:
            want = sorted(((w, int(counts[r])) for r, w in enumerate(words[:n]) if w.startswith(prefix)),
                          key=lambda x: (-x[1], x[0]))
            assert alpha.total(prefix) == len(want)
            assert alpha.prefix(prefix, 7, counts, view) == want[:7], prefix
