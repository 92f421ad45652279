"""GSM8K answer extraction and scoring mechanics (the live endpoint is exercised in the slow e2e test)."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from tuner.backends.vllm._accuracy import extract_answer, load_questions, normalize_number, run_gsm8k


@pytest.mark.parametrize(("text", "expected"), [
    (" She sells 9 eggs, 9 * 2 = $18.\n#### 18", "18"),
    ("#### 1,234", "1234"),
    ("The answer is $1,234.50 dollars.", "1234.5"),
    ("3 + 4 = 7 so 7 - 2 = 5", "5"),
    ("It takes 2/2=1 bolt. Total 3.\nQuestion: next one has 99", "3"),
    ("Answer: -4", "-4"),
    ("no digits here", None),
    ("", None),
    ("#### 18.0", "18"),
])
def test_extract_answer(text: str, expected: str | None) -> None:
    assert extract_answer(text) == expected


def test_normalize_number() -> None:
    assert normalize_number("$70,000") == "70000"
    assert normalize_number("0.5") == "0.5"
    assert normalize_number("none") is None


def test_packaged_dataset_has_every_question_with_a_number() -> None:
    questions = load_questions()
    assert len(questions) == 1319
    assert questions[0].answer == "18"


class _Fake(BaseHTTPRequestHandler):
    """Answers correctly for the ducks question, wrongly otherwise."""

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        last_question = body["prompt"].rsplit("Question:", 1)[1]
        text = " 16 - 3 - 4 = 9, 9 * 2 = 18.\n#### 18" if "Janet" in last_question else " #### 7"
        payload = json.dumps({"choices": [{"text": text}]}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def log_message(self, *args: object) -> None:
        pass


def test_run_gsm8k_scores_against_an_openai_like_endpoint() -> None:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Fake)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        result = run_gsm8k(f"http://127.0.0.1:{server.server_port}", "m", num_questions=4, concurrency=2)
    finally:
        server.shutdown()
    assert (result.correct, result.total, result.errors) == (1, 4, 0)
    assert result.score == 0.25
    assert result.samples[0]["got"] == "18"


def test_unreachable_endpoint_counts_as_wrong(tmp_path: Path) -> None:
    result = run_gsm8k("http://127.0.0.1:1", "m", num_questions=2, timeout_s=1)
    assert (result.score, result.errors) == (0.0, 2)
