"""``rdvpump console`` in headless Chromium (Debian's ``chromium`` and
``chromium-driver``, driven by Selenium): what a person sees on the page as a universe of
real processes changes.  Screenshots go to ``$RDVPUMP_SCREENSHOTS`` (default: the test's
temporary directory); the metrics guide's comes from there."""

from __future__ import annotations

import os
import pathlib
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from .procs import DEADLINE
from .test_console import _ECHO_LOAD, ENV, rdvpump, watched_universe

pytestmark = pytest.mark.slow  # real processes and a browser

CHROMIUM, DRIVER = shutil.which("chromium"), shutil.which("chromedriver")


@pytest.fixture
def browser(tmp_path: pathlib.Path) -> Iterator[Any]:
    webdriver = pytest.importorskip("selenium.webdriver", reason="pip install selenium")
    if CHROMIUM is None or DRIVER is None:
        pytest.skip("needs Debian's chromium and chromium-driver")
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-quic",
                 "--no-first-run", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--disable-dev-shm-usage",
                 "--window-size=1100,1300",
                 f"--user-data-dir={tmp_path / 'chromium'}"):
        options.add_argument(flag)
    os.environ.setdefault("SE_OFFLINE", "true")  # Selenium Manager downloads nothing
    driver = webdriver.Chrome(options=options, service=Service(DRIVER))
    driver.set_page_load_timeout(30)
    try:
        yield driver
    finally:
        driver.quit()


def rows(driver: Any, table: str) -> list[list[str]]:
    """The cells' text of each row of one of the page's tables, as a person reads it."""
    cells: list[list[str]] = driver.execute_script(
        "return [...document.querySelectorAll(arguments[0] + ' tbody tr')]"
        ".map(tr => [...tr.children].map(td => td.textContent))", "#" + table)
    return cells


def until(driver: Any, check: Callable[[Any], bool]) -> None:
    from selenium.webdriver.support.ui import WebDriverWait

    WebDriverWait(driver, DEADLINE, poll_frequency=0.2).until(check)


def test_the_console_page_shows_brokers_rates_lag_and_a_broker_gone(
        tmp_path: pathlib.Path, browser: Any) -> None:
    shots = pathlib.Path(os.environ.get("RDVPUMP_SCREENSHOTS", tmp_path))
    shots.mkdir(parents=True, exist_ok=True)
    with watched_universe(tmp_path, admin=True) as universe:
        mq: Any = ("--server", f"s1@{universe.at}", "--universe", "shop")
        rdvpump("mq", "declare", "orders", *mq)
        rdvpump("mq", "publish", "orders", *mq, stdin="".join(f"{i}\n" for i in range(50)))

        browser.get(universe.url)
        assert browser.title == "rdvpump console"
        until(browser, lambda d: sorted(r[0] for r in rows(d, "brokers")) == ["e1", "s1"])
        until(browser, lambda d: rows(d, "groups") == [["s1:15555", "orders", "orders", "50"]])
        # before any workload: no link between brokers, said so; the universe's own
        # links (heartbeats) counted below, not listed; an empty section says so
        until(browser, lambda d: rows(d, "links") == [
            ["no link between brokers of a process serving --metrics"]])
        assert "not shown" in browser.find_element("id", "service-links").text
        assert rows(browser, "replicated") == [["no replicated group"]]
        browser.save_screenshot(str(shots / "console.png"))
        rdvpump("mq", "consume", "orders", *mq, "--count", "20")
        until(browser, lambda d: [r[3] for r in rows(d, "groups")] == ["30"])

        # --admin: a consume group declared from the page's form, as mq declare would
        assert browser.find_element("id", "admin").is_displayed()
        form = browser.find_element("id", "declare")
        for name, value in (("server", "s1"), ("topic", "orders"), ("group", "audit"),
                            ("start", "beginning")):
            form.find_element("name", name).send_keys(value)
        form.find_element("tag name", "button").click()
        until(browser, lambda d: d.find_element("id", "said").text
              == "s1: declared group audit of orders")
        until(browser, lambda d: [r[2:] for r in rows(d, "groups")] == [
            ["audit", "50"], ["orders", "30"]])

        load = subprocess.Popen([sys.executable, "-c", _ECHO_LOAD, universe.where], env=ENV,
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        universe.procs.append(load)
        # the links table: broker, peer, port, sent, msgs/s, queued / high-water
        until(browser, lambda d: any(r[0] == "e1" and r[1] == "load" and float(r[4]) > 0
                                     for r in rows(d, "links")))
        browser.save_screenshot(str(shots / "console-load.png"))
        load.kill()
        universe.echo.send_signal(signal.SIGKILL)
        universe.echo.wait()
        killed = time.monotonic()
        until(browser, lambda d: [r[0] for r in rows(d, "brokers")] == ["s1"])
        # the manager's expiry (3 s) and scan (0.5 s), then a snapshot a second, with
        # room for a loaded machine
        assert time.monotonic() - killed < 3 + 0.5 + 2 + 4
        warnings = browser.execute_script(
            "return [...document.querySelectorAll('#warnings li')].map(li => li.textContent)")
        assert any("broker e1 is gone" in w for w in warnings), warnings
        assert universe.procs[1].poll() is None  # s1 served on throughout
