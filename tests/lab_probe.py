"""A ps-lite node run inside a lab host (``ip netns exec``), so that it resolves the Mesos-DNS names the
cluster advertises, as every task there does. It answers each ``stats`` line on stdin with one JSON
line: every server's statistics (its ledger), or null while a server does not answer."""
from __future__ import annotations

import sys

import orjson

from online.cluster import ps_commands as pc
from ps_bridge.roles import start_worker
from ps_bridge.settings import NodeSettings


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
