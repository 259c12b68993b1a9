"""``livevec train``: offline, in-process training of a text file; writes word2vec files.

    livevec train --input corpus.txt.xz --out model/ [--epochs N] [--workers N]

Reads plain, .gz or .xz text (one record per line: text, or JSON with ``LIVEVEC_RECORD_FORMAT=json``,
read as the workers read a topic's records, ``online.stream.records``), runs the same ``Trainer`` the Kafka
workers run, against an in-process ``EmbeddingShard`` updated in place by ``--workers``
threads (the compiled kernels run without the GIL; one reader thread reads blocks of lines,
tokenises them into mini-batches of token spans, compiled too, and feeds them), and writes
``DIR/vectors.txt`` and ``DIR/vectors.bin`` (word2vec text and binary, most frequent word
first), ``DIR/vocab.txt`` (word and count) and ``DIR/train_stats.json``.

Passes: the first pass counts the vocabulary as it trains (a stream); later passes
re-read the same text without counting it again, so that ``min_count`` keeps meaning
"occurrences in the corpus" as it does for gensim. Nothing depends on the corpus length.
"""
from __future__ import annotations

import argparse
import gzip
import json
import logging
import lzma
import os
import queue
import sys
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from online.learner.param_store import LocalParamStore
from online.learner.spans import TokenSpans, batch_ends
from ps_bridge.structured_logging import log_event
from online.learner.trainer import LearnerConfig, Trainer
from online.learner.word2vec_format import write_binary, write_text, write_vocab
from online.learner.settings import LEARNER, MODEL, learner_config
from online.stream.records import RECORDS, RecordFormat
from ps_bridge.settings import Setting, SettingError, SettingGroup, add_groups

logger = logging.getLogger("livevec.train")
DEFAULT_BATCH_WORDS = LEARNER["batch_words"].default
BLOCK_BYTES = 1 << 20     # the reader's unit: about 170k tokens of English


@dataclass
class TrainSettings:
    input: str
    out: str
    epochs: int = 1
    workers: int = 1
    batch_words: int = DEFAULT_BATCH_WORDS
    max_tokens: int = 0                     # 0 = whole file; else stop each pass after this many tokens
    shards: int = 1                         # >1: the pull/push path over that many in-process shards
    progress: bool = True
    learner: LearnerConfig = field(default_factory=LearnerConfig)
    records: RecordFormat = field(default_factory=RecordFormat)

    def validate(self) -> None:
        if not Path(self.input).is_file():
            raise SettingError("--input", f"no such file: {self.input}")


@dataclass
class TrainResult:
    seconds: float
    passes: int
    raw_words: int
    effective_words: int
    pairs: int
    vocabulary: int
    words_per_second: float             # raw words / s (every token read, as gensim's raw_word_count)
    effective_words_per_second: float   # kept after min_count and subsampling (gensim's "effective words/s")
    files: dict[str, str]
    malformed: dict[str, int] = field(default_factory=dict)   # JSON records skipped, by reason (every pass)


TRAIN = SettingGroup("offline training", (
    Setting("input", (), required=True, metavar="FILE", help="text file: plain, .gz or .xz, one record per line"),
    Setting("out", (), required=True, metavar="DIR", help="output directory (created)"),
    Setting("epochs", (), int, 1, minimum=1, help="passes over the file"),
    Setting("workers", (), int, 1, minimum=1, help="training threads"),
    Setting("shards", (), int, 1, minimum=1,
            help="1: update one in-process shard in place; N>1: pull/push mini-batches against N in-process "
                 "shards split by key range, as against parameter servers"),
    Setting("max_tokens", (), int, 0, minimum=0, help="stop each pass after this many tokens (0 = whole file)"),
    Setting("progress", (), bool, True, help="progress on stderr"),
))


def configure(parser: argparse.ArgumentParser) -> None:
    add_groups(parser, (TRAIN, MODEL, LEARNER, RECORDS))


def read_settings(args: argparse.Namespace, env=None) -> TrainSettings:
    env = os.environ if env is None else env
    values = TRAIN.read(args, env)
    model = {**MODEL.read(args, env), **LEARNER.read(args, env)}
    batch_words = model.pop("batch_words")
    settings = TrainSettings(**values, batch_words=batch_words, learner=learner_config(model),
                             records=RecordFormat.from_args(args, env))
    settings.validate()
    return settings


class _Source:
    """Lines of a plain/.gz/.xz file, with progress as a fraction of the bytes on disk."""

    def __init__(self, path: str):
        self.path = path
        self.size = max(1, os.path.getsize(path))
        self.raw = open(path, "rb")
        if path.endswith(".xz"):
            self.stream = lzma.open(self.raw)
        elif path.endswith(".gz"):
            self.stream = gzip.open(self.raw)
        else:
            self.stream = self.raw

    def fraction(self) -> float:
        try:
            return min(1.0, self.raw.tell() / self.size)
        except (OSError, ValueError):
            return 0.0

    def __iter__(self):
        for line in self.stream:
            yield line.decode("utf-8", errors="replace")

    def blocks(self, size: int = BLOCK_BYTES):
        """The file in blocks of about ``size`` bytes that end at a line's end (or the file's)."""
        while True:
            data = self.stream.read(size)
            if not data:
                return
            if not data.endswith(b"\n"):
                data += self.stream.readline()
            yield data

    def close(self) -> None:
        self.stream.close()
        self.raw.close()


class _Progress:
    def __init__(self, enabled: bool, passes: int, interval: float = 2.0):
        self.enabled = enabled
        self.passes = passes
        self.interval = interval
        self.t0 = time.perf_counter()
        self.last = 0.0
        self.tty = sys.stderr.isatty()

    def show(self, pass_no: int, fraction: float, trainer: Trainer, final: bool = False) -> None:
        now = time.perf_counter()
        if not self.enabled or (not final and now - self.last < self.interval):
            return
        self.last = now
        t = trainer.totals
        elapsed = max(now - self.t0, 1e-9)
        line = (f"livevec train: pass {pass_no}/{self.passes} {100 * fraction:5.1f}%  "
                f"{t.tokens / 1e6:.2f}M words  {t.tokens / elapsed / 1e3:.0f}k words/s  "
                f"vocab {trainer.vocab.num_trainable():,} trainable / {len(trainer.vocab):,} counted")
        print(("\r" + line) if self.tty else line, end="\n" if (final or not self.tty) else "",
              file=sys.stderr, flush=True)


def make_trainer(settings: TrainSettings) -> Trainer:
    """The trainer ``livevec train`` uses: in place on one shard, or pull/push over ``--shards``."""
    cfg = settings.learner
    store = LocalParamStore(num_shards=settings.shards, dim=cfg.dim, optimizer=cfg.optimizer, eta=cfg.eta,
                            adagrad_init=cfg.adagrad_init, seed=cfg.seed)
    return Trainer(cfg, store)


def train_file(settings: TrainSettings, trainer: Trainer | None = None) -> tuple[Trainer, TrainResult]:
    """Train on ``settings.input`` for ``settings.epochs`` passes and write the output files."""
    trainer = trainer or make_trainer(settings)
    progress = _Progress(settings.progress, settings.epochs)
    t0 = time.perf_counter()
    malformed: dict[str, int] = {}
    for pass_no in range(1, settings.epochs + 1):
        train_pass(settings, trainer, pass_no, progress, malformed)
    seconds = time.perf_counter() - t0
    return trainer, write_outputs(settings, trainer, seconds, malformed)


def write_outputs(settings: TrainSettings, trainer: Trainer, seconds: float,
                  malformed: dict[str, int] | None = None) -> TrainResult:
    """vectors.txt, vectors.bin, vocab.txt and train_stats.json in ``settings.out``."""
    out = Path(settings.out)
    out.mkdir(parents=True, exist_ok=True)
    words, vectors, counts = trainer.export()
    files = {"text": str(out / "vectors.txt"), "binary": str(out / "vectors.bin"), "vocab": str(out / "vocab.txt"),
             "stats": str(out / "train_stats.json")}
    write_text(files["text"], words, vectors)
    write_binary(files["binary"], words, vectors)
    write_vocab(files["vocab"], words, counts.tolist())   # (spelled as the vectors files spell the words)
    t = trainer.totals
    seconds = max(seconds, 1e-9)
    result = TrainResult(seconds=seconds, passes=settings.epochs, raw_words=t.tokens, effective_words=t.kept,
                         pairs=t.pairs, vocabulary=len(words), words_per_second=t.tokens / seconds,
                         effective_words_per_second=t.kept / seconds, files=files, malformed=dict(malformed or {}))
    with open(files["stats"], "w") as f:
        json.dump({**asdict(result), "learner": asdict(settings.learner), "records": settings.records.describe(),
                   "workers": settings.workers,
                   "batch_words": settings.batch_words, "shards": settings.shards}, f, indent=2)
    log_event(logger, "train_done", seconds=round(seconds, 2), words=t.tokens, effective=t.kept,
              vocabulary=len(words), words_per_s=round(result.words_per_second))
    return result


def train_pass(settings: TrainSettings, trainer: Trainer, pass_no: int, progress: _Progress | None = None,
               malformed: dict[str, int] | None = None) -> None:
    """One pass over the file: a reader thread (this one) reads blocks of lines and tokenises them
    into mini-batches of token spans (compiled, without the GIL), ``settings.workers`` threads
    train them. A batch closes with the sentence that brings it to ``batch_words`` tokens. JSON
    records that are malformed are counted into ``malformed`` by reason, logged (rate limited) and skipped."""
    progress = progress or _Progress(False, settings.epochs)
    update_vocab = pass_no == 1
    work: queue.Queue = queue.Queue(maxsize=2 * settings.workers)
    errors: list[BaseException] = []

    def worker() -> None:
        while True:
            batch = work.get()
            if batch is None:
                return
            if errors:
                continue
            try:
                trainer.train_sentences(batch, update_vocab)
            except BaseException as exc:  # surfaced by the reader below
                errors.append(exc)

    threads = [threading.Thread(target=worker, name=f"livevec-train-{i}", daemon=True)
               for i in range(settings.workers)]
    for t in threads:
        t.start()
    source = _Source(settings.input)
    tokenizer = trainer.tokenizer
    budget = settings.max_tokens or None
    pending: TokenSpans | None = None     # the sentences of the batch still being filled
    try:
        for block in source.blocks():
            if settings.records.is_text:
                spans = tokenizer.text_spans(block)
            else:
                records, skipped = settings.records.extract_lines(block)
                _count_malformed(malformed, skipped)
                spans = tokenizer.spans(records)
            if budget is not None:
                spans = spans.head(budget)
                budget -= spans.num_tokens
            if pending is not None:
                spans = TokenSpans.concat([pending, spans])
            first = 0
            for end in batch_ends(spans.sentences, 0, settings.batch_words).tolist():
                work.put(spans.sentence_slice(first, end))
                first = end
                if errors:
                    raise errors[0]
                progress.show(pass_no, source.fraction(), trainer)
            pending = spans.sentence_slice(first, spans.num_sentences).compact() if first < spans.num_sentences \
                else None
            if budget is not None and budget <= 0:
                break
        if pending is not None and pending.num_tokens:
            work.put(pending)
    finally:
        for _ in threads:
            work.put(None)
        for t in threads:
            t.join()
        source.close()
    if errors:
        raise errors[0]
    progress.show(pass_no, 1.0 if budget is None else source.fraction(), trainer, final=True)


def _count_malformed(totals: dict[str, int] | None, skipped: dict[str, int]) -> None:
    """Adds a block's malformed records to ``totals``; logs the totals at the first ten such records,
    then at every thousandth (a corrupt file must not flood the log)."""
    if totals is None or not skipped:
        return
    before = sum(totals.values())
    for reason, n in skipped.items():
        totals[reason] = totals.get(reason, 0) + n
    after = sum(totals.values())
    if before < 10 or after // 1000 > before // 1000:
        log_event(logger, "malformed_records_skipped", level=logging.WARNING, **totals)


def run(args: argparse.Namespace) -> int:
    settings = read_settings(args)
    _, result = train_file(settings)
    print(json.dumps({"words_per_second": round(result.words_per_second),
                      "effective_words_per_second": round(result.effective_words_per_second),
                      "seconds": round(result.seconds, 2), "vocabulary": result.vocabulary,
                      "malformed": result.malformed,
                      "files": result.files}))
    return 0
