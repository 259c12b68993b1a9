"""Model sources: the word2vec reader (checked against gensim's writer), the file source, and the
in-process source over real EmbeddingShards and a real Trainer."""
from __future__ import annotations

import gzip

import numpy as np
import pytest
from gensim.models import KeyedVectors

from online.learner.embedding_shard import EmbeddingShard
from online.search.model_index import ModelIndex
from online.frontend.sources import EmbeddingShardSource, ModelSource, Word2VecFileSource, trainer_source
from online.search.delta import ModelDelta
from online.learner.keys import is_input_row, output_rows, word_key, word_keys
from online.learner.word2vec_format import (Word2VecFormatError, read_vocab_counts, read_word2vec,
                                            sniff_format, write_binary, write_text)


def sample(n=50, dim=12, seed=3):
    rng = np.random.default_rng(seed)
    words = ["paris", "France", "naïve", "日本語", "a'b"] + [f"w{i}" for i in range(n - 5)]
    return words, rng.standard_normal((n, dim)).astype(np.float32)


def gensim_file(path, words, vectors, binary):
    kv = KeyedVectors(vector_size=vectors.shape[1])
    kv.add_vectors(words, vectors)
    kv.save_word2vec_format(str(path), binary=binary)


@pytest.mark.parametrize("binary", [False, True])
def test_reader_matches_gensims_writer(tmp_path, binary):
    words, vectors = sample()
    path = tmp_path / ("v.bin" if binary else "v.txt")
    gensim_file(path, words, vectors, binary)
    assert sniff_format(path.read_bytes()) == ("binary" if binary else "text")
    wv = read_word2vec(path)
    assert wv.words == words
    assert wv.vectors.dtype == np.float32 and wv.vectors.shape == vectors.shape
    assert np.allclose(wv.vectors, vectors, atol=0 if binary else 1e-6)
    # and gensim reads what livevec's writer wrote the same way the front end does
    out = tmp_path / ("mine.bin" if binary else "mine.txt")
    (write_binary if binary else write_text)(out, words, vectors)
    ours = read_word2vec(out, "binary" if binary else "text")
    theirs = KeyedVectors.load_word2vec_format(str(out), binary=binary)
    assert ours.words == list(theirs.index_to_key)
    assert np.allclose(ours.vectors, theirs.vectors, atol=1e-6)


def test_reader_variants_gz_headerless_and_no_trailing_newline(tmp_path):
    words, vectors = sample(n=8, dim=4)
    lines = [w + " " + " ".join(f"{x:.7g}" for x in row) for w, row in zip(words, vectors)]
    glove = tmp_path / "glove.txt"
    glove.write_text("\n".join(lines), encoding="utf-8")          # no header, no final newline
    wv = read_word2vec(glove)
    assert wv.words == words and np.allclose(wv.vectors, vectors, atol=1e-6)
    gz = tmp_path / "v.bin.gz"
    with gzip.open(gz, "wb") as fh:                                 # gensim layout: no newline after vectors
        fh.write(f"{len(words)} 4\n".encode())
        for w, row in zip(words, vectors):
            fh.write(w.encode() + b" " + row.astype("<f4").tobytes())
    wv = read_word2vec(gz)
    assert wv.words == words and np.array_equal(wv.vectors, vectors)


@pytest.mark.parametrize("content, fmt, fragment", [
    (b"", "auto", "empty"),
    (b"3 4\nparis 1 2 3 4\nfrance 1 2 3\nberlin 1 2 3 4\n", "text", "line 3 (word 'france')"),
    (b"2 2\nparis 1 x\nfrance 1 2\n", "text", "line 2 (word 'paris')"),
    (b"5 2\nparis 1 2\n", "text", "promises 5 words"),
    (b"2 4\nparis " + b"\x00" * 16 + b"\nfrance " + b"\x00" * 7, "binary", "record 2 of 2 is truncated"),
    (b"paris \x00\x00", "binary", "must start with"),
])
def test_reader_errors_say_where(tmp_path, content, fmt, fragment):
    path = tmp_path / "bad"
    path.write_bytes(content)
    with pytest.raises(Word2VecFormatError) as err:
        read_word2vec(path, fmt)
    assert fragment in str(err.value) and str(path) in str(err.value)


def test_vocab_counts_file(tmp_path):
    path = tmp_path / "vocab.txt"
    path.write_text("paris 12\nfrance 7\n\n", encoding="utf-8")
    assert read_vocab_counts(path) == {"paris": 12, "france": 7}
    path.write_text("paris twelve\n", encoding="utf-8")
    with pytest.raises(Word2VecFormatError, match="line 1"):
        read_vocab_counts(path)


async def test_file_source_versions(tmp_path):
    words, vectors = sample()
    path = tmp_path / "v.bin"
    write_binary(path, words, vectors)
    counts = tmp_path / "counts.txt"
    counts.write_text("paris 5\nw3 9\n", encoding="utf-8")
    source = Word2VecFileSource(path, counts_path=counts)
    assert isinstance(source, ModelSource)
    first = await source.changes_since(0)
    assert first.full and first.version == 1 and first.words == words
    assert first.keys.tolist() == [word_key(w) for w in words]
    assert first.counts[words.index("paris")] == 5 and first.counts[words.index("w3")] == 9
    again = await source.changes_since(1)
    assert len(again) == 0 and not again.full and again.version == 1
    stale = await source.changes_since(99)                       # a version it never issued: everything
    assert stale.full and stale.version == 1 and len(stale) == len(words)
    write_binary(path, words[:10], vectors[:10])
    reloaded = await source.changes_since(1)
    assert reloaded.full and reloaded.version == 2 and reloaded.words == words[:10]
    assert (await source.stats())["vocab_size"] == 10
    path.unlink()
    with pytest.raises(FileNotFoundError):
        await source.changes_since(2)


def shard_with(words, vectors, dim):
    shard = EmbeddingShard(dim)
    keys = word_keys(words)
    shard.assign(keys, vectors)
    shard.assign(output_rows(keys), np.ones_like(vectors))      # output rows must not be served
    shard.set_words(keys, words)
    shard.add_counts(keys, np.arange(1, len(words) + 1))
    return shard, keys


def as_dict(index: ModelIndex):
    return {w: (index.vectors[i].copy(), int(index.counts[i])) for i, w in enumerate(index.words)}


async def test_shard_source_full_incremental_and_removals():
    dim = 6
    words, vectors = sample(n=40, dim=dim)
    a, b = words[:25], words[25:]
    shard_a, keys_a = shard_with(a, vectors[:25], dim)
    shard_b, keys_b = shard_with(b, vectors[25:], dim)
    nameless = np.array([word_key("no-string-yet")], dtype=np.uint64)
    shard_a.rows_for(nameless)                                     # a row whose word is not known yet
    source = EmbeddingShardSource([shard_a, shard_b], stats_fn=lambda: {"words_trained": 123})
    index = ModelIndex.empty()

    d1 = await source.changes_since(0)
    assert d1.full and sorted(d1.words) == sorted(words)
    assert is_input_row(d1.keys).all()
    index = index.apply(d1)
    got = as_dict(index)
    for i, w in enumerate(words):
        assert np.allclose(got[w][0], vectors[i], rtol=1e-6, atol=1e-7)
        assert got[w][1] == (i + 1 if i < 25 else i - 25 + 1)
    assert "no-string-yet" not in got

    unchanged = await source.changes_since(d1.version)
    assert len(unchanged) == 0 and unchanged.version == d1.version

    # training touches two rows of shard a, a new word arrives on shard b, a word is evicted from a
    shard_a.assign(keys_a[[3, 4]], np.full((2, dim), 7.0, np.float32))
    new_key = word_keys(["newcomer"])
    shard_b.assign(new_key, np.full((1, dim), 2.0, np.float32))
    shard_b.set_words(new_key, ["newcomer"])
    shard_a.free(np.concatenate([keys_a[[10]], output_rows(keys_a[[10]])]))
    d2 = await source.changes_since(d1.version)
    assert not d2.full and d2.version != d1.version
    assert set(d2.words) == {a[3], a[4], "newcomer"}
    assert d2.removed.tolist() == [int(keys_a[10])]
    index = index.apply(d2)
    got = as_dict(index)
    assert a[10] not in got and len(got) == len(words)
    assert np.all(got[a[3]][0] == 7.0) and np.all(got["newcomer"][0] == 2.0)

    # a version the source has forgotten (or never issued) gets the whole model
    d3 = await source.changes_since(10_000)
    assert d3.full and set(d3.words) == set(index.words)
    assert (await source.stats()) == {"source": "in-process", "shards": 2, "words_trained": 123}


async def test_trainer_source_serves_what_the_in_process_trainer_learns():
    from online.stream.sample_corpus import generate_lines
    from online.learner.trainer import LearnerConfig, Trainer

    trainer = Trainer(LearnerConfig(dim=24, min_count=3, seed=5))
    lines = generate_lines(6000, seed=2)
    trainer.train_records(lines[:3000])
    source = trainer_source(trainer)
    first = await source.changes_since(0)
    index = ModelIndex.empty().apply(first)
    exported_words, exported_vectors, _ = trainer.export()
    assert set(index.words) == set(exported_words)
    for w in ("king", "paris", "kafka"):
        assert np.allclose(index.vectors[index.row(w)], exported_vectors[exported_words.index(w)])
    trainer.train_records(lines[3000:])
    delta = await source.changes_since(first.version)
    assert not delta.full and len(delta) > 0
    index = index.apply(delta)
    exported_words, exported_vectors, exported_counts = trainer.export()
    assert set(index.words) == set(exported_words)
    for w in ("king", "paris", "kafka"):
        i = exported_words.index(w)
        assert np.allclose(index.vectors[index.row(w)], exported_vectors[i])
        assert index.counts[index.row(w)] == exported_counts[i]
    stats = await source.stats()
    assert stats["words_trained"] == trainer.totals.tokens and stats["vocab_size"] == len(exported_words)


def test_model_delta_unchanged_helper():
    d = ModelDelta.unchanged(7, 3)
    assert len(d) == 0 and d.version == 7 and d.dim == 3 and not d.full and len(d.removed) == 0
