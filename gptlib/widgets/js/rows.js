// The attention rows a page keeps for the heads panel: a window of the last W positions of the
// model's context (the panel's window, separate from the model's n_ctx), with the first key (where
// many heads put their spare weight) kept beside them. So a run of any length holds at most
// n_layers * n_heads * W * (W + 1) / 2 weights, and the panel draws at most W rows.
//
// The window of a context of S positions is the key list `positions`: every position while
// S <= W, else [0, S - W + 1, ..., S - 1] (W of them). A head's pattern over it is lower-
// triangular: row c is the query positions[c]'s weights on the keys positions[0..c] (its weights
// on the keys left out, 1 .. S - W, are not kept: such a row sums to less than 1). Each kept row
// holds at most 2 SLACK - 1 weights more, of keys the window has let go (see SLACK).

export const PANEL_WINDOW = 128;
// A kept row is cut again (copied without the keys the window has let go) once the window's start
// has moved SLACK to 2 SLACK - 1 positions past the one it was cut for (by its query: the rows of
// one step are not all cut on the same step); until then it is read at an offset. A window that
// slides by one position a step would otherwise cut every row it keeps (SmolLM2: 270 heads x 127
// rows, 50 ms a click); this way a step cuts about 1/SLACK of them.
const SLACK = 16;

// Row `row` (key 0, then keys from lo0 on) cut to start at lo0 + d: key 0, then lo0 + d on.
function cutRow(row, d) {
  const out = new Float32Array(row.length - d);
  out[0] = row[0];
  out.set(row.subarray(1 + d), 1);
  return out;
}

// The key list of a context of S positions in a window of W (see above).
export function windowPositions(S, W = PANEL_WINDOW) {
  const lo = Math.max(1, S - W + 1);
  return S === 0 ? [] : [0, ...Array.from({ length: S - lo }, (_, k) => lo + k)];
}

// The entropy (nats) of one attention row.
export function entropyOf(row) {
  let e = 0;
  for (const a of row) if (a > 0) e -= a * Math.log(a);
  return e;
}

// The first query whose row the window of a context of K positions keeps (0: every row).
export const firstKept = (K, W = PANEL_WINDOW) => (K > W ? K - W + 1 : 0);

// The new queries of a step on positions P .. P + T - 1 whose rows the window needs: the step
// asks only for these (their count r, the last r of the T).
export const rowsWanted = (P, T, W = PANEL_WINDOW) => P + T - Math.max(P, firstKept(P + T, W));

// The rows kept for L * H heads in a window of W. add(attn, P, T, r) takes a step's rows `attn`
// (L, H, r, P + T): the last r of its T new queries P .. P + T - 1 over every key (r = T: all);
// rows it held for queries from P + T - r on are replaced, and those before are kept (the caller
// knows they are still right: the same ids and head mask before them; a query the window needs
// and nobody gave is an Error). addCut(cut, entropy, P, T, r) takes rows already cut to the
// window's keys (L, H, r, positions.length) and each head's last-row entropy (L, H), as the
// kernel sends them. heads() -> {positions, patterns[l][h][c], entropy[l][h] (the last row's,
// over all its keys), total(l, h, pairs)}, or null before any rows: each head's pattern is cut
// from the kept rows when it is first read (a panel draws one head), and total(l, h, pairs) is
// the sum of patterns[l][h][c][j] over the pairs [c, j], in their order, read from the kept rows
// themselves (the scores of every head: no pattern cut); neither changes when later rows come.
// held(K) -> the positions its rows are of, as far as a context of K positions (the same ids
// before) can build on them: 0 when it would need rows before the first one kept (K smaller than
// before: an undo, a restart), which a step must then bring from firstKept(K) on.
export function rowWindow(L, H, W = PANEL_WINDOW) {
  const lh = L * H;
  let rows = [], // rows[k][q - from]: [w(q, 0), w(q, lo), ..., w(q, q)], lo = los[q - from]
    los = [], // the window start each kept row was cut for
    from = 0, // the first query kept
    S = 0, // the positions the rows are of
    entropy = null; // entropy[k]: the last row's

  // Ready for new rows from query P0 on (of K positions): the rows before it that the window
  // keeps stay. Returns the window's first key after 0 (1 while it holds every position).
  function begin(P0, K) {
    const need = firstKept(K, W);
    if (P0 <= need || S === 0) {
      if (P0 > need) throw new Error(`rows of queries ${need} to ${P0 - 1} were never given`);
      rows = Array.from({ length: lh }, () => []);
      los = [];
      from = need;
    } else {
      if (P0 > S || from > need) throw new Error(`rows of queries ${S} to ${P0 - 1} are missing`);
      for (const r of rows) r.length = P0 - from;
      los.length = P0 - from;
      const drop = need - from; // the rows the window lets go
      if (drop > 0) {
        for (const r of rows) r.splice(0, drop);
        los.splice(0, drop);
        from = need;
      }
    }
    S = K;
    return Math.max(1, need);
  }

  return {
    add(attn, P, T, r = T) {
      const K = P + T,
        lo = begin(K - r, K);
      entropy = new Float64Array(lh);
      for (let k = 0; k < lh; k++) {
        for (let t = 0; t < r; t++) {
          const q = K - r + t,
            o = (k * r + t) * K;
          if (t === r - 1) entropy[k] = entropyOf(attn.subarray(o, o + q + 1));
          if (q < from) continue;
          const row = new Float32Array(q === 0 ? 1 : q - lo + 2);
          row[0] = attn[o];
          if (q > 0) row.set(attn.subarray(o + lo, o + q + 1), 1);
          rows[k].push(row);
          if (k === 0) los.push(lo);
        }
      }
      return this;
    },
    addCut(cut, ent, P, T, r = T) {
      const K = P + T,
        lo = begin(K - r, K),
        n = windowPositions(K, W).length;
      entropy = Float64Array.from(ent);
      for (let k = 0; k < lh; k++) {
        for (let t = 0; t < r; t++) {
          const q = K - r + t;
          if (q < from) continue;
          const c = q === 0 ? 0 : q - lo + 1, // the query's place in the key list
            o = (k * r + t) * n;
          rows[k].push(cut.slice(o, o + c + 1));
          if (k === 0) los.push(lo);
        }
      }
      return this;
    },
    held: (K = S) => (from <= firstKept(K, W) ? S : 0),
    heads() {
      if (!S) return null;
      const positions = windowPositions(S, W),
        lo = Math.max(1, firstKept(S, W)),
        first = from === 0 ? 0 : 1; // 1: the window's row 0 is query 0's, which sees only key 0
      // (rows that came in one step are cut again on different steps: by their query)
      los.forEach((l0, i) => {
        if (lo - l0 >= SLACK + ((from + i) % SLACK) && from + i > 0) {
          for (const r of rows) r[i] = cutRow(r[i], lo - l0); // a new array: none is changed
          los[i] = lo;
        }
      });
      const query0 = Float32Array.of(1),
        kept = rows.map((r) => r.slice()), // the rows as they are now, for the reads below
        shift = los.map((l0, i) => (from + i === 0 ? 0 : lo - l0)); // row i's keys' offset
      // head k's row c of the window: its weights on positions[0 .. c]
      const rowOf = (k, c) => {
        if (c < first) return query0;
        const i = c - first;
        return shift[i] ? cutRow(kept[k][i], shift[i]) : kept[k][i];
      };
      const total = (l, h, pairs) => {
        const rs = kept[l * H + h];
        let s = 0;
        for (let r = 0; r < pairs.length; r++) {
          const c = pairs[r][0],
            j = pairs[r][1];
          if (c < first) s += j === 0 ? 1 : 0;
          else s += rs[c - first][j === 0 ? 0 : j + shift[c - first]];
        }
        return s;
      };
      const n = positions.length,
        cut = new Array(L * H);
      const pattern = (k) => {
        cut[k] ??= Array.from({ length: n }, (_, c) => rowOf(k, c));
        return cut[k];
      };
      const patterns = [...Array(L).keys()].map((l) => {
        const layer = new Array(H);
        for (let h = 0; h < H; h++) {
          Object.defineProperty(layer, h, { get: () => pattern(l * H + h), enumerable: true });
        }
        return layer;
      });
      const ent = [...Array(L).keys()].map((l) => Array.from(entropy.subarray(l * H, l * H + H)));
      return { positions, patterns, entropy: ent, total };
    },
  };
}
