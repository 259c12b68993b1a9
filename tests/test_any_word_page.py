"""The live page with hostile words, in headless Chromium, against gensim on the same vectors.

The search box and the analogy form take words with commas, slashes, quotes, emoji, CJK,
Hebrew and spaces; the page must show gensim's neighbours for each (the analogy form sends
its words in a JSON body: a comma-joined query string would split ``a,b``).
"""
from __future__ import annotations

import os

import numpy as np
import pytest
from gensim.models import KeyedVectors
from playwright.async_api import async_playwright, expect

from online.client import LiveKeyedVectors
from tests.any_word_model import HOSTILE, hostile_model, save
from tests.frontend_process import clean_env, running_frontend
from tests.test_frontend_browser import CHROMIUM, CHROMIUM_ARGS

pytestmark = pytest.mark.browser


@pytest.fixture
def served(tmp_path):
    words, vectors, counts = hostile_model()
    save(tmp_path / "model.npz", words, vectors, counts)
    reference = KeyedVectors(vector_size=vectors.shape[1], count=0, dtype=np.float32)
    reference.add_vectors(words, vectors)
    env = clean_env(LIVEVEC_MODEL_SOURCE="tests.any_word_model:source", ANY_WORD_MODEL=str(tmp_path / "model.npz"))
    with running_frontend(["--sync-interval", "0.1"], env) as (url, _proc):
        with LiveKeyedVectors(url, retries=50, backoff=0.05, max_backoff=0.2) as kv:
            assert kv.vector_size == reference.vector_size       # the model is served before the page asks
        yield url, reference


async def shown_words(page, selector: str) -> list[str]:
    return [await w.inner_text() for w in await page.locator(f"{selector} li .word").all()]


@pytest.mark.timeout(120)
async def test_the_page_searches_and_solves_analogies_with_any_word(served):
    assert os.path.exists(CHROMIUM), "Debian's chromium is missing: run `make browser` (apt-get install chromium)"
    url, reference = served
    async with async_playwright() as p:
        browser = await p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            page = await browser.new_page(viewport={"width": 1280, "height": 800})
            errors: list[str] = []
            page.on("pageerror", lambda exc: errors.append(str(exc)))
            await page.goto(url)
            box = page.locator("#q")
            for word in HOSTILE:
                await box.fill(word)
                await expect(page.locator("#result-meta")).to_contain_text(f"“{word}”", timeout=10_000)
                expected = [w for w, _ in reference.most_similar(word, topn=10)]
                assert await shown_words(page, "#neighbours") == expected, word
            await page.locator("details.analogy summary").click()
            for a, b, c in [("a,b", "x/y", "two words"), ('"q"', "🙂", "分散"), ("king", "man", "woman"),
                            ("C++", "100%", "שלום")]:
                await page.locator("#an-a").fill(a)
                await page.locator("#an-b").fill(b)
                await page.locator("#an-c").fill(c)
                expected = [w for w, _ in reference.most_similar(positive=[a, c], negative=[b], topn=5)]
                await page.locator("#analogy-form button").click()
                await expect(page.locator("#analogy-result li .word").first).to_have_text(expected[0],
                                                                                          timeout=10_000)
                assert await shown_words(page, "#analogy-result") == expected, (a, b, c)
        finally:
            await browser.close()
    assert not errors, errors
