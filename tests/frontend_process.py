"""A real ``livevec frontend`` process for tests: started on a free port, stopped afterwards."""
from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def clean_env(**extra: str) -> dict[str, str]:
    """The test's environment without any LIVEVEC_/DMLC_ setting of the caller's shell."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LIVEVEC_", "DMLC_"))}
    env.update(extra)
    return env


@contextlib.contextmanager
def running_frontend(args: list[str], env: dict[str, str]):
    """Yields ``(url, proc)`` once the front end printed the URL it serves."""
    proc = subprocess.Popen([sys.executable, "-m", "online.cli", "frontend", "--port", "0", *args],
                            cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()
        assert line.startswith("livevec frontend: serving "), line + proc.stderr.read()
        yield line.split()[-1], proc
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
