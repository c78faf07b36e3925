"""gptlib.training.windows_loss: the loss over windows in nats per token and bits per byte."""

import math

import pytest
import torch
import torch.nn.functional as F

from gptlib.data import load_corpus, token_byte_lengths, train_val_split
from gptlib.model import GPT, GPTConfig
from gptlib.training import make_windows, windows_loss

pytestmark = pytest.mark.usefixtures("one_thread")  # tiny models: one thread is as fast


def test_equals_cross_entropy_over_all_windows_at_once_for_any_batch_size():
    torch.manual_seed(0)
    model = GPT(GPTConfig.preset("tiny", dropout=0.3)).train()
    x, y = make_windows(
        torch.randint(0, 512, (700,), generator=torch.Generator().manual_seed(1)), 64, 48
    )
    with torch.no_grad():
        model.eval()
        peer = float(F.cross_entropy(model(x).flatten(0, 1), y.flatten()))
        model.train()
    for batch_size in (1, 5, 64):
        r = windows_loss(model, x, y, batch_size=batch_size)
        assert r.nats_per_token == pytest.approx(peer, rel=1e-6) and r.tokens == y.numel()
        assert r.bits_per_byte is None and r.bytes is None
    assert model.training  # scored in eval mode (no dropout), the mode restored


def test_bits_per_byte_divides_the_total_by_the_texts_bytes(book_bpe):
    tok = book_bpe
    _, val = train_val_split(load_corpus(), 0.1)
    ids = torch.tensor(tok.encode(val[:20_000]))
    x, y = make_windows(ids, 32, 32)
    torch.manual_seed(0)
    model = GPT(GPTConfig.preset("tiny", d_vocab=tok.vocab_size, n_ctx=32))
    r = windows_loss(model, x, y, byte_lengths=token_byte_lengths(tok))
    assert r.bytes == len(
        tok.decode(y.flatten().tolist()).encode("utf-8")
    )  # byte-level: the targets' text
    assert r.bits_per_byte == pytest.approx(
        r.nats_per_token * r.tokens / (math.log(2) * r.bytes), rel=1e-12
    )
    assert (
        abs(r.nats_per_token - math.log(tok.vocab_size)) < 0.1
    )  # untrained: near the uniform ln |V|


def test_errors_name_what_is_wrong():
    model = GPT(GPTConfig.preset("tiny"))
    x = torch.zeros(2, 8, dtype=torch.long)
    with pytest.raises(ValueError, match="x and y"):
        windows_loss(model, x, x[:, 1:])
    with pytest.raises(ValueError, match="no window"):
        windows_loss(model, x[:0], x[:0])
    with pytest.raises(ValueError, match="batch_size"):
        windows_loss(model, x, x, batch_size=0)
    with pytest.raises(ValueError, match="byte_lengths"):
        windows_loss(model, x, x + 300, byte_lengths=[1] * 256)
