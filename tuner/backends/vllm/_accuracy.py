"""The accuracy gate: GSM8K against the deployment's OpenAI endpoint, the way vLLM's own eval scores it.

A deployment that is fast but wrong (a broken kernel, a bad quantization, a KV transfer that corrupts) must not
win. The protocol follows vLLM's tests/evals/gsm8k/gsm8k_eval.py so a score compares with published vLLM
figures: 5 worked examples from the TRAIN split, prompts "Question: ...\\nAnswer:", greedy completions of at most
256 tokens with stop sequences "Question", "Assistant:", "<|separator|>", and the answer is the last integer in
the completion (commas removed), compared with the last integer of the reference answer.

A gate asks a sample (the first N of the 1,319 test questions, as vLLM's --num-questions does) and so carries
sampling noise: the verdict uses a Wilson interval and fails only when the interval's upper bound is below the
bar, i.e. when the data rule out, at the chosen confidence, that the deployment meets it. A correct deployment
then fails by chance at most (1 - confidence) / 2 of the time. stdlib HTTP only (no extra dependency).
"""

from __future__ import annotations

import json
import math
import re
import urllib.error
import urllib.request
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from statistics import NormalDist

NUM_SHOTS = 5  # vLLM's gsm8k_eval default: the first 5 train examples
STOP_SEQUENCES: tuple[str, ...] = ("Question", "Assistant:", "<|separator|>")
SEED = 42  # vLLM's gsm8k_eval default request seed
TEST_QUESTIONS = 1319
_INTEGER = re.compile(r"\d+")


@dataclass(frozen=True)
class Question:
    question: str
    answer: int  # the reference: the last integer of the worked answer (after "####")

    @classmethod
    def from_record(cls, record: dict[str, str]) -> Question:
        number = answer_value(record["answer"])
        if number is None:
            raise ValueError(f"no final number in GSM8K answer: {record['answer'][-80:]!r}")
        return cls(question=record["question"], answer=number)


def answer_value(text: str) -> int | None:
    """The last integer in `text` once thousands separators are gone ('$1,234' -> 1234); None when none.

    Same rule as vLLM's scorer: signs and decimals are not read ('-3' -> 3, '18.5' -> 5), on both the model's
    completion and the reference, so scores match vLLM's."""
    numbers = _INTEGER.findall(text.replace(",", ""))
    return int(numbers[-1]) if numbers else None


def data_dir() -> Path:
    return Path(str(resources.files("tuner") / "data" / "gsm8k"))


def _records(path: Path) -> list[dict[str, str]]:
    with path.open(encoding="utf-8") as fh:
        return [json.loads(line) for line in fh if line.strip() and not line.startswith("#")]


def load_questions(path: Path | None = None) -> list[Question]:
    """The test split (1,319 questions), in order."""
    return [Question.from_record(r) for r in _records(path or data_dir() / "test.jsonl")]


def few_shot_prefix(train: Path | None = None, num_shots: int = NUM_SHOTS) -> str:
    """The worked examples every prompt starts with: the first `num_shots` train records, verbatim."""
    shots = _records(train or data_dir() / "train.jsonl")[:num_shots]
    return "".join(f"Question: {r['question']}\nAnswer: {r['answer']}\n\n" for r in shots)


def build_prompt(question: Question, prefix: str) -> str:
    return f"{prefix}Question: {question.question}\nAnswer:"


def wilson_interval(correct: int, total: int, confidence: float = 0.95) -> tuple[float, float]:
    """The Wilson score interval for a binomial proportion: sound at small n and at scores near 0 or 1,
    where the normal approximation gives bounds outside [0, 1] or of zero width."""
    if total <= 0:
        return 0.0, 1.0
    z = NormalDist().inv_cdf(0.5 + confidence / 2)
    p = correct / total
    denom = 1 + z * z / total
    centre = (p + z * z / (2 * total)) / denom
    half = z * math.sqrt(p * (1 - p) / total + z * z / (4 * total * total)) / denom
    return max(0.0, centre - half), min(1.0, centre + half)


@dataclass(frozen=True)
class AccuracyResult:
    score: float
    correct: int
    total: int
    ci_low: float = 0.0
    ci_high: float = 1.0
    confidence: float = 0.95
    invalid: int = 0  # completions with no integer in them (vLLM's invalid_rate numerator)
    errors: int = 0  # requests that failed (counted as wrong)
    first_error: str = ""  # why the first failed request failed (the server's answer when it gave one)
    num_shots: int = NUM_SHOTS
    output_tokens: int = 0  # generated over the gate (the server's usage counts), for its cost
    samples: tuple[dict[str, str | int | None], ...] = field(default=())

    def passes(self, min_accuracy: float) -> bool:
        """False only when the interval rules the bar out: its upper bound is below `min_accuracy`."""
        return self.ci_high >= min_accuracy


def _complete(endpoint: str, model: str, prompt: str, max_tokens: int, timeout_s: float) -> tuple[str, int]:
    body = json.dumps({"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0.0,
                       "seed": SEED, "stop": list(STOP_SEQUENCES)}).encode()
    req = urllib.request.Request(endpoint.rstrip("/") + "/v1/completions", data=body,
                                 headers={"Content-Type": "application/json"}, method="POST")
    with urllib.request.urlopen(req, timeout=timeout_s) as resp:
        data = json.loads(resp.read())
    return data["choices"][0]["text"], int((data.get("usage") or {}).get("completion_tokens", 0))


Completion = tuple[str | None, str, int]  # text (None when the request failed), why it failed, tokens generated


def ask_completion(endpoint: str, model: str, prompt: str, max_tokens: int, timeout_s: float) -> Completion:
    """The completion and its token count, or None and why the request failed."""
    try:
        text, tokens = _complete(endpoint, model, prompt, max_tokens, timeout_s)
        return text, "", tokens
    except urllib.error.HTTPError as exc:  # e.g. 400: the prompt does not fit max-model-len
        body = exc.read().decode("utf-8", errors="replace") if exc.fp else ""
        return None, f"HTTP {exc.code}: {body[:300] or exc.reason}", 0
    except (urllib.error.URLError, OSError, KeyError, ValueError, TypeError) as exc:
        return None, f"{type(exc).__name__}: {exc}"[:300], 0


def score(questions: Sequence[Question], completions: Sequence[Completion], *,
          confidence: float = 0.95) -> AccuracyResult:
    """Exact match of each completion's answer with the reference, and the interval around the score."""
    correct = invalid = errors = output_tokens = 0
    first_error = ""
    samples = []
    for q, (text, error, tokens) in zip(questions, completions, strict=True):
        output_tokens += tokens
        got = answer_value(text) if text is not None else None
        errors += bool(error)
        first_error = first_error or error
        invalid += text is not None and got is None
        correct += got == q.answer
        samples.append({"question": q.question[:200], "expected": q.answer, "got": got,
                        "completion": (text or "")[:300]})
    total = len(questions)
    low, high = wilson_interval(correct, total, confidence)
    return AccuracyResult(score=correct / total if total else 0.0, correct=correct, total=total, ci_low=low,
                          ci_high=high, confidence=confidence, invalid=invalid, errors=errors,
                          first_error=first_error, output_tokens=output_tokens, samples=tuple(samples))


def run_gsm8k(endpoint: str, model: str, *, num_questions: int = 200, max_tokens: int = 256,
              concurrency: int = 8, timeout_s: float = 600.0, confidence: float = 0.95,
              dataset: Path | None = None, train: Path | None = None) -> AccuracyResult:
    """Score the first `num_questions` test questions (deterministic: greedy, fixed order, fixed shots)."""
    prefix = few_shot_prefix(train)
    chosen = load_questions(dataset)[:num_questions]
    with ThreadPoolExecutor(max_workers=max(1, concurrency)) as pool:
        completions = list(pool.map(
            lambda q: ask_completion(endpoint, model, build_prompt(q, prefix), max_tokens, timeout_s), chosen))
    return score(chosen, completions, confidence=confidence)
