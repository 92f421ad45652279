"""The accuracy gate: GSM8K questions against the deployment's OpenAI endpoint, exact match on the final number.

A deployment that is fast but wrong (a broken kernel, a bad quantization, a KV transfer that corrupts) must not
win. The score is stored with the trial and used as a study constraint. stdlib HTTP only (no extra dependency).
"""

from __future__ import annotations

import json
import re
import urllib.error
import urllib.request
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

FEW_SHOT = 2  # worked examples (from the end of the test set, never scored) before each question
_NUMBER = re.compile(r"-?\$?\d[\d,]*(?:\.\d+)?")


@dataclass(frozen=True)
class Question:
    question: str
    answer: str  # the reference number, normalised

    @classmethod
    def from_record(cls, record: dict[str, str]) -> Question:
        final = record["answer"].split("####")[-1]
        number = normalize_number(final)
        if number is None:
            raise ValueError(f"no final number in GSM8K answer: {record['answer'][-80:]!r}")
        return cls(question=record["question"], answer=number)


def normalize_number(text: str) -> str | None:
    """'$1,234.50' -> '1234.5', '18.' -> '18', '-3' -> '-3'; None when there is no number."""
    match = _NUMBER.search(text)
    if match is None:
        return None
    raw = match[0].replace(",", "").replace("$", "")
    try:
        value = float(raw)
    except ValueError:
        return None
    return str(int(value)) if value == int(value) else repr(value)


def extract_answer(completion: str) -> str | None:
    """The model's final number: after the last '####' if present, else after 'answer is', else the last number.

    Only the text before the model starts a new few-shot 'Question:' counts.
    """
    text = completion.split("Question:")[0]
    if "####" in text:
        return normalize_number(text.rsplit("####", 1)[1])
    lowered = text.lower()
    for marker in ("the answer is", "answer:"):
        idx = lowered.rfind(marker)
        if idx >= 0:
            found = normalize_number(text[idx + len(marker):])
            if found is not None:
                return found
    numbers = _NUMBER.findall(text)
    return normalize_number(numbers[-1]) if numbers else None


def default_dataset() -> Path:
    return Path(str(resources.files("tuner") / "data" / "gsm8k" / "test.jsonl"))


def load_questions(path: Path | None = None) -> list[Question]:
    with (path or default_dataset()).open(encoding="utf-8") as fh:
        return [Question.from_record(json.loads(line)) for line in fh if line.strip()]


def build_prompt(question: Question, shots: Sequence[tuple[str, str]]) -> str:
    parts = [f"Question: {q}\nAnswer: {a}\n\n" for q, a in shots]
    parts.append(f"Question: {question.question}\nAnswer:")
    return "".join(parts)


@dataclass(frozen=True)
class AccuracyResult:
    score: float
    correct: int
    total: int
    errors: int = 0  # requests that failed (counted as wrong)
    first_error: str = ""  # why the first failed request failed (the server's answer when it gave one)
    samples: tuple[dict[str, str | None], ...] = field(default=())


def _complete(endpoint: str, model: str, prompt: str, max_tokens: int, timeout_s: float) -> str:
    body = json.dumps({"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0.0,
                       "stop": ["Question:", "\n\n"]}).encode()
    req = urllib.request.Request(endpoint.rstrip("/") + "/v1/completions", data=body,
                                 headers={"Content-Type": "application/json"}, method="POST")
    with urllib.request.urlopen(req, timeout=timeout_s) as resp:
        return json.loads(resp.read())["choices"][0]["text"]


def run_gsm8k(endpoint: str, model: str, *, num_questions: int = 50, max_tokens: int = 256,
              concurrency: int = 8, timeout_s: float = 120.0, dataset: Path | None = None) -> AccuracyResult:
    """Score the first `num_questions` GSM8K test questions (deterministic: greedy, fixed order)."""
    with (dataset or default_dataset()).open(encoding="utf-8") as fh:
        records = [json.loads(line) for line in fh if line.strip()]
    scored, shot_records = (records[:-FEW_SHOT], records[-FEW_SHOT:]) if FEW_SHOT else (records, [])
    shots = [(r["question"], r["answer"]) for r in shot_records]
    chosen = [Question.from_record(r) for r in scored[:num_questions]]

    def ask(q: Question) -> tuple[Question, str | None, str]:
        try:
            return q, _complete(endpoint, model, build_prompt(q, shots), max_tokens, timeout_s), ""
        except urllib.error.HTTPError as exc:  # e.g. 400: the prompt does not fit max-model-len
            body = exc.read().decode("utf-8", errors="replace") if exc.fp else ""
            return q, None, f"HTTP {exc.code}: {body[:300] or exc.reason}"
        except (urllib.error.URLError, OSError, KeyError, ValueError) as exc:
            return q, None, f"{type(exc).__name__}: {exc}"[:300]

    with ThreadPoolExecutor(max_workers=max(1, concurrency)) as pool:
        results = list(pool.map(ask, chosen))
    correct = errors = 0
    first_error = ""
    samples = []
    for q, text, error in results:
        got = extract_answer(text) if text is not None else None
        errors += bool(error)
        first_error = first_error or error
        correct += got == q.answer
        samples.append({"question": q.question[:200], "expected": q.answer, "got": got,
                        "completion": (text or "")[:300]})
    total = len(chosen)
    return AccuracyResult(score=correct / total if total else 0.0, correct=correct, total=total, errors=errors,
                          first_error=first_error,
                          samples=tuple(samples))
