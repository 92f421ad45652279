"""Headless Chromium asks "What should I deploy?": signs in, gets a field error beside its field, then the
recommendation with its reason, both fronts on a chart numbered as the table, the commands and the downloads, the
same winner POST /v1/advice gives; then a trace from the picker at its own rate. Screenshot in test-artifacts/."""

from __future__ import annotations

import shutil

import httpx2
import pytest
from api_helpers import ARTIFACTS, AUTH, FAST_STUDY, REFERENCE_MODEL, REPO, TOKEN, finished, served, wait_for
from test_api_browser import _wait, chromium, driver  # noqa: F401 - the browser fixtures

from api.main import create_app


@pytest.fixture
def advice_server(sqlite_url, make_settings, model_store, tmp_path):  # type: ignore[no-untyped-def]
    """The service with a folder of traces among its allowed roots (the page's trace picker lists them)."""
    traces = tmp_path / "traces"
    traces.mkdir()
    shutil.copy(REPO / "examples" / "traces" / "chat-multiturn.jsonl", traces / "chat.jsonl")
    settings = make_settings(sqlite_url, allowed_roots=[model_store, REPO / "search_spaces", traces])
    with served(create_app(settings)) as url:
        yield url, str((traces / "chat.jsonl").resolve())


def _type(browser, element_id: str, text: str) -> None:  # type: ignore[no-untyped-def]
    from selenium.webdriver.common.by import By

    box = browser.find_element(By.ID, element_id)
    box.clear()
    box.send_keys(text)


def test_a_browser_asks_what_to_deploy(driver, advice_server) -> None:  # type: ignore[no-untyped-def]  # noqa: F811
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    base, trace = advice_server
    css = driver.find_elements
    driver.get(f"{base}/ui")
    driver.find_element(By.ID, "nav-advice").click()
    _wait(driver, lambda d: d.current_url.endswith("/ui/advice") and d.find_elements(By.ID, "sign-in-needed"))
    assert not driver.find_element(By.ID, "ask").is_enabled()
    driver.find_element(By.ID, "sign-in").click()
    _wait(driver, lambda d: d.find_elements(By.ID, "token"))
    driver.find_element(By.ID, "token").send_keys(TOKEN)
    driver.find_element(By.CSS_SELECTOR, "#login-form button").click()
    _wait(driver, lambda d: d.current_url.endswith("/ui/advice") and d.find_elements(By.ID, "sign-out"))

    # an SLA nothing meets: the 422 is shown beside its field
    Select(driver.find_element(By.ID, "model")).select_by_value(REFERENCE_MODEL)
    _type(driver, "gpus", "32")
    _type(driver, "max-mtp", "0")
    driver.find_element(By.CSS_SELECTOR, "input[name=traffic][value=distributions]").click()
    _type(driver, "max-ttft-ms", "10")
    driver.find_element(By.ID, "ask").click()
    error = _wait(driver, lambda d: d.find_elements(By.CSS_SELECTOR, "[data-field='sla.max_ttft_ms'] .field-error"))[0]
    assert error.text.startswith("sla.max_ttft_ms:") and "TTFT <= 10 ms" in error.text, error.text

    # a reachable SLA: the recommendation, its reason, both fronts charted and numbered as the table, the commands
    _type(driver, "max-ttft-ms", "2000")
    _type(driver, "max-itl-ms", "50")
    driver.find_element(By.ID, "ask").click()
    _wait(driver, lambda d: d.find_element(By.ID, "advice-result").is_displayed()
          and not d.find_elements(By.CSS_SELECTOR, ".field-error"))
    recommendation = driver.find_element(By.ID, "recommendation").text
    reason = driver.find_element(By.ID, "reason").text
    body = {"model_path": REFERENCE_MODEL, "hardware": "gb300", "gpus": 32, "max_mtp": 0, "mode": "both",
            "workload": {"input_tokens": {"distribution": "lognormal", "mean": 2000, "stddev": 1500,
                                          "max_tokens": 16000},
                         "output_tokens": {"distribution": "normal", "mean": 300, "stddev": 100}},
            "sla": {"max_ttft_ms": 2000, "max_itl_ms": 50, "percentile": "p90"}}
    with httpx2.Client(base_url=base, timeout=60) as http:
        api = http.post("/v1/advice", json=body, headers=AUTH).json()
    winner = api["recommendation"][api["recommendation"]["winner"]]
    assert recommendation.startswith(f"{api['recommendation']['winner']}: {winner['deployment']} on "), recommendation
    assert reason == api["reason"] and "under TTFT <= 2000 ms, ITL <= 50 ms at p90" in reason
    rows = css(By.CSS_SELECTOR, "#advice-table tbody tr")
    assert len(rows) == len(api["front"]) + len(api["aggregated_front"]) > 1
    assert [r.find_elements(By.TAG_NAME, "td")[0].text for r in rows] == [str(i) for i in range(len(rows))]
    assert driver.find_element(By.ID, "winner-row").find_elements(By.TAG_NAME, "td")[2].text == winner["deployment"]
    labels = [t.text for t in css(By.CSS_SELECTOR, "#advice-chart .scatterlayer .textpoint text")]
    assert sorted(labels, key=lambda s: int(s[1:])) == [f"#{i}" for i in range(len(rows))]
    assert css(By.CSS_SELECTOR, "#advice-chart .scatterlayer .points path")
    assert driver.find_element(By.ID, "commands").text.strip() == api["commands"].strip()
    assert "vllm serve" in api["commands"] and driver.find_element(By.ID, "operating").text == \
        api["operating_deployment"]
    for link in ("download-commands", "download-json"):
        assert driver.find_element(By.ID, link).get_attribute("href").startswith("blob:")
    ARTIFACTS.mkdir(exist_ok=True)
    driver.save_screenshot(str(ARTIFACTS / "ui-advice.png"))

    # a trace from the picker, at its own arrival rate: the fewest GPUs that carry it
    driver.find_element(By.CSS_SELECTOR, "input[name=traffic][value=trace]").click()
    Select(driver.find_element(By.ID, "trace")).select_by_value(trace)
    driver.find_element(By.ID, "own-rate").click()
    _type(driver, "max-ttft-ms", "1000")
    _type(driver, "max-itl-ms", "30")
    driver.find_element(By.ID, "ask").click()
    _wait(driver, lambda d: "req/s" in d.find_element(By.ID, "reason").text)
    assert "carries 1.199 req/s" in driver.find_element(By.ID, "reason").text  # the trace's own rate
    assert "req/s per instance" in driver.find_element(By.CSS_SELECTOR, "#advice-table tbody tr").text

    # the same trace uploaded from this machine: the same answer
    driver.find_element(By.CSS_SELECTOR, "input[name=traffic][value=upload]").click()
    driver.find_element(By.ID, "trace-file").send_keys(str(REPO / "examples" / "traces" / "chat-multiturn.jsonl"))
    driver.find_element(By.ID, "upload-own-rate").click()
    before = driver.find_element(By.ID, "reason").text
    driver.execute_script('document.getElementById("reason").textContent = "";')
    driver.find_element(By.ID, "ask").click()
    assert _wait(driver, lambda d: d.find_element(By.ID, "reason").text) == before


def test_the_new_study_form_shows_the_spaces_sla_and_a_traces_summary(driver, advice_server) -> None:  # type: ignore[no-untyped-def]  # noqa: F811
    from selenium.webdriver.common.by import By

    base, _ = advice_server
    driver.get(f"{base}/ui/new")
    ttft = driver.find_element(By.ID, "max-ttft-ms")
    assert ttft.get_attribute("placeholder") == "2000"  # the default space's own bound
    driver.find_element(By.CSS_SELECTOR, "input[name=space-kind][value=yaml]").click()
    assert ttft.get_attribute("placeholder") == "the pasted space's"
    assert driver.find_element(By.ID, "min-accuracy").get_attribute("placeholder") == "the pasted space's"
    # the workload section: a trace from the picker, with its summary
    driver.find_element(By.CSS_SELECTOR, "input[name=workload-kind][value=trace]").click()
    summary = _wait(driver, lambda d: "requests" in d.find_element(By.ID, "trace-summary").text
                    and d.find_element(By.ID, "trace-summary"))
    assert summary.text.startswith("202 requests") and "1.199 req/s" in summary.text
    assert "prefix-cache hits" in summary.text


def test_the_study_page_shows_its_advice_and_numbered_points(driver, advice_server) -> None:  # type: ignore[no-untyped-def]  # noqa: F811
    from selenium.webdriver.common.by import By

    base, _ = advice_server
    with httpx2.Client(base_url=base, timeout=60) as http:
        sid = http.post("/v1/studies", json=FAST_STUDY, headers=AUTH).json()["id"]
        assert wait_for(http, sid, finished, timeout_s=120)["status"] == "succeeded"
        n_front = len(http.get(f"/v1/studies/{sid}/pareto").json()["composed_front"])
    driver.get(f"{base}/ui/studies/{sid}")
    reason = _wait(driver, lambda d: d.find_element(By.ID, "study-advice-reason"))
    assert "under" in reason.text and driver.find_element(By.ID, "study-advice-winner").text.startswith("Predicted")
    labels = _wait(driver, lambda d: d.find_elements(By.CSS_SELECTOR, "#front-chart .scatterlayer .textpoint text"))
    assert sorted(t.text for t in labels) == sorted(f"#{i}" for i in range(n_front))
    marked = driver.find_element(By.ID, "recommended-row").find_elements(By.TAG_NAME, "td")[0].text
    assert marked.endswith("\u2605") and f"Measured: point #{marked.split()[0]}," in \
        driver.find_element(By.ID, "measured-recommendation").text
    driver.save_screenshot(str(ARTIFACTS / "ui-study-advice.png"))
