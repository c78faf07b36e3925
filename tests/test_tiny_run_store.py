"""Chapter 8's stored first run (gptlib.recipes.save_tiny_run / load_tiny_run): a round trip gives
the same weights and history; a damaged, missing or mismatched file fails naming it."""

import json
from pathlib import Path

import pytest
import torch

from gptlib.model import GPT, GPTConfig
from gptlib.recipes import TINY_RUN, load_tiny_run, save_tiny_run, tiny_run_config
from gptlib.trainer import History

MODELS = Path(__file__).resolve().parents[1] / "models"
CONFIG = GPTConfig(d_vocab=16, n_ctx=8, d_model=8, n_heads=2, n_layers=1)


def tiny_model(seed=0):
    torch.manual_seed(seed)
    return GPT(CONFIG).eval()


def history():
    """A made-up history of the stored form: what is stored, not how."""
    return History([0, 1, 2], [2.5, 2.25, 2.0], [1e-3, 2e-3, 3e-3], [2], [2.125])


def test_a_round_trip_gives_the_same_weights_and_history(tmp_path):
    model, hist = tiny_model(), history()
    save_tiny_run(tmp_path, model, hist)
    again, h = load_tiny_run(tmp_path, CONFIG)
    sa, sb = model.state_dict(), again.state_dict()
    assert sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)
    assert h == hist and not again.training


@pytest.mark.parametrize("name", ["model.safetensors", "history.json"])
def test_a_missing_file_is_named_with_the_script_that_makes_it(tmp_path, name):
    save_tiny_run(tmp_path, tiny_model(), history())
    (tmp_path / name).unlink()
    with pytest.raises(FileNotFoundError, match=f"{name}.*scripts/tiny_run.py"):
        load_tiny_run(tmp_path, CONFIG)


def test_weights_from_another_run_are_refused_naming_the_history(tmp_path):
    save_tiny_run(tmp_path, tiny_model(0), history())
    tiny_model(1).save(tmp_path / "model.safetensors")  # valid weights, not the stored ones
    with pytest.raises(ValueError, match="history.json.*weights_sha256"):
        load_tiny_run(tmp_path, CONFIG)


def test_damaged_weights_are_named(tmp_path):
    save_tiny_run(tmp_path, tiny_model(), history())
    path = tmp_path / "model.safetensors"
    data = bytearray(path.read_bytes())
    data[-3] ^= 0xFF
    path.write_bytes(bytes(data))
    with pytest.raises(ValueError, match="model.safetensors"):
        load_tiny_run(tmp_path, CONFIG)


@pytest.mark.parametrize(
    "edit",
    [
        lambda r: r["history"].pop("loss"),
        lambda r: r["history"]["loss"].pop(),  # one value short
        lambda r: r["history"]["step"].reverse(),  # not increasing
        lambda r: r["history"]["eval_loss"].__setitem__(0, "nan"),
        lambda r: r.pop("weights_sha256"),
    ],
)
def test_a_damaged_history_is_named(tmp_path, edit):
    save_tiny_run(tmp_path, tiny_model(), history())
    path = tmp_path / "history.json"
    record = json.loads(path.read_text())
    edit(record)
    path.write_text(json.dumps(record))
    with pytest.raises(ValueError, match="history.json"):
        load_tiny_run(tmp_path, CONFIG)


def test_a_model_of_another_shape_is_refused_naming_the_weights(tmp_path):
    save_tiny_run(tmp_path, tiny_model(), history())
    other = GPTConfig(d_vocab=16, n_ctx=8, d_model=8, n_heads=2, n_layers=2)
    with pytest.raises(ValueError, match="model.safetensors.*config"):
        load_tiny_run(tmp_path, other)


def test_the_stored_run_is_8_4s_run():
    """Known values of models/tiny_run: 300 steps of the tiny preset over the book's 1024-token
    BPE, the validation loss every 50 steps, falling by more than a nat."""
    model, hist = load_tiny_run(MODELS / "tiny_run", tiny_run_config(1024))
    assert model.num_parameters() == 169_728
    assert hist.step == list(range(TINY_RUN.steps))
    assert hist.eval_step == list(range(50, 301, 50))
    assert hist.eval_loss[-1] < hist.eval_loss[0] - 1.0
    assert abs(hist.loss[0] - torch.log(torch.tensor(1024.0)).item()) < 0.1  # ln|V| at start
