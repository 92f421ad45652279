"""Run vLLM's own V1 Scheduler (no model, no GPU) over a request list and print each step's batch as JSON.

Runs inside the vLLM venv: `python vllm_scheduler_steps.py MODEL_DIR < spec.json`. The spec gives the scheduler's
flags and the requests (prompt token ids, max_tokens, the step each arrives before); every scheduled request that
completes its prompt or decodes gets one sampled token (no EOS: max_tokens decides the end). Output: one entry per
step, {request id: tokens scheduled}, the preempted ids, and the prefix-cache hits at admission. A JSON list of
specs gives a list of outputs (one vLLM import for them all: each spec gets its own fresh Scheduler).
"""

from __future__ import annotations

import json
import sys

import torch
from vllm.config import CacheConfig, ModelConfig, SchedulerConfig, VllmConfig
from vllm.sampling_params import SamplingParams
from vllm.utils.hashing import sha256
from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
from vllm.v1.outputs import ModelRunnerOutput
from vllm.v1.request import Request
from vllm.v1.structured_output import StructuredOutputManager


def main() -> None:
    model_dir = sys.argv[1]
    specs = json.load(sys.stdin)
    init_none_hash(sha256)
    out = [run(model_dir, spec) for spec in specs] if isinstance(specs, list) else run(model_dir, specs)
    print(json.dumps(out))


def run(model_dir: str, spec: dict) -> dict:
    bs = spec["block_size"]
    scheduler_config = SchedulerConfig(
        max_num_seqs=spec["max_num_seqs"], max_num_batched_tokens=spec["max_num_batched_tokens"],
        max_model_len=spec["max_model_len"], long_prefill_token_threshold=spec.get("long_prefill_token_threshold", 0),
        enable_chunked_prefill=True, is_encoder_decoder=False)
    model_config = ModelConfig(model=model_dir, dtype="float32", seed=0, skip_tokenizer_init=True,
                               max_model_len=spec["max_model_len"])
    cache_config = CacheConfig(block_size=bs, enable_prefix_caching=True)
    vllm_config = VllmConfig(scheduler_config=scheduler_config, model_config=model_config, cache_config=cache_config)
    kv = KVCacheConfig(num_blocks=spec["num_blocks"], kv_cache_tensors=[], kv_cache_groups=[
        KVCacheGroupSpec(["layer"], FullAttentionSpec(block_size=bs, num_kv_heads=1, head_size=1,
                                                      dtype=torch.float32))])
    cache_config.num_gpu_blocks = spec["num_blocks"]
    scheduler = Scheduler(vllm_config=vllm_config, kv_cache_config=kv, log_stats=True,
                          structured_output_manager=StructuredOutputManager(vllm_config), block_size=bs)
    hasher = get_request_block_hasher(bs, sha256)
    pending = sorted(spec["requests"], key=lambda r: r["arrive_step"])
    steps = []
    step = 0
    hits = {}
    while pending or scheduler.has_requests():
        while pending and pending[0]["arrive_step"] <= step:
            r = pending.pop(0)
            scheduler.add_request(Request(request_id=r["id"], prompt_token_ids=r["prompt"],
                                          sampling_params=SamplingParams(max_tokens=r["max_tokens"], ignore_eos=True),
                                          pooling_params=None, block_hasher=hasher))
        out = scheduler.schedule()
        for new in out.scheduled_new_reqs:
            hits.setdefault(new.req_id, new.num_computed_tokens)
        batch = dict(out.num_scheduled_tokens)
        req_ids = list(batch)
        sampled = []
        for rid in req_ids:
            request = scheduler.requests[rid]
            # schedule() already advanced num_computed_tokens (`_update_after_schedule`)
            done_prompt = request.num_computed_tokens >= request.num_tokens
            sampled.append([7] if done_prompt else [])
        runner = ModelRunnerOutput(req_ids=req_ids, req_id_to_index={r: i for i, r in enumerate(req_ids)},
                                   sampled_token_ids=sampled, logprobs=None, prompt_logprobs_dict={},
                                   pooler_output=[])
        scheduler.update_from_output(out, runner)
        pool = scheduler.kv_cache_manager.block_pool
        steps.append({"batch": batch, "preempted": sorted(out.preempted_req_ids or []),
                      "free_blocks": pool.get_num_free_blocks(), "cached_blocks": len(pool.cached_block_hash_to_block)})
        step += 1
        if step > 100_000:
            raise SystemExit("no progress")
    return {"steps": steps, "hits": hits}


if __name__ == "__main__":
    main()
