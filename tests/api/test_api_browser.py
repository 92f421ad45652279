"""Headless Chromium opens a finished study's page: the Plotly front renders with points; a screenshot is kept."""

from __future__ import annotations

import socket
import subprocess
import threading
import time

import httpx
import pytest
from api_helpers import ARTIFACTS, AUTH, FAST_STUDY, REPO

from api.main import create_app


@pytest.fixture(scope="session")
def chromium() -> tuple[str, str]:
    """Debian's chromium + chromium-driver, installed by scripts/setup-browser.sh when missing."""
    setup = subprocess.run(["bash", str(REPO / "scripts" / "setup-browser.sh")], capture_output=True, text=True,
                           timeout=900, check=False)
    if setup.returncode != 0:
        pytest.skip(f"chromium could not be installed (apt): {setup.stderr.strip()[-300:]}")
    return "/usr/bin/chromium", "/usr/bin/chromedriver"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def live_server(sqlite_url, make_settings):
    import uvicorn

    port = _free_port()
    server = uvicorn.Server(uvicorn.Config(create_app(make_settings(sqlite_url)), host="127.0.0.1", port=port,
                                           log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert time.monotonic() < deadline, "server did not start"
        time.sleep(0.1)
    yield f"http://127.0.0.1:{port}"
    server.should_exit = True
    thread.join(timeout=60)


def test_study_page_renders_the_front(chromium, live_server):
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    with httpx.Client(base_url=live_server, timeout=30) as http:
        sid = http.post("/v1/studies", json=FAST_STUDY, headers=AUTH).json()["id"]
        deadline = time.monotonic() + 90
        while http.get(f"/v1/studies/{sid}").json()["status"] != "succeeded":
            assert time.monotonic() < deadline
            time.sleep(0.5)
        n_front = len(http.get(f"/v1/studies/{sid}/pareto").json()["composed_front"])

    binary, driver_path = chromium
    options = webdriver.ChromeOptions()
    options.binary_location = binary
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--no-first-run", "--disable-dev-shm-usage",
                 "--window-size=1300,2000"):
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(driver_path), options=options)
    try:
        driver.get(f"{live_server}/ui/studies/{sid}")
        points = WebDriverWait(driver, 30).until(
            lambda d: d.find_elements(By.CSS_SELECTOR, "#front-chart .scatterlayer .points path") or False)
        assert len(points) >= n_front > 0
        assert driver.find_elements(By.CSS_SELECTOR, "#phase-charts .scatterlayer .points path")
        rows = driver.find_elements(By.CSS_SELECTOR, "#front-table tr")
        assert len(rows) == n_front + 1
        links = [a.get_attribute("href") for a in driver.find_elements(By.CSS_SELECTOR, "#front-table a")]
        assert any("/export?point=0&format=vllm" in h for h in links)
        assert driver.find_elements(By.CSS_SELECTOR, "a[href^='/dashboard/studies/']")
        ARTIFACTS.mkdir(exist_ok=True)
        driver.save_screenshot(str(ARTIFACTS / "ui-study.png"))
        driver.get(f"{live_server}/ui")
        assert driver.find_elements(By.CSS_SELECTOR, f"a[href='/ui/studies/{sid}']")
        driver.get(f"{live_server}/dashboard")
        WebDriverWait(driver, 30).until(lambda d: "Optuna" in d.title or d.find_elements(By.ID, "dashboard"))
        driver.save_screenshot(str(ARTIFACTS / "ui-dashboard.png"))
    finally:
        driver.quit()
