"""OpenAPI conformance: schemathesis generates valid and invalid requests from /openapi.json and
runs them against a real ``livevec frontend`` process; every response must match the document
(status codes, content types, bodies), invalid input must get a 4xx, valid input must not be
rejected, and nothing may answer 5xx."""
from __future__ import annotations

import json
import re
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import numpy as np
import pytest

from online.learner.word2vec_format import write_binary
from tests.frontend_process import clean_env, running_frontend

SCHEMATHESIS = Path(sys.executable).with_name("schemathesis")


@pytest.fixture
def frontend(tmp_path):
    rng = np.random.default_rng(1)
    # short words too, so that generated strings sometimes hit the vocabulary
    words = ["paris", "france", "a", "b", "0", "00", "A", "king", "queen", "man", "woman", "é"]
    words += [f"w{i}" for i in range(300)]
    model = tmp_path / "model.bin"
    write_binary(model, words, rng.standard_normal((len(words), 8)).astype(np.float32))
    with running_frontend(["--model", str(model), "--max-k", "100", "--max-batch-words", "20"], clean_env()) as running:
        for _ in range(200):         # the document gives query vectors the model's dimension once it is loaded
            try:
                with urllib.request.urlopen(running[0] + "ready", timeout=10):
                    break
            except urllib.error.HTTPError:
                time.sleep(0.05)
        yield running


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_live_api_conforms_to_its_openapi_document(frontend, tmp_path):
    url, proc = frontend
    result = subprocess.run(
        [str(SCHEMATHESIS), "run", url + "openapi.json", "--checks", "all", "--max-examples", "40",
         "--workers", "1", "--seed", "20261130", "--generation-database", "none", "--no-color",
         "--wait-for-schema", "20", "--request-timeout", "20"],
        cwd=tmp_path, capture_output=True, text=True, timeout=170)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-6000:]
    # every operation of the document was exercised, but GET /openapi.json, which schemathesis leaves out
    # because it is where the document was loaded from
    with urllib.request.urlopen(url + "openapi.json", timeout=10) as r:
        operations = sum(len(item) for item in json.load(r)["paths"].values())
    assert f"Tested: {operations - 1}" in output, output[-3000:]
    generated = re.search(r"(\d+) generated, (\d+) passed", output)
    assert generated and int(generated.group(1)) == int(generated.group(2)) > 200, output[-3000:]
    # the server survived all of it, and none of it reached the internal-error handler
    assert proc.poll() is None
    with urllib.request.urlopen(url + "v1/stats", timeout=10) as r:
        stats = json.load(r)
    assert stats["queries"]["requests"] > 100
    assert stats["queries"]["internal_errors"] == 0


def test_the_document_shows_the_guards_answers_and_the_token():
    from online.frontend.openapi import build_openapi
    from online.frontend.settings import FrontendSettings

    open_doc = build_openapi(FrontendSettings(source="x"))
    assert "408" in open_doc["paths"]["/v1/similar"]["post"]["responses"]
    assert "securitySchemes" not in open_doc["components"]
    assert all("security" not in op for item in open_doc["paths"].values() for op in item.values())
    doc = build_openapi(FrontendSettings(source="x", api_token="s" * 24))
    assert doc["components"]["securitySchemes"]["bearer"]["scheme"] == "bearer"
    for path, item in doc["paths"].items():
        for op in item.values():
            guarded = path.startswith("/v1/") or path == "/metrics"
            assert ("security" in op) == guarded and ("401" in op["responses"]) == guarded, path
