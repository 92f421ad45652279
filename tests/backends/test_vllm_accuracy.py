"""The GSM8K gate as vLLM's eval does it: prompt, stop sequences, scoring, Wilson interval, verdict.
(The live endpoint is exercised in the slow e2e test.)"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import ClassVar

import pytest

from tuner.backends.vllm._accuracy import (
    NUM_SHOTS,
    STOP_SEQUENCES,
    Question,
    answer_value,
    build_prompt,
    few_shot_prefix,
    load_questions,
    run_gsm8k,
    score,
    wilson_interval,
)


@pytest.mark.parametrize(("text", "expected"), [
    (" She sells 9 eggs, 9 * 2 = $18.\n#### 18", 18),
    ("#### 1,234", 1234),
    ("3 + 4 = 7 so 7 - 2 = 5", 5),
    ("The answer is $70,000.", 70000),
    ("#### -10", 10),  # vLLM's scorer reads no sign, on the reference alike: the pair still matches
    ("no digits here", None),
    ("", None),
])
def test_answer_value_is_vllms_last_integer(text: str, expected: int | None) -> None:
    assert answer_value(text) == expected


def test_packaged_test_split_has_every_question() -> None:
    questions = load_questions()
    assert len(questions) == 1319
    assert questions[0].answer == 18


def test_prompt_is_five_train_shots_then_the_question() -> None:
    prefix = few_shot_prefix()
    assert NUM_SHOTS == 5 and prefix.count("Question: ") == 5 and prefix.count("\nAnswer: ") == 5
    # the first train record (Natalia's clips), never a test question
    assert prefix.startswith("Question: Natalia sold clips to 48 of her friends in April")
    assert "#### 72\n\n" in prefix
    test_texts = {q.question for q in load_questions()}
    assert not any(f"Question: {t}\n" in prefix for t in test_texts)
    prompt = build_prompt(Question(question="What is 2+2?", answer=4), prefix)
    assert prompt.endswith("\n\nQuestion: What is 2+2?\nAnswer:")


def test_wilson_interval_known_values() -> None:
    low, high = wilson_interval(180, 200)  # 0.90 at n=200
    assert low == pytest.approx(0.8506, abs=1e-4) and high == pytest.approx(0.9343, abs=1e-4)
    assert wilson_interval(0, 4)[0] == 0.0 and wilson_interval(0, 4)[1] == pytest.approx(0.4899, abs=1e-4)
    assert wilson_interval(4, 4)[1] == 1.0
    narrow = wilson_interval(900, 1000)
    assert narrow[1] - narrow[0] < high - low  # more questions, narrower interval


def test_verdict_does_not_fail_a_correct_deployment_on_noise() -> None:
    """A deployment at the bar's accuracy scoring a little under it on a 200-question sample passes; one whose
    interval lies wholly below the bar fails."""
    questions = [Question(question=str(i), answer=i) for i in range(200)]
    noisy = score(questions, [(f"#### {i if i < 176 else -1}", "", 5) for i in range(200)])  # 0.88, bar 0.90
    assert noisy.score == pytest.approx(0.88) and noisy.ci_high > 0.90 and noisy.passes(0.90)
    broken = score(questions, [(f"#### {i if i < 150 else -1}", "", 5) for i in range(200)])  # 0.75
    assert broken.ci_high < 0.90 and not broken.passes(0.90)


def test_invalid_and_failed_requests_are_counted() -> None:
    questions = [Question(question="a", answer=1), Question(question="b", answer=2)]
    result = score(questions, [("no number", "", 3), (None, "HTTP 400: too long", 0)])
    assert (result.correct, result.invalid, result.errors, result.first_error) == (0, 1, 1, "HTTP 400: too long")
    assert result.output_tokens == 3


class _Fake(BaseHTTPRequestHandler):
    """Answers correctly for the ducks question, wrongly otherwise; records what it was sent."""

    bodies: ClassVar[list[dict]] = []

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        _Fake.bodies.append(body)
        last_question = body["prompt"].rsplit("Question:", 1)[1]
        text = " 16 - 3 - 4 = 9, 9 * 2 = 18.\n#### 18" if "Janet" in last_question else " #### 7"
        payload = json.dumps({"choices": [{"text": text}], "usage": {"completion_tokens": 11}}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def log_message(self, *args: object) -> None:
        pass


def test_run_gsm8k_sends_vllms_request_and_scores_it() -> None:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Fake)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        result = run_gsm8k(f"http://127.0.0.1:{server.server_port}", "m", num_questions=4, concurrency=2)
    finally:
        server.shutdown()
    assert (result.correct, result.total, result.errors) == (1, 4, 0)
    assert result.score == 0.25 and result.ci_low < 0.25 < result.ci_high
    assert result.samples[0]["got"] == 18 and result.output_tokens == 44
    body = _Fake.bodies[-1]
    assert body["stop"] == list(STOP_SEQUENCES) == ["Question", "Assistant:", "<|separator|>"]
    assert body["temperature"] == 0.0 and body["max_tokens"] == 256 and body["seed"] == 42


def test_unreachable_endpoint_counts_as_wrong(tmp_path: Path) -> None:
    result = run_gsm8k("http://127.0.0.1:1", "m", num_questions=2, timeout_s=1)
    assert (result.score, result.errors) == (0.0, 2)


def test_interval_verdict_rarely_fails_a_deployment_at_the_bar() -> None:
    """Seeded simulation: 4,000 gates of 250 questions on a deployment whose true accuracy is exactly the bar.
    The interval verdict fails about 2.5% of them; comparing the score with the bar would fail about half."""
    import numpy as np

    from tuner.backends.vllm._accuracy import wilson_interval

    correct = np.random.default_rng(0).binomial(250, 0.95, size=4000)
    interval_fails = np.mean([wilson_interval(int(c), 250)[1] < 0.95 for c in correct])
    naive_fails = np.mean(correct / 250 < 0.95)
    assert interval_fails < 0.05 and naive_fails > 0.3
