"""Writes chat-multiturn.jsonl: a synthetic multi-turn chat trace in the mooncake format (seeded, reproducible).

Every conversation starts with the same 2-block system prompt; each turn re-sends the whole history (the previous
turns' blocks) plus a new user message, so a prefix cache serves most of a late turn. Conversations interleave;
arrivals are Poisson at 2 requests/s. Blocks are 512 tokens, as in the published mooncake traces.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

BLOCK = 512


def main() -> None:
    rng = np.random.default_rng(35)
    next_id = 2  # ids 0 and 1: the shared system prompt
    requests = []
    start_ms = 0.0
    for _ in range(60):  # conversations
        start_ms += float(rng.exponential(2000.0))
        clock_ms = start_ms
        history = [0, 1]
        for _ in range(int(rng.integers(2, 6))):  # turns
            new_blocks = int(rng.integers(1, 4))
            history = history + list(range(next_id, next_id + new_blocks))
            next_id += new_blocks
            tail = int(rng.integers(1, BLOCK))  # the last block is partial
            output = int(np.clip(rng.lognormal(np.log(180), 0.6), 16, 1024))
            requests.append({"timestamp": round(clock_ms), "input_length": (len(history) - 1) * BLOCK + tail,
                             "output_length": output, "hash_ids": list(history)})
            # the reply becomes history for the next turn
            reply_blocks = max(1, output // BLOCK)
            history = history + list(range(next_id, next_id + reply_blocks))
            next_id += reply_blocks
            clock_ms += float(rng.exponential(8000.0))
    requests.sort(key=lambda r: r["timestamp"])
    lines = [json.dumps(r) for r in requests]
    Path(__file__).with_name("chat-multiturn.jsonl").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
