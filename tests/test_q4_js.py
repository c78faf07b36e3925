"""The page's unpacking of SmolLM2's blocks (gptlib/widgets/js/q4.js, run with node) equals
gptlib.export.q4.unpack_external bit for bit: Q4_1's d q + m and Q8_0's q d, each float32
operation rounded once (Math.fround), on blocks whose d and m run through float16's values
(subnormals, signs, large and small) and on the cached SmolLM2 GGUF's own tensors."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from node_support import import_as, run_node

from gptlib.export.q4 import BLOCK_BYTES, unpack_external, unpack_q4_1


def _js_unpack(tmp_path: Path, blocks: bytes, weights: dict) -> bytes:
    """q4.js's unpackWeights on ``blocks`` and the table ``weights``, run by node; its
    lazyWeights (what onnxruntime-web reads, a tensor at a time) must give the same bytes, tensor
    by tensor and over a range that straddles tensors."""
    (tmp_path / "blocks.bin").write_bytes(blocks)
    (tmp_path / "weights.json").write_text(json.dumps(weights), encoding="utf-8")
    script = (
        import_as("q", "q4.js")
        + f"""
import {{ readFileSync, writeFileSync }} from "node:fs";
const dir = {json.dumps(str(tmp_path))};
const blocks = new Uint8Array(readFileSync(dir + "/blocks.bin"));
const weights = JSON.parse(readFileSync(dir + "/weights.json", "utf8"));
const out = q.unpackWeights(blocks, weights), bytes = new Uint8Array(out.buffer);
writeFileSync(dir + "/out.bin", bytes);
const lazy = q.lazyWeights(blocks, weights), read = new Uint8Array(weights.bytes);
if (lazy.data.byteLength !== weights.bytes || lazy.served()) throw new Error("lazy: size");
for (const t of weights.tensors)
  read.set(lazy.data.subarray(t.offset, t.offset + t.bytes), t.offset);
if (!lazy.served() || read.some((b, i) => b !== bytes[i])) throw new Error("lazy: tensors");
const a = weights.tensors[0].bytes - 6, b = Math.min(weights.bytes, a + 300);
if (lazy.data.subarray(a, b).some((x, i) => x !== bytes[a + i])) throw new Error("lazy: range");
"""
    )
    run_node(script, timeout=300)
    return (tmp_path / "out.bin").read_bytes()


def _table(shapes: list[tuple[str, int, int, bool]]) -> list[dict]:
    tensors, at, offset = [], 0, 0
    for kind, rows, cols, transpose in shapes:
        n = rows * cols
        nb = n // 32 * BLOCK_BYTES[kind]
        tensors.append(
            dict(name=f"t{len(tensors)}", type=kind, rows=rows, cols=cols, transpose=transpose,
                 blocks_offset=at, blocks_bytes=nb, offset=offset, bytes=n * 4)
        )  # fmt: skip
        at, offset = at + nb, offset + n * 4
    return tensors


def _random_blocks(tensors: list[dict], rng) -> bytes:
    """Blocks whose d and m take every finite float16 bit pattern in turn, numbers at random."""
    size = sum(t["blocks_bytes"] for t in tensors)
    raw = rng.integers(0, 256, size, dtype=np.uint8)
    finite = np.arange(65536, dtype=np.uint16)
    finite = finite[np.isfinite(finite.view(np.float16))]
    k = 0
    for t in tensors:
        per = BLOCK_BYTES[t["type"]]
        view = raw[t["blocks_offset"] : t["blocks_offset"] + t["blocks_bytes"]].reshape(-1, per)
        for field in range(2 if per == 20 else 1):
            bits = finite[(np.arange(len(view)) * 7919 + k) % len(finite)]
            view[:, 2 * field : 2 * field + 2] = bits.view(np.uint8).reshape(-1, 2)
            k += len(view)
    return raw.tobytes()


def test_js_unpacking_equals_numpys_bit_for_bit(tmp_path):
    # transposed tensors of whole and partial tiles of 32 rows
    tensors = _table([("Q4_1", 96, 64, True), ("Q4_1", 40, 32, False), ("Q8_0", 64, 96, False),
                      ("Q8_0", 32, 64, True), ("Q4_1", 1024, 2048, True), ("Q8_0", 45, 64, True),
                      ("Q4_1", 7, 32, True)])  # fmt: skip
    blocks = _random_blocks(tensors, np.random.default_rng(0))
    weights = {"bytes": tensors[-1]["offset"] + tensors[-1]["bytes"], "tensors": tensors}
    want = unpack_external(blocks, tensors)
    got = _js_unpack(tmp_path, blocks, weights)
    assert len(got) == len(want) == weights["bytes"]
    a, b = np.frombuffer(got, "<u4"), np.frombuffer(want, "<u4")
    assert np.array_equal(a, b), int((a != b).sum())
    # a known value: d = 0.5, m = -1, the first byte 0x21 gives numbers 1 (first) and 2 (17th)
    w = np.frombuffer(want, "<f4")
    q, d, m = unpack_q4_1(np.frombuffer(blocks, np.uint8)[:20])
    first = np.float32(d[0, 0]) * np.float32(q[0, 0] & 15) + np.float32(m[0, 0])
    assert w[0] == first  # t0 is transposed: its (0, 0) is the first number of the first block


EMBEDDING_ROWS = 4096


def test_js_unpacking_equals_the_cached_smollm2_weights(tmp_path):
    """A few of the cached GGUF's own tensors (Q4_1 and Q8_0) unpacked by the page equal the
    model's float32 weights that PyTorch computes with (the cached safetensors). Of the embedding
    (the one Q8_0 tensor, 49,152 rows) the first :data:`EMBEDDING_ROWS` rows: its rows are whole
    blocks, stored one after another, so a prefix of its blocks is a tensor of its own; all of it
    is 113 MB of float32 that node, numpy and the comparisons each went through."""
    from gptlib.assets import asset_path
    from gptlib.gguf import ASSET, gguf_tensor_table

    try:
        path = asset_path(ASSET)
    except (FileNotFoundError, ValueError) as e:
        pytest.skip(f"SmolLM2's GGUF is not in the cache ({e})")
    table, start = gguf_tensor_table(path)
    picked = ("blk.0.attn_q.weight", "blk.7.ffn_down.weight", "token_embd.weight")
    shapes, parts = [], []
    with open(path, "rb") as f:
        for name in picked:
            kind, (cols, rows), offset = table[name]  # GGUF lists the fastest dimension first
            if name == "token_embd.weight":
                assert rows > EMBEDDING_ROWS
                rows = EMBEDDING_ROWS
            f.seek(start + offset)
            parts.append(f.read(rows * cols // 32 * BLOCK_BYTES[kind]))
            shapes.append((kind, rows, cols, name != "token_embd.weight"))
    assert {s[0] for s in shapes} == {"Q4_1", "Q8_0"}, shapes
    tensors = _table(shapes)
    blocks = b"".join(parts)
    weights = {"bytes": tensors[-1]["offset"] + tensors[-1]["bytes"], "tensors": tensors}
    got = _js_unpack(tmp_path, blocks, weights)
    assert got == unpack_external(blocks, tensors)
    from safetensors import safe_open

    from gptlib.gguf import _export_paths

    ours = {"blk.0.attn_q.weight": "blocks.0.attn.W_Q", "blk.7.ffn_down.weight":
            "blocks.7.mlp.W_out", "token_embd.weight": "W_E"}  # fmt: skip
    with safe_open(str(_export_paths()[0]), "pt") as f:  # only these three of the model's tensors
        state = {k: f.get_tensor(k) for k in ours.values()}
    flat = np.frombuffer(got, "<f4")
    for t, name in zip(tensors, picked):
        w = state[ours[name]].numpy()
        w = w[:EMBEDDING_ROWS] if name == "token_embd.weight" else w
        mine = flat[t["offset"] // 4 : (t["offset"] + t["bytes"]) // 4].reshape(w.shape)
        assert np.array_equal(mine.view(np.uint32), w.view(np.uint32)), name


def test_js_unpacking_refuses_a_table_that_does_not_fit(tmp_path):
    tensors = _table([("Q4_1", 2, 32, False)])
    blocks = bytes(40)
    bad = [dict(tensors[0], blocks_bytes=20), dict(tensors[0], type="Q5_0"),
           dict(tensors[0], offset=8)]  # fmt: skip
    for t, msg in zip(bad, ("sizes do not agree", "Q4_1 or Q8_0 expected", "outside the files")):
        with pytest.raises(AssertionError, match=msg):
            _js_unpack(tmp_path, blocks, {"bytes": 256, "tensors": [t]})
