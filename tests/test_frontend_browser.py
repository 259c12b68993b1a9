"""The live page in headless Chromium (Debian's /usr/bin/chromium, driven by playwright).

A real ``livevec frontend`` process serves a model that keeps changing, with training
statistics (the synthetic source). The test types a word letter by letter and sees the
suggestions and the neighbours appear, clicks a neighbour, and watches the live stats (the
workers' training signal among them) and the chart update. The page must load nothing from outside the front end.
"""
from __future__ import annotations

import os
import re
from pathlib import Path

import pytest
from playwright.async_api import async_playwright, expect

from tests.frontend_process import clean_env, running_frontend

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run"]

pytestmark = pytest.mark.browser


@pytest.fixture
def live_frontend():
    env = clean_env(LIVEVEC_SYNTHETIC_WORDS="5000", LIVEVEC_DIM="32", LIVEVEC_SYNTHETIC_UPDATES="500",
                    LIVEVEC_SYNTHETIC_NEW_WORDS="5")
    with running_frontend(["--source", "online.frontend.synthetic:create_source",
                           "--sync-interval", "0.2", "--stats-interval", "0.3"], env) as (url, _proc):
        yield url


@pytest.mark.timeout(120)
async def test_page_shows_neighbours_as_you_type_and_live_stats(live_frontend, tmp_path):
    assert os.path.exists(CHROMIUM), "Debian's chromium is missing: run `make browser` (apt-get install chromium)"
    url = live_frontend
    screenshot = Path(os.environ.get("LIVEVEC_SCREENSHOT", tmp_path / "page.png"))
    async with async_playwright() as p:
        browser = await p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            page = await browser.new_page(viewport={"width": 1280, "height": 800})
            errors: list[str] = []
            requested: list[str] = []
            page.on("pageerror", lambda exc: errors.append(str(exc)))
            # a 404 from /v1/similar while a word is half typed is expected; anything else is not
            page.on("console", lambda msg: errors.append(msg.text)
                    if msg.type == "error" and "status of 404" not in msg.text else None)
            not_found: list[str] = []
            page.on("response", lambda r: not_found.append(r.url) if r.status == 404 else None)
            page.on("request", lambda req: requested.append(req.url))
            await page.goto(url)
            await expect(page.locator("#status")).to_contain_text("live", timeout=15_000)

            # type letter by letter: suggestions for the prefix, then the neighbours of the word
            box = page.locator("#q")
            await box.press_sequentially("par", delay=60)
            await expect(page.locator("#suggestions .chip", has_text="paris")).to_be_visible(timeout=10_000)
            await box.press_sequentially("is", delay=60)
            first = page.locator("#neighbours li .word").first
            await expect(first).to_have_text("france", timeout=10_000)
            assert await page.locator("#neighbours li").count() == 10
            await expect(page.locator("#result-meta")).to_contain_text("paris")

            # a word that is not in the vocabulary says so
            await box.fill("")
            await box.press_sequentially("zzqx", delay=30)
            await expect(page.locator("#neighbours")).to_contain_text("not in the vocabulary", timeout=10_000)
            message = page.locator("#neighbours li.empty")
            box_size = await message.bounding_box()
            assert box_size and box_size["height"] < 56, "the message should sit on one line"

            # clicking a neighbour searches for it
            await box.fill("")
            await box.press_sequentially("king", delay=30)
            await expect(page.locator("#neighbours li .word").first).not_to_have_text("", timeout=10_000)
            neighbour = await page.locator("#neighbours li .word").first.inner_text()
            await page.locator("#neighbours li .word").first.click()
            await expect(box).to_have_value(neighbour)
            await expect(page.locator("#result-meta")).to_contain_text(neighbour, timeout=10_000)

            # live training stats: words trained and the model version move, the chart gets drawn
            trained = page.locator("#stat-trained")
            version = page.locator("#stat-version")
            await expect(trained).not_to_have_text("–", timeout=10_000)
            before_trained, before_version = await trained.inner_text(), await version.inner_text()
            await expect(trained).not_to_have_text(before_trained, timeout=10_000)
            await expect(version).not_to_have_text(before_version, timeout=10_000)
            for stat in ("#stat-wps", "#stat-vocab", "#stat-lag", "#stat-fresh", "#stat-loss", "#stat-norm",
                         "#stat-norm-max"):
                await expect(page.locator(stat)).not_to_have_text("–", timeout=10_000)
            # the workers' training signal: a healthy model's loss per pair and hot rows, not in red
            assert 1.0 < float(await page.locator("#stat-loss").inner_text()) < 5.0
            assert 0.5 < float(await page.locator("#stat-norm").inner_text()) < 10.0
            assert "alarm" not in (await page.locator("#stat-norm").get_attribute("class"))
            await expect(page.locator("#chart-line")).to_have_attribute("d", re.compile(r"^M.+L"),
                                                                        timeout=10_000)
            await page.locator("#q").fill("paris")
            await expect(page.locator("#neighbours li .word").first).to_have_text("france", timeout=10_000)
            await page.wait_for_timeout(400)
            await page.screenshot(path=str(screenshot), full_page=True)
        finally:
            await browser.close()
    assert screenshot.stat().st_size > 10_000
    assert not errors, errors
    assert not_found and all("/v1/similar?" in u for u in not_found), not_found
    outside = [u for u in requested if not u.startswith(url)]
    assert not outside, f"the page loaded something from outside the front end: {outside}"
