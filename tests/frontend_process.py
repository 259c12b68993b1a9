"""A real ``livevec frontend`` process for tests: started on a free port, stopped afterwards."""
from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import threading
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def clean_env(**extra: str) -> dict[str, str]:
    """The test's environment without any LIVEVEC_/DMLC_ setting of the caller's shell."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LIVEVEC_", "DMLC_"))}
    env.update(extra)
    return env


@contextlib.contextmanager
def running_frontend(args: list[str], env: dict[str, str]):
    """Yields ``(url, proc)`` once the front end printed the URL it serves. Its log lines (stderr) are read all
    along: a pipe nobody reads fills at 64 KB, and a front end logging at DEBUG (numba's compiles on a cold cache)
    would then block before it prints its URL. ``proc.communicate()`` still returns them all."""
    proc = subprocess.Popen([sys.executable, "-m", "online.cli", "frontend", "--port", "0", *args],
                            cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    log_lines: list[str] = []
    reader = threading.Thread(target=lambda: log_lines.extend(proc.stderr), daemon=True)
    reader.start()

    def communicate(input=None, timeout=None):   # noqa: A002 - Popen.communicate's signature
        out = proc.stdout.read()
        proc.wait(timeout)
        reader.join(timeout)
        return out, "".join(log_lines)

    proc.communicate = communicate
    try:
        line = proc.stdout.readline()
        if not line.startswith("livevec frontend: serving "):
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=10)   # (the log lines it wrote before it exited)
        assert line.startswith("livevec frontend: serving "), line + "".join(log_lines[-200:])
        yield line.split()[-1], proc
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
