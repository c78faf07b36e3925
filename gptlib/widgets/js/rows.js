// The attention rows a page keeps for the heads panel: a window of the last W positions of the
// model's context (the panel's window, separate from the model's n_ctx), with the first key (where
// many heads put their spare weight) kept beside them. So a run of any length holds
// n_layers * n_heads * W * (W + 1) weights (see rowWindow; and, for each result of heads() still
// held, copies of the slots it reads that were written since: at most W of them), and the panel
// draws at most W rows.
//
// The window of a context of S positions is the key list `positions`: every position while
// S <= W, else [0, S - W + 1, ..., S - 1] (W of them). A head's pattern over it is lower-
// triangular: row c is the query positions[c]'s weights on the keys positions[0..c] (its weights
// on the keys left out, 1 .. S - W, are not kept: such a row sums to less than 1).

export const PANEL_WINDOW = 128;

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
//
// The rows live in one array, head by head, W slots of W + 1 weights a head: query q's row in
// slot q mod W, its weight on key 0 first, then its weight on key j >= 1 at 1 + (j mod W) (the
// keys of a row, key 0 and at most W - 1 more in a row, never share a place). A new row is
// written over the slot of the row W queries before it, which the window has let go: a step
// allocates nothing, and a window that slides copies nothing. What heads() returned reads the
// slots as they were: a slot it reads that a later step writes is first copied (once, for every
// result still read; a result keeps only the slots it reads).
export function rowWindow(L, H, W = PANEL_WINDOW) {
  const lh = L * H,
    span = W + 1, // a slot's weights
    perHead = W * span;
  let ring = null, // ring[k * perHead + (q mod W) * span + col]
    from = 0, // the first query kept
    S = 0, // the positions the rows are of
    entropy = null; // entropy[k]: the last row's
  const readers = new Set(); // WeakRefs to heads() results that read slots of the ring

  // Ready for new rows from query P0 on (of K positions): the rows before it that the window
  // keeps stay. Returns the window's first key after 0 (1 while it holds every position).
  function begin(P0, K) {
    const need = firstKept(K, W);
    if (P0 <= need || S === 0) {
      if (P0 > need) throw new Error(`rows of queries ${need} to ${P0 - 1} were never given`);
      from = need;
    } else {
      if (P0 > S || from > need) throw new Error(`rows of queries ${S} to ${P0 - 1} are missing`);
      from = Math.max(from, need); // the rows the window lets go
    }
    S = K;
    ring ??= new Float32Array(lh * perHead);
    return Math.max(1, need);
  }

  // Before query q's row is written over the row W queries before it: the earlier results of
  // heads() that read that slot (see heads) get a copy of it, one copy for all of them.
  function keep(q) {
    const slot = q % W;
    let copy = null;
    for (const ref of readers) {
      const st = ref.deref();
      if (!st) {
        readers.delete(ref); // nothing reads that result any more
        continue;
      }
      const c = st.first + ((slot - (st.q0 % W) + W) % W); // its row in that slot, if any
      if (c < st.n && st.src[c] === ring) {
        if (!copy) {
          copy = new Float32Array(lh * span);
          for (let k = 0; k < lh; k++) {
            const at = k * perHead + slot * span;
            copy.set(ring.subarray(at, at + span), k * span);
          }
        }
        st.src[c] = copy;
        st.at[c] = 0;
        st.stride[c] = span;
        if (--st.unread === 0) readers.delete(ref); // it reads nothing more from the ring
      }
    }
  }

  // Write head k's row of query q: w0 on key 0, then src[at .. at + q - lo] on keys lo .. q.
  function write(k, q, lo, w0, src, at) {
    const base = k * perHead + (q % W) * span;
    ring[base] = w0;
    let j = lo;
    while (j <= q) {
      const col = j % W,
        n = Math.min(q - j + 1, W - col); // up to the slot's end, then from its start
      ring.set(src.subarray(at + (j - lo), at + (j - lo) + n), base + 1 + col);
      j += n;
    }
  }

  return {
    add(attn, P, T, r = T) {
      const K = P + T,
        lo = begin(K - r, K);
      entropy = new Float64Array(lh);
      for (let t = 0; t < r; t++) {
        const q = K - r + t;
        if (q >= from) keep(q);
        for (let k = 0; k < lh; k++) {
          const o = (k * r + t) * K;
          if (t === r - 1) entropy[k] = entropyOf(attn.subarray(o, o + q + 1));
          if (q >= from) write(k, q, lo, attn[o], attn, o + lo);
        }
      }
      return this;
    },
    addCut(cut, ent, P, T, r = T) {
      const K = P + T,
        lo = begin(K - r, K),
        n = windowPositions(K, W).length;
      entropy = Float64Array.from(ent);
      for (let t = 0; t < r; t++) {
        const q = K - r + t;
        if (q < from) continue;
        keep(q);
        for (let k = 0; k < lh; k++) {
          const o = (k * r + t) * n;
          write(k, q, lo, cut[o], cut, o + 1);
        }
      }
      return this;
    },
    held: (K = S) => (from <= firstKept(K, W) ? S : 0),
    heads() {
      if (!S) return null;
      const positions = windowPositions(S, W),
        n = positions.length,
        f = from,
        first = f === 0 ? 0 : 1; // 1: the window's row 0 is query 0's, which sees only key 0
      // row c >= first is query positions[c] (positions[first] + c - first), kept in slot
      // positions[c] mod W: read from the ring until a later step writes that slot, then from a
      // copy (keep). `readers` holds the state weakly: it goes with the result's last reader.
      const st = {
        first,
        n,
        q0: positions[first] ?? 0,
        unread: n - first, // the rows still read from the ring
        src: new Array(n).fill(ring),
        at: positions.map((q) => (q % W) * span), // row c's place in its slot's array
        stride: new Array(n).fill(perHead), // and from one head to the next
      };
      if (st.unread > 0) readers.add(new WeakRef(st));
      const query0 = Float32Array.of(1),
        col = Int32Array.from(positions, (p, j) => (j === 0 ? 0 : 1 + (p % W))); // key j's place
      // head k's row c of the window: its weights on positions[0 .. c]
      const rowOf = (k, c) => {
        if (c < first) return query0;
        const a = st.src[c],
          base = k * st.stride[c] + st.at[c],
          row = new Float32Array(c + 1);
        row[0] = a[base];
        for (let j = 1; j <= c; j++) row[j] = a[base + col[j]];
        return row;
      };
      const total = (l, h, pairs) => {
        const k = l * H + h,
          { src, at, stride } = st;
        let s = 0;
        for (let r = 0; r < pairs.length; r++) {
          const c = pairs[r][0],
            j = pairs[r][1];
          if (c < first) s += j === 0 ? 1 : 0;
          else s += src[c][k * stride[c] + at[c] + col[j]];
        }
        return s;
      };
      const cut = new Array(lh);
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
