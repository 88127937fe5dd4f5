"""The documentation site as a reader gets it: built by ``make docs`` into site/, served over
HTTP and opened in headless Chromium (Debian's ``chromium`` and ``chromium-driver``, driven by
selenium).

* The start page, a guide and the API reference render: each has its title and main heading,
  the API pages show ``shmbus.Client`` and ``Publication.offer``, the browser logs no error
  (a missing asset, a script that failed), and a screenshot of each lands in
  site/_screenshots/.
* Every internal link of every built page resolves: a relative href names a file of the site,
  and its ``#anchor`` is an id of that page.

The site is not built here (mkdocs takes a while): a missing site/ fails, saying to run make docs.
"""

from __future__ import annotations

import http.server
import shutil
import threading
from collections.abc import Iterator
from functools import partial
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import unquote, urljoin, urlsplit

import pytest
from selenium import webdriver
from selenium.common.exceptions import NoSuchElementException
from selenium.webdriver.common.by import By

ROOT = Path(__file__).resolve().parents[2]
SITE = ROOT / "site"
SCREENSHOTS = SITE / "_screenshots"
PAGE_LOAD_TIMEOUT_S = 30

pytestmark = pytest.mark.timeout(240)


def _require_site() -> None:
    if not (SITE / "index.html").is_file():
        pytest.fail(f"the documentation site is not built ({SITE}/index.html is missing): "
                    f"run make docs")


# -- serving and browsing ---------------------------------------------------------------------


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture(scope="module")
def server() -> Iterator[str]:
    """The base URL of site/, served on a free localhost port from a thread."""
    _require_site()
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0),
                                            partial(_QuietHandler, directory=str(SITE)))
    thread = threading.Thread(target=httpd.serve_forever, name="docs-site", daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}/"
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join(timeout=10)


@pytest.fixture(scope="module")
def browser(tmp_path_factory: pytest.TempPathFactory) -> Iterator[webdriver.Chrome]:
    """Headless Chromium from Debian's packages (no browser or driver is downloaded)."""
    chromium, chromedriver = shutil.which("chromium"), shutil.which("chromedriver")
    if chromium is None or chromedriver is None:
        pytest.fail("headless Chromium is missing: make system-deps installs it "
                    "(apt-get install chromium chromium-driver)")
    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for argument in ("--headless=new", "--no-sandbox", "--disable-gpu",
                     "--disable-dev-shm-usage", "--window-size=1280,1000",
                     f"--user-data-dir={tmp_path_factory.mktemp('chromium-profile')}"):
        options.add_argument(argument)
    options.set_capability("goog:loggingPrefs", {"browser": "SEVERE"})
    driver = webdriver.Chrome(options=options,
                              service=webdriver.ChromeService(executable_path=chromedriver))
    try:
        driver.set_page_load_timeout(PAGE_LOAD_TIMEOUT_S)
        driver.set_script_timeout(PAGE_LOAD_TIMEOUT_S)
        yield driver
    finally:
        driver.quit()


def _open(browser: webdriver.Chrome, url: str, screenshot: str) -> None:
    """Load ``url``, fail on any error the browser logged, and save a screenshot."""
    browser.get(url)
    errors = [entry["message"] for entry in browser.get_log("browser")
              if entry["level"] == "SEVERE"]
    assert errors == [], f"{url}: the browser logged errors"
    SCREENSHOTS.mkdir(exist_ok=True)
    assert browser.save_screenshot(str(SCREENSHOTS / f"{screenshot}.png"))


def _main_heading(browser: webdriver.Chrome) -> str:
    try:
        heading = browser.find_element(By.CSS_SELECTOR, "article h1")
    except NoSuchElementException:
        pytest.fail(f"{browser.current_url}: no main heading (article h1)")
    assert heading.is_displayed()
    return heading.text.replace("¶", "").strip()


def _shown(browser: webdriver.Chrome, element_id: str) -> str:
    """The text of the element with ``element_id``, which must be displayed."""
    try:
        element = browser.find_element(By.ID, element_id)
    except NoSuchElementException:
        pytest.fail(f"{browser.current_url}: no element with id {element_id!r}")
    assert element.is_displayed(), f"{browser.current_url}: {element_id!r} is hidden"
    return element.text


def test_the_start_page_renders(server: str, browser: webdriver.Chrome) -> None:
    _open(browser, server, "index")
    assert browser.title == "shmbus"
    assert _main_heading(browser) == "shmbus"
    # the navigation reaches the guides and the API reference
    nav = browser.find_element(By.CSS_SELECTOR, "nav.md-nav--primary").get_attribute("innerHTML")
    assert "guides/publish-and-read/" in nav and "api/" in nav


def test_a_guide_renders(server: str, browser: webdriver.Chrome) -> None:
    _open(browser, server + "guides/publish-and-read/", "guide-publish-and-read")
    assert browser.title == "Publish and read - shmbus"
    assert _main_heading(browser) == "Publish and read"
    code = browser.find_elements(By.CSS_SELECTOR, "article pre code")
    assert code and "add_publication" in code[0].text
    # its links into the API reference are there
    hrefs = [a.get_attribute("href") for a in browser.find_elements(By.CSS_SELECTOR, "article a")]
    assert any(href and href.endswith("api/publications/#shmbus.Publication.offer")
               for href in hrefs)


def test_the_api_reference_renders(server: str, browser: webdriver.Chrome) -> None:
    _open(browser, server + "api/client/", "api-client")
    assert browser.title == "Client and context - shmbus"
    assert _main_heading(browser) == "Client and context"
    assert "shmbus.Client" in _shown(browser, "shmbus.Client")
    assert "add_publication" in _shown(browser, "shmbus.Client.add_publication")

    _open(browser, server + "api/publications/", "api-publications")
    assert _main_heading(browser) == "Publications"
    assert "offer" in _shown(browser, "shmbus.Publication.offer")
    # its signature and the docstring help(shmbus.Publication.offer) shows
    entry = browser.find_element(By.ID, "shmbus.Publication.offer").find_element(By.XPATH, "..")
    assert "reserved_value" in entry.text and "stream position" in entry.text


# -- links -----------------------------------------------------------------------------------


class _Page(HTMLParser):
    """The ids and the links (a, link, img, script) of one HTML page."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.ids: set[str] = set()
        self.links: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        values = dict(attrs)
        for name in ("id",) + (("name",) if tag == "a" else ()):
            if values.get(name):
                self.ids.add(values[name] or "")
        attribute = {"a": "href", "link": "href", "img": "src", "script": "src"}.get(tag)
        if attribute and values.get(attribute):
            self.links.append(values[attribute] or "")


def _parse(path: Path) -> _Page:
    page = _Page()
    page.feed(path.read_text(encoding="utf-8"))
    return page


def _target(url_path: str) -> Path:
    """The file a site URL path names (a folder: its index.html)."""
    path = SITE / unquote(url_path).lstrip("/")
    return path / "index.html" if url_path.endswith("/") or path.is_dir() else path


def test_every_internal_link_resolves() -> None:
    _require_site()
    pages = {path: _parse(path) for path in sorted(SITE.rglob("*.html"))}
    assert len(pages) > 20, f"only {len(pages)} pages in {SITE}"
    broken = []
    for path, page in pages.items():
        here = "/" + path.relative_to(SITE).as_posix()
        for link in page.links:
            if urlsplit(link).scheme or link.startswith("//"):
                continue  # another site (or mailto:, data:): not this one's to check
            url = urlsplit(urljoin(here, link))
            target = _target(url.path)
            if not target.is_file():
                broken.append(f"{here}: {link} (no file {target.relative_to(SITE)})")
                continue
            if url.fragment and target.suffix == ".html":
                ids = pages[target].ids if target in pages else _parse(target).ids
                if unquote(url.fragment) not in ids:
                    broken.append(f"{here}: {link} (no id {unquote(url.fragment)!r} in "
                                  f"{target.relative_to(SITE)})")
    assert broken == [], "broken links:\n" + "\n".join(broken)
