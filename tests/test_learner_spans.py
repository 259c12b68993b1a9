"""The compiled mini-batch preparation: text8 token spans, the byte-keyed vocabulary index, the
keep pass, and the trainer fed spans against the trainer fed lists of strings."""
from __future__ import annotations

import random
from collections import Counter

import numpy as np
import pytest

from online.learner.keys import word_key
from online.learner.spans import TokenSpans, batch_ends, hash_spans, spans_of_sentences, text8_spans
from online.learner.subsampling import keep_probability, keep_tokens
from online.learner.tokenizers import Tokenizer
from online.learner.trainer import LearnerConfig, Trainer
from online.learner.vocab import OnlineVocab

TRICKY = [
    "The Cat sat, in 1984!  Köln", "", "a b\n\nc", b"caf\xe9 \xff\xfeok", None,
    "One two. Three four five six!\nSeven", "end.\u00a0Next one\u3002\u3000x\uff01y \uff1f z",
    "a.b c?\td!\x85e", "x\ud800. y", b"a.\xc2\x85b", b"a.\xc2 b", b"a.\xe3\x80\x80b", b"a.\xe3\x80",
    "abc123def", "A" * 30 + " b", "..  ..\r\nfoo\rbar", "no.\u2028break?\u205fhere\u3002\u200bnot",
    "東京\u3002Tokyo", b"trunc\xe3\x80\x82end. \xef\xbc", "1.5 2! 3",
]
_ALPHABET = list("abcXYZ019 .!?\n\r\t\x0b\x0c\x1c,;'") + [
    "\u3002", "\uff01", "\uff1f", "\u00a0", "\x85", "\u2003", "\u3000", "é", "東", "\u2028", "\u205f", "\u200b", "\ud800"]


def _spans_sentences(tok: Tokenizer, records) -> list[list[str]]:
    spans = tok.spans(records)
    check = np.empty(spans.num_tokens, dtype=np.uint64)
    hash_spans(spans.buf, spans.start, spans.length, check)
    assert (check == spans.hash).all()      # the scan's inline hash is span_hash
    return spans.to_sentences()


@pytest.mark.parametrize("limit", [2, 3, 10_000])
@pytest.mark.parametrize("split", [True, False])
def test_compiled_text8_agrees_with_the_python_tokenizer_on_tricky_text(limit, split):
    tok = Tokenizer("text8", max_sentence_length=limit, split_sentences=split)
    for record in TRICKY:
        assert _spans_sentences(tok, [record]) == tok.sentences_of([record]), record
    assert _spans_sentences(tok, TRICKY) == tok.sentences_of(TRICKY)


def test_compiled_text8_agrees_with_the_python_tokenizer_on_random_text_and_bytes():
    rng = random.Random(0)
    for _ in range(1500):
        text = "".join(rng.choice(_ALPHABET) for _ in range(rng.randint(0, 40)))
        record: str | bytes = text
        if rng.random() < 0.5:
            record = bytes(rng.randrange(256) for _ in range(rng.randint(0, 12))) + text.encode("utf-8", "surrogatepass")
        tok = Tokenizer("text8", max_sentence_length=rng.choice([2, 5]), split_sentences=rng.random() < 0.7)
        records = [record, "x y", None, record]
        assert _spans_sentences(tok, records) == tok.sentences_of(records), repr(record)


def test_a_block_of_lines_is_the_same_as_its_lines_as_records():
    block = "\n".join(str(r) for r in TRICKY if isinstance(r, str)).encode("utf-8", "surrogatepass") + b"\nlast"
    for split in (True, False):
        tok = Tokenizer("text8", max_sentence_length=3, split_sentences=split)
        assert tok.text_spans(block).to_sentences() == tok.sentences_of(block.split(b"\n"))
    uni = Tokenizer("unicode")
    assert uni.text_spans("Köln’s ÉCOLE. l'homme\nnaïve".encode()).to_sentences() == [
        ["köln’s", "école"], ["l'homme"], ["naïve"]]


def test_spans_of_string_sentences_round_trip_any_token():
    sentences = [["a", "b"], [], ["köln", "東京", ""], ["x y", "\ud800", "tab\there"]]
    spans = spans_of_sentences(sentences)
    assert spans.to_sentences() == sentences and spans.num_sentences == 4 and spans.num_tokens == 8
    same = spans_of_sentences([["köln"]])
    assert same.hash[0] == spans.hash[2]
    assert text8_spans(b"Koln 1", 100).hash.tolist() == spans_of_sentences([["koln", "one"]]).hash.tolist()


def test_batches_slices_and_concatenation():
    tok = Tokenizer()
    spans = tok.text_spans(b"a b c\nd e\nf g h i\nj\nk l m")
    assert [len(s) for s in spans.to_sentences()] == [3, 2, 4, 1, 3]
    ends = batch_ends(spans.sentences, 0, 4).tolist()
    # livevec train's rule: sentences accumulate until the batch holds >= 4 tokens
    assert ends == [2, 3, 5]
    parts = [spans.sentence_slice(a, b) for a, b in zip([0] + ends[:-1], ends)]
    assert [p.to_sentences() for p in parts] == [[["a", "b", "c"], ["d", "e"]], [["f", "g", "h", "i"]],
                                                 [["j"], ["k", "l", "m"]]]
    assert TokenSpans.concat([p.compact() for p in parts]).to_sentences() == spans.to_sentences()
    assert spans.head(6).to_sentences() == [["a", "b", "c"], ["d", "e"], ["f"]]
    assert spans.head(5).to_sentences() == [["a", "b", "c"], ["d", "e"]] and spans.head(0).num_sentences == 0
    compact = parts[2].compact()
    assert len(compact.buf) == 4 and compact.to_sentences() == parts[2].to_sentences()


class _ReferenceVocab:
    """The dict-based OnlineVocab this index replaced (counts, admission, Misra-Gries)."""

    def __init__(self, capacity: int, min_count: int):
        self.capacity, self.min_count = capacity, min_count
        self.index: dict[str, int] = {}
        self.words: list[str | None] = [None] * capacity
        self.counts = np.zeros(capacity, dtype=np.int64)
        self.trainable = np.zeros(capacity, dtype=bool)
        self.free = list(range(capacity - 1, -1, -1))
        self.evictions = 0

    def update(self, tokens: list[str]) -> None:
        new = list(dict.fromkeys(t for t in tokens if t not in self.index))
        if len(new) > len(self.free):
            occupied = np.array(list(self.index.values()), dtype=np.int64)
            to_free = len(new) - len(self.free)
            d = int(self.counts[occupied].max()) if to_free >= len(occupied) else \
                int(np.partition(self.counts[occupied], to_free - 1)[to_free - 1])
            self.counts[occupied] -= max(d, 1)
            for s in occupied[self.counts[occupied] <= 0].tolist():
                del self.index[self.words[s]]
                self.words[s] = None
                self.free.append(s)
                self.counts[s] = 0
                self.evictions += 1
            self.trainable[occupied] &= self.counts[occupied] >= self.min_count
        for w in new[:len(self.free)]:
            s = self.free.pop()
            self.index[w], self.words[s] = s, w
            self.counts[s], self.trainable[s] = 0, False
        for t in tokens:
            s = self.index.get(t)
            if s is not None:
                self.counts[s] += 1
                self.trainable[s] |= self.counts[s] >= self.min_count

    def state(self) -> dict:
        return {w: (int(self.counts[s]), bool(self.trainable[s])) for w, s in self.index.items()}


def _state(vocab: OnlineVocab) -> dict:
    return {w: (int(vocab.counts[s]), bool(vocab.trainable[s])) for s, w in enumerate(vocab.words) if w is not None}


@pytest.mark.parametrize("capacity,min_count,batch", [(100_000, 5, 777), (300, 3, 100), (50, 2, 30)])
def test_compiled_vocabulary_update_agrees_with_the_dict_based_one(capacity, min_count, batch):
    rng = np.random.default_rng(capacity)
    tokens = [f"w{int(z)}" for z in rng.zipf(1.3, 40_000) if z < 100_000]
    if capacity < 1000:     # a table that fills: a few frequent words among unique junk
        tokens = [t if i % 3 else f"junk{i}" for i, t in enumerate(f"w{int(z) % 40}" for z in rng.zipf(1.5, 20_000))]
    ref, vocab = _ReferenceVocab(capacity, min_count), OnlineVocab(capacity, min_count)
    evicting = 0
    for i in range(0, len(tokens), batch):
        chunk = tokens[i:i + batch]
        known = {t for t in chunk if t in ref.index}
        before = {w for w, (_, trainable) in ref.state().items() if trainable}
        ref.update(chunk)
        upd = vocab.update(chunk)
        if known - ref.index.keys():
            # a word known before the batch was evicted by it: the reference counted its
            # occurrences into whatever took its slot; start both again from empty
            ref, vocab = _ReferenceVocab(capacity, min_count), OnlineVocab(capacity, min_count)
            continue
        evicting += upd.counts_rescaled
        assert [vocab.words[s] if s >= 0 else ref.index.get(t) for s, t in zip(upd.slots.tolist(), chunk)] == [
            t if t in ref.index else None for t in chunk]
        assert _state(vocab) == ref.state() and len(vocab) == len(ref.index)
        assert vocab.trainable_total == int(vocab.counts[vocab.trainable].sum())
        after = {w for w, (_, trainable) in ref.state().items() if trainable}
        newly = {vocab.words[s] for s in upd.newly_trainable}
        # (a decrement can take a word below min_count before the batch's counts lift it again)
        assert after - before <= newly <= after and (upd.counts_rescaled or newly == after - before)
    if capacity > 1000:
        assert _state(vocab) == {w: (c, c >= min_count) for w, c in Counter(tokens).items()}
    else:
        assert evicting > 0
    for w in list(ref.index)[:50]:
        assert w in vocab and vocab.count(w) == ref.counts[ref.index[w]] and vocab.keys[vocab.slot(w)] == word_key(w)
    assert "never-seen" not in vocab and vocab.slot("never-seen") == -1


def test_a_word_evicted_by_the_batch_that_names_it_is_not_counted_into_another_word():
    vocab = OnlineVocab(capacity=3, min_count=1)
    vocab.update(["a"] * 5 + ["b", "c"])
    upd = vocab.update(["b", "d", "e"])       # two newcomers: b and c (count 1) must go, b is in the batch
    assert "b" not in vocab and "c" not in vocab and vocab.count("a") == 4
    assert vocab.count("d") == 1 and vocab.count("e") == 1 and upd.slots[0] == -1
    assert all(vocab.words[s] is not None for s in np.flatnonzero(vocab.trainable))
    assert vocab.trainable_total == int(vocab.counts[vocab.trainable].sum()) == 6


def test_the_cluster_verdict_makes_a_word_trainable_until_it_is_withdrawn():
    vocab = OnlineVocab(capacity=100, min_count=5)
    vocab.update(["rare", "rare", "common"] + ["common"] * 5)
    rare = vocab.slot("rare")
    assert not vocab.trainable[rare] and vocab.trainable_total == 6
    assert vocab.mark_trainable(np.array([rare, -1]), np.array([True, True])).tolist() == [rare]
    assert vocab.trainable[rare] and vocab.trainable_total == 8
    upd = vocab.update(["rare"])            # still trainable by the cluster's verdict, counted locally
    assert vocab.trainable[rare] and len(upd.newly_trainable) == 0 and vocab.trainable_total == 9
    vocab.mark_trainable(np.array([rare]), np.array([False]))
    assert not vocab.trainable[rare] and vocab.trainable_total == 6
    vocab.update(["rare", "rare"])          # its own count reaches min_count
    assert vocab.trainable[rare] and vocab.trainable_total == 11


def test_keep_pass_drops_untrainable_tokens_subsamples_at_the_formula_and_renumbers_sentences():
    counts = np.array([5_000, 50_000, 500_000, 3, 0])
    trainable = np.array([True, True, True, False, False])
    total = int(counts[trainable].sum())
    n = 30_000
    slots = np.tile(np.array([0, 1, 2, 3, -1]), n)
    sentences = np.array([0, 2, 2, len(slots)], dtype=np.int64)
    kept, starts = keep_tokens(slots, sentences, trainable, counts, total, 1e-3, seed=11)
    assert 3 not in kept and -1 not in kept and starts[0] == 0 and starts[1] == starts[2] and starts[-1] == len(kept)
    p = keep_probability(counts, total, 1e-3)
    for s in (0, 1, 2):
        rate = np.count_nonzero(kept == s) / n
        assert abs(rate - p[s]) < 5 * np.sqrt(p[s] * (1 - p[s]) / n) + 1e-9, (s, rate, p[s])
    rows_in, rows_out = np.array([10, 11, 12, 13, 14]), np.array([20, 21, 22, 23, 24])
    a, b, starts2 = keep_tokens(slots, sentences, trainable, counts, total, 1e-3, 11, rows_in, rows_out)
    assert (a == rows_in[kept]).all() and (b == rows_out[kept]).all() and (starts2 == starts).all()
    everything, _ = keep_tokens(slots, sentences, trainable, counts, total, 0.0, 1)
    assert len(everything) == 3 * n


@pytest.mark.parametrize("inplace", [True, False])
def test_the_trainer_prepares_spans_exactly_as_it_prepares_lists_of_strings(inplace):
    text = [f"the {w} of {w}s is {i % 7} and the cat. Sat on {w}" for i, w in
            enumerate(["dog", "cat", "king", "queen", "city"] * 60)]
    config = LearnerConfig(dim=8, min_count=2, vocab_capacity=1000, noise_table_size=1009)
    a, b = Trainer(config, inplace=inplace), Trainer(config, inplace=inplace)
    tok = Tokenizer()
    for i in range(0, len(text), 40):
        chunk = text[i:i + 40]
        pa, pb = a.prepare(tok.sentences_of(chunk)), b.prepare(tok.spans(chunk))
        for name in ("in_rows", "out_rows", "starts", "noise", "keys", "pair_in", "pair_out", "negs"):
            x, y = getattr(pa, name), getattr(pb, name)
            assert (x is None and y is None) or np.array_equal(x, y), name
        assert pa.stats == pb.stats and pa.stats.kept > 0
        if inplace:                         # the in-place kernel's noise table holds output rows
            assert np.array_equal(pa.noise, a.slot_out_row[a.noise.active()])
        a.run(pa), b.run(pb)
    assert a.export()[0] == b.export()[0]
