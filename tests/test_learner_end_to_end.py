"""End to end: a generated corpus with planted structure, trained by ``livevec train`` (a real
subprocess) and by the pull/push path, read back with gensim."""
from __future__ import annotations

import itertools
import json
import lzma
import random
import subprocess
import sys
from pathlib import Path

import numpy as np
from gensim.models import KeyedVectors

from online.learner.param_store import LocalParamStore
from online.stream.sample_corpus import PLANTED_CONTEXTS, iter_sentences, planting_sentences
from online.learner.trainer import LearnerConfig, Trainer

REPO = Path(__file__).resolve().parents[1]
PAIRS = [("paris", "france"), ("berlin", "germany"), ("tokyo", "japan"), ("rome", "italy"),
         ("madrid", "spain"), ("oslo", "norway"), ("cairo", "egypt"), ("lima", "peru")]


def _letters(i: int) -> str:
    """0 -> 'a', 25 -> 'z', 26 -> 'ba': digits would be spelled out by the text8 tokenizer."""
    out = ""
    while True:
        out = chr(97 + i % 26) + out
        i //= 26
        if i == 0:
            return out


FILLER = [f"filler{_letters(i)}" for i in range(300)]


def planted_corpus(n_lines: int, seed: int) -> list[str]:
    """Each planted pair (a, b) always occurs side by side, inside a run of words drawn
    from its own context set; those context words are also scattered through the far
    more common filler sentences, so they are not each other's twins. a and b are the
    only words that share a context so exactly: each must be the other's nearest
    neighbour."""
    rng = random.Random(seed)
    weights = [1 / (r + 1) for r in range(len(FILLER))]
    contexts = {a: [f"{a}ctx{_letters(j)}" for j in range(6)] for a, _ in PAIRS}
    all_context = [w for ws in contexts.values() for w in ws]
    lines = []
    for _ in range(n_lines):
        if rng.random() < 0.85:
            words = rng.choices(FILLER, weights, k=rng.randint(8, 20))
            for w in rng.choices(all_context, k=3):
                words.insert(rng.randrange(len(words) + 1), w)
        else:
            a, b = rng.choice(PAIRS)
            around = rng.choices(contexts[a], k=6)
            cut = rng.randrange(len(around) + 1)
            words = around[:cut] + ([a, b] if rng.random() < 0.5 else [b, a]) + around[cut:]
        lines.append(" ".join(words))
    return lines


def _assert_pairs_are_nearest_neighbours(kv: KeyedVectors, max_misses: int = 1) -> None:
    misses = []
    for a, b in PAIRS:
        for x, y in ((a, b), (b, a)):
            nearest = kv.most_similar(x, topn=1)[0][0]
            if nearest != y:
                misses.append((x, nearest))
    assert len(misses) <= max_misses, misses


def test_livevec_train_subprocess_writes_files_gensim_loads_with_planted_neighbours(tmp_path):
    corpus = tmp_path / "planted.txt.xz"
    with lzma.open(corpus, "wt", encoding="utf-8") as f:
        f.write("\n".join(planted_corpus(8000, seed=3)) + "\n")
    out = tmp_path / "model"
    proc = subprocess.run(
        [sys.executable, "-m", "online.cli", "train", "--input", str(corpus), "--out", str(out),
         "--epochs", "3", "--workers", "2", "--dim", "32", "--batch-words", "2000", "--min-count", "5"],
        cwd=REPO, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    assert summary["vocabulary"] > 300 and summary["words_per_second"] > 0
    assert "pass 3/3" in proc.stderr                      # progress display
    text = KeyedVectors.load_word2vec_format(out / "vectors.txt", binary=False)
    binary = KeyedVectors.load_word2vec_format(out / "vectors.bin", binary=True)
    assert text.index_to_key == binary.index_to_key and text.vector_size == 32
    np.testing.assert_allclose(text.vectors, binary.vectors, rtol=1e-4, atol=1e-6)
    counts = [int(line.split()[1]) for line in (out / "vocab.txt").read_text().splitlines()]
    assert counts == sorted(counts, reverse=True) and len(counts) == len(text.index_to_key)
    assert text.index_to_key[0] == "fillera"               # most frequent first (restrict_vocab relies on it)
    _assert_pairs_are_nearest_neighbours(binary)


def test_livevec_train_rejects_bad_settings_with_exit_code_2(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "online.cli", "train", "--input", str(tmp_path / "missing.txt"),
                           "--out", str(tmp_path / "o")], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "--input" in proc.stderr
    (tmp_path / "c.txt").write_text("a b c\n")
    proc = subprocess.run([sys.executable, "-m", "online.cli", "train", "--input", str(tmp_path / "c.txt"),
                           "--out", str(tmp_path / "o")], cwd=REPO, capture_output=True, text=True, timeout=60,
                          env={"LIVEVEC_WINDOW": "zero", "PATH": "/usr/bin:/bin"})
    assert proc.returncode == 2 and "LIVEVEC_WINDOW" in proc.stderr


def test_pull_push_path_over_two_shards_learns_the_planted_pairs(tmp_path):
    store = LocalParamStore(num_shards=2, dim=32, optimizer="adagrad", eta=0.1)
    trainer = Trainer(LearnerConfig(dim=32, min_count=5), store)
    assert trainer.shard is None
    lines = planted_corpus(8000, seed=4)
    losses = []
    for _ in range(3):
        for i in range(0, len(lines), 100):
            stats = trainer.train_records(lines[i:i + 100])
            if stats.loss is not None:
                losses.append(stats.loss / max(stats.pairs, 1))
    assert np.mean(losses[-20:]) < 0.75 * np.mean(losses[:3])   # starts at 6 log 2 = 4.16 per pair
    words, vectors, counts = trainer.export()
    kv = KeyedVectors(32)
    kv.add_vectors(words, vectors)
    _assert_pairs_are_nearest_neighbours(kv)
    assert sum(len(s) for s in store.shards) == 2 * len(words)
    assert all(len(s) > 0.3 * len(words) for s in store.shards)
    # counts and words reached the servers
    key = trainer.vocab.keys[trainer.vocab.slot("paris")]
    shard = store.shards[int(key >= store._starts[1])]
    assert shard.words_for(np.array([key]))[0] == "paris"
    assert shard.counts_for(np.array([key]))[0] == trainer.vocab.count("paris")


def _burst_trials(local_rate: float, trials: int) -> list[tuple[str, list[str]]]:
    """Train the pull/push path on the sample corpus, then plant new words one burst at a
    time (as bench/freshness.py does through Kafka): (anchor, new word's top 10) per trial."""
    store = LocalParamStore(num_shards=2, dim=100, optimizer="adagrad")   # the servers' default optimizer
    trainer = Trainer(LearnerConfig(dim=100, local_rate=local_rate), store)
    assert trainer.shard is None
    background = iter_sentences(seed=7)
    for _ in range(60):
        trainer.train_sentences([line.split() for line in itertools.islice(background, 1000)])
    rng = random.Random(1)
    anchors = [a for pair in PLANTED_CONTEXTS for a in pair]
    planted, out = set(), []
    for t in range(trials):
        anchor, new = anchors[t % len(anchors)], f"fresh{_letters(t + 1000)}"
        lines = planting_sentences(new, anchor, 200, rng) + list(itertools.islice(background, 300))
        rng.shuffle(lines)
        trainer.train_sentences([line.split() for line in lines])
        vocab = trainer.vocab
        slots = np.flatnonzero(vocab.trainable[:len(vocab.words)])
        words = [vocab.words[i] for i in slots.tolist()]
        vectors = store.pull(vocab.keys[slots])
        vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
        order = np.argsort(-(vectors @ vectors[words.index(new)]))
        out.append((anchor, [words[i] for i in order.tolist() if words[i] != new and words[i] not in planted][:10]))
        planted.add(new)
    return out


def test_pull_push_path_places_a_word_first_seen_in_one_burst_next_to_its_twin():
    """A word's first batch must already put it among its twin's neighbours (the front end's
    freshness rests on it). One step against the pulled snapshot, the walk's rate 0, put it
    next to the function words around it in about half of these trials."""
    results = _burst_trials(LearnerConfig().local_rate, 16)
    misses = [(anchor, top[:5]) for anchor, top in results if anchor not in top]
    assert len(misses) <= 1, misses


def test_train_file_reads_plain_and_gzip_and_stops_at_max_tokens(tmp_path):
    import gzip

    from online.cli.train import TrainSettings, train_file
    lines = planted_corpus(500, seed=5)
    plain = tmp_path / "c.txt"
    plain.write_text("\n".join(lines) + "\n")
    packed = tmp_path / "c.txt.gz"
    with gzip.open(packed, "wt") as f:
        f.write("\n".join(lines) + "\n")
    total = sum(len(line.split()) for line in lines)
    results = []
    for path in (plain, packed):
        settings = TrainSettings(input=str(path), out=str(tmp_path / f"out-{path.name}"), epochs=2, progress=False,
                                 learner=LearnerConfig(dim=8))
        settings.validate()
        trainer, result = train_file(settings)
        assert result.raw_words == 2 * total and trainer.vocab.total_tokens == total   # counted in pass 1 only
        results.append(KeyedVectors.load_word2vec_format(result.files["binary"], binary=True))
    np.testing.assert_array_equal(results[0].vectors, results[1].vectors)     # same text, same seed, 1 worker
    settings = TrainSettings(input=str(packed), out=str(tmp_path / "cut"), max_tokens=1000, progress=False,
                             learner=LearnerConfig(dim=8))
    _, result = train_file(settings)
    assert result.raw_words == 1000
