"""The front end fixes glibc's mmap threshold and heap count at start, unless the operator's environment
already sets them (glibc's own tunables win), and says so once in its log."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
CODE = ("import json, logging; logging.basicConfig(level=logging.INFO, format='%(message)s');"
        "from online.frontend.allocator import give_freed_memory_back as g; print(json.dumps(g()))")


@pytest.mark.parametrize("preset, expected", [
    ({}, {"MALLOC_MMAP_THRESHOLD_": 4 << 20, "MALLOC_ARENA_MAX": 2}),
    ({"MALLOC_ARENA_MAX": "4"}, {"MALLOC_MMAP_THRESHOLD_": 4 << 20}),
    ({"MALLOC_ARENA_MAX": "4", "MALLOC_MMAP_THRESHOLD_": "65536"}, {}),
])
def test_the_allocator_is_tuned_unless_the_environment_already_says(preset, expected):
    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}
    done = subprocess.run([sys.executable, "-c", CODE], cwd=REPO, env={**env, **preset}, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.splitlines()[-1]) == expected
    assert ("allocator_tuned" in done.stderr) == bool(expected)
