"""Tokenizer, word keys and the bounded online vocabulary."""
from __future__ import annotations

import hashlib
from collections import Counter

import numpy as np
import pytest

from online.learner.tokenizers import Tokenizer, text8_tokens, unicode_tokens
from online.learner.keys import OUTPUT_BIT, is_input_row, output_rows, word_key, word_keys, word_rows
from online.learner.vocab import OnlineVocab


def test_text8_normalisation_matches_the_text8_script():
    assert text8_tokens("The Cat sat, in 1984!  Köln") == [
        "the", "cat", "sat", "in", "one", "nine", "eight", "four", "k", "ln"]
    assert text8_tokens("") == []


def test_unicode_tokenizer_keeps_non_ascii_words_and_apostrophes():
    assert unicode_tokens("Köln’s ÉCOLE, l'homme; naïve café 東京") == ["köln’s", "école", "l'homme", "naïve", "café",
                                                                      "東京"]


def test_records_are_split_into_sentences_and_long_ones_chunked():
    tok = Tokenizer("unicode", max_sentence_length=3)
    assert tok.sentences("One two. Three four five six!\nSeven") == [
        ["one", "two"], ["three", "four", "five"], ["six"], ["seven"]]
    assert Tokenizer().sentences(b"a b\n\nc") == [["a", "b"], ["c"]]
    assert Tokenizer().sentences(b"caf\xe9 \xff\xfeok") == [["caf", "ok"]]       # invalid UTF-8 splits, never raises
    assert Tokenizer("unicode").sentences(None) == [] and Tokenizer().sentences_of(["a", None, ""]) == [["a"]]
    with pytest.raises(ValueError):
        Tokenizer("whitespace")


def test_word_key_is_blake2b_64_little_endian_with_low_bit_cleared():
    digest = hashlib.blake2b("the".encode(), digest_size=8).digest()
    assert word_key("the") == int.from_bytes(digest, "little") & ~1
    assert word_key("the") == 3331141520948189790        # stable across processes and versions
    keys = word_keys(["the", "köln", "", "東京"])
    assert keys.dtype == np.uint64 and not (keys & np.uint64(1)).any() and is_input_row(keys).all()
    assert int(keys[1]) == word_key("köln")
    assert len({word_key(f"w{i}") for i in range(20000)}) == 20000


def test_a_words_output_row_is_its_key_with_bit_0_set():
    keys = word_keys(["the", "köln", "東京"])
    assert output_rows(keys).tolist() == [k | 1 for k in keys.tolist()]
    assert int(OUTPUT_BIT) == 1
    rows = word_rows(keys)
    assert rows.tolist() == keys.tolist() + [k | 1 for k in keys.tolist()]
    assert is_input_row(rows).tolist() == [True] * 3 + [False] * 3
    assert (rows[3:] - rows[:3]).tolist() == [1, 1, 1]     # side by side: one server's key range holds both


def test_counts_are_exact_and_words_become_trainable_at_min_count():
    vocab = OnlineVocab(capacity=100, min_count=3)
    upd = vocab.update(["a", "b", "a", "c"])
    assert vocab.count("a") == 2 and vocab.count("b") == 1 and vocab.count("zzz") == 0
    assert len(upd.newly_trainable) == 0 and vocab.num_trainable() == 0
    assert list(upd.slots) == [vocab.slot(t) for t in ["a", "b", "a", "c"]]
    upd = vocab.update(["a", "b", "b"])
    assert sorted(vocab.words[s] for s in upd.newly_trainable) == ["a", "b"]
    assert vocab.trainable_total == 6 and vocab.total_tokens == 7
    upd = vocab.update(["a"])
    assert len(upd.newly_trainable) == 0 and vocab.trainable_total == 7
    assert [vocab.words[s] for s in vocab.trainable_slots()] == ["a", "b"]
    assert vocab.keys[vocab.slot("a")] == word_key("a")


def test_stream_counts_match_a_counter_when_the_table_never_fills():
    rng = np.random.default_rng(0)
    tokens = [f"w{int(z)}" for z in rng.zipf(1.3, 20000) if z < 5000]
    vocab = OnlineVocab(capacity=10000, min_count=5)
    for i in range(0, len(tokens), 777):
        vocab.update(tokens[i:i + 777])
    expected = Counter(tokens)
    assert len(vocab) == len(expected)
    assert all(vocab.count(w) == c for w, c in expected.items())
    assert vocab.num_trainable() == sum(c >= 5 for c in expected.values())
    assert vocab.trainable_total == sum(c for c in expected.values() if c >= 5)


def test_a_full_vocabulary_evicts_rare_words_misra_gries_and_reports_trainable_keys():
    vocab = OnlineVocab(capacity=4, min_count=2)
    vocab.update(["a"] * 10 + ["b"] * 3 + ["c", "d"])
    upd = vocab.update(["e", "f"])       # 2 new words, no free slot: subtract 1 from every count
    assert sorted(vocab.words[s] for s in vocab.trainable_slots()) == ["a", "b"]
    assert vocab.count("a") == 9 and vocab.count("b") == 2
    assert "c" not in vocab and "d" not in vocab and vocab.count("e") == 1 and vocab.count("f") == 1
    assert len(upd.evicted_keys) == 0           # c and d never had rows
    assert upd.counts_rescaled and len(upd.evicted_slots) == 2
    # now 'b' (count 2, trainable) is the rarest that has to go for three newcomers
    upd = vocab.update(["g", "h", "i"])
    assert "b" not in vocab and "a" in vocab
    assert word_key("b") in set(upd.evicted_keys.tolist())
    assert word_key("a") not in set(upd.evicted_keys.tolist())
    assert len(vocab) <= vocab.capacity
    assert vocab.trainable_total == int(vocab.counts[vocab.trainable].sum())


def test_frequent_words_survive_a_stream_of_unique_junk():
    vocab = OnlineVocab(capacity=50, min_count=5)
    for i in range(200):
        vocab.update(["the", "of", "the"] + [f"junk{i}_{j}" for j in range(20)])
    assert vocab.count("the") >= 400 - 200 * 20 * 3 // 50 and vocab.count("of") > 0
    assert {vocab.words[s] for s in vocab.trainable_slots()} >= {"the", "of"}
    assert len(vocab) <= 50 and vocab.evictions > 0


def test_a_first_batch_with_more_new_words_than_the_table_holds_counts_what_fits():
    """An empty table has nothing to evict: the words that do not fit go uncounted, nothing raises."""
    vocab = OnlineVocab(capacity=40, min_count=1)
    words = [f"w{i}" for i in range(100)]
    upd = vocab.update(words)
    assert len(vocab) == 40 and len(upd.evicted_keys) == 0
    vocab.update(words[:10] * 3)          # later batches go on as usual (Misra-Gries evictions)
    assert len(vocab) <= 40
