"""Standalone generator of a tiny random-weight Qwen3 (dense) or Qwen3-MoE model, for CPU tests.

Run it by path with the vLLM venv's python (it needs tokenizers, transformers and torch, which topotune's own
venv does not have): `python _tiny_model.py OUT_DIR [--moe] [--seed N]`. No model hub: the byte-level BPE
tokenizer is trained on generated text, the weights are random. Takes ~10 s; commit the generator, not weights.
"""

import argparse
import json
import random
import sys
from pathlib import Path

CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
WORDS = (
    "the", "a", "of", "to", "and", "in", "is", "it", "you", "that", "he", "was", "for", "on", "are", "with",
    "as", "his", "they", "be", "at", "one", "have", "this", "from", "or", "had", "by", "word", "but", "what",
    "some", "we", "can", "out", "other", "were", "all", "there", "when", "up", "use", "your", "how", "said",
    "an", "each", "she", "which", "do", "their", "time", "if", "will", "way", "about", "many", "then", "them",
    "write", "would", "like", "so", "these", "her", "long", "make", "thing", "see", "him", "two", "has", "look",
    "more", "day", "could", "go", "come", "did", "number", "sound", "no", "most", "people", "my", "over",
    "know", "water", "than", "call", "first", "who", "may", "down", "side", "been", "now", "find", "question",
    "answer", "eggs", "dollars", "market", "sells", "makes", "total", "how", "much", "many",
)


def corpus(seed: int, lines: int = 4000) -> list[str]:
    """Generated English-like text plus digits and punctuation, so GSM8K prompts tokenize sensibly."""
    rng = random.Random(seed)
    out = []
    for _ in range(lines):
        words = [rng.choice(WORDS) for _ in range(rng.randint(5, 25))]
        words.insert(rng.randint(0, len(words)), str(rng.randint(0, 10_000)))
        out.append(" ".join(words).capitalize() + rng.choice([".", "?", "!", ":", " = 42.", " #### 18"]))
    return out


def build_tokenizer(out: Path, seed: int, vocab_size: int):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIAL_TOKENS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(corpus(seed), trainer=trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>",
                                   bos_token=None, unk_token=None)
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(out)
    return fast


def build_model(out: Path, tokenizer, moe: bool, seed: int) -> None:
    import torch
    from transformers import GenerationConfig, Qwen3Config, Qwen3ForCausalLM, Qwen3MoeConfig, Qwen3MoeForCausalLM

    torch.manual_seed(seed)
    common = dict(vocab_size=len(tokenizer), hidden_size=128, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, head_dim=32, max_position_embeddings=4096, rope_theta=1_000_000.0,
                  tie_word_embeddings=False, torch_dtype="bfloat16",
                  bos_token_id=tokenizer.convert_tokens_to_ids("<|endoftext|>"),
                  eos_token_id=tokenizer.convert_tokens_to_ids("<|im_end|>"))
    if moe:
        config = Qwen3MoeConfig(intermediate_size=256, moe_intermediate_size=64, num_experts=4,
                                num_experts_per_tok=2, decoder_sparse_step=1, norm_topk_prob=True, **common)
        model = Qwen3MoeForCausalLM(config)
    else:
        config = Qwen3Config(intermediate_size=256, **common)
        model = Qwen3ForCausalLM(config)
    # A random model otherwise samples special tokens and lone UTF-8 continuation bytes, which decode to ""
    # and are streamed as empty deltas: AIPerf then sees one content chunk per request and measures no
    # inter-token latency. Zero logits for those tokens and 10x logits for the rest make them (nearly) never
    # sampled, so every step streams visible text.
    with torch.no_grad():
        weight = model.lm_head.weight
        weight.mul_(10.0)
        for token_id in range(len(tokenizer)):
            text = tokenizer.decode([token_id])
            if not text.strip() or "\ufffd" in text or not text.isascii():
                weight[token_id] = 0.0
    model = model.to(torch.bfloat16)
    model.generation_config = GenerationConfig(eos_token_id=common["eos_token_id"], do_sample=False)
    model.save_pretrained(out, safe_serialization=True)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--moe", action="store_true", help="Qwen3-MoE: 4 experts, top-2")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--vocab-size", type=int, default=1536)
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tokenizer(args.out, args.seed, args.vocab_size)
    build_model(args.out, tokenizer, args.moe, args.seed)
    print(json.dumps({"path": str(args.out), "moe": args.moe, "vocab_size": len(tokenizer)}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
