"""Chapter 9's stored runs (gptlib.recipes.save_rlhf_runs / load_rlhf_runs): a round trip gives the
same tensors and curves; a damaged, missing or mismatched file fails naming it."""

import dataclasses
import json
from pathlib import Path

import pytest
import torch

from gptlib import rlhf
from gptlib.model import GPT, GPTConfig
from gptlib.recipes import RLHF_STEPS, RLHFRuns, load_rlhf_runs, save_rlhf_runs

MODELS = Path(__file__).resolve().parents[1] / "models"
CONFIG = GPTConfig.preset("tiny", dropout=0.0)


def tiny(seed):
    torch.manual_seed(seed)
    return GPT(CONFIG).eval()


def tiny_runs() -> RLHFRuns:
    """Untrained tiny models and made-up curves of the stored lengths: what is stored, not how."""
    sft = tiny(0)
    rm = rlhf.RewardModel(tiny(1)).eval()
    with torch.no_grad():
        rm.w_r.normal_()
        rm.b_r.fill_(0.25)
    curves = {
        name: [0.5 + i / 7 for i in range(n)] for name, n in RLHF_STEPS.items() if name != "ppo"
    }
    n = RLHF_STEPS["ppo"]
    curves["ppo"] = {
        k: [i / 3 + j for i in range(n)] for j, k in enumerate(("judged", "reward", "kl"))
    }
    samples = torch.randint(0, CONFIG.d_vocab, (8, 12), generator=torch.Generator().manual_seed(3))
    ref = -torch.rand(2, 5, generator=torch.Generator().manual_seed(4)) * 30
    heldout = {"pretrained": [60.5, 58.25, 61.0], "sft": [59.5, 58.0, 60.75]}
    return RLHFRuns(sft, rm, tiny(2), tiny(3), samples, ref[0], ref[1], curves, heldout)


def same_tensors(a: torch.nn.Module, b: torch.nn.Module) -> bool:
    sa, sb = a.state_dict(), b.state_dict()
    return sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


def test_a_round_trip_gives_the_same_models_data_and_curves(tmp_path):
    runs = tiny_runs()
    save_rlhf_runs(tmp_path, runs)
    again = load_rlhf_runs(tmp_path, CONFIG)
    for name in ("sft", "reward_model", "ppo", "dpo"):
        assert same_tensors(getattr(again, name), getattr(runs, name)), name
        assert not getattr(again, name).training
    ids = runs.samples
    with torch.no_grad():  # the head too: the same rewards
        assert torch.equal(again.reward_model(ids), runs.reward_model(ids))
    for name in ("samples", "ref_w", "ref_l"):
        assert torch.equal(getattr(again, name), getattr(runs, name))
    assert again.curves == runs.curves and again.heldout == runs.heldout
    before = {f.name: f.read_bytes() for f in tmp_path.iterdir()}
    save_rlhf_runs(tmp_path, runs)  # the same runs, the same bytes
    assert {f.name: f.read_bytes() for f in tmp_path.iterdir()} == before


def test_a_damaged_or_mismatched_store_fails_naming_the_file(tmp_path):
    save_rlhf_runs(tmp_path, tiny_runs())
    other = dataclasses.replace(CONFIG, n_layers=CONFIG.n_layers + 1)
    with pytest.raises(ValueError, match=r"sft\.safetensors: config"):
        load_rlhf_runs(tmp_path, other)  # models of another shape than the chapter's
    source = tmp_path / "curves.json"
    record = json.loads(source.read_text())
    source.write_text("{not json")
    with pytest.raises(ValueError, match="curves.json"):
        load_rlhf_runs(tmp_path, CONFIG)
    short = {**record, "curves": {**record["curves"], "dpo": record["curves"]["dpo"][:-1]}}
    source.write_text(json.dumps(short))
    with pytest.raises(ValueError, match="curves.json: curve 'dpo' must have 20 steps"):
        load_rlhf_runs(tmp_path, CONFIG)
    bad = {**record, "curves": {**record["curves"], "sft": [float("nan")] * 20}}
    source.write_text(json.dumps(bad))
    with pytest.raises(ValueError, match="curves.json: curve 'sft'"):
        load_rlhf_runs(tmp_path, CONFIG)
    uneven = {**record, "heldout": {**record["heldout"], "sft": [1.0]}}
    source.write_text(json.dumps(uneven))
    with pytest.raises(ValueError, match="curves.json: the two heldout lists"):
        load_rlhf_runs(tmp_path, CONFIG)
    source.write_text(json.dumps({**record, "sha256": {**record["sha256"], "ppo": "0" * 64}}))
    with pytest.raises(ValueError, match=r"curves.json: sha256 of 'ppo' .*ppo\.safetensors"):
        load_rlhf_runs(tmp_path, CONFIG)
    source.write_text(json.dumps(record))
    load_rlhf_runs(tmp_path, CONFIG)  # restored: loads again
    weights = tmp_path / "dpo.safetensors"
    data = bytearray(weights.read_bytes())
    data[-4:] = b"\xff\xff\xff\x7f"  # a changed weight: the digest no longer matches
    weights.write_bytes(bytes(data))
    with pytest.raises(ValueError, match=r"dpo\.safetensors"):
        load_rlhf_runs(tmp_path, CONFIG)
    weights.write_bytes(b"\0" * 16)
    with pytest.raises(ValueError, match=r"dpo\.safetensors"):
        load_rlhf_runs(tmp_path, CONFIG)
    weights.unlink()
    with pytest.raises(FileNotFoundError, match="rlhf_runs.py"):
        load_rlhf_runs(tmp_path, CONFIG)
