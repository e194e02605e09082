"""The chat page in Debian's headless Chromium: a message sent, the streamed answer on screen."""

from __future__ import annotations

import io
import re
import os
import shutil
import tempfile

import pytest

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
DRIVER = shutil.which("chromedriver") or "/usr/bin/chromedriver"

webdriver = pytest.importorskip("selenium.webdriver")
if not (os.path.exists(CHROMIUM) and os.path.exists(DRIVER)):
    pytest.skip("Debian's chromium and chromium-driver are not installed (apt-get install chromium chromium-driver)",
                allow_module_level=True)


@pytest.fixture
def browser():
    from selenium.webdriver.chrome.options import Options
    from selenium.webdriver.chrome.service import Service

    profile = tempfile.mkdtemp(prefix="tsspec-chromium-")
    options = Options()
    options.binary_location = CHROMIUM
    for flag in ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync",
                 "--disable-dev-shm-usage", f"--user-data-dir={profile}", "--window-size=1000,800"):
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(DRIVER), options=options)
    yield driver
    driver.quit()
    shutil.rmtree(profile, ignore_errors=True)


def _dark_pixels(png: bytes) -> int:
    from PIL import Image

    image = Image.open(io.BytesIO(png)).convert("L")
    return sum(1 for value in image.getdata() if value < 100)


def _send(browser, wait, text: str, index: int):
    from selenium.webdriver.common.by import By

    box = browser.find_element(By.ID, "input")
    box.send_keys(text)
    browser.find_element(By.ID, "send").click()
    wait.until(lambda d: len(d.find_elements(By.CSS_SELECTOR, ".msg.assistant[data-done='1']")) > index)
    return browser.find_elements(By.CSS_SELECTOR, ".msg.assistant")[index]


@pytest.mark.slow
def test_page_streams_an_answer_with_speed_and_acceptance(live, browser, tmp_path):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    browser.get(live.base_url + "/")
    wait = WebDriverWait(browser, 120)
    wait.until(lambda d: "smol" in d.find_element(By.ID, "model").text)
    browser.execute_script("document.getElementById('max_tokens').value = '12'")
    reply = _send(browser, wait, "Say the word hello three times.", 0)
    answer = reply.find_element(By.CSS_SELECTOR, ".text").text
    stats = reply.find_element(By.CSS_SELECTOR, ".stats").text
    assert answer.strip() and "error" not in stats
    assert re.match(r"\d+ tokens · [\d.]+ tok/s", stats) and "speculation: ngram" in stats, stats
    assert ("accepted" in stats) or ("no drafts" in stats)
    # the answer is on screen: its bubble's screenshot has rendered (dark) text pixels
    shot = reply.screenshot_as_png
    (tmp_path / "reply.png").write_bytes(browser.get_screenshot_as_png())
    assert _dark_pixels(shot) > 50
    # a second turn reuses the first turn's KV blocks (the whole conversation is the prompt)
    second = _send(browser, wait, "Now say it once.", 1)
    stats2 = second.find_element(By.CSS_SELECTOR, ".stats").text
    assert "prefix reused" in stats2 and "(armed)" in stats2, stats2


# every select's widest option, measured in the select's own font, against its inner width
# (less the drop-down arrow); the header's model label against the box it is drawn in
_CLIPPED = """
const out = [];
const canvas = document.createElement("canvas").getContext("2d");
for (const select of document.querySelectorAll("select")) {
  const style = getComputedStyle(select);
  canvas.font = style.font;
  const widest = Math.max(...Array.from(select.options, o => canvas.measureText(o.text).width));
  const inner = select.clientWidth - parseFloat(style.paddingLeft) - parseFloat(style.paddingRight);
  if (widest + 16 > inner) out.push(select.id + ": " + widest.toFixed(0) + "px of text in " + inner.toFixed(0) + "px");
}
const label = document.getElementById("model");
if (label.scrollWidth > label.clientWidth + 1) out.push("model label: " + label.scrollWidth + " > " + label.clientWidth);
return out;
"""


@pytest.mark.slow
def test_no_dropdown_or_model_label_is_clipped(live, browser):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    browser.get(live.base_url + "/")
    WebDriverWait(browser, 60).until(lambda d: "smol" in d.find_element(By.ID, "model").text)
    assert browser.execute_script(_CLIPPED) == []
    # the check can fail: squeezed back to the old fixed width, the speculation select clips
    browser.execute_script("document.getElementById('spec').style.width = '70px'")
    assert any(line.startswith("spec:") for line in browser.execute_script(_CLIPPED))
