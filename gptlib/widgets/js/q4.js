// SmolLM2's weights from the GGUF's own blocks (gptlib/export/q4.py writes them and the table):
// Q4_1 blocks of 32 numbers, 20 bytes each (d and m as float16, then 16 bytes whose low nibbles
// are numbers 0..15 and high nibbles 16..31), w = d q + m in float32; Q8_0 blocks, 34 bytes (d
// as float16, 32 int8 numbers), w = q d. Each float32 operation is rounded once, with
// Math.fround: d q is exact in a double (11 by 8 bits), so fround(d q) is float32's product, and
// fround(a + b) of two float32s is float32's sum (a double holds 53 >= 2 * 24 + 2 bits), so the
// numbers are PyTorch's bit for bit (tests/test_q4_js.py checks them against q4.unpack_external).

// A float16's bits (an int 0..65535) as a number.
export function halfToFloat(h) {
  const s = h & 0x8000 ? -1 : 1,
    e = (h >> 10) & 31,
    f = h & 1023;
  if (e === 0) return s * f * 2 ** -24;
  if (e === 31) return f ? Number.NaN : s * Number.POSITIVE_INFINITY;
  return s * (1024 + f) * 2 ** (e - 25);
}

const HALF = new Float64Array(65536);
for (let h = 0; h < 65536; h++) HALF[h] = halfToFloat(h);

const BLOCK_BYTES = { Q4_1: 20, Q8_0: 34 };

// One tensor of the table ({type, rows, cols, transpose, blocks_offset, blocks_bytes, offset,
// bytes}) unpacked from `blocks` (Uint8Array) into `out` (a Float32Array over the external-data
// file) at t.offset: the GGUF's (rows, cols), or (cols, rows) with t.transpose. A transposed
// tensor is unpacked 32 rows at a time (a tile of 32 x 32 numbers per block column) and written
// a row of the tile at a time, 32 numbers side by side: one number at a time, each a row of
// the output apart (196 KB for SmolLM2's W_E^T), took several times as long.
export function unpackTensor(blocks, t, out) {
  const per = BLOCK_BYTES[t.type];
  if (!per) throw new Error(`${t.name}: blocks of type ${t.type}; Q4_1 or Q8_0 expected`);
  const n = t.rows * t.cols;
  if (t.blocks_bytes !== (n / 32) * per || t.bytes !== n * 4 || t.cols % 32) {
    throw new Error(`${t.name}: the table's sizes do not agree with its shape`);
  }
  if (t.blocks_offset + t.blocks_bytes > blocks.length || (t.offset + t.bytes) / 4 > out.length) {
    throw new Error(`${t.name}: its bytes lie outside the files`);
  }
  const at = t.offset / 4,
    R = t.rows,
    C = t.cols,
    perRow = C / 32; // blocks in a row: a block never crosses a row, C is a multiple of 32
  const b8 = blocks.subarray(t.blocks_offset, t.blocks_offset + t.blocks_bytes);
  const f = Math.fround;
  const q4 = new Float32Array(16); // a Q4_1 block's 16 possible numbers, d q + m for q = 0..15
  // block b's 32 numbers into w[to .. to + 32)
  const block = (b, w, to) => {
    const o = b * per,
      d = HALF[b8[o] | (b8[o + 1] << 8)];
    if (per === 20) {
      const m = HALF[b8[o + 2] | (b8[o + 3] << 8)];
      for (let q = 0; q < 16; q++) q4[q] = f(f(d * q) + m);
      for (let j = 0; j < 16; j++) {
        const x = b8[o + 4 + j];
        w[to + j] = q4[x & 15];
        w[to + j + 16] = q4[x >> 4];
      }
    } else {
      for (let j = 0; j < 32; j++) w[to + j] = f(((b8[o + 2 + j] << 24) >> 24) * d);
    }
  };
  if (!t.transpose) {
    for (let b = 0; b < n / 32; b++) block(b, out, at + b * 32);
    return;
  }
  const tile = new Float32Array(32 * 32); // tile[i * 32 + j]: row r0 + i, column cb * 32 + j
  for (let r0 = 0; r0 < R; r0 += 32) {
    const h = Math.min(32, R - r0);
    for (let cb = 0; cb < perRow; cb++) {
      for (let i = 0; i < h; i++) block((r0 + i) * perRow + cb, tile, i * 32);
      for (let j = 0; j < 32; j++) {
        const to = at + (cb * 32 + j) * R + r0;
        for (let i = 0; i < h; i++) out[to + i] = tile[i * 32 + j];
      }
    }
  }
}

// The external-data file of the graph (manifest.weights: {bytes, tensors}) from the blocks, as
// a Float32Array; onTensor(k) after each tensor.
export function unpackWeights(blocks, weights, onTensor = () => {}) {
  const out = new Float32Array(weights.bytes / 4);
  weights.tensors.forEach((t, k) => {
    unpackTensor(blocks, t, out);
    onTensor(k);
  });
  return out;
}

// The external-data file as onnxruntime-web reads it, without ever holding it whole: a
// Uint8Array of weights.bytes whose subarray(begin, end) unpacks the tensor at `begin` when
// onnxruntime asks for it (onnxruntime-web copies each initializer's bytes of a mounted file
// into its own memory, one subarray at a time, at once: the view returned is a scratch buffer
// reused by the next call). A range that is not exactly one tensor is unpacked tensor by tensor.
// served() says whether every tensor was read (a caller checks it), ms() the time unpacking.
export function lazyWeights(blocks, weights) {
  const tensors = weights.tensors,
    at = new Map(tensors.map((t, k) => [t.offset, k]));
  const read = new Set();
  let ms = 0; // the time spent unpacking
  const most = Math.max(...tensors.map((t) => t.bytes));
  let scratch = new Float32Array(most / 4);
  const one = (k) => {
    const t = tensors[k],
      out = scratch.subarray(0, t.bytes / 4),
      t0 = performance.now();
    unpackTensor(blocks, { ...t, offset: 0 }, out);
    ms += performance.now() - t0;
    read.add(k);
    return new Uint8Array(out.buffer, 0, t.bytes);
  };
  class Unpacked extends Uint8Array {
    get byteLength() {
      return weights.bytes;
    }
    get length() {
      return weights.bytes;
    }
    subarray(begin = 0, end = weights.bytes) {
      const k = at.get(begin);
      if (k !== undefined && tensors[k].offset + tensors[k].bytes === end) return one(k);
      const out = new Uint8Array(end - begin);
      tensors.forEach((t, j) => {
        const lo = Math.max(begin, t.offset),
          hi = Math.min(end, t.offset + t.bytes);
        if (lo < hi) out.set(one(j).subarray(lo - t.offset, hi - t.offset), lo - begin);
      });
      return out;
    }
  }
  return {
    data: new Unpacked(0),
    served: () => read.size === tensors.length,
    ms: () => ms,
    // the scratch buffer (as large as the largest tensor, 113 MB for SmolLM2's W_E) given back
    // now (detached), not at the garbage collector's next full pass
    release: () => {
      scratch.buffer.transfer?.(0);
      scratch = new Float32Array(0);
    },
  };
}
