"""The heads panel's window of attention rows (gptlib/widgets/js/rows.js, run with node): what it
keeps after any sequence of steps is the full patterns cut to the window (key 0 and the last
W - 1 positions), whatever the steps' sizes, the rows they bring and the rows replaced; it holds
at most W rows a head; its entropy is the last row's over every key; a step that skips rows the
window needs fails, naming them."""

from __future__ import annotations

import json
import math

import pytest
import torch
from node_support import import_as, run_node


def _node(script: str):
    head = import_as("m", "rows.js") + (
        "const plain = (k, v) => (ArrayBuffer.isView(v) ? Array.from(v) : v);\n"
    )
    return run_node(head + script)


def _patterns(L, H, S, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(L, H, S, S, generator=g, dtype=torch.float64) * 2
    mask = torch.ones(S, S, dtype=torch.bool).triu(1)
    return torch.softmax(x.masked_fill(mask, -math.inf), dim=-1).float()  # (L, H, S, S)


def _window(A, S, W):
    """The full patterns of S positions cut to the window: (positions, rows[l][h][c])."""
    lo = max(1, S - W + 1)
    pos = [0] + list(range(lo, S))
    rows = [
        [[A[l, h, q, [p for p in pos if p <= q]].tolist() for q in pos] for h in range(A.shape[1])]
        for l in range(A.shape[0])
    ]
    return pos, rows


@pytest.mark.parametrize("W", [4, 7, 128])
def test_window_after_steps_equals_the_cut_patterns(W):
    L, H, N = 2, 3, 23
    A = _patterns(L, H, N, seed=W)
    # steps (P, T, r): a prompt, single tokens, a run whose rows come only for the last r
    # queries, a rewind (P smaller than held: the rows from P on are replaced)
    steps = [(0, 5, 5), (5, 1, 1), (6, 3, 3), (9, 8, None), (17, 1, 1), (12, 9, None), (21, 2, 2)]
    script = f"const out = []; const w = m.rowWindow({L}, {H}, {W});\n"
    want = []
    for P, T, r in steps:
        S = P + T
        r = r if r is not None else min(T, max(1, S - max(P, S - W + 1 if S > W else 0)))
        rows = A[:, :, S - r : S, :S].contiguous()  # (L, H, r, S)
        script += (
            f"w.add(Float32Array.from({json.dumps(rows.flatten().tolist())}), {P}, {T}, {r});\n"
            "out.push(w.heads());\n"
        )
        want.append(_window(A, S, W))
    got = _node(script + "console.log(JSON.stringify(out, plain));")
    for (P, T, _), g, (pos, rows) in zip(steps, got, want):
        S = P + T
        assert g["positions"] == pos and len(pos) == min(S, W)
        for l in range(L):
            for h in range(H):
                for c, row in enumerate(rows[l][h]):
                    assert g["patterns"][l][h][c] == pytest.approx(row, abs=0), (S, l, h, c)
        ent = torch.special.entr(A[:, :, S - 1, :S].double()).sum(-1)
        torch.testing.assert_close(
            torch.tensor(g["entropy"], dtype=torch.float64), ent, atol=1e-6, rtol=0
        )


def test_rows_wanted_and_missing_rows():
    got = _node(
        "const w = m.rowWindow(1, 1, 4); let err = '';\n"
        "w.add(Float32Array.from([1]), 0, 1);\n"
        "try { w.add(new Float32Array(3), 2, 1); } catch (e) { err = e.message; }\n"
        "console.log(JSON.stringify({ wanted: [m.rowsWanted(0, 10, 4), m.rowsWanted(9, 1, 4),"
        " m.rowsWanted(0, 3, 4), m.rowsWanted(100, 900, 128)], err,"
        " pos: [m.windowPositions(0, 4), m.windowPositions(3, 4), m.windowPositions(10, 4)] }));"
    )
    assert got["wanted"] == [3, 1, 3, 127]
    assert got["err"] == "rows of queries 1 to 1 are missing"
    assert got["pos"] == [[], [0, 1, 2], [0, 7, 8, 9]]


def test_add_cut_equals_add():
    """The kernel's rows, cut to the window in Python, give what the full rows give."""
    L, H, S, W = 2, 2, 12, 5
    A = _patterns(L, H, S, seed=3)
    pos = [0] + list(range(S - W + 1, S))
    r = 4
    cut = A[:, :, S - r :, pos]  # (L, H, r, W)
    ent = torch.special.entr(A[:, :, -1].double()).sum(-1)
    full = A[:, :, S - r :, :]
    f32 = lambda t: f"Float32Array.from({json.dumps(t.flatten().tolist())})"  # noqa: E731
    got = _node(
        f"const a = m.rowWindow({L}, {H}, {W}).add({f32(full)}, 0, {S}, {r});\n"
        f"const b = m.rowWindow({L}, {H}, {W}).addCut({f32(cut)},"
        f" {json.dumps(ent.flatten().tolist())}, 0, {S}, {r});\n"
        "console.log(JSON.stringify([a.heads(), b.heads()], plain));"
    )
    assert got[0]["positions"] == got[1]["positions"] == pos
    assert got[0]["patterns"] == got[1]["patterns"]
    torch.testing.assert_close(
        torch.tensor(got[0]["entropy"]), torch.tensor(got[1]["entropy"]), atol=1e-6, rtol=0
    )


def test_held_after_the_context_shrinks():
    """An undo or a restart after more than W positions: the window of the shorter context needs
    rows before the first one kept, so held(K) says 0 and a step brings them from firstKept(K)
    on (rowsWanted(firstKept(K), ...)); the window is then the cut patterns again. While the
    context only grows, held(K) is every position held."""
    L, H, W = 1, 2, 4
    A = _patterns(L, H, 9, seed=5)
    f32 = lambda t: f"Float32Array.from({json.dumps(t.flatten().tolist())})"  # noqa: E731
    got = _node(
        f"const w = m.rowWindow({L}, {H}, {W});\n"
        f"w.add({f32(A[:, :, :8, :8])}, 0, 8);\n"  # 8 positions: rows of queries 5..7 kept
        "const held = [w.held(), w.held(9), w.held(7), w.held(3)];\n"
        "const fk = m.firstKept(7, 4), r = m.rowsWanted(fk, 7 - fk, 4);\n"
        f"w.add({f32(A[:, :, 4:7, :7])}, fk, 7 - fk, r);\n"  # undo: 7 positions, from query 4
        "console.log(JSON.stringify({ held, fk, r, heads: w.heads() }, plain));"
    )
    assert got["held"] == [8, 8, 0, 0] and got["fk"] == 4 and got["r"] == 3
    pos, rows = _window(A, 7, W)
    assert got["heads"]["positions"] == pos
    for h in range(H):
        for c, row in enumerate(rows[0][h]):
            assert got["heads"]["patterns"][0][h][c] == pytest.approx(row, abs=0)
