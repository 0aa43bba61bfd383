"""The page as a person uses it, in a real headless browser (Debian's chromium driven by Playwright): type a
sentence and click, upload an image, upload a file that is not audio and read the message, then speak
again. Each part's screenshot is written under $SERVE_SCREENSHOTS when set (how docs/serve.png was made).

Chromium comes from the test setup (shell/install_test_sysdeps.sh, run by `make test`). Where it is missing
these tests skip with the reason, except under CI (CI=true), where a missing browser is a failure.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from .tiny import png_bytes, wav_file_bytes

CHROMIUM = next((p for p in (shutil.which("chromium"), shutil.which("chromium-browser"), "/usr/bin/chromium")
                 if p and Path(p).is_file()), None)


def _missing() -> str | None:
    if CHROMIUM is None:
        return "chromium is not installed (apt-get install chromium, or shell/install_test_sysdeps.sh)"
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return "playwright is not installed (pip install -r requirements-test.txt)"
    return None


@pytest.fixture(scope="module")
def browser_page(live_server):
    """One headless chromium page on the app served on a local port (conftest's `live_server`)."""
    reason = _missing()
    if reason:
        if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
            pytest.fail(f"the browser tests cannot run: {reason}")
        pytest.skip(reason)
    from playwright.sync_api import sync_playwright

    url, _ = live_server
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, headless=True,
                                     args=["--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"])
        page = browser.new_page(viewport={"width": 1100, "height": 900})
        page.set_default_timeout(20_000)
        page.goto(f"{url}/")
        page.wait_for_selector("body[data-ready='1']")
        yield page
        browser.close()


def _shot(page, name: str) -> None:
    folder = os.environ.get("SERVE_SCREENSHOTS")
    if folder:
        Path(folder).mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(Path(folder) / f"{name}.png"), full_page=True)


def _audio_bytes(page, selector: str) -> int:
    """The size of the wav an <audio> element plays (fetched back from its blob URL)."""
    return page.eval_on_selector(selector, "async (a) => (await (await fetch(a.src)).arrayBuffer()).byteLength")


def test_speak_then_a_bad_upload_then_speak_again(browser_page, tmp_path):
    page = browser_page
    page.fill("#speak-text", "Салом, дунё! Bugun havo juda yaxshi.")
    page.click("#speak-go")
    page.wait_for_selector("#speak-result audio")
    assert _audio_bytes(page, "#speak-result audio") > 1000
    assert "real-time factor" in page.inner_text("#speak-result")
    # the text as the model read it, and the control this model ignores (tiny VITS: no stochastic duration predictor)
    assert page.inner_text("#speak-result .spoken") == "spoken as: salom, dunyo! bugun havo juda yaxshi."
    assert page.is_disabled("#speak-noisew") and "unused" in page.inner_text("label[for='speak-noisew']")
    assert not page.is_disabled("#speak-noise")
    _shot(page, "speak")

    page.click("nav button[data-tab='vocode']")
    bad = tmp_path / "notes.txt"
    bad.write_text("this is not a recording")
    page.set_input_files("#vocode-file", str(bad))
    page.click("#vocode-go")
    page.wait_for_function("document.getElementById('vocode-error').textContent.length > 0")
    assert "not audio" in page.inner_text("#vocode-error")
    _shot(page, "vocode_error")

    page.click("nav button[data-tab='speak']")  # the server goes on serving
    page.fill("#speak-text", "Yana bir gap.")
    page.eval_on_selector("#speak-result", "e => e.replaceChildren()")
    page.click("#speak-go")
    page.wait_for_selector("#speak-result audio")
    assert _audio_bytes(page, "#speak-result audio") > 1000
    assert page.inner_text("#speak-error") == ""


def test_vocode_shows_spectrograms_and_metrics(browser_page, tmp_path):
    page = browser_page
    page.click("nav button[data-tab='vocode']")
    clip = tmp_path / "voice.wav"
    clip.write_bytes(wav_file_bytes(1.0))
    page.set_input_files("#vocode-file", str(clip))
    page.click("#vocode-go")
    page.wait_for_selector("#vocode-result img.spec")
    assert "MCD-DTW" in page.inner_text("#vocode-result") and page.inner_text("#vocode-error") == ""
    page.wait_for_function("document.querySelector('#vocode-result img.spec').naturalWidth > 0")
    _shot(page, "vocode")


def _reconstruct(page, tmp_path: Path, width: int, height: int) -> None:
    """Upload a `width` x `height` PNG on the Reconstruct tab and wait for its reconstruction."""
    page.click("nav button[data-tab='reconstruct']")
    image = tmp_path / "picture.png"
    image.write_bytes(png_bytes(width, height))
    page.set_input_files("#reconstruct-file", str(image))
    page.click("#reconstruct-go")
    page.wait_for_selector("#reconstruct-result img.recon")


def test_reconstruct_shows_the_image_beside_its_reconstruction(browser_page, tmp_path):
    page = browser_page
    _reconstruct(page, tmp_path, 96, 64)
    page.wait_for_function("document.querySelector('#reconstruct-result img.recon').naturalWidth === 96")
    assert "PSNR" in page.inner_text("#reconstruct-result")
    _shot(page, "reconstruct")


def _compare(page, a: str, b: str, upload: Path, sides: int) -> str:
    """Compare `a` and `b` on `upload` in the page; the result's text once `sides` columns are there."""
    page.click("nav button[data-tab='compare']")
    page.select_option("#compare-a", a)
    page.select_option("#compare-b", b)
    page.set_input_files("#compare-file", str(upload))
    page.click("#compare-go")
    page.wait_for_function(f"document.querySelectorAll('#compare-result .side').length === {sides}")
    return page.inner_text("#compare-result")


def test_compare_two_vocoders_side_by_side(browser_page, tmp_path):
    clip = tmp_path / "voice.wav"
    clip.write_bytes(wav_file_bytes(1.0))
    text = _compare(browser_page, "vocoder-1", "vocoder-2", clip, sides=2)
    assert "A: vocoder-1" in text and "B: vocoder-2" in text and text.count("MCD-DTW") == 2
    _shot(browser_page, "compare")


def test_compare_two_reconstructions_beside_their_original(browser_page, tmp_path):
    """Two VAEs (here the same one twice) on one image: the original, then A and B with their PSNR."""
    image = tmp_path / "picture.png"
    image.write_bytes(png_bytes(64, 48))
    text = _compare(browser_page, "vae-1", "vae-1", image, sides=3)
    browser_page.wait_for_function("document.querySelector('#compare-result img.original').naturalWidth === 64")
    assert text.index("original") < text.index("A: vae-1") < text.index("B: vae-1") and text.count("PSNR") == 2


def test_another_site_cannot_post_and_the_token_comes_in_the_address(browser_page, served, tmp_path):
    """A page of another origin (here the same server under its other name) posts what a cross-site attacker can:
    a no-cors fetch without the custom header, and a GET /speak?text=… as an <img> would send it (Sec-Fetch-Site:
    cross-site); the server refuses both (403) before any model runs. On a server
    started with a token, the page opened at …/#token=… takes it from the address (and clears it there) and
    works; opened without it, it says it needs the token."""
    from urllib.parse import urlsplit

    from serve.app import create_app
    from serve.guard import Access

    from .conftest import serving

    port = urlsplit(browser_page.url).port
    other = browser_page.context.browser.new_page()
    try:
        other.goto(f"http://localhost:{port}/")
        with other.expect_response(lambda r: r.url.endswith("/speak")) as info:
            other.evaluate("(u) => fetch(u, {method: 'POST', mode: 'no-cors', body: new URLSearchParams("
                           "{model: 'vits-1', text: 'salom'})}).catch(() => null)", f"http://127.0.0.1:{port}/speak")
        assert info.value.status == 403
        with other.expect_response(lambda r: "/speak?" in r.url) as info:  # GET /speak makes audio: not from here
            other.evaluate("(u) => fetch(u, {mode: 'no-cors'}).catch(() => null)",
                           f"http://127.0.0.1:{port}/speak?text=salom&model=vits-1")
        assert info.value.status == 403
        with serving(create_app(served, access=Access(token="tok-123"))) as url:
            other.goto(f"{url}/")
            other.wait_for_selector("body[data-ready='error']")
            assert "needs its token" in other.inner_text("#page-error")
            other.goto("about:blank")  # else only the fragment changes: no new load
            other.goto(f"{url}/#token=tok-123")
            other.wait_for_selector("body[data-ready='1']")
            assert other.evaluate("location.hash") == "" and other.inner_text("#page-error") == ""
            _reconstruct(other, tmp_path, 32, 32)
    finally:
        other.close()
