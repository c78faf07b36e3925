"""The heads panel's window of attention rows (gptlib/widgets/js/rows.js, run with node): what it
keeps after any sequence of steps is the full patterns cut to the window (key 0 and the last
W - 1 positions), whatever the steps' sizes, the rows they bring and the rows replaced; it holds
at most W rows a head; its entropy is the last row's over every key; a step that skips rows the
window needs fails, naming them."""

from __future__ import annotations

import base64
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


# JavaScript that defines A (the patterns (L, H, N, N), flat) and row(S): the rows of query S - 1
# over its S keys, (L, H, 1, S) flat, as a step of one token at position S - 1 gives them
def _steps_js(A):
    L, H, N, _ = A.shape
    b64 = base64.b64encode(A.contiguous().numpy().tobytes()).decode()  # node's argument: < 128 KB
    return (
        f"const A = new Float32Array(new Uint8Array(Buffer.from('{b64}', 'base64')).buffer);\n"
        f"const row = (S) => {{ const out = new Float32Array({L * H} * S);\n"
        f"  for (let k = 0; k < {L * H}; k++)\n"
        f"    out.set(A.subarray((k * {N} + S - 1) * {N}, (k * {N} + S - 1) * {N} + S), k * S);\n"
        "  return out; };\n"
    )


def test_a_sliding_window_reads_its_rows_where_they_are():
    """One token a step past the window (W = 40, 90 positions): the window moves a key a step and
    each new row is written over the slot of the row it lets go (rows.js's ring). After every
    step the patterns and total(l, h, [[c, j]]) are the full patterns cut to the window; what a
    step's heads() gave is unchanged by the later steps (read at the end)."""
    L, H, W, N = 1, 2, 40, 90
    A = _patterns(L, H, N, seed=11)
    got = _node(
        _steps_js(A) + f"const out = [], ws = [], w = m.rowWindow({L}, {H}, {W});\n"
        f"for (let S = 1; S <= {N}; S++) {{\n"
        "  const g = w.add(row(S), S - 1, 1, 1).heads(), n = g.positions.length;\n"
        "  out.push(g);\n"
        f"  ws.push([...Array({L * H}).keys()].map((k) => [...Array(n).keys()].map((c) =>\n"
        f"    [...Array(c + 1).keys()].map((j) =>\n"
        f"      g.total(Math.floor(k / {H}), k % {H}, [[c, j]])))));\n"
        "}\n"
        "console.log(JSON.stringify({ out, ws }, plain));"
    )
    for S in range(1, N + 1):
        g, ws = got["out"][S - 1], got["ws"][S - 1]
        pos, rows = _window(A, S, W)
        assert g["positions"] == pos
        for h in range(H):
            for c, r in enumerate(rows[0][h]):
                assert g["patterns"][0][h][c] == pytest.approx(r, abs=0), (S, h, c)
                assert ws[h][c] == pytest.approx(r, abs=0), (S, h, c)


def test_head_scores_from_the_kept_rows_equal_those_of_the_patterns():
    """heads.js's scores of every head, read from the kept rows by total(l, h, pairs), are
    those of the window's patterns themselves, bit for bit (the same sums in the same order)."""
    L, H, W, N = 2, 2, 24, 60
    A = _patterns(L, H, N, seed=12)
    ids = [7, 3, 9, 7, 3, 5] * 12
    got = _node(
        import_as("hd", "heads.js") + _steps_js(A) + f"const w = m.rowWindow({L}, {H}, {W});\n"
        "const out = [];\n"
        f"for (let S = 1; S <= {N}; S++) {{\n"
        "  const g = w.add(row(S), S - 1, 1, 1).heads();\n"
        f"  const keys = g.positions.map((p) => {json.dumps(ids)}[p]);\n"
        "  const a = hd.headScores(g.patterns, keys, g.positions, g.total),\n"
        "    b = hd.headScores(g.patterns, keys, g.positions);\n"
        "  out.push([JSON.stringify(a) === JSON.stringify(b), a.length]);\n"
        "}\n"
        "console.log(JSON.stringify(out));"
    )
    assert all(same for same, _ in got) and {n for _, n in got[5:]} == {3}  # induction too


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


def test_a_result_read_later_through_its_patterns_alone():
    """What heads() gave, kept only as its patterns and total (as the page keeps them), is
    unchanged by later steps that write over the slots it reads, with the garbage collector run
    between the steps (rows.js holds the results weakly)."""
    L, H, W, N = 1, 2, 6, 30
    A = _patterns(L, H, N, seed=13)
    got = _node(
        "import v8 from 'node:v8'; import vm from 'node:vm';\n"
        "v8.setFlagsFromString('--expose-gc'); const gc = vm.runInNewContext('gc');\n"
        + _steps_js(A)
        + f"const kept = [], w = m.rowWindow({L}, {H}, {W});\n"
        f"for (let S = 1; S <= {N}; S++) {{\n"
        "  const { patterns, total, positions } = w.add(row(S), S - 1, 1, 1).heads();\n"
        "  kept.push({ patterns, total, positions });\n"
        "  await new Promise((r) => setTimeout(r, 0)); gc();\n"  # WeakRefs hold to a job's end
        "}\n"
        "const out = kept.map((g) => ({ positions: g.positions, patterns: g.patterns,\n"
        f"  total: [...Array({H}).keys()].map((h) => g.positions.map((_, c) =>\n"
        "    g.total(0, h, [[c, c]]))) }));\n"
        "console.log(JSON.stringify(out, plain));"
    )
    for S in range(1, N + 1):
        g = got[S - 1]
        pos, rows = _window(A, S, W)
        assert g["positions"] == pos
        for h in range(H):
            for c, r in enumerate(rows[0][h]):
                assert g["patterns"][0][h][c] == pytest.approx(r, abs=0), (S, h, c)
                assert g["total"][h][c] == pytest.approx(r[-1], abs=0), (S, h, c)
