"""gptlib.recipes: how the shipped models are made (run configs, presets, the training runs)."""

import json
import math
from dataclasses import asdict
from pathlib import Path

import pytest
import torch

from gptlib.data import load_corpus, train_val_split
from gptlib.model import GPT, GPTConfig
from gptlib.recipes import (
    DOCUMENTATION_RUN,
    INDUCTION_TOY,
    PRESETS,
    RunConfig,
    load_induction_toy,
    samples,
    save_induction_toy,
    train_induction_toy,
    train_run,
)
from gptlib.tokenizers import BPETokenizer
from gptlib.trainer import TrainConfig
from gptlib.training import WindowsLoss

MODELS = Path(__file__).resolve().parents[1] / "models"


pytestmark = pytest.mark.usefixtures("one_thread")  # tiny models: one thread is as fast


def test_run_config_but_routes_fields_and_derives_sizes_again():
    rc = PRESETS["cpu"]
    changed = rc.but(d_model=192, n_heads=6, steps=10, warmup=5, train_fraction=0.5)
    assert (changed.model.d_model, changed.model.d_head, changed.model.d_mlp) == (192, 32, 768)
    assert changed.train.steps == 10 and changed.train_fraction == 0.5
    assert (
        changed.train.batch_size == rc.train.batch_size
        and changed.model.d_vocab == rc.model.d_vocab
    )
    assert rc.but() == rc and rc.model.d_model == 256  # the preset itself is unchanged
    with pytest.raises(ValueError, match="unknown run fields.*d_modle"):
        rc.but(d_modle=64)
    with pytest.raises(ValueError, match="train_fraction"):
        RunConfig(rc.model, rc.train, train_fraction=0.0)
    with pytest.raises(ValueError, match="n_heads"):
        rc.but(n_heads=3)  # 3 does not divide 256


def test_the_english_preset_is_the_shipped_models_config():
    log = json.loads((MODELS / "english" / "train_log.json").read_text())
    assert log["run_config"] == json.loads(json.dumps(asdict(PRESETS[log["preset"]])))
    assert GPTConfig(**log["run_config"]["model"]) == GPT.load(MODELS / "english").config


def test_train_run_is_seeded_and_scores_every_window():
    text = "The cat sat on the mat. The dog sat on the log. " * 40
    tok = BPETokenizer.train(text, 276)  # all the merges the text allows
    ids = torch.tensor(tok.encode(text))
    data = (tok, ids[: len(ids) * 9 // 10], ids[len(ids) * 9 // 10 :], "", "")
    rc = RunConfig(
        GPTConfig(d_vocab=tok.vocab_size, n_ctx=16, d_model=32, n_heads=2, n_layers=1, dropout=0.0),
        TrainConfig(steps=6, batch_size=4, warmup=2, eval_every=3, eval_batches=1),
    )
    a, b = train_run(rc, data), train_run(rc, data)
    assert a["history"].loss == b["history"].loss and a["val"] == b["val"]
    assert isinstance(a["val"], WindowsLoss) and a["val"].tokens == (len(data[2]) - 1) // 16 * 16
    assert a["val"].bits_per_byte > 0 and a["tokens_seen"] == 6 * 4 * 16
    weights = torch.cat([p.flatten() for p in a["model"].parameters()])
    assert torch.equal(weights, weights.half().float())  # scored as shipped: rounded to fp16
    assert len(samples(a["model"], tok, n_tokens=5)) == 3


def test_documentation_run_is_the_shipped_small_models_recipe():
    """models/small is rebuilt by `make small-model`: its config, log and tokenizer are the
    recipe's."""
    log = json.loads((MODELS / "small" / "train_log.json").read_text())
    assert log["train_config"] == json.loads(json.dumps(asdict(DOCUMENTATION_RUN.train)))
    assert GPT.load(MODELS / "small").config == DOCUMENTATION_RUN.model
    train_text, _ = train_val_split(load_corpus(), 0.1)
    tok = BPETokenizer.train(
        train_text, DOCUMENTATION_RUN.model.d_vocab
    )  # the recipe's first step, 2 s
    assert tok.vocab == BPETokenizer.load(MODELS / "small" / "tokenizer.json").vocab
    assert log["train_tokens"] == len(tok.encode(train_text))


def test_run_configs_and_samples_check_their_arguments():
    """Issue 24's audit: a bool or a str is not a fraction, a config is a config; samples() names a
    bad seed or length and leaves the caller's model where it is (it used to call model.cpu())."""
    rc = PRESETS["cpu"]
    for bad in (True, "0.5", math.nan, 0.0, 1.5):
        with pytest.raises(ValueError, match="train_fraction"):
            RunConfig(rc.model, rc.train, bad)
    with pytest.raises(ValueError, match="model must be a GPTConfig"):
        RunConfig({"d_model": 64}, rc.train)
    with pytest.raises(ValueError, match="train must be a TrainConfig"):
        RunConfig(rc.model, None)
    tok = BPETokenizer.train("The cat sat on the mat. " * 10, 270)
    torch.manual_seed(0)
    model = GPT(GPTConfig.preset("tiny", d_vocab=tok.vocab_size, n_ctx=16))
    for kwargs, name in (
        ({"seed": 1.5}, "seed"),
        ({"seed": True}, "seed"),
        ({"n_tokens": -1}, "n_tokens"),
        ({"n_tokens": 2.0}, "n_tokens"),
    ):
        with pytest.raises(ValueError, match=f"^{name} must"):
            samples(model, tok, **kwargs)
    model.cpu = model.to = lambda *a, **k: pytest.fail("samples() moved the caller's model")
    assert len(samples(model, tok, n_tokens=2)) == 3 and model.training  # its mode is kept too


def test_the_induction_toys_first_steps_are_the_stored_runs():
    # the stored run is train_induction_toy() in full; its first 10 steps, rerun, give its first
    # two points to the chapter's 1e-4 nats (other kernels sum in other orders)
    toy, curve = load_induction_toy(MODELS / "induction_toy")
    assert toy.config == INDUCTION_TOY and [s for s, _, _ in curve] == list(range(0, 501, 10))
    _, live = train_induction_toy(steps=10)
    assert [s for s, _, _ in live] == [0, 10]
    for r, q in zip(live, curve):
        assert r[0] == q[0] and max(abs(a - b) for a, b in zip(r[1:], q[1:])) <= 1e-4
    assert live[-1][2] < live[0][2]  # the repeated half has started to fall
    with pytest.raises(ValueError, match="steps"):
        train_induction_toy(steps=-1)
    with pytest.raises(ValueError, match="every"):
        train_induction_toy(every=0)


def test_a_stored_induction_toy_is_checked_naming_the_file(tmp_path):
    toy, curve = load_induction_toy(MODELS / "induction_toy")
    save_induction_toy(tmp_path, toy, curve[:3])
    again, rows = load_induction_toy(tmp_path)
    assert rows == curve[:3]
    assert all(torch.equal(a, b) for a, b in zip(again.parameters(), toy.parameters()))
    record = json.loads((tmp_path / "curve.json").read_text())
    (tmp_path / "curve.json").write_text("{not json")
    with pytest.raises(ValueError, match="curve.json"):
        load_induction_toy(tmp_path)
    (tmp_path / "curve.json").write_text(json.dumps({**record, "weights_sha256": "0" * 64}))
    with pytest.raises(ValueError, match="curve.json.*model.safetensors"):
        load_induction_toy(tmp_path)
    (tmp_path / "curve.json").write_text(json.dumps({**record, "curve": [[10, 1, 1], [0, 1, 1]]}))
    with pytest.raises(ValueError, match="curve.json"):
        load_induction_toy(tmp_path)
    (tmp_path / "curve.json").write_text(json.dumps(record))
    (tmp_path / "model.safetensors").write_bytes(b"\0" * 16)
    with pytest.raises(ValueError, match="model.safetensors"):
        load_induction_toy(tmp_path)
    (tmp_path / "model.safetensors").unlink()
    with pytest.raises(FileNotFoundError, match="induction_toy.py"):
        load_induction_toy(tmp_path)
