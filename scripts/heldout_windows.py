"""The English model's loss on each of its held-out windows, for Chapter 8 (§8.8).

    nice -n 10 python scripts/heldout_windows.py [--out models/english_heldout.json]

Chapter 8 reports the shipped English model (``models/english``) on the whole held-out split of
the Brown corpus (``gptlib.data.load_english``): the text is encoded with the model's tokenizer and
cut into tiled windows of its context (``make_windows(ids, n_ctx, n_ctx)``), 661 of 128 tokens.
Scoring all of them costs more than the chapter's time budget, so this script scores them once
and stores, per window, the summed negative log-likelihood of its targets (nats, from the logits
with ``F.cross_entropy``) and their bytes. The chapter adds them up, compares the totals with the
training log's ``final_val`` (measured by ``gptlib.training.windows_loss`` when the model was
made) and recomputes a seeded sample of the windows from the shipped weights itself. One thread,
no randomness: a rerun writes the same file.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from gptlib.data import load_english, token_byte_lengths
from gptlib.files import model_file, read_fields
from gptlib.model import GPT
from gptlib.runtime import atomic_write
from gptlib.tokenizers import BPETokenizer
from gptlib.training import make_windows

ROOT = Path(__file__).resolve().parents[1]
ENGLISH = ROOT / "models" / "english"


def window_nats(
    model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, batch: int = 32
) -> list[float]:
    """(n,) the summed -log P(target) of each window (x, y): (n, T) inputs and targets; ``model``
    maps (b, T) ids to (b, T, |V|) logits (below, an embedding that gives uniform logits).

    >>> emb = torch.nn.Embedding(4, 4)
    >>> _ = torch.nn.init.zeros_(emb.weight)  # uniform over 4 tokens: ln 4 nats per target
    >>> x, y = make_windows(list(range(4)) * 3, n_ctx=5, stride=5)
    >>> [round(v, 4) for v in window_nats(emb, x, y)]  # two windows of 5 targets
    [6.9315, 6.9315]
    """
    out: list[float] = []
    was = model.training
    model.eval()
    with torch.no_grad():
        for xb, yb in zip(x.split(batch), y.split(batch)):
            logits = model(xb)  # (b, T, |V|)
            nll = F.cross_entropy(logits.flatten(0, 1), yb.flatten(), reduction="none")
            out += nll.view(len(xb), -1).sum(dim=1).tolist()  # (b,)
    model.train(was)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=ROOT / "models" / "english_heldout.json")
    args = ap.parse_args()
    torch.set_num_threads(1)
    start = time.time()
    model = GPT.load(ENGLISH).eval()
    tok = BPETokenizer.load(ENGLISH / "tokenizer.json")
    _, val_text = load_english()
    ids = torch.tensor(tok.encode(val_text))
    n_ctx = model.config.n_ctx
    x, y = make_windows(ids, n_ctx, n_ctx)  # (n, n_ctx): the tiled held-out windows
    nats = window_nats(model, x, y)
    byte_lengths = token_byte_lengths(tok)  # (|V|,)
    n_bytes = byte_lengths[y].sum(dim=1).tolist()  # (n,): the bytes of each window's targets
    total, tokens, total_bytes = sum(nats), y.numel(), sum(n_bytes)
    out = {
        "what": "the shipped English model's summed loss (nats) and target bytes on each tiled "
        "held-out window of the Brown corpus; made by scripts/heldout_windows.py",
        "model_sha256": read_fields(model_file(ENGLISH))["sha256"],  # the weights scored
        "n_ctx": n_ctx,
        "windows": len(x),
        "tokens": tokens,
        "bytes": total_bytes,
        "nats_per_token": round(total / tokens, 6),
        "bits_per_byte": round(total / (math.log(2) * total_bytes), 6),
        "nats": [round(v, 4) for v in nats],
        "window_bytes": n_bytes,
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
    }
    atomic_write(args.out, json.dumps(out, indent=1) + "\n")
    print(
        f"wrote {args.out}: {len(x)} windows, {out['nats_per_token']} nats/token, "
        f"{out['bits_per_byte']} bits/byte in {time.time() - start:.0f} s"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
