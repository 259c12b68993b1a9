"""``livevec checkpoint``: trigger, inspect, verify and export coordinated checkpoints.

    livevec checkpoint now [--timeout 120]     ask the coordinator for a checkpoint and wait for it
    livevec checkpoint list                    every checkpoint: complete / partial / damaged, size, offsets
    livevec checkpoint verify [ID]             full SHA-256 verification (exit 1 if damaged)
    livevec checkpoint export --out DIR        latest complete checkpoint -> word2vec text + binary

All of them work on the checkpoint directory alone (``--dir`` or ``LIVEVEC_CHECKPOINT_DIR``),
local or on the shared file system: ``now`` drops a request file that the coordinator (in the
scheduler) picks up within a second and answers next to it, so it needs no cluster port.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np

from online.checkpoint.settings import STORE
from online.checkpoint.store import CheckpointError, CheckpointStore, read_shard_file


def configure(parser: argparse.ArgumentParser) -> None:
    STORE.add_arguments(parser)
    sub = parser.add_subparsers(dest="action", metavar="ACTION")
    sub.required = True
    now = sub.add_parser("now", help="take a checkpoint now (the coordinator must be running)")
    now.add_argument("--timeout", type=float, default=120.0, help="seconds to wait for the answer (120)")
    sub.add_parser("list", help="list checkpoints with their state (sizes only; see verify)")
    verify = sub.add_parser("verify", help="verify checksums of one or all checkpoints")
    verify.add_argument("id", nargs="?", type=int, help="checkpoint id (default: all)")
    export = sub.add_parser("export", help="write the latest complete checkpoint in word2vec formats")
    export.add_argument("--out", required=True, help="output directory (vectors.txt, vectors.bin, vocab.txt)")
    export.add_argument("--id", type=int, help="export this checkpoint instead of the latest complete one")


def run(args: argparse.Namespace) -> int:
    store = CheckpointStore(STORE.read(args, os.environ)["checkpoint_dir"])
    return {"now": _now, "list": _list, "verify": _verify, "export": _export}[args.action](store, args)


def _now(store: CheckpointStore, args) -> int:
    if not store.root.is_dir():
        print(f"no checkpoint directory {store.root}", file=sys.stderr)
        return 1
    request = store.add_request("livevec checkpoint now")
    done = request.with_name(request.name[:-5] + ".done.json")
    deadline = time.monotonic() + args.timeout
    while time.monotonic() < deadline:
        if done.is_file():
            answer = json.loads(done.read_text())
            done.unlink(missing_ok=True)
            print(json.dumps(answer, indent=1))
            return 0 if answer.get("ok") else 1
        time.sleep(0.2)
    for leftover in (request, request.with_suffix(".taken")):
        leftover.unlink(missing_ok=True)
    print(f"no answer within {args.timeout:g} s: is the scheduler running with LIVEVEC_CHECKPOINT_DIR={store.root}?",
          file=sys.stderr)
    return 1


def _describe(store: CheckpointStore, ckpt_id: int, check_data: bool) -> tuple[bool, str]:
    try:
        ckpt = store.verify(ckpt_id, check_data=check_data)
    except CheckpointError as exc:
        return False, f"DAMAGED  {exc}"
    m = ckpt.manifest
    parts = sum(len(p) for p in m.get("offsets", {}).values())
    created = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(m.get("created", 0)))
    rows = sum(int(f.get("rows", 0)) for f in m["files"].values())
    return True, (f"complete {created}  {ckpt.bytes / 1e6:8.1f} MB  {rows} rows  {m['num_servers']} servers  "
                  f"{parts} partitions  records={m.get('records')}  pause={m.get('pause_seconds')}s")


def _list(store: CheckpointStore, args) -> int:
    ids = store.ids()
    if not ids:
        print(f"no checkpoints in {store.root}")
        return 0
    for ckpt_id in ids:
        _ok, text = _describe(store, ckpt_id, check_data=False)
        print(f"{ckpt_id:8d}  {text}")
    return 0


def _verify(store: CheckpointStore, args) -> int:
    ids = [args.id] if args.id is not None else store.ids()
    if not ids:
        print(f"no checkpoints in {store.root}")
        return 1
    bad = 0
    for ckpt_id in ids:
        ok, text = _describe(store, ckpt_id, check_data=True)
        bad += not ok
        print(f"{ckpt_id:8d}  {text}")
    latest = store.latest_complete()
    print(f"latest complete: {latest.id if latest else 'none'}")
    return 1 if bad else 0


def _export(store: CheckpointStore, args) -> int:
    from online.learner.word2vec_format import write_binary, write_text, write_vocab

    ckpt = store.verify(args.id) if args.id is not None else store.latest_complete()
    if ckpt is None:
        print(f"no complete checkpoint in {store.root}", file=sys.stderr)
        return 1
    words: list[str] = []
    vectors, counts = [], []
    for rank in range(ckpt.num_servers):   # one shard in memory at a time
        st = read_shard_file(ckpt.shard_path(rank))
        pos = np.searchsorted(st.keys, st.word_keys)
        pos = np.minimum(pos, max(len(st.keys) - 1, 0))
        found = (len(st.keys) > 0) & (st.keys[pos] == st.word_keys) if len(st.keys) else np.zeros(0, bool)
        idx = np.flatnonzero(found)
        words.extend(st.words[i] for i in idx.tolist())
        vectors.append(st.vectors[pos[idx]])
        counts.append(st.counts[pos[idx]])
    dim = vectors[0].shape[1] if vectors else 0
    vecs = np.concatenate(vectors) if vectors else np.zeros((0, dim), np.float32)
    cnts = np.concatenate(counts) if counts else np.zeros(0, np.int64)
    order = np.lexsort((np.array(words, dtype=object).astype(str), -cnts)) if words else np.zeros(0, np.int64)
    words = [words[i] for i in order.tolist()]
    vecs, cnts = vecs[order], cnts[order]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    write_text(out / "vectors.txt", words, vecs)
    write_binary(out / "vectors.bin", words, vecs)
    write_vocab(out / "vocab.txt", words, cnts.tolist())   # (spelled as the vectors files spell the words)
    print(f"exported checkpoint {ckpt.id}: {len(words)} words, dim {dim} -> {out}/vectors.txt, vectors.bin, vocab.txt")
    return 0
