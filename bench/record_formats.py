"""Record formats and tokenizers against ``text8`` on the worker's path, in one run on one machine.

    .venv/bin/python bench/record_formats.py [--tokens 300000] [--rounds 3] [--json]

Each case streams records through what a worker does with them: the stream's record format
(``online.stream.records``: decoding, and for JSON records the field's extraction, a batch at a time as the
stream does it) and the trainer
(``Trainer.train_records``: tokenising, counting, subsampling, the SGNS kernel in place, d=100), in
batches of about 5,000 tokens, on about ``--tokens`` tokens each. Cases:

- ``text8`` on English (the generated sample corpus, 10 lines a record): the reference of the English cases;
- ``tokens`` and ``unicode`` on the same English records, and JSON text (``{"user": ..., "text": "<English>"}``,
  field ``text``, ``text8``): the same tokens and sentences, so the same work in the kernel;
- ``text8`` on an ID stream (the sessions demo's sessions, one a record, each ID spelt in letters so that
  ``text8`` keeps it one token: ``sku-10417`` -> ``skubaebh``): the reference of the ID cases;
- ``tokens`` on the same ID stream as sent (``sku-10417 sku-tent-2p ...``), and JSON ID sessions
  (``{"user": ..., "items": [...]}``, field ``items``: one sentence of tokens): the same tokens, sentences and
  vocabulary distribution as their reference;
- ``unicode`` on Chinese and on Japanese (records drawn from a pool of hand-written sentences: there
  is no Chinese or Japanese corpus on this machine; the segmenters' speed depends on the text, not on
  its variety).

The kernel's work per token depends on the stream (sentence lengths, the vocabulary's distribution,
subsampling), so each case is compared with ``text8`` on the same tokens: the ratio is what the record
format and the tokenizer cost. Each case is timed in CPU seconds of its thread (what a worker's core
spends, whatever else runs on the machine) and in wall seconds; rounds run the cases in turn, in
alternate orders, each with a fresh model, and a figure is the median of ``--rounds`` rounds. It
prints words/s and the ratio to its reference's, the tokenizer's own rate
(``Tokenizer.spans`` alone), and the segmenters' MB/s on one core: the ``unicode`` tokenizer on CJK
text (normalisation, regex, routing and segmentation), and ``rjieba`` and Sudachi (mode C) alone.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from online.learner.tokenizers import Tokenizer  # noqa: E402
from online.learner.tokenizers.cjk import segment_chinese, segment_japanese  # noqa: E402
from online.learner.trainer import LearnerConfig, Trainer  # noqa: E402
from online.stream.batches import decode_records  # noqa: E402
from online.stream.records import RecordFormat  # noqa: E402
from online.stream.sample_corpus import generate_lines  # noqa: E402
from online.stream.sample_sessions import iter_sessions  # noqa: E402

CHINESE = [
    "分布式操作系统管理每台机器的处理器和内存。", "北京是中华人民共和国的首都，也是全国的政治和文化中心。",
    "我昨天和朋友一起在新开的餐厅吃了晚饭。", "机器学习模型可以从大量数据中学习词语的含义。",
    "今天天气很好，我们去公园散步吧。", "这家公司去年的销售额比前年增长了百分之二十。",
    "上海的地铁网络是世界上最长的城市轨道交通系统之一。", "科学家们在南极洲发现了一种新的微生物。",
    "他每天早上六点起床，然后跑步半个小时。", "这本小说讲述了一个普通家庭三代人的故事。",
    "长江是亚洲最长的河流，全长约六千三百公里。", "学生们正在图书馆里准备下个月的期末考试。",
    "政府宣布将在明年投资建设更多的高速铁路。", "互联网改变了人们获取信息和相互交流的方式。",
    "我的手机电池坏了，需要去商店换一个新的。", "这座古老的寺庙已经有一千多年的历史了。",
    "足球比赛在晚上八点开始，球迷们早早来到了体育场。", "医生建议他少吃油腻的食物，多喝水。",
    "人工智能在医疗诊断领域的应用越来越广泛。", "春节是中国最重要的传统节日，家人会团聚在一起。",
]
JAPANESE = [
    "分散型のオペレーティングシステムは、各マシンのCPUとメモリを管理する。", "東京都は日本の首都であり、人口は約千四百万人です。",
    "私は昨日友達と一緒に新しいレストランで晩ご飯を食べました。", "機械学習のモデルは大量のデータから単語の意味を学習することができる。",
    "今日は天気が良いので、公園まで散歩に行こうと思います。", "この会社の昨年の売上高は前年と比べて二割増加した。",
    "新幹線は東京と大阪の間をおよそ二時間半で結んでいる。", "研究者たちは南極で新しい微生物を発見したと発表した。",
    "彼は毎朝六時に起きて、三十分ほどジョギングをしている。", "この小説は、ある普通の家族の三世代にわたる物語を描いている。",
    "富士山は日本で最も高い山で、標高は三千七百七十六メートルです。", "学生たちは図書館で来月の期末試験の準備をしている。",
    "政府は来年、再生可能エネルギーへの投資を拡大すると発表した。", "インターネットは人々が情報を得て交流する方法を大きく変えた。",
    "スマートフォンの電池が壊れたので、新しいものに交換してもらった。", "京都には千年以上の歴史を持つ古い寺がたくさんある。",
    "サッカーの試合は午後八時に始まり、ファンは早くからスタジアムに集まった。", "医者は彼に脂っこい食べ物を控えて、水をたくさん飲むように勧めた。",
    "人工知能は医療の診断にますます広く使われるようになっている。", "正月には家族が集まり、一緒におせち料理を食べる。",
]


def english(tokens: int) -> list[str]:
    lines = generate_lines(tokens // 5 + 100, seed=3)
    records, count = [], 0
    for i in range(0, len(lines), 10):
        record = "\n".join(lines[i:i + 10])
        records.append(record)
        count += len(record.split())
        if count >= tokens:
            break
    return records


def sessions(tokens: int) -> list[dict]:
    out, count = [], 0
    for session in iter_sessions(seed=3):
        out.append(session)
        count += len(session["items"])
        if count >= tokens:
            return out


def letters(item: str) -> str:
    """An ID as ``text8`` keeps it whole: digits spelt as letters, anything else not a letter dropped."""
    return "".join(c if "a" <= c <= "z" else chr(97 + int(c)) if c.isdigit() else "" for c in item.lower())


def cjk(pool: list[str], chars: int, seed: int) -> list[str]:
    """Records of about 150 characters, sentences drawn at random from ``pool``, about ``chars`` in all."""
    rng = random.Random(seed)
    records, total = [], 0
    while total < chars:
        record = ""
        while len(record) < 150:
            record += rng.choice(pool)
        records.append(record)
        total += len(record)
    return records


BASELINE = {"tokens English": "text8 English", "unicode English": "text8 English",
            "JSON English text (text8)": "text8 English", "tokens ID text": "text8 ID text (letters)",
            "JSON ID sessions (tokens)": "text8 ID text (letters)", "unicode Chinese": "text8 English",
            "unicode Japanese": "text8 English"}


def cases(tokens: int) -> list[tuple[str, str, RecordFormat, list[bytes]]]:
    """(name, tokenizer, record format, record values as Kafka carries them)."""
    en = [r.encode() for r in english(tokens)]
    ids = sessions(tokens)
    text = RecordFormat()
    per_char = {}   # characters per token of each CJK language, to give each case about ``tokens`` tokens
    for name, pool in (("zh", CHINESE), ("ja", JAPANESE)):
        sample = cjk(pool, 20_000, seed=1)
        per_char[name] = sum(len(s) for s in sample) / Tokenizer("unicode").spans(sample).num_tokens
    return [
        ("text8 English", "text8", text, en),
        ("tokens English", "tokens", text, en),
        ("unicode English", "unicode", text, en),
        ("text8 ID text (letters)", "text8", text, [" ".join(map(letters, s["items"])).encode() for s in ids]),
        ("tokens ID text", "tokens", text, [" ".join(s["items"]).encode() for s in ids]),
        ("JSON ID sessions (tokens)", "tokens", RecordFormat("json", "items"), [json.dumps(s).encode() for s in ids]),
        ("JSON English text (text8)", "text8", RecordFormat("json", "text"),
         [json.dumps({"user": i, "text": r.decode()}).encode() for i, r in enumerate(en)]),
        ("unicode Chinese", "unicode", text,
         [r.encode() for r in cjk(CHINESE, int(tokens * per_char["zh"]), seed=2)]),
        ("unicode Japanese", "unicode", text,
         [r.encode() for r in cjk(JAPANESE, int(tokens * per_char["ja"]), seed=2)]),
    ]


def batches(records: list, size: int = 5000) -> list[list]:
    """Records in batches of about ``size`` whitespace-separated words (CJK: characters / 2)."""
    out, cur, n = [], [], 0
    for r in records:
        cur.append(r)
        n += max(len(r.split()), len(r) // 2 if r and r[:1] > "\u2e80" else 0)
        if n >= size:
            out.append(cur)
            cur, n = [], 0
    if cur:
        out.append(cur)
    return out


class Case:
    """One case's trainer and its batches of record values, a batch of about 5,000 tokens as a worker makes."""

    def __init__(self, name: str, tokenizer: str, fmt: RecordFormat, values: list[bytes]):
        self.name, self.tokenizer, self.fmt = name, tokenizer, fmt
        self.trainer = Trainer(LearnerConfig(tokenizer=tokenizer))
        self.chunks, first = [], 0
        for batch in batches(self.read(values)):      # every value here is a valid record
            self.chunks.append(values[first:first + len(batch)])
            first += len(batch)
        self.cpu = self.wall = self.tokenising = self.reading = 0.0

    def read(self, chunk: list[bytes]) -> list:
        """What the stream does with a batch of values (``_build_batch``): decode, then the record format."""
        return [text for text, reason in decode_records(chunk, 1 << 20, self.fmt) if reason is None]

    def step(self, k: int) -> None:
        """Read and train batch ``k`` (timed), then tokenise it again alone (timed apart)."""
        if k >= len(self.chunks):
            return
        w0, c0 = time.perf_counter(), time.thread_time()
        records = self.read(self.chunks[k])
        c1 = time.thread_time()
        self.trainer.train_records(records)
        self.reading += c1 - c0
        self.cpu += time.thread_time() - c0
        self.wall += time.perf_counter() - w0
        t0 = time.thread_time()
        self.trainer.tokenizer.spans(records)
        self.tokenising += time.thread_time() - t0


def segmenter_speed(rounds: int) -> dict[str, float]:
    """MB/s on one core of the unicode tokenizer on CJK text, and of each segmenter alone."""
    out: dict[str, list[float]] = {}
    zh, ja = cjk(CHINESE, 300_000, seed=4), cjk(JAPANESE, 300_000, seed=4)
    tok = Tokenizer("unicode")
    jobs = {"unicode tokenizer, Chinese": (lambda: [tok.tokens(r) for r in zh], zh),
            "unicode tokenizer, Japanese": (lambda: [tok.tokens(r) for r in ja], ja),
            "rjieba alone, Chinese": (lambda: [segment_chinese(r) for r in zh], zh),
            "Sudachi (mode C) alone, Japanese": (lambda: [segment_japanese(r) for r in ja], ja)}
    for _ in range(rounds):
        for name, (job, text) in jobs.items():
            mb = sum(len(r.encode()) for r in text) / 1e6
            t0 = time.process_time()
            job()
            out.setdefault(name, []).append(mb / (time.process_time() - t0))
    return {name: statistics.median(v) for name, v in out.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokens", type=int, default=300_000, help="tokens per case (about)")
    ap.add_argument("--rounds", type=int, default=3, help="passes over every case (each with a fresh model)")
    ap.add_argument("--json", action="store_true", help="print the results as JSON too")
    args = ap.parse_args()
    all_cases = cases(args.tokens)
    for name, tokenizer, fmt, values in all_cases:     # compile and load everything once
        Case(name, tokenizer, fmt, values[:200]).step(0)
    rates: dict[str, list[tuple[float, float, float, int]]] = {}
    load0 = os.getloadavg()
    for r in range(args.rounds):
        run = []
        for c in (all_cases if r % 2 == 0 else all_cases[::-1]):
            case = Case(*c)
            for k in range(len(case.chunks)):
                case.step(k)
            run.append(case)
        for case in run:
            tokens = case.trainer.totals.tokens
            rates.setdefault(case.name, []).append((tokens / case.cpu, tokens / case.wall, tokens / case.tokenising,
                                                    tokens))
    load1 = os.getloadavg()
    print(f"load average {load0[0]:.2f} {load0[1]:.2f} {load0[2]:.2f} at the start, {load1[0]:.2f} {load1[1]:.2f} "
          f"{load1[2]:.2f} at the end; {args.rounds} rounds, medians")
    med = {name: [statistics.median(r[i] for r in rows) for i in range(3)] for name, rows in rates.items()}
    print(f"{'case':27s} {'tokens':>7s} {'words/CPU-s':>11s} {'ratio':>6s} {'words/s':>9s} {'ratio':>6s} "
          f"{'reference':24s} {'tokenizer words/CPU-s':>21s}")
    summary = {}
    for name, rows in rates.items():
        ref = BASELINE.get(name, name)
        cpu, wall, tok = med[name]
        summary[name] = {"tokens": rows[0][3], "words_per_cpu_second": round(cpu), "words_per_second": round(wall),
                         "reference": ref, "ratio_cpu": round(cpu / med[ref][0], 3),
                         "ratio_wall": round(wall / med[ref][1], 3), "tokenizer_words_per_cpu_second": round(tok)}
        print(f"{name:27s} {rows[0][3]:7d} {cpu:11,.0f} {cpu / med[ref][0]:5.2f}x {wall:9,.0f} "
              f"{wall / med[ref][1]:5.2f}x {ref:24s} {tok:21,.0f}")
    seg = segmenter_speed(args.rounds)
    for name, mbs in seg.items():
        print(f"{name:34s} {mbs:6.2f} MB/s per core")
    if args.json:
        print(json.dumps({"load": [load0, load1], "cases": summary, "segmenters_mb_per_s": seg}, indent=1))


if __name__ == "__main__":
    main()
