"""gensim's ``evaluate_word_analogies`` and ``evaluate_word_pairs``, run by the client on the live model.

Why client-side: the question files are the caller's (``questions-words.txt``, WordSim-353,
SimLex), and the evaluations are gensim's loops over ordinary reads. Running them here
against ``most_similar`` and the served vectors gives gensim's numbers for the model as it
is now, without downloading it (``to_keyed_vectors()`` then gensim's own method is the
alternative, at the price of the whole model).

gensim's rules are kept line by line: ``restrict_vocab`` keeps the first words of
``index_to_key`` (most frequent first), ``case_insensitive`` upper-cases the questions and
maps each upper-cased form to its most frequent spelling, a prediction is the first of the
5 nearest words that is in that vocabulary and not a question word, and the result has
gensim's shape (``(score, sections)``; ``(pearson, spearman, oov_ratio)`` from scipy).
One difference: gensim searches only the first ``restrict_vocab`` words; the front end
searches all of them, so on a model larger than ``restrict_vocab`` the client asks for
``5 * RESTRICTED_OVERSAMPLE`` neighbours and keeps the first 5 inside the restriction
(the same answer unless more than that many outsiders come first).

Each evaluation asks its questions as one list of calls: the blocking client sends them one
after another on a kept-alive connection, the asyncio one concurrently.
"""
from __future__ import annotations

import itertools
import logging
import os

import numpy as np
import orjson

from online.client.operations import Vocabulary, _unit, _vector_call, _vector_of
from online.client.protocol import Call, Operation

log = logging.getLogger("livevec.client")

ANALOGY_TOPN = 5                      # gensim's
RESTRICTED_OVERSAMPLE = 10


def _ok_vocab(vocab: Vocabulary, restrict_vocab: int, case_insensitive: bool) -> dict[str, int]:
    keys = vocab.index_to_key[:restrict_vocab]
    if case_insensitive:
        return {k.upper(): vocab.key_to_index[k] for k in reversed(keys)}
    return {k: vocab.key_to_index[k] for k in reversed(keys)}


def _section_score(section: dict) -> float:
    correct, incorrect = len(section["correct"]), len(section["incorrect"])
    if correct + incorrect == 0:
        return 0.0
    score = correct / (correct + incorrect)
    log.info("%s: %.1f%% (%i/%i)", section["section"], 100.0 * score, correct, correct + incorrect)
    return score


def evaluate_word_analogies(vocab: Vocabulary, analogies: str | os.PathLike, restrict_vocab: int = 300000,
                            case_insensitive: bool = True, dummy4unknown: bool = False,
                            similarity_function: str = "most_similar") -> Operation[tuple]:
    ok_vocab = _ok_vocab(vocab, restrict_vocab, case_insensitive)
    oversample = len(vocab.index_to_key) > restrict_vocab
    topn = ANALOGY_TOPN * (RESTRICTED_OVERSAMPLE if oversample else 1)
    sections: list[dict] = []
    section: dict | None = None
    entries: list[tuple[dict, tuple[str, str, str, str], bool]] = []   # in the file's order; bool: asked
    oov = quadruplets = 0
    with open(analogies, "rb") as fin:
        for line_no, raw in enumerate(fin):
            line = raw.decode("utf-8")
            if line.startswith(": "):
                if section:
                    sections.append(section)
                section = {"section": line.lstrip(": ").strip(), "correct": [], "incorrect": []}
                continue
            if not section:
                raise ValueError("Missing section header before line #%i in %s" % (line_no, analogies))
            try:
                a, b, c, expected = [w.upper() for w in line.split()] if case_insensitive else line.split()
            except ValueError:
                log.info("Skipping invalid line #%i in %s", line_no, analogies)
                continue
            quadruplets += 1
            if a not in ok_vocab or b not in ok_vocab or c not in ok_vocab or expected not in ok_vocab:
                oov += 1
                if dummy4unknown:
                    entries.append((section, (a, b, c, expected), False))
                continue
            entries.append((section, (a, b, c, expected), True))
    if section:
        sections.append(section)
    word = vocab.index_to_key
    calls = [Call("POST", "/v1/similar", orjson.dumps({
        "positive": [word[ok_vocab[b]], word[ok_vocab[c]]], "negative": [word[ok_vocab[a]]], "k": topn}),
        accept=(200, 404)) for _, (a, b, c, _), was_asked in entries if was_asked]
    replies = iter((yield calls) if calls else [])
    for sec, question, was_asked in entries:
        a, b, c, expected = question
        predicted = None
        if was_asked:
            reply = next(replies)
            sims = reply.json()["neighbours"] if reply.status == 200 else []
            if oversample:
                sims = [n for n in sims if vocab.key_to_index.get(n["word"], restrict_vocab) < restrict_vocab]
            for element in sims[:ANALOGY_TOPN]:
                predicted = element["word"].upper() if case_insensitive else element["word"]
                if predicted in ok_vocab and predicted not in {a, b, c}:
                    break
        (sec["correct"] if predicted == expected else sec["incorrect"]).append(question)
    for sec in sections:
        _section_score(sec)
    total = {"section": "Total accuracy",
             "correct": list(itertools.chain.from_iterable(s["correct"] for s in sections)),
             "incorrect": list(itertools.chain.from_iterable(s["incorrect"] for s in sections))}
    log.info("Quadruplets with out-of-vocabulary words: %.1f%%", float(oov) / quadruplets * 100)
    score = _section_score(total)
    sections.append(total)
    return score, sections


def evaluate_word_pairs(vocab: Vocabulary, pairs: str | os.PathLike, delimiter: str = "\t",
                        encoding: str = "utf8", restrict_vocab: int = 300000, case_insensitive: bool = True,
                        dummy4unknown: bool = False) -> Operation[tuple]:
    try:
        from scipy import stats
    except ImportError as exc:
        raise ImportError("evaluate_word_pairs needs scipy (pip install scipy, or gensim)") from exc
    ok_vocab = _ok_vocab(vocab, restrict_vocab, case_insensitive)
    gold: list[float] = []
    wanted: list[tuple[str, str] | None] = []          # per gold value: the words to compare, None for a zero
    oov = 0
    with open(pairs, encoding=encoding) as fin:
        for line_no, line in enumerate(fin):
            if not line or line.startswith("#"):
                continue
            try:
                a, b, sim = [w.upper() for w in line.split(delimiter)] if case_insensitive \
                    else line.split(delimiter)
                sim = float(sim)
            except (ValueError, TypeError):
                log.info("Skipping invalid line #%d in %s", line_no, pairs)
                continue
            if a not in ok_vocab or b not in ok_vocab:
                oov += 1
                if dummy4unknown:
                    gold.append(sim)
                    wanted.append(None)
                continue
            gold.append(sim)
            wanted.append((vocab.index_to_key[ok_vocab[a]], vocab.index_to_key[ok_vocab[b]]))
    if not gold:
        raise ValueError(f"No valid similarity judgements found in {pairs}: either invalid format or "
                         f"all are out-of-vocabulary in the live model")
    words = list(dict.fromkeys(w for pair in wanted if pair for w in pair))
    replies = (yield [_vector_call(w) for w in words]) if words else []
    vectors = {}
    for w, reply in zip(words, replies):
        v = _vector_of(reply, w)
        if v is None:
            raise KeyError(f"Key '{w}' not present")
        vectors[w] = _unit(v)
    model = [0.0 if pair is None else np.dot(vectors[pair[0]], vectors[pair[1]]) for pair in wanted]
    spearman = stats.spearmanr(gold, model)
    pearson = stats.pearsonr(gold, model)
    oov_ratio = float(oov) / len(gold) * 100 if dummy4unknown else float(oov) / (len(gold) + oov) * 100
    log.info("Pearson correlation coefficient against %s: %.4f", pairs, pearson[0])
    log.info("Spearman rank-order correlation coefficient against %s: %.4f", pairs, spearman[0])
    log.info("Pairs with unknown words ratio: %.1f%%", oov_ratio)
    return pearson, spearman, oov_ratio
