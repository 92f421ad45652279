"""Headless Chromium drives the service: a finished study's page renders its Plotly front; a browser signs in,
starts a study from the form (a field error shown next to its field first), watches the trials in flight with their
logs, cancels it, compares two studies' fronts on one chart, and uses the Optuna dashboard's write API. Screenshots
are kept in test-artifacts/."""

from __future__ import annotations

import re
import subprocess
import time

import httpx2
import pytest
from api_helpers import ARTIFACTS, AUTH, FAST_STUDY, REFERENCE_MODEL, REPO, TOKEN, finished, served, wait_for

from api.main import create_app


@pytest.fixture(scope="session")
def chromium() -> tuple[str, str]:
    """Debian's chromium + chromium-driver, installed by scripts/setup-browser.sh when missing."""
    setup = subprocess.run(["bash", str(REPO / "scripts" / "setup-browser.sh")], capture_output=True, text=True,
                           timeout=900, check=False)
    if setup.returncode != 0:
        pytest.skip(f"chromium could not be installed (apt): {setup.stderr.strip()[-300:]}")
    return "/usr/bin/chromium", "/usr/bin/chromedriver"


@pytest.fixture
def live_server(sqlite_url, make_settings):
    with served(create_app(make_settings(sqlite_url))) as url:
        yield url


@pytest.fixture
def driver(chromium):
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    binary, driver_path = chromium
    options = webdriver.ChromeOptions()
    options.binary_location = binary
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--no-first-run", "--disable-dev-shm-usage",
                 "--window-size=1300,2000"):
        options.add_argument(flag)
    drv = webdriver.Chrome(service=Service(driver_path), options=options)
    yield drv
    drv.quit()


def test_study_page_renders_the_front(driver, live_server):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    with httpx2.Client(base_url=live_server, timeout=30) as http:
        sid = http.post("/v1/studies", json=FAST_STUDY, headers=AUTH).json()["id"]
        assert wait_for(http, sid, finished, timeout_s=90)["status"] == "succeeded"
        pareto = http.get(f"/v1/studies/{sid}/pareto").json()
        n_front = len(pareto["composed_front"])
        trials = http.get(f"/v1/studies/{sid}/trials", params={"limit": 1000}).json()

    driver.get(f"{live_server}/ui/studies/{sid}")
    points = WebDriverWait(driver, 30).until(
        lambda d: d.find_elements(By.CSS_SELECTOR, "#front-chart .scatterlayer .points path") or False)
    assert len(points) >= n_front > 0
    assert driver.find_elements(By.CSS_SELECTOR, "#phase-charts .scatterlayer .points path")
    _check_trial_numbering(driver, trials, pareto)
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
    banner = driver.find_element(By.ID, "topotune-banner")  # says why its buttons fail (read-only inside topotune)
    assert banner.is_displayed() and "Read-only inside topotune" in banner.text
    create_in_dashboard(driver, "refused-signed-out")
    WebDriverWait(driver, 30).until(lambda d: "Failed to create a study" in d.find_element(By.TAG_NAME, "body").text)
    driver.save_screenshot(str(ARTIFACTS / "ui-dashboard.png"))


def _check_trial_numbering(driver, trials: dict, pareto: dict) -> None:
    """One meaning of "trial": the header counts trials (configurations) and measured points apart, and every
    table row and chart point is numbered by its trial with its load ("#8 c16"), never by a load level's own
    stored number."""
    from selenium.webdriver.common.by import By

    numbers = {(t["phase"], t["trial_number"]) for t in trials["items"]}
    assert all(t["kind"] != "extra" for t in trials["items"])
    assert driver.find_element(By.ID, "stored").text == str(trials["total"])
    points = sum(ph["points_total"] for ph in pareto["phases"].values())
    assert int(driver.find_element(By.ID, "points-stored").text) == points > trials["total"]  # several loads each
    rows = driver.find_elements(By.CSS_SELECTOR, "table.phase-front tr[data-trial]")
    assert rows
    for row in rows:
        cells = [c.text for c in row.find_elements(By.TAG_NAME, "td")]
        assert any(n == int(cells[0]) for _, n in numbers) and re.fullmatch(r"c\d+", cells[2]), cells
    texts = driver.execute_script(
        "return Array.from(document.querySelectorAll('#phase-charts .js-plotly-plot')).flatMap(function (d) {"
        "  return d.data.flatMap(function (t) { return t.text || []; }); });")
    labelled = [re.match(r"(?:<b>)?trial #(\d+) c\d+", t) for t in texts if "trial" in t]
    assert labelled and all(m is not None and any(n == int(m.group(1)) for _, n in numbers) for m in labelled), texts


def create_in_dashboard(driver, name: str) -> None:
    """The dashboard's own CREATE button and its New Study dialog (optuna-dashboard 0.21)."""
    from selenium.webdriver.common.by import By

    button = _wait(driver, lambda d: [b for b in d.find_elements(By.TAG_NAME, "button") if b.text == "CREATE"])[0]
    button.click()
    dialog = _wait(driver, lambda d: d.find_element(By.CSS_SELECTOR, "[role=dialog]"))
    dialog.find_element(By.CSS_SELECTOR, "input[type=text]").send_keys(name)
    time.sleep(1.0)  # the name field is debounced (500 ms) before CREATE reads it
    next(b for b in dialog.find_elements(By.TAG_NAME, "button") if b.text == "CREATE").click()


def _wait(driver, condition, timeout_s: float = 60.0):
    from selenium.common.exceptions import NoSuchElementException, StaleElementReferenceException
    from selenium.webdriver.support.ui import WebDriverWait

    # the live page replaces its in-flight panel every 2 s and reloads when the study ends: elements go stale
    return WebDriverWait(driver, timeout_s, poll_frequency=0.2,
                         ignored_exceptions=(NoSuchElementException, StaleElementReferenceException)).until(condition)


def test_a_browser_drives_the_service(driver, live_server):
    """Sign in, start a study from the form, watch its trials in flight with logs, cancel it, compare two fronts,
    and create + delete a study through the embedded dashboard's own buttons."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    ARTIFACTS.mkdir(exist_ok=True)
    css = driver.find_elements
    driver.get(f"{live_server}/ui/new")
    assert css(By.ID, "sign-in-needed") and not driver.find_element(By.ID, "start").is_enabled()

    # sign in: a wrong token first
    driver.find_element(By.ID, "sign-in").click()
    _wait(driver, lambda d: d.find_elements(By.ID, "token"))
    driver.find_element(By.ID, "token").send_keys("not-the-token-not-the-token")
    driver.find_element(By.CSS_SELECTOR, "#login-form button").click()
    assert "wrong token" in _wait(driver, lambda d: d.find_element(By.ID, "login-error")).text
    driver.save_screenshot(str(ARTIFACTS / "ui-login.png"))
    driver.find_element(By.ID, "token").send_keys(TOKEN)
    driver.find_element(By.CSS_SELECTOR, "#login-form button").click()
    _wait(driver, lambda d: d.current_url.endswith("/ui/new") and d.find_elements(By.ID, "sign-out"))
    cookie = next(c for c in driver.get_cookies() if c["name"] == "topotune_session")
    assert cookie["httpOnly"] and cookie["sameSite"] == "Strict"
    assert "topotune_session" not in driver.execute_script("return document.cookie")  # scripts never see it

    # the form: a pasted space that does not parse, then a bad budget, each shown at its field; then a study starts
    Select(driver.find_element(By.ID, "model")).select_by_value(REFERENCE_MODEL)
    driver.find_element(By.CSS_SELECTOR, "input[name=space-kind][value=yaml]").click()
    driver.find_element(By.ID, "space-yaml").send_keys("name: [unclosed")
    driver.find_element(By.ID, "start").click()
    error = _wait(driver, lambda d: d.find_elements(By.CSS_SELECTOR, "[data-field2=space] .field-error"))[0]
    assert error.text.startswith("space:"), error.text
    driver.find_element(By.CSS_SELECTOR, "input[name=space-kind][value=file]").click()
    Select(driver.find_element(By.ID, "space-file")).select_by_value("gb300-nvl72-8k1k.yaml")
    driver.find_element(By.CSS_SELECTOR, "input.phase[value=prefill]").click()  # decode only
    trials = driver.find_element(By.ID, "trials")
    trials.clear()
    trials.send_keys("0")
    driver.find_element(By.ID, "max-itl-ms").send_keys("40")
    delay = driver.find_element(By.ID, "trial-delay-s")
    delay.clear()
    delay.send_keys("4")
    driver.find_element(By.ID, "start").click()
    error = _wait(driver, lambda d: d.find_elements(By.CSS_SELECTOR, "[data-field=trials] .field-error"))[0]
    assert error.text.startswith("trials:")
    trials.clear()
    trials.send_keys("3")
    driver.save_screenshot(str(ARTIFACTS / "ui-new.png"))
    driver.find_element(By.ID, "start").click()
    _wait(driver, lambda d: "/ui/studies/" in d.current_url)
    sid = int(driver.current_url.rsplit("/", 1)[-1])

    # live: a trial in flight with its trial.log, then cancel from the page
    panel_js = "const p = document.getElementById('in-flight'); return p ? p.innerText : '';"
    panel = _wait(driver, lambda d: "started in thread" in d.execute_script(panel_js) and d.execute_script(panel_js),
                  120)
    assert "trial.log" in panel and re.search(r"decode #\d+: tp=\d+ dp=\d+", panel), panel
    assert "ITL \u2264 40.0 ms" in driver.find_element(By.TAG_NAME, "body").text  # the form's constraint
    driver.save_screenshot(str(ARTIFACTS / "ui-study-live.png"))
    driver.find_element(By.ID, "cancel").click()
    driver.switch_to.alert.accept()
    _wait(driver, lambda d: "status:" in d.find_element(By.ID, "cancel-result").text)
    _wait(driver, lambda d: d.find_element(By.ID, "status").text == "cancelled", 120)
    with httpx2.Client(base_url=live_server, timeout=30) as http:
        assert http.get(f"/v1/studies/{sid}").json()["status"] == "cancelled"
        # two finished studies for the compare chart (started through the REST API, as a client would)
        pair = [http.post("/v1/studies", json={**FAST_STUDY, "seed": seed}, headers=AUTH).json()["id"]
                for seed in (1, 2)]
        for other in pair:
            assert wait_for(http, other, finished, timeout_s=120)["status"] == "succeeded"
        fronts = [len(http.get(f"/v1/studies/{i}/pareto").json()["composed_front"]) for i in pair]

    driver.get(f"{live_server}/ui")
    for other in pair:
        driver.find_element(By.CSS_SELECTOR, f"input.pick[value='{other}']").click()
    driver.find_element(By.ID, "compare").click()
    selector = "#compare-composed .scatterlayer .trace"
    traces = _wait(driver, lambda d: len(d.find_elements(By.CSS_SELECTOR, selector)) == 2
                   and d.find_elements(By.CSS_SELECTOR, selector))
    counts = sorted(len(t.find_elements(By.CSS_SELECTOR, ".points path")) for t in traces)
    assert counts == sorted(fronts) and min(counts) > 0
    assert len(css(By.CSS_SELECTOR, "#compare-summary tr")) == 3
    legend = driver.find_element(By.CSS_SELECTOR, "#compare-composed .legend").text
    assert f"study {pair[0]}" in legend and f"study {pair[1]}" in legend
    driver.save_screenshot(str(ARTIFACTS / "ui-compare.png"))

    # re-verify from the page's form: a bad budget is shown at its field, then an emulated upgrade's verdicts
    driver.get(f"{live_server}/ui/studies/{pair[0]}")
    budget = _wait(driver, lambda d: d.find_element(By.ID, "rv-budget"))
    budget.clear()
    budget.send_keys("0")
    driver.find_element(By.ID, "reverify-start").click()
    error = _wait(driver, lambda d: d.find_elements(By.CSS_SELECTOR, "[data-field=budget] .field-error"))[0]
    assert error.text.startswith("budget:"), error.text
    budget.clear()
    budget.send_keys("2")
    driver.find_element(By.ID, "rv-emulate").send_keys("0.99.0")
    driver.find_element(By.ID, "reverify-start").click()
    heading = _wait(driver, lambda d: [h for h in d.find_elements(By.TAG_NAME, "h3")
                                       if h.text.startswith("Re-verified on")], 120)[0]
    assert "0.99.0" in heading.text
    verdicts = driver.find_elements(By.CSS_SELECTOR, "#reverify-table tr")
    assert len(verdicts) >= 2  # a header and at least one re-measured config
    driver.save_screenshot(str(ARTIFACTS / "ui-reverify.png"))

    # the cluster's page: what every finished study taught it, linked from the study page
    driver.find_element(By.ID, "cluster-link").click()
    section = _wait(driver, lambda d: d.find_elements(By.CSS_SELECTOR, "section.cluster"))[0]
    assert "learnt" in section.text, section.text[:500]
    driver.save_screenshot(str(ARTIFACTS / "ui-clusters.png"))

    # the dashboard is read-only inside topotune, signed in too: its CREATE is refused and nothing is created
    driver.get(f"{live_server}/dashboard")
    _wait(driver, lambda d: "Optuna" in d.title or d.find_elements(By.ID, "dashboard"))
    assert "Read-only inside topotune" in css(By.ID, "topotune-banner")[0].text
    create_in_dashboard(driver, "made-in-the-browser")
    _wait(driver, lambda d: "Failed to create a study" in d.find_element(By.TAG_NAME, "body").text)
    status = driver.execute_async_script("""
        const done = arguments[arguments.length - 1];
        fetch("/api/studies").then(function (r) { return r.json(); }).then(function (j) {
          done(j.study_summaries.map(function (s) { return s.study_name; })); });
    """)
    assert "made-in-the-browser" not in status
    status = driver.execute_async_script("""
        const done = arguments[arguments.length - 1];
        fetch("/api/studies/1", {method: "DELETE", headers: {"Content-Type": "application/json"},
                                 body: JSON.stringify({remove_associated_artifacts: false})})
          .then(function (r) { done(r.status); });
    """)
    assert status == 405
