"""Headless Chromium driven by Selenium, for the console tests.

The coordinator under test serves from the test's own event loop, so every browser call runs
in a worker thread (``Browser.run``): a blocking WebDriver call on the loop would stall the
server it waits for. Chromium resolves no host name but the loopback address, so a page that
reached for an asset on the internet would fail to load it, and ``foreign_requests`` names any
request that left the coordinator's origin.

The console replaces its content at every refresh, so reads go through one script call each
(atomic in the page) and clicks are retried when the element was replaced under them.
"""

from __future__ import annotations

import asyncio
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import pytest
from selenium import webdriver
from selenium.common.exceptions import StaleElementReferenceException
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.support import expected_conditions
from selenium.webdriver.support.ui import WebDriverWait

T = TypeVar("T")

HOW_TO_GET_CHROMIUM = (
    "headless Chromium is needed for the console's browser tests: on Debian/Ubuntu run "
    "`apt-get install chromium chromium-driver` (.ci/run installs them when missing)"
)
# Generous for CI's two busy cores: a page load plus a fragment fetch or two.
WAIT_S = 30.0


def chromium_or_skip() -> tuple[str, str]:
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    driver = shutil.which("chromedriver")
    missing = [
        name for name, path in (("chromium", chromium), ("chromedriver", driver)) if not path
    ]
    if missing:
        pytest.skip(f"{' and '.join(missing)} not found: {HOW_TO_GET_CHROMIUM}")
    assert chromium is not None and driver is not None
    return chromium, driver


class Browser:
    def __init__(self, screenshots: Path) -> None:
        chromium, driver = chromium_or_skip()
        options = webdriver.ChromeOptions()
        options.binary_location = chromium
        for argument in (
            "--headless=new",
            "--no-sandbox",
            "--disable-dev-shm-usage",
            "--disable-gpu",
            "--window-size=1280,1000",
            "--host-resolver-rules=MAP * ~NOTFOUND , EXCLUDE 127.0.0.1",
        ):
            options.add_argument(argument)
        self.driver = webdriver.Chrome(options=options, service=Service(executable_path=driver))
        self.screenshots = screenshots

    async def run(self, action: Callable[..., T], *args: Any) -> T:
        return await asyncio.to_thread(action, *args)

    def open(self, url: str) -> None:
        self.driver.get(url)

    def wait_for(self, condition: Callable[[Any], T], what: str) -> T:
        waiting = WebDriverWait(
            self.driver,
            WAIT_S,
            poll_frequency=0.1,
            ignored_exceptions=[StaleElementReferenceException],
        )
        result: T = waiting.until(
            condition, message=f"timed out after {WAIT_S} s waiting for {what}"
        )
        return result

    def css(self, selector: str) -> list[Any]:
        return list(self.driver.find_elements(By.CSS_SELECTOR, selector))

    def text_of(self, selector: str) -> str:
        """The element's text as shown, or "" when there is no such element."""
        text = self.driver.execute_script(
            "const found = document.querySelector(arguments[0]);"
            "return found === null ? '' : found.innerText.trim()",
            selector,
        )
        return str(text)

    def attributes(self, selector: str, name: str) -> list[str]:
        values = self.driver.execute_script(
            "return Array.from(document.querySelectorAll(arguments[0]),"
            " e => e.getAttribute(arguments[1]))",
            selector,
            name,
        )
        return [str(value) for value in values]

    def click(self, selector: str) -> None:
        def clicked(_: object) -> bool:
            found = self.css(selector)
            if not found:
                return False
            found[0].click()
            return True

        self.wait_for(clicked, f"{selector} to click")

    def shows(self, selector: str, text: str) -> bool:
        return text in self.text_of(selector)

    def accept_confirmation(self) -> str:
        alert = self.wait_for(expected_conditions.alert_is_present(), "a confirmation")
        message = str(alert.text)
        alert.accept()
        return message

    def screenshot(self, name: str) -> Path:
        path = self.screenshots / f"{name}.png"
        self.driver.save_screenshot(str(path))
        return path

    def foreign_requests(self, origin: str) -> list[str]:
        """Every resource the page loaded from anywhere but ``origin``."""
        names = self.driver.execute_script(
            "return performance.getEntriesByType('resource').map(e => e.name)"
        )
        return [name for name in names if not name.startswith(origin)]

    def quit(self) -> None:
        self.driver.quit()
