"""A scaling model from measurement: what each role costs per trained token, over real links.

    python bench/scaling.py [--quick | --full] [--json PATH] [--corpus FILE] [--tokens N] [--pairs N]

1. A network-namespace lab of 4 hosts (``online.deployment.netns_lab``, lab id 60 - 69), one Kafka broker on
   its bridge, and the committed Marathon group placed over the hosts as Mesos would place it
   (``online.deployment.lab_runner``): 1 scheduler, S servers, W workers, 1 front end, checkpoints on, with the
   environment ``livevec up`` gives them. The corpus (the Wikipedia corpus of ../shared/data, else the generated
   sample corpus) is produced into a fresh 16-partition topic before each cluster starts, and trained once.
2. Per round it samples, at the first trained token and at the last: the CPU time (utime + stime from
   /proc/<pid>/stat of each task's process tree, and of the Kafka broker's JVM), every process's /metrics
   (ps-lite payload bytes in and out, the workers' Kafka bytes and tokens, the scheduler's messages), the bytes
   on every host's link (the bridge side of its veth) and, from nftables counters inside each host, the bytes
   of its Kafka connections. Words/s is tokens trained between the two samples over the time between them.
   The window opens again after every rollback (each cluster starts with one, and the consumer group's
   rebalance when its second member joins usually rolls back to the start), so it covers kept training;
   the periodic checkpoints fall inside it.
3. Rounds alternate unshaped links and links shaped to ``--link`` (1 Gbit/s, ``tc`` token bucket on both ends
   of every host's link), in ABBA order, and the shaped / unshaped words/s ratio is printed.
4. A last round runs 16 workers across the 4 hosts (correctness, not speed, on 2 cores; the group's
   hostname:MAX_PER:2 for workers becomes 4 for that round only): every worker must train, and the model's quality (analogy accuracy and WS353 with the Wikipedia corpus, the planted
   neighbours of ``sample_corpus.planted_groups`` with the sample corpus) is compared with the 2-worker rounds.
5. Prints a table of the per-token figures, a projection for 4 / 16 / 64 workers on 1 / 4 / 16 servers over
   1 and 10 Gbit/s links derived from them (docs/scaling.md explains the formulas), and writes it all as JSON.

Everything it makes (namespaces, processes, the broker, temporary directories) is removed on exit, also after
a failure, Ctrl-C or SIGTERM (``--keep`` keeps the work directory with the logs). Needs root (network
namespaces); ``--quick`` without root prints "skipped" and exits 0. Exit status 1 if the many-workers round
did not train on every worker or its quality dropped against the 2-worker rounds.
"""
from __future__ import annotations

import argparse
import concurrent.futures
import dataclasses
import json
import logging
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from online.deployment.lab_runner import lab_cluster  # noqa: E402
from online.deployment.netns_lab import NetnsLab, lab_support_problem  # noqa: E402
from online.deployment.topology import default_topology  # noqa: E402
from online.learner.tokenizers import Tokenizer, text8_tokens  # noqa: E402
from online.stream.kafka_broker import KafkaBroker  # noqa: E402
from online.stream.producer import TextSource, produce  # noqa: E402
from online.stream.sample_corpus import generate_lines, planted_groups  # noqa: E402
from online.stream.settings import KafkaBrokerSettings  # noqa: E402

DEFAULT_CORPUS = REPO.parent / "shared" / "data" / "wiki17m.txt.xz"
LAB_IDS = range(60, 70)            # tests use 100 - 199, `livevec up` 0
HOSTS = 4
PARTITIONS = 16                    # >= the 16 workers of the last round: partitions bound a group's parallelism
SCHEDULER_METRICS_PORT = 39100     # inside the scheduler's host, if the group gives it no metrics port
WORDS_PER_RECORD = 100             # about what `livevec up` sends (10 sample sentences per record)
NFT_TABLE = "lvscale"
ETHERNET_FRAMING = 1538 / 1448     # wire bytes per TCP payload byte at MTU 1500 (Ethernet + IP + TCP + timestamps)
CLK_TCK = os.sysconf("SC_CLK_TCK")
# What `livevec up` (online.cli.up.local_cluster) gives every role on top of the committed group.
UP_ENV = {"PS_HEARTBEAT_INTERVAL": "1", "PS_HEARTBEAT_TIMEOUT": "10"}


def loadavg() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')} load {loadavg()}] {msg}", file=sys.stderr, flush=True)


# ----------------------------------------------------------------------------- corpus

def wiki_records(path: Path, max_tokens: int) -> list[str]:
    """The corpus's first ``max_tokens`` tokens as records of ``WORDS_PER_RECORD`` words."""
    records, n = [], 0
    source = TextSource(str(path))
    try:
        while n < max_tokens and (chunk := source.read_chunk()):
            for raw in chunk:
                toks = text8_tokens(raw.decode("utf-8", "replace") if isinstance(raw, bytes) else raw)
                for i in range(0, len(toks), WORDS_PER_RECORD):
                    piece = toks[i:i + WORDS_PER_RECORD][:max_tokens - n]
                    if piece:
                        records.append(" ".join(piece))
                        n += len(piece)
                if n >= max_tokens:
                    break
    finally:
        source.close()
    return records


def sample_records(max_tokens: int) -> list[str]:
    """The generated corpus (planted pairs), 10 sentences per record as `livevec up` streams it."""
    lines = generate_lines(max(10, max_tokens // 9), seed=7)
    records = [" ".join(lines[i:i + 10]) for i in range(0, len(lines), 10)]
    out, n = [], 0
    for r in records:
        out.append(r)
        n += len(r.split())
        if n >= max_tokens:
            break
    return out


def count_tokens(records: list[str]) -> int:
    """Tokens as the workers count them (livevec_worker_tokens_total)."""
    return sum(len(s) for s in Tokenizer("text8").sentences_of(records))


# ----------------------------------------------------------------------------- measuring

def scrape(url: str, timeout: float = 5.0) -> dict[str, float]:
    """A Prometheus page as name -> value, summed over labels (histogram buckets dropped); each labelled series
    is also there under its own ``name{labels}``."""
    out: dict[str, float] = {}
    with urllib.request.urlopen(url, timeout=timeout) as resp:
        text = resp.read().decode()
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name_labels, value = line.rsplit(" ", 1)
            name = re.sub(r"\{.*\}", "", name_labels)
            if name.endswith("_bucket"):
                continue
            try:
                out[name] = out.get(name, 0.0) + float(value)
            except ValueError:
                continue
            if name_labels != name:
                out[name_labels] = float(value)
    return out


def proc_table() -> dict[int, tuple[int, float]]:
    """pid -> (ppid, CPU seconds utime + stime) of every process."""
    table = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            fields = Path(f"/proc/{entry.name}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        table[int(entry.name)] = (int(fields[1]), (int(fields[11]) + int(fields[12])) / CLK_TCK)
    return table


def children_of(table: dict[int, tuple[int, float]]) -> dict[int, list[int]]:
    children: dict[int, list[int]] = {}
    for p, (ppid, _) in table.items():
        children.setdefault(ppid, []).append(p)
    return children


def tree_pids(pid: int | None, table: dict[int, tuple[int, float]], children: dict[int, list[int]]) -> list[int]:
    """``pid`` and all its live descendants."""
    if pid is None or pid not in table:
        return []
    out, stack = [], [pid]
    while stack:
        p = stack.pop()
        out.append(p)
        stack.extend(children.get(p, ()))
    return out


def tree_cpu(pid: int | None, table: dict[int, tuple[int, float]], children: dict[int, list[int]]) -> float:
    """CPU seconds of ``pid`` and all its live descendants."""
    return sum(table[p][1] for p in tree_pids(pid, table, children))


def nft_setup(lab: NetnsLab, kafka_port: int) -> None:
    """Counters of each host's Kafka traffic (to and from the broker on the bridge), inside its namespace."""
    rules = (f"add table inet {NFT_TABLE}\n"
             f"add chain inet {NFT_TABLE} in {{ type filter hook input priority 0; }}\n"
             f"add chain inet {NFT_TABLE} out {{ type filter hook output priority 0; }}\n"
             f"add rule inet {NFT_TABLE} in ip saddr {lab.bridge_address} tcp sport {kafka_port} counter\n"
             f"add rule inet {NFT_TABLE} out ip daddr {lab.bridge_address} tcp dport {kafka_port} counter\n")
    for host in lab.hosts:
        subprocess.run([*lab.exec_prefix(host.name), "nft", "-f", "-"], input=rules, text=True, check=True,
                       capture_output=True, timeout=20)


def nft_read(lab: NetnsLab, host) -> dict[str, float]:
    done = subprocess.run([*lab.exec_prefix(host.name), "nft", "-j", "list", "table", "inet", NFT_TABLE],
                          capture_output=True, text=True, timeout=20)
    out = {"kafka_in": 0.0, "kafka_out": 0.0}
    if done.returncode != 0:
        return out
    for item in json.loads(done.stdout).get("nftables", []):
        rule = item.get("rule")
        if not rule:
            continue
        for expr in rule.get("expr", []):
            if "counter" in expr:
                out["kafka_in" if rule["chain"] == "in" else "kafka_out"] += expr["counter"]["bytes"]
    return out


def nic_read(host) -> dict[str, float]:
    """Bytes on the host's link, read on the bridge side of its veth (its rx is what the host sent)."""
    base = Path(f"/sys/class/net/{host.veth}/statistics")
    return {"out": float((base / "rx_bytes").read_text()), "in": float((base / "tx_bytes").read_text())}


class Round:
    """One cluster over the lab, one pass over the topic, and the samples taken while it trains."""

    def __init__(self, ctx: "Context", index: int, label: str, link: str | None, servers: int, workers: int):
        self.ctx, self.index, self.label, self.link = ctx, index, label, link
        self.servers, self.workers = servers, workers
        self.work = ctx.root / f"round{index}"
        self.topic = f"scale{index}"
        self.runner = None
        self.first = self.all_in = self.last = None
        self.done = threading.Event()
        self.error: str | None = None
        self.pool = concurrent.futures.ThreadPoolExecutor(max_workers=max(8, workers + servers + 2))

    # -- the cluster
    def topology(self):
        topo = default_topology(servers=self.servers, workers=self.workers, frontends=1,
                                kafka_partitions=PARTITIONS)
        per_host = math.ceil(self.workers / HOSTS)
        if per_host > 2:
            # The committed group allows 2 workers per agent (hostname:MAX_PER:2); 16 workers on 4 hosts
            # need 4 per host. Only this constraint changes, and only for this round.
            roles = tuple(dataclasses.replace(r, constraints=tuple(
                ("hostname", "MAX_PER", str(per_host)) if c[:2] == ("hostname", "MAX_PER") else c
                for c in r.constraints)) if r.name == "worker" else r for r in topo.roles)
            topo = dataclasses.replace(topo, roles=roles)
        return topo

    def start(self) -> None:
        env = {"LIVEVEC_KAFKA_BOOTSTRAP": self.ctx.broker.bootstrap, "LIVEVEC_KAFKA_TOPICS": self.topic,
               "LIVEVEC_KAFKA_GROUP": f"scale-group{self.index}", **UP_ENV, **getattr(self, "extra_env", {})}
        app_env = {"frontend": {"LIVEVEC_HTTP_HOST": "0.0.0.0", "LIVEVEC_MODEL_SOURCE": "ps"},
                   "scheduler": {"LIVEVEC_METRICS_PORT": str(SCHEDULER_METRICS_PORT)}}
        self.runner = lab_cluster(self.ctx.lab, self.topology(), work_dir=self.work, env=env, app_env=app_env,
                                  instances={"server": self.servers, "worker": self.workers, "frontend": 1,
                                             "producer-example": 0},
                                  volumes={"/mnt/mfs": self.work / "shared"})
        self.placement = {f"{a.rsplit('/', 1)[-1]}{i}": h for (a, i), h in sorted(self.runner.placement.items())}
        self.sampler = threading.Thread(target=self._sample_loop, name=f"sampler{self.index}", daemon=True)
        self.sampler.start()
        self.runner.start()

    def stop(self) -> None:
        self.done.set()
        if self.runner is not None:
            self.runner.stop()
        self.pool.shutdown(wait=False, cancel_futures=True)

    # -- the samples
    def _urls(self) -> dict[str, str]:
        """/metrics of every task launched so far."""
        urls = {}
        for s in self.runner.status():
            port = {"server": "metrics", "worker": "metrics", "frontend": "http"}.get(s.app)
            if port and s.ports.get(port):
                urls[f"{s.app}{s.index}"] = f"http://{s.host}:{s.ports[port]}/metrics"
            elif s.app == "scheduler":
                # the group may give the scheduler a metrics port of its own; else it gets ours (app_env)
                urls["scheduler0"] = f"http://{s.host}:{s.ports.get('metrics') or SCHEDULER_METRICS_PORT}/metrics"
        return urls

    def _pids(self) -> dict[str, int | None]:
        return {f"{s.app}{s.index}": s.pid for s in self.runner.status()}

    def _scrape_all(self, names) -> dict[str, dict[str, float]]:
        urls = self._urls()

        def one(name):
            try:
                return name, scrape(urls[name], timeout=3.0)
            except Exception:   # noqa: BLE001 - not up yet, or busy: counted as missing
                return name, None
        return {n: m for n, m in self.pool.map(one, [n for n in names if n in urls]) if m is not None}

    def snapshot(self) -> dict:
        """Everything at one moment: the counters (in parallel), the time, then the CPU and the links."""
        metrics = self._scrape_all(list(self._urls()))
        t = time.monotonic()
        table = proc_table()
        kids = children_of(table)
        cpu = {name: tree_cpu(pid, table, kids) for name, pid in self._pids().items()}
        cpu["kafka0"] = tree_cpu(self.ctx.broker.process.pid if self.ctx.broker.process else None, table, kids)
        nic = {h.address: nic_read(h) for h in self.ctx.lab.hosts}
        kafka_wire = {h.address: nft_read(self.ctx.lab, h) for h in self.ctx.lab.hosts}
        return {"t": t, "cpu": cpu, "metrics": metrics, "nic": nic, "kafka_wire": kafka_wire,
                "loadavg": loadavg()}

    def _state(self) -> tuple[list[float], float, float, float] | None:
        """(tokens per worker, Kafka lag, rollbacks so far, recovering) or None while not every task answers."""
        # The scheduler is asked once a second only: its own CPU is one of the figures, and serving /metrics
        # costs it more than its share of the cluster's heartbeats.
        self._polls = getattr(self, "_polls", 0) + 1
        ask_scheduler = self._sched is None or self._polls % self._sched_every == 0
        names = [f"worker{i}" for i in range(self.workers)] + (["scheduler0"] if ask_scheduler else [])
        got = self._scrape_all(names)
        if len(got) < len(names):
            return None
        if ask_scheduler:
            self._sched = got["scheduler0"]
        tokens = [got[f"worker{i}"].get("livevec_worker_tokens_total", 0.0) for i in range(self.workers)]
        lag = sum(got[f"worker{i}"].get("livevec_worker_kafka_lag", 0.0) for i in range(self.workers))
        return tokens, lag, self._sched.get("livevec_rollbacks_total", 0.0), self._sched.get("livevec_recovering", 0.0)

    def _sample_loop(self) -> None:
        """The window opens at the first batch trained after the last rollback and closes at the last batch.

        Every cluster starts with a rollback (the coordinator takes the workers in), and the Kafka group
        usually rebalances once more when the second member joins a few seconds into training (the first
        one got every partition), which rolls the cluster back to the start: the tokens trained before
        that are trained again. So the window restarts after every rollback; words/s and the per-token
        figures are those of training that is kept."""
        poll = 0.2 if self.workers <= 4 else 0.4
        self._sched, self._sched_every = None, max(1, round(1.0 / poll))
        expected = self.ctx.tokens
        last_change, last_total = None, -1.0
        seen_rollbacks, base, base_each = -1.0, 0.0, None
        deadline = time.monotonic() + self.ctx.round_timeout
        self._errors_seen: set[str] = set()
        try:
            self.zero = self.snapshot()
            while not self.done.is_set():
                if time.monotonic() > deadline:
                    self.error = f"not every token trained within {self.ctx.round_timeout:.0f} s"
                    return
                time.sleep(poll)
                try:
                    state = self._state()
                except Exception as exc:   # noqa: BLE001 - runner not started yet
                    state = None
                    if str(exc) not in self._errors_seen:
                        self._errors_seen.add(str(exc))
                        log(f"round {self.index}: sampler: {type(exc).__name__}: {exc}")
                if state is None:
                    continue
                tokens, lag, rollbacks, recovering = state
                total = sum(tokens)
                if rollbacks != seen_rollbacks:
                    if self.first is not None:
                        log(f"round {self.index}: rollback {rollbacks:.0f} after {total - base:,.0f} tokens: "
                            f"the window starts again")
                    seen_rollbacks, base, base_each = rollbacks, total, list(tokens)
                    self.first = self.all_in = None
                if recovering:
                    continue
                if self.first is None and total > base:
                    self.first = self.snapshot()
                    log(f"round {self.index}: first trained tokens ({total - base:,.0f} since the last rollback)")
                if self.all_in is None and base_each is not None and all(
                        t > b for t, b in zip(tokens, base_each)):
                    self.all_in = self.snapshot()
                if total != last_total:
                    last_change, last_total = time.monotonic(), total
                    if total >= expected and self.first is not None:
                        # the last token so far (after a rollback the total passes the corpus before the end)
                        self.last = self.snapshot()
                if (self.last is not None and lag == 0 and last_change is not None
                        and time.monotonic() - last_change > 2.5):
                    return
        except Exception as exc:   # noqa: BLE001
            self.error = f"sampler failed: {type(exc).__name__}: {exc}"
        finally:
            self.done.set()

    def wait(self) -> None:
        self.done.wait()
        self.sampler.join(timeout=10)
        if self.error:
            raise RuntimeError(f"round {self.index} ({self.label}): {self.error}; logs in {self.runner.log_dir}")

    # -- quality through the front end
    def wait_frontend_synced(self, timeout: float = 60.0) -> None:
        url = self.runner.url("frontend", "http", "/metrics")
        t0 = time.monotonic()
        start = None
        while time.monotonic() - t0 < timeout:
            try:
                syncs = scrape(url).get("livevec_frontend_syncs_total", 0.0)
            except Exception:   # noqa: BLE001
                syncs = None
            if syncs is not None:
                start = syncs if start is None else start
                if syncs >= start + 3:      # two full sync intervals after the last token
                    return
            time.sleep(0.3)

    def quality(self) -> dict:
        base = self.runner.url("frontend", "http")
        if self.ctx.corpus_kind == "sample":
            found, groups = 0, planted_groups()
            for group in groups:
                try:
                    with urllib.request.urlopen(f"{base}/v1/similar?word={group[0]}&k=4", timeout=10) as resp:
                        body = json.loads(resp.read())
                    if {n["word"] for n in body["neighbours"]} & set(group[1:]):
                        found += 1
                except Exception:   # noqa: BLE001 - 404: the word is not in the model
                    pass
            return {"planted_found": found, "planted_groups": len(groups), "planted_score": found / len(groups)}
        path = self.work / "vectors.bin"
        with urllib.request.urlopen(f"{base}/v1/export?format=binary", timeout=120) as resp, open(path, "wb") as out:
            shutil.copyfileobj(resp, out)
        return {"export": str(path)}


def evaluate_vectors(path: str) -> dict:
    """Analogy accuracy (restrict_vocab 30000) and WS353 Spearman, by gensim's own code."""
    from gensim.models import KeyedVectors
    from gensim.test.utils import datapath
    kv = KeyedVectors.load_word2vec_format(path, binary=True)
    analogy, _ = kv.evaluate_word_analogies(datapath("questions-words.txt"), restrict_vocab=30000)
    pearson, spearman, oov = kv.evaluate_word_pairs(datapath("wordsim353.tsv"))
    return {"vocab": len(kv), "analogy": float(analogy), "ws353": float(spearman[0]), "ws353_oov_pct": float(oov)}


# ----------------------------------------------------------------------------- figures

ROLES = ("scheduler", "server", "worker", "frontend", "kafka")


def _role(name: str) -> str:
    return re.sub(r"\d+$", "", name)


def figures(rnd: Round, start: dict, end: dict) -> dict:
    """Per-token and per-second figures between two snapshots."""
    dt = end["t"] - start["t"]

    def tok(s):
        return sum(m.get("livevec_worker_tokens_total", 0.0) for n, m in s["metrics"].items() if n.startswith("worker"))

    def metric(s, name, key):
        return s["metrics"].get(name, {}).get(key, 0.0)

    tokens = max(tok(end) - tok(start), 1.0)   # 1: a window with no new batch (reported as such)
    out: dict = {"seconds": dt, "tokens": tokens, "words_per_second": tokens / dt if dt > 0 else 0.0,
                 "loadavg_start": start["loadavg"], "loadavg_end": end["loadavg"]}
    names = sorted(set(end["cpu"]) | set(end["metrics"]))
    cpu = {n: end["cpu"].get(n, 0.0) - start["cpu"].get(n, 0.0) for n in names}
    out["cpu_seconds"] = {n: round(v, 3) for n, v in cpu.items()}
    out["cpu_us_per_token"] = {role: 1e6 * sum(v for n, v in cpu.items() if _role(n) == role) / tokens
                               for role in ROLES}
    out["cores_used"] = {role: sum(v for n, v in cpu.items() if _role(n) == role) / dt for role in ROLES}
    ps = {}
    for role in ("server", "worker", "frontend", "scheduler"):
        members = [n for n in names if _role(n) == role]
        sent = sum(metric(end, n, "pslite_sent_bytes_total") - metric(start, n, "pslite_sent_bytes_total")
                   for n in members)
        recv = sum(metric(end, n, "pslite_received_bytes_total") - metric(start, n, "pslite_received_bytes_total")
                   for n in members)
        ps[role] = {"out_per_token": sent / tokens, "in_per_token": recv / tokens}
        if role == "server" and members:
            per = [metric(end, n, "pslite_sent_bytes_total") - metric(start, n, "pslite_sent_bytes_total")
                   for n in members]
            ps[role]["imbalance"] = max(per) / (sum(per) / len(per)) if sum(per) else 1.0
    out["ps_bytes"] = ps
    keys = {k: sum(metric(end, f"server{i}", k) - metric(start, f"server{i}", k) for i in range(rnd.servers))
            / tokens for k in ("livevec_server_keys_pulled_total", "livevec_server_keys_pushed_total")}
    out["rows_per_token"] = {"pulled": keys["livevec_server_keys_pulled_total"],
                             "pushed": keys["livevec_server_keys_pushed_total"]}
    # The front end's ps-lite counters are not on its /metrics; its syncs' rows are.
    synced = metric(end, "frontend0", "livevec_frontend_synced_rows_total") - \
        metric(start, "frontend0", "livevec_frontend_synced_rows_total")
    syncs = metric(end, "frontend0", "livevec_frontend_syncs_total") - metric(start, "frontend0", "livevec_frontend_syncs_total")
    out["frontend_sync"] = {"rows_per_second": synced / dt if dt > 0 else 0.0, "syncs": syncs,
                            "rows_per_token": synced / tokens,
                            "estimated_bytes_per_second": synced * (4 * 100 + 16) / dt if dt > 0 else 0.0}
    # Kafka over the whole round: consumers fetch ahead (a small corpus is fetched before the first batch
    # is trained) and fetch again after a rollback's seek, so bytes over every token the round trained
    zero = rnd.zero
    round_tokens = max(tok(end) - tok(zero), 1.0)
    kafka_payload = sum(metric(end, f"worker{i}", "livevec_stream_bytes_total") for i in range(rnd.workers))
    wire_in = sum(end["kafka_wire"][h]["kafka_in"] - zero["kafka_wire"][h]["kafka_in"] for h in end["kafka_wire"])
    wire_out = sum(end["kafka_wire"][h]["kafka_out"] - zero["kafka_wire"][h]["kafka_out"] for h in end["kafka_wire"])
    # less what the idle JVM burns anyway (measured before the first round; the round includes the cluster's start)
    kafka_cpu = max(0.0, end["cpu"].get("kafka0", 0.0) - zero["cpu"].get("kafka0", 0.0)
                    - rnd.ctx.broker_idle_cores * (end["t"] - zero["t"]))
    out["kafka_bytes"] = {"payload_per_token": kafka_payload / round_tokens, "wire_in_per_token": wire_in / round_tokens,
                          "wire_out_per_token": wire_out / round_tokens, "round_tokens": round_tokens,
                          "broker_cpu_us_per_token_round": 1e6 * kafka_cpu / round_tokens,
                          "broker_produce_cpu_us_per_token": rnd.produce_cpu_us_per_token}
    hosts = {}
    for h in end["nic"]:
        d_in = end["nic"][h]["in"] - start["nic"][h]["in"]
        d_out = end["nic"][h]["out"] - start["nic"][h]["out"]
        k_in = end["kafka_wire"][h]["kafka_in"] - start["kafka_wire"][h]["kafka_in"]
        k_out = end["kafka_wire"][h]["kafka_out"] - start["kafka_wire"][h]["kafka_out"]
        on = sorted(n for n, a in rnd.placement.items() if a == h)
        payload = sum(metric(end, n, k) - metric(start, n, k) for n in on
                      for k in ("pslite_sent_bytes_total", "pslite_received_bytes_total"))
        roles = {_role(n) for n in on}
        # ps-lite payload against the bytes its link carried (Kafka's counted apart): valid where no two
        # tasks that exchange rows share the host (their traffic would not cross the link)
        # (the front end's own ps-lite counters are not on its /metrics, so a host with it is left out too)
        crossing = not ({"server", "worker"} <= roles or "frontend" in roles)
        hosts[h] = {"tasks": on, "in_per_token": d_in / tokens, "out_per_token": d_out / tokens,
                    "in_MBps": d_in / dt / 1e6, "out_MBps": d_out / dt / 1e6,
                    "ps_wire_overhead": ((d_in + d_out - k_in - k_out) / payload
                                         if crossing and payload > 1e5 else None)}
    out["link_bytes"] = hosts
    sched_msgs = sum(metric(end, "scheduler0", k) - metric(start, "scheduler0", k)
                     for k in ("pslite_messages_sent_total", "pslite_messages_received_total"))
    out["scheduler"] = {"messages_per_second": sched_msgs / dt if dt > 0 else 0.0,
                        "messages": sched_msgs,
                        "cpu_us_per_message": 1e6 * cpu.get("scheduler0", 0.0) / sched_msgs if sched_msgs else None,
                        "nodes": 1 + rnd.servers + rnd.workers + 1,
                        "checkpoints": sum(metric(end, "scheduler0", k) - metric(start, "scheduler0", k)
                                           for k in ("livevec_checkpoints_total",)),
                        "rollbacks": metric(end, "scheduler0", "livevec_rollbacks_total")}
    return out


def summarise(rnd: Round) -> dict:
    res = {"round": rnd.index, "label": rnd.label, "link": rnd.link or "unshaped", "servers": rnd.servers,
           "extra_env": getattr(rnd, "extra_env", {}),
           "workers": rnd.workers, "placement": rnd.placement, "window": figures(rnd, rnd.first, rnd.last)}
    if rnd.workers > 4 and rnd.all_in is not None and rnd.all_in is not rnd.last:
        res["window_all_workers_in"] = figures(rnd, rnd.all_in, rnd.last)
    per_worker = [rnd.last["metrics"].get(f"worker{i}", {}).get("livevec_worker_tokens_total", 0.0)
                  for i in range(rnd.workers)]
    res["tokens_per_worker"] = per_worker
    res["workers_trained"] = sum(1 for t in per_worker if t > 0)
    sched_log = (rnd.work / "logs" / "livevec-scheduler-0.log")
    text = sched_log.read_text(errors="replace") if sched_log.exists() else ""
    res["scheduler_log_workers"] = max([int(x) for x in re.findall(r"\bworkers=(\d+)", text)] or [0])
    return res


# ----------------------------------------------------------------------------- the model

def project(m: dict, workers: int, servers: int, link_gbit: float) -> dict:
    """Cluster words/s and the resource that limits it, from the per-token figures ``m`` (see docs/scaling.md)."""
    link = link_gbit * 1e9 / 8                      # bytes/s each way (full duplex)
    o = m["ps_wire_overhead"]                       # link bytes / ps-lite payload bytes (TCP/IP, ZeroMQ framing)
    bounds = {
        "worker CPU": workers * m["cores_per_worker"] / (m["worker_cpu_us"] * 1e-6),
        "server CPU": servers * m["cores_per_server"] / (m["server_cpu_us"] * 1e-6 * m["server_imbalance"]),
        "server NIC": servers * link / (max(m["server_in"], m["server_out"]) * o * m["server_imbalance"]),
        "worker NIC": workers * link / max(m["worker_in"] * o + m["kafka_in"], m["worker_out"] * o + m["kafka_out"]),
        "Kafka broker NIC": m["kafka_brokers"] * link / m["kafka_in"],
        "Kafka broker CPU": m["kafka_brokers"] * m["cores_per_broker"]
                            / ((m["kafka_cpu_us"] + m["kafka_produce_cpu_us"]) * 1e-6),
    }
    limit = min(bounds, key=bounds.get)
    # A batch's pull and push cross the worker's link while its CPU waits unless the other batch in flight
    # hides them: with no overlap at all a worker spends cpu + bytes/link per token.
    link_s = (m["worker_in"] + m["worker_out"]) * o / link
    serial = workers / (m["worker_cpu_us"] * 1e-6 / m["cores_per_worker"] + link_s)
    nodes = 1 + servers + workers + 1
    sched_load = nodes * m["scheduler_msgs_per_node_s"] * m["scheduler_cpu_us_per_msg"] * 1e-6
    return {"workers": workers, "servers": servers, "link_gbit": link_gbit, "words_per_second": bounds[limit],
            "limit": limit, "bounds": bounds, "words_per_second_no_overlap": min(bounds[limit], serial),
            "worker_link_us_per_token": link_s * 1e6, "kafka_partitions_needed": workers,
            "scheduler_cores": sched_load}


def model_inputs(rounds: list[dict]) -> dict:
    """The model's inputs: medians over the unshaped 2-worker rounds."""
    base = [r["window"] for r in rounds if r["link"] == "unshaped" and r["workers"] <= 4]

    def med(values):
        values = sorted(values)
        return values[len(values) // 2] if len(values) % 2 else sum(values[len(values) // 2 - 1:][:2]) / 2

    overheads = [h["ps_wire_overhead"] for w in base for h in w["link_bytes"].values()
                 if h["ps_wire_overhead"] is not None]
    return {
        "worker_cpu_us": med([w["cpu_us_per_token"]["worker"] for w in base]),
        "server_cpu_us": med([w["cpu_us_per_token"]["server"] for w in base]),
        # the broker's whole CPU in the window (its idle JVM included: the fetches alone are not told apart
        # from it; the idle-corrected figure of the round, broker_cpu_us_per_token_round, is often 0)
        "kafka_cpu_us": med([w["cpu_us_per_token"]["kafka"] for w in base]),
        "frontend_cpu_us": med([w["cpu_us_per_token"]["frontend"] for w in base]),
        "scheduler_cpu_us": med([w["cpu_us_per_token"]["scheduler"] for w in base]),
        "server_in": med([w["ps_bytes"]["server"]["in_per_token"] for w in base]),
        "server_out": med([w["ps_bytes"]["server"]["out_per_token"] for w in base]),
        "server_imbalance": med([w["ps_bytes"]["server"].get("imbalance", 1.0) for w in base]),
        "worker_in": med([w["ps_bytes"]["worker"]["in_per_token"] for w in base]),
        "worker_out": med([w["ps_bytes"]["worker"]["out_per_token"] for w in base]),
        # steady state: the records' bytes in Ethernet frames. The measured wire bytes (kafka_wire_in) are an
        # upper bound: a consumer fetches up to 1 MB per partition ahead and drops it at every rebalance, and a
        # rollback fetches again from the checkpoint, which on a short run is a large part of the total
        "kafka_in": ETHERNET_FRAMING * med([w["kafka_bytes"]["payload_per_token"] for w in base]),
        "kafka_wire_in": med([w["kafka_bytes"]["wire_in_per_token"] for w in base]),
        "kafka_out": med([w["kafka_bytes"]["wire_out_per_token"] for w in base]),
        "kafka_payload": med([w["kafka_bytes"]["payload_per_token"] for w in base]),
        # link bytes per ps-lite payload byte (TCP/IP headers, ACKs, ZeroMQ framing), on hosts whose
        # traffic all crosses their link; Kafka's wire bytes are measured as such
        "ps_wire_overhead_lab": med(overheads) if overheads else None,
        # the lab's veth links carry 64 KB segments (GSO), so they show almost no header bytes; a real
        # Ethernet link with a 1500-byte MTU carries 1448 payload bytes per 1538 bytes on the wire (headers,
        # preamble, gap): the projection uses that
        "ps_wire_overhead": max(ETHERNET_FRAMING, med(overheads) if overheads else 1.0),
        "kafka_produce_cpu_us": med([w["kafka_bytes"]["broker_produce_cpu_us_per_token"] for w in base]),
        "scheduler_msgs_per_node_s": med([w["scheduler"]["messages_per_second"] / w["scheduler"]["nodes"]
                                          for w in base]),
        "scheduler_cpu_us_per_msg": med([w["scheduler"]["cpu_us_per_message"] or 0.0 for w in base]),
        "cores_per_worker": 1.0, "cores_per_server": 1.0, "cores_per_broker": 1.0, "kafka_brokers": 1,
    }


# ----------------------------------------------------------------------------- output

def fmt_si(v: float) -> str:
    for div, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(v) >= div:
            return f"{v / div:.3g}{suffix}"
    return f"{v:.3g}"


def print_table(rounds: list[dict]) -> None:
    print("\nper round (window: first trained token -> last; CPU in us per token, bytes per token)")
    head = (f"{'#':>2} {'config':<13}{'link':<9}{'tokens':>10}{'s':>7}{'words/s':>10}  "
            f"{'cpu wrk':>8}{'srv':>6}{'sched':>6}{'fe':>6}{'kafka':>7}  "
            f"{'ps srv in':>10}{'out':>7}{'wrk in':>8}{'out':>7}{'fe rows/s':>10}  "
            f"{'kafka B':>8}{'wire':>6}  {'sched msg/s':>11}{'rb':>3}  load")
    print(head)
    for r in rounds:
        w = r["window"]
        c, p, k = w["cpu_us_per_token"], w["ps_bytes"], w["kafka_bytes"]
        print(f"{r['round']:>2} {str(r['servers']) + 's/' + str(r['workers']) + 'w':<13}{r['link']:<9}"
              f"{w['tokens']:>10,.0f}{w['seconds']:>7.1f}{w['words_per_second']:>10,.0f}  "
              f"{c['worker']:>8.2f}{c['server']:>6.2f}{c['scheduler']:>6.3f}{c['frontend']:>6.2f}{c['kafka']:>7.3f}  "
              f"{p['server']['in_per_token']:>10.0f}{p['server']['out_per_token']:>7.0f}"
              f"{p['worker']['in_per_token']:>8.0f}{p['worker']['out_per_token']:>7.0f}"
              f"{w.get('frontend_sync', {}).get('rows_per_second', 0):>10,.0f}  "
              f"{k['payload_per_token']:>8.2f}{k['wire_in_per_token']:>6.2f}  "
              f"{w['scheduler']['messages_per_second']:>11.1f}{w['scheduler']['rollbacks']:>3.0f}  "
              f"{w['loadavg_start']} -> {w['loadavg_end']}")


def print_projection(proj: list[dict]) -> None:
    print("\nprojection from the per-token figures (docs/scaling.md): cluster words/s and the limiting resource")
    print(f"{'workers':>7} {'servers':>7} {'link':>6}  {'words/s':>9} {'no overlap':>10}  {'limit':<18} "
          f"{'worker CPU':>10} {'server CPU':>10} {'server NIC':>10} {'worker NIC':>10} {'Kafka CPU':>10} "
          f"{'sched cores':>11}")
    for p in proj:
        b = p["bounds"]
        print(f"{p['workers']:>7} {p['servers']:>7} {p['link_gbit']:>4g}G  {fmt_si(p['words_per_second']):>9} "
              f"{fmt_si(p['words_per_second_no_overlap']):>10}  "
              f"{p['limit']:<18} {fmt_si(b['worker CPU']):>10} {fmt_si(b['server CPU']):>10} "
              f"{fmt_si(b['server NIC']):>10} {fmt_si(b['worker NIC']):>10} {fmt_si(b['Kafka broker CPU']):>10} "
              f"{p['scheduler_cores']:>11.4f}")


# ----------------------------------------------------------------------------- the run

@dataclasses.dataclass
class Context:
    lab: NetnsLab
    broker: KafkaBroker
    root: Path
    records: list[str]
    tokens: int
    corpus_kind: str
    round_timeout: float
    broker_idle_cores: float = 0.0


def broker_cpu(broker: KafkaBroker) -> float:
    table = proc_table()
    return tree_cpu(broker.process.pid if broker.process else None, table, children_of(table))


def free_lab_id() -> int:
    names = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True).stdout
    netns = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    for lab_id in LAB_IDS:
        if f"lv{lab_id}br" not in names and not re.search(rf"\blv{lab_id}h\d", netns):
            return lab_id
    raise SystemExit(f"every lab id in {LAB_IDS.start}-{LAB_IDS.stop - 1} is in use (ip netns list)")


def run_round(ctx: Context, index: int, label: str, link: str | None, servers: int, workers: int,
              extra_env: dict[str, str]) -> dict:
    for host in ctx.lab.hosts:
        ctx.lab.shape(host.name, link)
    log(f"round {index}: {label}, {servers} servers, {workers} workers, links {link or 'unshaped'}; "
        f"producing {len(ctx.records):,} records ({ctx.tokens:,} tokens) into topic scale{index}")
    c0, t0 = broker_cpu(ctx.broker), time.monotonic()
    produce(ctx.records, bootstrap=ctx.broker.bootstrap, topic=f"scale{index}", partitions=PARTITIONS,
            create_topic=True)
    produce_cpu = max(0.0, broker_cpu(ctx.broker) - c0 - ctx.broker_idle_cores * (time.monotonic() - t0))
    rnd = Round(ctx, index, label, link, servers, workers)
    rnd.extra_env = extra_env
    rnd.produce_cpu_us_per_token = 1e6 * produce_cpu / ctx.tokens
    try:
        rnd.start()
        log(f"round {index}: placement {rnd.placement}")
        rnd.wait()
        res = summarise(rnd)
        rnd.wait_frontend_synced()
        try:
            res["quality"] = rnd.quality()
        except Exception as exc:   # noqa: BLE001 - reported, not fatal
            res["quality"] = {"error": f"{type(exc).__name__}: {exc}"}
    finally:
        rnd.stop()
    if "export" in res.get("quality", {}):
        res["quality"].update(evaluate_vectors(res["quality"].pop("export")))
    w = res["window"]
    log(f"round {index}: {w['tokens']:,.0f} tokens in {w['seconds']:.1f} s = {w['words_per_second']:,.0f} words/s; "
        f"{res['workers_trained']}/{workers} workers trained; quality {res.get('quality')}")
    return res


def main() -> int:
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))   # run the finally blocks
    signal.signal(signal.SIGINT, signal.default_int_handler)   # Ctrl-C, even when started with SIGINT ignored
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    mode = ap.add_mutually_exclusive_group()
    mode.add_argument("--quick", action="store_true", help="sample corpus, 1M tokens, one round per link (smoke)")
    mode.add_argument("--full", action="store_true", help="the whole Wikipedia corpus, three rounds per link")
    ap.add_argument("--corpus", default=None, help="text file (plain/.gz/.xz), or 'sample' for the generated corpus")
    ap.add_argument("--tokens", type=int, default=None, help="tokens of the corpus to train (default 3M; quick 1M)")
    ap.add_argument("--pairs", type=int, default=None, help="rounds per link setting (default 2; quick 1)")
    ap.add_argument("--servers", type=int, default=2)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--many-workers", type=int, default=16, help="workers of the correctness round (0 = skip)")
    ap.add_argument("--many-env", action="append", default=[], metavar="KEY=VALUE",
                    help="extra environment of the many-workers round only (a diagnostic, e.g. LIVEVEC_MIN_COUNT=1)")
    ap.add_argument("--link", default="1gbit", help="the shaped rate (tc syntax)")
    ap.add_argument("--json", default=None, metavar="PATH", help="write the measured figures here")
    ap.add_argument("--keep", action="store_true", help="keep the work directory (logs) instead of removing it")
    args = ap.parse_args()
    logging.getLogger("aiokafka").setLevel(logging.ERROR)   # NotLeaderForPartition retries right after creation
    problem = lab_support_problem()
    if problem:
        if args.quick:   # bench/run_all.py's smoke run on a machine without the lab: skipped, not failed
            print(f"skipped: {problem}")
            return 0
        raise SystemExit(f"bench/scaling.py: {problem}")
    pairs = args.pairs if args.pairs is not None else (1 if args.quick else 3 if args.full else 2)
    max_tokens = args.tokens or (1_000_000 if args.quick else 17_100_000 if args.full else 3_000_000)
    corpus = args.corpus or ("sample" if args.quick or not DEFAULT_CORPUS.is_file() else str(DEFAULT_CORPUS))
    if corpus == "sample":
        kind, records = "sample", sample_records(max_tokens)
    else:
        if not Path(corpus).is_file():
            raise SystemExit(f"no corpus at {corpus}")
        kind, records = "wiki", wiki_records(Path(corpus), max_tokens)
    tokens = count_tokens(records)
    log(f"corpus {corpus}: {tokens:,} tokens in {len(records):,} records")

    root = Path(tempfile.mkdtemp(prefix="livevec-bench-scaling-"))
    lab = broker = None
    results: list[dict] = []
    started = time.strftime("%Y-%m-%d %H:%M:%S %Z")
    load_start = loadavg()
    try:
        lab_id = free_lab_id()
        lab = NetnsLab(HOSTS, lab_id=lab_id).start()
        log(f"lab {lab_id}: hosts {[h.address for h in lab.hosts]}, bridge {lab.bridge_address}")
        settings = dataclasses.replace(KafkaBrokerSettings.from_env(), host=lab.bridge_address, port=0,
                                       data_dir=root / "kafka", state_file=None)
        broker = KafkaBroker(settings)
        broker.start()
        nft_setup(lab, broker.port)
        c0, t0 = broker_cpu(broker), time.monotonic()
        time.sleep(5.0)
        idle = max(0.0, (broker_cpu(broker) - c0) / (time.monotonic() - t0))
        log(f"Kafka broker idle: {idle:.3f} cores")
        ctx = Context(lab, broker, root, records, tokens, kind, round_timeout=max(300.0, tokens / 20_000),
                      broker_idle_cores=idle)
        schedule = []
        for p in range(pairs):   # ABBA: drifts of the machine's load hit both settings alike
            order = [None, args.link] if p % 2 == 0 else [args.link, None]
            schedule += [("shaped" if link else "unshaped", link, args.servers, args.workers) for link in order]
        if args.many_workers:
            schedule.append(("many workers", None, args.servers, args.many_workers))
        many_env = dict(kv.split("=", 1) for kv in args.many_env)
        for i, (label, link, s, w) in enumerate(schedule):
            results.append(run_round(ctx, i, label, link, s, w, many_env if label == "many workers" else {}))
    finally:
        if broker is not None:
            broker.stop()
        if lab is not None:
            lab.close()
        if args.keep:
            print(f"work directory kept: {root}", file=sys.stderr)
        else:
            shutil.rmtree(root, ignore_errors=True)
    load_end = loadavg()

    print_table(results)
    base = [r for r in results if r["workers"] == args.workers]
    un = [r["window"]["words_per_second"] for r in base if r["link"] == "unshaped"]
    sh = [r["window"]["words_per_second"] for r in base if r["link"] != "unshaped"]
    ratio = (sum(sh) / len(sh)) / (sum(un) / len(un)) if un and sh else None
    pair_ratios = [b["window"]["words_per_second"] / a["window"]["words_per_second"]
                   for a, b in zip([r for r in base if r["link"] == "unshaped"],
                                   [r for r in base if r["link"] != "unshaped"])]
    if ratio is not None:
        print(f"\nratio shaped ({args.link}) / unshaped words/s: {ratio:.2f} "
              f"(per pair {', '.join(f'{x:.2f}' for x in pair_ratios)}; {args.servers} servers, {args.workers} workers)")
    many = next((r for r in results if r["workers"] == args.many_workers and r["label"] == "many workers"), None)
    verdict = None
    if many is not None:
        ref = [r for r in base if r["link"] == "unshaped"]
        q2 = ref[0]["quality"] if ref else {}
        q16 = many["quality"]
        if kind == "sample":
            holds = q16.get("planted_score", 0) >= q2.get("planted_score", 0) - 0.125
            qline = f"planted neighbours {q16.get('planted_found')}/{q16.get('planted_groups')} vs " \
                    f"{q2.get('planted_found')}/{q2.get('planted_groups')} with {args.workers} workers"
        else:
            holds = (q16.get("analogy", 0) >= 0.75 * q2.get("analogy", 0) - 0.005
                     and q16.get("ws353", -1) >= q2.get("ws353", 0) - 0.05)
            qline = f"analogy {q16.get('analogy', 0):.2%} vs {q2.get('analogy', 0):.2%}, WS353 " \
                    f"{q16.get('ws353', float('nan')):.3f} vs {q2.get('ws353', float('nan')):.3f} with {args.workers} workers"
        joined = many["workers_trained"] == args.many_workers
        verdict = {"all_trained": joined, "quality_holds": holds}
        print(f"{args.many_workers} workers on {HOSTS} hosts: {many['workers_trained']}/{args.many_workers} trained "
              f"(tokens per worker {min(many['tokens_per_worker']):,.0f} - {max(many['tokens_per_worker']):,.0f}; "
              f"scheduler log: workers={many['scheduler_log_workers']}); {qline}: "
              f"{'quality holds' if holds else 'QUALITY DROPPED'}; words/s {many['window']['words_per_second']:,.0f} "
              f"(2 cores, not a speed figure)")
    inputs, proj = None, []
    if any(r["link"] == "unshaped" and r["workers"] <= 4 for r in results):
        inputs = model_inputs(results)
        proj = [project(inputs, w, s, g) for g in (1.0, 10.0) for s in (1, 4, 16) for w in (4, 16, 64)]
        print_projection(proj)
        print(f"\nmodel inputs (medians of the unshaped {args.workers}-worker rounds): "
              + ", ".join(f"{k} {v:.4g}" if isinstance(v, float) else f"{k} {v}" for k, v in inputs.items()))
    print(f"load average {load_start} at the start, {load_end} at the end ({started})")
    out = {"bench": "scaling", "date": started, "loadavg_start": load_start, "loadavg_end": load_end,
           "corpus": corpus, "corpus_kind": kind, "tokens": tokens, "records": len(records),
           "link_shaped": args.link, "rounds": results, "ratio_shaped_unshaped": ratio,
           "pair_ratios": pair_ratios, "many_workers": verdict, "model_inputs": inputs, "projection": proj}
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1, default=str))
        print(f"figures written to {args.json}")
    ok = verdict is None or all(verdict.values())
    return 0 if ok else 1


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:   # everything was stopped and removed by the finally blocks
        print("bench/scaling.py: interrupted; the lab, the cluster and the broker were stopped", file=sys.stderr)
        sys.exit(130)
