"""Every server's statistics, read by a ps-lite node of its own: for tests and benchmarks of the lab.

It runs inside a lab host (``ip netns exec HOST python -m tests.support.stats_probe SCHEDULER PORT
SERVERS HOST``, from the repository's root), so that it resolves the Mesos-DNS names the cluster
advertises, as every task there does, and answers each ``stats`` line on stdin with one JSON line: the
servers' statistics (server 0's holds the batch ledger), or null while a server does not answer.
``StatsProbe`` starts one and talks to it."""
from __future__ import annotations

import sys
from pathlib import Path

import orjson

from online.cluster import ps_commands as pc
from ps_bridge.roles import start_worker
from ps_bridge.settings import NodeSettings


class StatsProbe:
    """The probe process on one lab host, and its ``stats()``."""

    def __init__(self, lab, host: str, scheduler: str, root_port: int, servers: int, timeout: float = 90.0):
        import os
        import subprocess
        import threading
        repo = Path(__file__).resolve().parents[2]
        self.proc = subprocess.Popen(
            [*lab.exec_prefix(host), sys.executable, "-m", "tests.support.stats_probe", scheduler,
             str(root_port), str(servers), host], cwd=repo, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            text=True, env={**os.environ, "PYTHONPATH": str(repo)})
        if self.proc.stdout.readline().strip() != "ready":
            self.proc.kill()
            raise RuntimeError("the stats probe did not join the cluster")
        self.lock = threading.Lock()

    def stats(self):
        with self.lock:
            self.proc.stdin.write("stats\n")
            self.proc.stdin.flush()
            return orjson.loads(self.proc.stdout.readline())

    def ledger(self):
        stats = self.stats()
        return stats[0].get("ledger") if stats else None

    def close(self) -> None:
        try:
            self.proc.stdin.close()
            self.proc.wait(timeout=10)
        except Exception:   # noqa: BLE001 - gone already
            self.proc.kill()


def main() -> None:
    scheduler, port, servers, host = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
    kv = start_worker(NodeSettings(role="worker", root_uri=scheduler, root_port=port, num_server=servers,
                                   num_worker=2, elastic_workers=True, node_host=host, heartbeat_interval=0.5),
                      timeout=60)
    print("ready", flush=True)
    for line in sys.stdin:
        if line.strip() != "stats":
            break
        out = []
        for sid in kv.po.server_ids():
            try:
                ts = kv.request(pc.HEAD_STATS, b"", sid)
                out.append(orjson.loads(kv.wait(ts, 3.0)[0].body))
            except Exception:   # a server is cut off or down
                out = None
                break
        sys.stdout.write(orjson.dumps(out).decode() + "\n")
        sys.stdout.flush()
    kv.po.leave()


if __name__ == "__main__":
    main()
