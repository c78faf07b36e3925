"""Tokenizer benchmark: training speed against HF `tokenizers` and a naive loop, encoding against
tiktoken.

    python bench/bench_tokenizer.py

Targets: >= 100x the naive re-count loop, <= 20x the time of HF's Rust trainer,
encode throughput >= 0.2x tiktoken's on the same ranks. Long pieces: one word of
20,000 letters and 4,000 CJK characters without a break, with GPT-2's ranks, in a small multiple
of tiktoken's time (the merge loop is O(n log n) in the length of a piece, tiktoken's too).
All measured in this run.
"""

from __future__ import annotations

import random
import time

import regex

from gptlib.data import load_corpus
from gptlib.tokenizers import (
    GPT2_SPLIT_PATTERN,
    BPETokenizer,
    get_stats,
    gpt2_tokenizer,
    merge,
    merge_steps,
)

VOCAB = 4096


def best_of(fn, repeats=3):
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t0)
    return min(times), out


def naive_seconds_per_merge(text: str, n_merges: int = 5) -> float:
    """The notes' algorithm: re-count every pair of the whole corpus for every merge."""
    chunks = [list(c.encode("utf-8")) for c in regex.findall(GPT2_SPLIT_PATTERN, text)]
    t0 = time.perf_counter()
    for k in range(n_merges):
        stats: dict = {}
        for c in chunks:
            get_stats(c, stats)
        pair = max(stats, key=stats.get)
        chunks = [merge(c, pair, 256 + k) for c in chunks]
    return (time.perf_counter() - t0) / n_merges


def hf_train_seconds(text: str) -> float:
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    def run():
        tok = Tokenizer(models.BPE())
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        trainer = trainers.BpeTrainer(
            vocab_size=VOCAB,
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
            special_tokens=["<|endoftext|>"],
            show_progress=False,
        )
        tok.train_from_iterator([text], trainer)
        return tok

    return best_of(run)[0]


def main() -> None:
    text = load_corpus()
    print(f"corpus: {len(text):,} characters; vocabulary {VOCAB}")
    t_ours, tok = best_of(lambda: BPETokenizer.train(text, VOCAB))
    t_hf = hf_train_seconds(text)
    per_merge = naive_seconds_per_merge(text)
    n_merges = VOCAB - 257
    t_naive = per_merge * n_merges
    print(
        f"train  gptlib {t_ours:.2f} s | HF tokenizers {t_hf:.2f} s | naive loop {t_naive:.0f} s "
        f"(extrapolated: {per_merge:.3f} s per merge x {n_merges} merges)"
    )
    print(f"  speed-up over the naive loop: {t_naive / t_ours:.0f}x (target >= 100x)")
    print(f"  time relative to HF's Rust trainer: {t_ours / t_hf:.1f}x (target <= 20x)")

    enc = tok.to_tiktoken()
    sample = text[: len(text) // 2]
    n_bytes = len(sample.encode("utf-8"))
    assert tok.encode(sample) == enc.encode_ordinary(sample)
    fresh = BPETokenizer.load  # a tokenizer with an empty chunk cache, for the cold number
    import tempfile
    from pathlib import Path

    with tempfile.TemporaryDirectory() as d:
        tok.save(Path(d) / "t.json")
        cold = fresh(Path(d) / "t.json")
        t_cold, _ = best_of(lambda: cold.encode(sample), repeats=1)
    t_warm, _ = best_of(lambda: tok.encode(sample))
    t_tik, _ = best_of(lambda: enc.encode_ordinary(sample))
    print(
        f"encode {n_bytes / 1e6:.2f} MB: gptlib {n_bytes / t_warm / 1e6:.1f} MB/s (cold cache "
        f"{n_bytes / t_cold / 1e6:.1f} MB/s)"
        f" | tiktoken {n_bytes / t_tik / 1e6:.1f} MB/s"
    )
    print(
        f"  encode throughput relative to tiktoken: {t_tik / t_warm:.2f}x warm, "
        f"{t_tik / t_cold:.2f}x cold (target >= 0.2x)"
    )

    long_pieces()


def long_pieces() -> None:
    """One long piece each: gptlib's heap merge against tiktoken, and against the readable loop."""
    gpt2 = gpt2_tokenizer()
    enc = gpt2.to_tiktoken()
    rng = random.Random(0)
    cases = {
        "20,000 random letters": "".join(
            rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(20_000)
        ),
        "20,000 x 'a'": "a" * 20_000,
        "4,000 CJK characters": "".join(chr(rng.randrange(0x4E00, 0xA000)) for _ in range(4_000)),
    }
    for name, text in cases.items():
        assert len(gpt2.split(text)) == 1 and gpt2.encode(text) == enc.encode_ordinary(text)
        t_ours, _ = best_of(
            lambda: gpt2.encode(text), repeats=5
        )  # (pieces this long are not cached)
        t_tik, _ = best_of(lambda: enc.encode_ordinary(text), repeats=5)
        print(
            f"long piece, {name}: gptlib {t_ours * 1e3:.1f} ms | tiktoken {t_tik * 1e3:.2f} ms"
            f"  -> {t_ours / t_tik:.1f}x tiktoken's time"
        )
    # The readable loop rescans every pair per merge: quadratic, so only 2,000 letters here.
    word = cases["20,000 random letters"][:2_000].encode()

    def readable():
        parts = [bytes([b]) for b in word]
        for _ in merge_steps(parts, gpt2.ranks):
            pass
        return [gpt2.ranks[p] for p in parts]

    t_read, ids = best_of(readable, repeats=1)
    t_fast, fast = best_of(lambda: gpt2.encode(word.decode()))
    assert ids == fast
    print(
        f"2,000 letters: readable merge_steps {t_read * 1e3:.0f} ms | encode_piece "
        f"{t_fast * 1e3:.1f} ms"
        f"  -> {t_read / t_fast:.0f}x faster"
    )


if __name__ == "__main__":
    main()
