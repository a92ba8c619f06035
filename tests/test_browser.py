"""JupyterLab's UI really loads in a real browser: headless Debian chromium through selenium and
chromedriver (apt-get install chromium chromium-driver). Keeps a screenshot in artifacts/."""
import pytest
import requests
from conftest import require_tool
from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.support import expected_conditions as ec
from selenium.webdriver.support.ui import WebDriverWait

CHROME_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                "--disable-background-networking", "--disable-component-update", "--disable-sync",
                "--no-first-run", "--window-size=1400,900"]


@pytest.fixture
def browser():
    chromium, chromedriver = require_tool("chromium", "chromium"), require_tool("chromedriver", "chromium-driver")
    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for flag in CHROME_FLAGS:
        options.add_argument(flag)
    # An explicit driver path: selenium-manager would otherwise try to download one.
    driver = webdriver.Chrome(service=Service(chromedriver), options=options)
    driver.set_page_load_timeout(120)
    yield driver
    driver.quit()


def test_jupyterlab_ui_loads_in_a_headless_browser(start_jupyter, browser, artifacts):
    """Container should serve a JupyterLab UI that renders, shows the launcher and lists /workspace."""
    _, base, token = start_jupyter()
    r = requests.put(f"{base}/api/contents/from-the-test.txt", headers={"Authorization": f"token {token}"},
                     json={"type": "file", "format": "text", "content": "hello"}, timeout=30)
    assert r.status_code == 201, f"creating a file through the API should work: {r.status_code}"

    browser.get(f"{base}/lab?token={token}")
    wait = WebDriverWait(browser, 120)
    try:
        wait.until(ec.visibility_of_element_located((By.CSS_SELECTOR, ".jp-LauncherCard")))
        wait.until(ec.text_to_be_present_in_element((By.CSS_SELECTOR, ".jp-DirListing-content"),
                                                    "from-the-test.txt"))
    finally:
        browser.save_screenshot(str(artifacts / "jupyterlab.png"))
    assert "JupyterLab" in browser.title, f"the page title should be JupyterLab's, got {browser.title!r}"
    cards = [e.text for e in browser.find_elements(By.CSS_SELECTOR, ".jp-LauncherCard")]
    assert any("Python 3" in c for c in cards), f"the launcher should offer a Python 3 kernel: {cards}"
    assert any("Terminal" in c for c in cards), f"the launcher should offer a terminal: {cards}"
