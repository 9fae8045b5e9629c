#!/usr/bin/env python3
"""Lane-level emulation of CSKA's convolutional-logits kernels (cuda/kernels/conv_logits.cu).

Checks their index arithmetic without a GPU: the forward kernel, grad_q and grad_w (with the
partial sums' kernel) are mirrored line by line, with the same names where the code allows. A
warp's registers are numpy arrays over its 32 lanes and mma is computed from the PTX ISA's
m16n8k16 fragment layouts (cuda/kernels/mma.cuh), and ldmatrix from each lane's row address (the
kernels' default fragment loads) as the ISA defines it; every case runs twice on the same
operands, with ldmatrix and with the 32- and 16-bit loads (train.attention_loads: sync), which
must give the same values to the bit; `stage`, `neighbours` and `load_a_rows` keep
their row and column validity logic; the `active` flags, the `tiles` / `steps` bounds, the grid
sizes, args_of and conv_logits_chunks (backend/conv_logits_geometry.h) are the host's. Memory is
emulated as flat float64 arrays whose reads check their bounds: shared tiles start as NaN (a read
of a column or row the kernel never staged shows up in the result), q is the first half of a
[B, H*W, 2 h d] projection split into heads whose second half is NaN, the gradient of the
logits comes in several layouts (contiguous, rows padded with NaN, rows of 16 bytes a multiple
below a class row as CSKA-ViT's mixer makes them, heads interleaved), and the
outputs (logits, grad_q, grad_w's partials, grad_w) start as NaN and must be written exactly
once an element (grad_q, in every other case, into the first heads' columns of a projection's
gradient; the logits in turn on their own, below a class row (dense, or with rows padded to 16
bytes as CSKA-ViT's mixer makes them) and in the first columns of wider rows; the other elements
of those buffers, the padding included, must stay unwritten). Values stay float64 (no bf16 rounding), so every output must match a dense
float64 reference to ~1e-12. Not emulated: the barriers and the timing of the asynchronous
copies (a block stages a tile, then its warps run one after the other).

Run: /usr/bin/python3 scripts/conv_logits_emulate.py (Debian's python3-numpy). Prints a line a
case and exits non-zero on any mismatch. The [cuda] tests in tests/cuda/test_conv_logits.cpp
remain the real check on a GPU; keep this in step with the kernels when they change.
"""
import sys
import time
from types import SimpleNamespace

import numpy as np

L = np.arange(32); G = L >> 2; T = L & 3   # lane, g = lane >> 2, t = lane & 3

kRows = 16; kWarps = 4; kTile = kRows * kWarps; kKeys = 80; kKeyTiles = kKeys // 8
kKeyWarps = kKeys // kRows   # grad_w's warps: 16 keys each
kVec = 8   # 16 / sizeof(T) for bf16 / f16


class Mismatch(Exception):
    pass


# --- Memory: flat float64 arrays; reads and writes check their bounds ---

class Mem:
    def __init__(self, name, v, count=False):
        self.name = name; self.v = v
        self.writes = np.zeros(v.size, np.int64) if count else None

    def _check(self, i, what):
        if i.size and (i.min() < 0 or i.max() >= self.v.size):
            raise Mismatch("%s: %s at [%d, %d] outside [0, %d)" %
                           (self.name, what, i.min(), i.max(), self.v.size))

    def read(self, i):
        i = np.asarray(i, np.int64); self._check(i, "read")
        return self.v[i]

    def write(self, i, x):
        i = np.asarray(i, np.int64); self._check(i, "write")
        if self.writes is not None: np.add.at(self.writes, i, 1)
        self.v[i] = x


def ld16(cols): return cols + 8


class Carver:   # attention_tc.cuh: 128-byte aligned pieces of dynamic shared memory
    def __init__(self): self.bytes = 0

    def take(self, n):
        at = (self.bytes + 127) & ~127
        self.bytes = at + n
        return at


def shared(carve, n_bytes, name):
    return shared_at(carve.take(n_bytes), n_bytes, name)


def shared_at(at, n_bytes, name):   # a tile at byte offset `at` of a carved piece
    assert at % 16 == 0
    return Mem(name, np.full(n_bytes // 2, np.nan))   # 2-byte elements, never staged: NaN


# --- Fragments (mma.cuh): a register holding a pair is a [32, 2] array (low, high) ---

def _layouts():
    reg = np.arange(4)[:, None, None]; g = G[None, :, None]; t = T[None, :, None]
    h = np.arange(2)[None, None, :]
    ia = ((g + 8 * (reg & 1)) * 16 + 2 * t + 8 * (reg >> 1) + h).ravel()   # A 16 x 16
    ib = ((2 * t + h + 8 * reg[:2]) * 8 + g).ravel()                          # B 16 x 8
    ic = ((G[None] + 8 * (np.arange(4)[:, None] >> 1)) * 8 + 2 * T[None] +
          (np.arange(4)[:, None] & 1))                                        # C 16 x 8
    for idx, n in ((ia, 256), (ib, 128), (ic.ravel(), 128)):
        assert sorted(idx.tolist()) == list(range(n))   # every element once
    return ia, ib, ic
IA, IB, IC = _layouts()


def mma(c, a, b0, b1):   # c [4, 32] += A B on one m16n8k16 tile
    A = np.empty(256); A[IA] = np.stack(a).ravel()
    B = np.empty(128); B[IB] = np.stack([b0, b1]).ravel()
    return c + (A.reshape(16, 16) @ B.reshape(16, 8)).ravel()[IC]


def load_pair(m, p):   # p[0] low, p[1] high; 4-byte aligned
    p = np.asarray(p, np.int64)
    if (p % 2).any(): raise Mismatch("%s: load_pair at an odd element" % m.name)
    return np.stack([m.read(p), m.read(p + 1)], -1)


def load_pair2(m, lo, hi): return np.stack([m.read(lo), m.read(hi)], -1)


def load_pair_if(m, p, ok):   # ok ? load_pair(p) : 0u, lane by lane
    out = np.zeros((32, 2)); out[ok] = load_pair(m, p[ok]); return out


def load_b_rows(m, base, ld):   # b(k, n) = m[n][k]
    p = base + G * ld + 2 * T
    return load_pair(m, p), load_pair(m, p + 8)


def load_b_cols(m, base, ld):   # b(k, n) = m[k][n]
    p = base + 2 * T * ld + G
    return load_pair2(m, p, p + ld), load_pair2(m, p + 8 * ld, p + 9 * ld)


def load_a_trans(m, base, ld):   # a(r, c) = m[c][r]
    p = base + 2 * T * ld + G
    return [load_pair2(m, p, p + ld), load_pair2(m, p + 8, p + ld + 8),
            load_pair2(m, p + 8 * ld, p + 9 * ld), load_pair2(m, p + 8 * ld + 8, p + 9 * ld + 8)]


# ldmatrix.m8n8.b16 as the PTX ISA defines it: lanes 8j to 8j + 7 give the addresses of rows 0-7
# of matrix j (8 elements, 16 bytes, 16-byte aligned: the tiles start 128 bytes apart); register
# j of thread i holds row i // 4, columns 2 (i % 4) and + 1 of matrix j (with .trans, column
# i // 4, rows 2 (i % 4) and + 1).
def ldmatrix(m, addr, count, trans, row_of=None):
    """row_of(lane) -> (memory, address): the row lane l names when it is not addr[l] in m (the
    zero row of another tile: the kernels' shared memory is one space)."""
    rows = [row_of(l) if row_of else (m, int(addr[l])) for l in range(8 * count)]
    if any(at % 8 for _, at in rows): raise Mismatch("%s: ldmatrix row off 16 bytes" % m.name)
    regs = []
    for j in range(count):
        mat = np.stack([mem.read(at + np.arange(8)) for mem, at in rows[8 * j:8 * j + 8]])   # [row, col]
        if trans: regs.append(np.stack([mat[2 * T, G], mat[2 * T + 1, G]], 1))
        else: regs.append(np.stack([mat[G, 2 * T], mat[G, 2 * T + 1]], 1))
    return regs


def ldmatrix_x4(m, row, row_of=None): return ldmatrix(m, row, 4, False, row_of)   # each lane names a row
def load_b_rows_ldsm(m, base, ld):   # lanes 0-7 rows 0-7 at column 0, 8-15 at column 8
    return tuple(ldmatrix(m, base + (L & 7) * ld + ((L >> 3) & 1) * 8, 2, False))
def load_b_cols_ldsm(m, base, ld):   # lanes 0-15 rows 0-15, transposed
    return tuple(ldmatrix(m, base + (L & 15) * ld, 2, True))
def load_a_trans_ldsm(m, base, ld):
    return ldmatrix(m, base + ((L & 7) + ((L >> 4) & 1) * 8) * ld + ((L >> 3) & 1) * 8, 4, True)


# --- conv_logits.cu's device helpers ---

def stage(tile, ld, rows, col0, cols, valid, row_of):
    """row_of(r) -> (memory, pointers to the rows' column 0, nonnull); every e of the block's loop."""
    assert cols % kVec == 0
    per_row = cols // kVec
    e = np.arange(rows * per_row)
    r = e // per_row; c = e % per_row * kVec; col = col0 + c
    to = r * ld + c
    src, frm, nonnull = row_of(r)
    for x in range(kVec):   # the 16-byte copy and the element loop store the same values
        take = nonnull & (col + x < valid)
        val = np.zeros(e.size)
        if take.any(): val[take] = src.read(frm[take] + col[take] + x)
        tile.write(to + x, val)


def load_a_rows(m, src, ok, col):
    return [load_pair_if(m, src[0] + col, ok[0]), load_pair_if(m, src[1] + col, ok[1]),
            load_pair_if(m, src[0] + col + 8, ok[0]), load_pair_if(m, src[1] + col + 8, ok[1])]


def neighbour_row(p, p0, dy, dx, a):   # the staged row of p's neighbour, or -1
    x = p % a.width + dx; s = p + dy * a.width + dx
    ok = (p < a.positions) & (x >= 0) & (x < a.width) & (s >= 0) & (s < a.positions)
    return np.where(ok, s - p0 + a.halo, -1)


def neighbours(ld, pos, p0, dy, dx, a, t):   # src[r]: an offset into the tile
    src = [None, None]; ok = [None, None]
    for r in range(2):
        row = neighbour_row(pos[r], p0, dy, dx, a)
        ok[r] = row >= 0
        src[r] = np.maximum(row, 0) * ld + 2 * t
    return src, ok


def lane_neighbour(ld, first, p0, dy, dx, a):   # lane l's row for ldmatrix_x4, or -1
    row = neighbour_row(first + L % 16, p0, dy, dx, a)
    return np.where(row >= 0, row * ld + L // 16 * 8, -1)


def load_a_neighbours(m, ldsm, mine, src, ok, zero_mem, zeros, col):
    if ldsm:   # the lanes off the grid name the zero row (in the first tile)
        return ldmatrix_x4(m, None, lambda l: (m, mine[l] + col) if mine[l] >= 0 else (zero_mem, zeros))
    return load_a_rows(m, src, ok, col)


def multiply_down(acc, fa, m, base, ldb, cols, kOut, ldsm):   # acc[n] += a b, B down the rows
    for n in range(kOut):
        if n * 8 >= cols: break
        b0, b1 = (load_b_cols_ldsm if ldsm else load_b_cols)(m, base + n * 8, ldb)
        acc[n] = mma(acc[n], fa, b0, b1)


# --- Forward: a block per (kPer tiles of 64 positions, 80 keys) and head ---

def conv_logits_forward_kernel(kPer, a, grid, smem_bytes):
    for by in range(grid[1]):
        for bx in range(grid[0]):
            forward_block(kPer, a, bx, by, smem_bytes)


def block_tiles(kPer, a, unit0):
    """The block's tiles u: image, first position, its warps' rows, and whether each is staged
    (a unit of the batch) and each warp active."""
    tiles = []
    for u in range(kPer):
        unit = unit0 + u
        b = unit // a.tiles
        p0 = (unit - b * a.tiles) * kTile
        pos = [[p0 + warp * kRows + G, p0 + warp * kRows + G + 8] for warp in range(kWarps)]
        staged = unit < a.units
        active = [staged and p0 + warp * kRows < a.positions for warp in range(kWarps)]
        tiles.append(SimpleNamespace(b=b, p0=p0, pos=pos, staged=staged, active=active))
    return tiles


def forward_block(kPer, a, bx, by, smem_bytes):
    chunk = bx % a.key_chunks; unit0 = bx // a.key_chunks * kPer
    h = by; key0 = chunk * kKeys
    ld = ld16(a.d); span = kTile + 2 * a.halo
    carve = Carver()
    q_s = [shared(carve, span * ld * 2, "q_s[%d]" % u) for u in range(kPer)]
    w_s = [shared(carve, a.group * kKeys * ld * 2, "w_s[%d]" % i) for i in range(2)]   # two buffers
    assert carve.bytes == smem_bytes
    zeros = a.d   # ldmatrix's zero row: q_s[0]'s row 0 padding, which no stage writes
    if a.ldsm: q_s[0].write(zeros + np.arange(8), np.zeros(8))

    tl = block_tiles(kPer, a, unit0)
    for u, x in enumerate(tl):
        if not x.staged: continue
        qg = a.q + x.b * a.qb + h * a.qh
        def q_row(r, x=x, qg=qg):
            s = x.p0 - a.halo + r
            ok = (s >= 0) & (s < a.positions)
            return a.q_mem, qg + s * a.qp, ok
        stage(q_s[u], ld, span, 0, a.d, a.d, q_row)
    tiles = (min(kKeys, a.keys - key0) + 7) // 8
    wh = a.w + h * a.taps * a.keys * a.d

    acc = [[np.zeros((kKeyTiles, 4, 32)) for _ in range(kWarps)] for _ in range(kPer)]
    stage_filters(w_s[0], ld, wh, 0, min(a.group, a.taps), key0, a)
    buf = 0
    for tap0 in range(0, a.taps, a.group):
        group = min(a.group, a.taps - tap0)
        nxt = tap0 + a.group   # the next group's filters, in flight while this one runs
        if nxt < a.taps: stage_filters(w_s[buf ^ 1], ld, wh, nxt, min(a.group, a.taps - nxt), key0, a)
        for warp in range(kWarps):
            if not any(x.active[warp] for x in tl): continue
            for tap in range(tap0, tap0 + group):
                wt_s = (tap - tap0) * kKeys * ld   # this tap's filters, [80 keys][d]
                dy = tap // a.k - a.radius; dx = tap % a.k - a.radius
                nb = [neighbours(ld, x.pos[warp], x.p0, dy, dx, a, T) for x in tl]
                mine = [lane_neighbour(ld, x.p0 + warp * kRows, x.p0, dy, dx, a) for x in tl]
                for ks in range(a.d // 16):
                    fa = [load_a_neighbours(q_s[u], a.ldsm, mine[u], nb[u][0], nb[u][1], q_s[0],
                                            zeros, ks * 16) if x.active[warp] else None
                          for u, x in enumerate(tl)]
                    for n in range(kKeyTiles):
                        if n >= tiles: break
                        b0, b1 = (load_b_rows_ldsm if a.ldsm else load_b_rows)(
                            w_s[buf], wt_s + n * 8 * ld + ks * 16, ld)
                        for u, x in enumerate(tl):
                            if x.active[warp]: acc[u][warp][n] = mma(acc[u][warp][n], fa[u], b0, b1)
        buf ^= 1
    for u, x in enumerate(tl):
        for warp in range(kWarps):
            if not x.active[warp]: continue
            out = a.out + x.b * a.ob + h * a.oh
            for r in range(2):
                live = x.pos[warp][r] < a.positions   # continue, lane by lane
                row = out + x.pos[warp][r] * a.op
                for n in range(kKeyTiles):
                    if n >= tiles: break
                    j = key0 + n * 8 + 2 * T
                    v = []
                    for e in range(2):
                        on = live & (j + e < a.keys)
                        bias = np.zeros(32)
                        if a.bias is not None: bias[on] = a.bias_mem.read(h * a.keys + j[on] + e)
                        v.append(acc[u][warp][n][2 * r + e] + bias)
                    pair = live & a.pairs & (j + 1 < a.keys)
                    if pair.any():   # one aligned 32-bit store of both
                        if ((row[pair] + j[pair]) % 2).any(): raise Mismatch("logits: an unaligned pair store")
                        a.out_mem.write(row[pair] + j[pair], v[0][pair])
                        a.out_mem.write(row[pair] + j[pair] + 1, v[1][pair])
                    for e in range(2):
                        w = live & ~pair & (j + e < a.keys)
                        a.out_mem.write(row[w] + j[w] + e, v[e][w])


# --- grad_q: a block per kPer tiles of 64 positions (as the forward's) and head, walking the keys
# 80 at a time ---

def conv_logits_grad_q_kernel(kD, kPer, a, grid, smem_bytes):
    for by in range(grid[1]):
        for bx in range(grid[0]):
            grad_q_block(kD, kPer, a, bx, by, smem_bytes)


def grad_q_block(kD, kPer, a, bx, by, smem_bytes):
    kOut = kD // 8
    unit0 = bx * kPer
    h = by
    ldg = ld16(kKeys); ldw = ld16(a.d); span = kTile + 2 * a.halo
    carve = Carver()
    g_s = [shared(carve, span * ldg * 2, "g_s[%d]" % u) for u in range(kPer)]
    w_s = [shared(carve, a.group * kKeys * ldw * 2, "w_s[%d]" % i) for i in range(2)]   # two buffers
    assert carve.bytes == smem_bytes
    zeros = kKeys   # g_s[0]'s row 0 padding, as the forward kernel's
    if a.ldsm: g_s[0].write(zeros + np.arange(8), np.zeros(8))

    wh = a.w + h * a.taps * a.keys * a.d
    tl = block_tiles(kPer, a, unit0)

    acc = [[np.zeros((kOut, 4, 32)) for _ in range(kWarps)] for _ in range(kPer)]
    def stage_gradient(key0):
        for u, x in enumerate(tl):
            if not x.staged: continue
            gg = a.g + x.b * a.gb + h * a.gh
            def g_row(r, x=x, gg=gg):
                s = x.p0 - a.halo + r
                ok = (s >= 0) & (s < a.positions)
                return a.g_mem, gg + s * a.gp, ok
            stage(g_s[u], ldg, span, key0, kKeys, a.keys, g_row)
    # The steps: each chunk of 80 keys, and within it each group of taps; a step's filters in one
    # of two buffers in turn, the next step's staged while this one runs.
    groups = (a.taps + a.group - 1) // a.group; last_step = a.key_chunks * groups - 1
    def stage_step_filters(step):
        tap0 = step % groups * a.group
        stage_filters(w_s[step % 2], ldw, wh, tap0, min(a.group, a.taps - tap0), step // groups * kKeys, a)
    stage_gradient(0)
    stage_step_filters(0)
    for step in range(last_step + 1):
        key0 = step // groups * kKeys; tap0 = step % groups * a.group
        group = min(a.group, a.taps - tap0)
        if step > 0 and tap0 == 0: stage_gradient(key0)   # a new chunk of keys
        if step < last_step: stage_step_filters(step + 1)
        steps = (min(kKeys, a.keys - key0) + 15) // 16
        for warp in range(kWarps):
            if not any(x.active[warp] for x in tl): continue
            for tap in range(tap0, tap0 + group):
                wt_s = (tap - tap0) * kKeys * ldw   # this tap's filters, [80 keys][d]
                # The forward pair (s - off, tap) reached s: the neighbour at -(dy, dx).
                dy = a.radius - tap // a.k; dx = a.radius - tap % a.k
                nb = [neighbours(ldg, x.pos[warp], x.p0, dy, dx, a, T) for x in tl]
                mine = [lane_neighbour(ldg, x.p0 + warp * kRows, x.p0, dy, dx, a) for x in tl]
                for ks in range(steps):
                    fa = [load_a_neighbours(g_s[u], a.ldsm, mine[u], nb[u][0], nb[u][1], g_s[0],
                                            zeros, ks * 16) if x.active[warp] else None
                          for u, x in enumerate(tl)]
                    wk = wt_s + ks * 16 * ldw   # b(j, c) = w[j][c], down the filters' rows
                    for n in range(kOut):
                        if n * 8 >= a.d: break
                        b0, b1 = (load_b_cols_ldsm if a.ldsm else load_b_cols)(w_s[step % 2], wk + n * 8, ldw)
                        for u, x in enumerate(tl):
                            if x.active[warp]: acc[u][warp][n] = mma(acc[u][warp][n], fa[u], b0, b1)
    for u, x in enumerate(tl):
        for warp in range(kWarps):
            if not x.active[warp]: continue
            out = a.out + x.b * a.ob + h * a.oh
            for r in range(2):
                live = x.pos[warp][r] < a.positions
                for n in range(kOut):
                    if n * 8 >= a.d: break
                    at = out + x.pos[warp][r][live] * a.op + n * 8 + 2 * T[live]   # one 32-bit store
                    if (at % 2).any(): raise Mismatch("grad_q: an unaligned pair store")
                    for e in range(2):
                        a.out_mem.write(at + e, acc[u][warp][n][2 * r + e][live])


# --- grad_w: a block per (tap and row chunk, 80 keys, head), partial sums over its rows ---

def grad_w_step_rows(across): return kTile if across == 1 else 32   # the kernel's kStep


def conv_logits_grad_w_kernel(kD, kAcross, a, grid, smem_bytes):
    for bz in range(grid[2]):
        for by in range(grid[1]):
            for bx in range(grid[0]):
                grad_w_block(kD, kAcross, a, bx, by, bz, smem_bytes)


def grad_w_block(kD, kAcross, a, bx, by, bz, smem_bytes):
    # kAcross taps a block: 1 (a block per tap) or k (a block per filter row, train.conv_logits_grad_w:
    # per_row), kStep rows a step
    kOut = kD // 8; kStep = grad_w_step_rows(kAcross)
    per_chunk = a.taps // kAcross
    tap0 = bx % per_chunk * kAcross; chunk = bx // per_chunk; key0 = by * kKeys
    h = bz
    ldg = ld16(kKeys); ldq = ld16(a.d)
    carve = Carver()   # two buffers each: the rows of a step are staged while the last's are read
    g_s = [shared(carve, kStep * ldg * 2, "g_s[%d]" % i) for i in range(2)]
    # The queries' tiles, buffer 0's kAcross taps then buffer 1's, carved as one piece: each
    # kStep * ldq * 2 bytes, a multiple of 128.
    assert kStep * ldq * 2 % 128 == 0
    q_all = carve.take(2 * kAcross * kStep * ldq * 2)
    q_s = [[shared_at(q_all + (buf * kAcross + u) * kStep * ldq * 2, kStep * ldq * 2,
                      "q_s[%d][%d]" % (buf, u)) for u in range(kAcross)] for buf in range(2)]
    assert carve.bytes == smem_bytes

    first = chunk * a.chunk_rows
    last = first + a.chunk_rows if first + a.chunk_rows < a.rows else a.rows
    wkey = [warp * kRows for warp in range(kKeyWarps)]   # the warp's first key in the chunk
    active = [key0 + wkey[warp] < a.keys for warp in range(kKeyWarps)]
    # The centre tap's blocks also sum the columns (the bias gradient): one more mma a step with
    # a B of ones.
    bias_sums = a.bias_partial is not None and tap0 <= a.taps // 2 < tap0 + kAcross
    bias_acc = [np.zeros((4, 32)) for _ in range(kKeyWarps)]
    ones = np.ones((32, 2))

    acc = [[np.zeros((kOut, 4, 32)) for _ in range(kAcross)] for _ in range(kKeyWarps)]
    def stage_rows(buf, m0):   # rows [m0, m0 + kStep) of g and the shifted q into buffer buf
        # Row m of the batch is position m % P of image m / P.
        def g_row(r):
            m = m0 + r
            ok = ~(m >= last)
            b = m // a.positions
            p = m - b * a.positions
            return a.g_mem, a.g + b * a.gb + h * a.gh + p * a.gp, ok
        stage(g_s[buf], ldg, kStep, key0, kKeys, a.keys, g_row)
        for u in range(kAcross):
            tap = tap0 + u; dy = tap // a.k - a.radius; dx = tap % a.k - a.radius
            def q_row(r):
                m = m0 + r
                ok = ~(m >= last)
                b = m // a.positions
                p = m - b * a.positions
                x = p % a.width + dx; s = p + dy * a.width + dx
                ok &= ~((x < 0) | (x >= a.width) | (s < 0) | (s >= a.positions))
                return a.q_mem, a.q + b * a.qb + h * a.qh + s * a.qp, ok
            stage(q_s[buf][u], ldq, kStep, 0, a.d, a.d, q_row)
    if first < last: stage_rows(0, first)
    buf = 0
    for m0 in range(first, last, kStep):
        if m0 + kStep < last: stage_rows(buf ^ 1, m0 + kStep)   # in flight while this step runs
        for warp in range(kKeyWarps):
            if not active[warp]: continue
            steps = ((last - m0 if last - m0 < kStep else kStep) + 15) // 16
            for ks in range(steps):
                # A(j, m) = g_s[m][j]: the contraction runs down the staged rows.
                block = ks * 16 * ldg + wkey[warp]
                fa = (load_a_trans_ldsm if a.ldsm else load_a_trans)(g_s[buf], block, ldg)
                if bias_sums: bias_acc[warp] = mma(bias_acc[warp], fa, ones, ones)
                if a.partial is None: continue   # the bias gradient alone
                for u in range(kAcross):
                    multiply_down(acc[warp][u], fa, q_s[buf][u], ks * 16 * ldq, ldq, a.d, kOut, a.ldsm)
        buf ^= 1
    for warp in range(kKeyWarps):
        if not active[warp]: continue   # return
        if bias_sums:   # t == 0: column 0 of the sums, keys g and g + 8
            for r in range(2):
                j = key0 + wkey[warp] + G + 8 * r
                on = (T == 0) & (j < a.keys)
                a.bias_partial_mem.write(a.bias_partial + (h * a.chunks + chunk) * a.keys + j[on],
                                         bias_acc[warp][2 * r][on])
        if a.partial is None: continue   # return
        for u in range(kAcross):
            slice_ = h * a.taps + tap0 + u
            out = a.partial + (slice_ * a.chunks + chunk) * a.keys * a.d
            for r in range(2):
                j = key0 + wkey[warp] + G + 8 * r
                live = j < a.keys
                for n in range(kOut):
                    if n * 8 >= a.d: break
                    at = out + j[live] * a.d + n * 8 + 2 * T[live]   # one 64-bit store
                    if (at % 2).any(): raise Mismatch("grad_w: an unaligned pair store")
                    for e in range(2):
                        a.partial_mem.write(at + e, acc[warp][u][n][2 * r + e][live])


def conv_logits_sum_partials_kernel(partial, chunks, per, n, gw):
    i = np.arange(n)   # every i of the grid-stride loop
    s = i // per; e = i - s * per
    p = s * chunks * per + e
    total = np.zeros(n)
    for c in range(chunks): total = total + partial.read(p + c * per)
    gw.write(i, total)


# --- Host side ---

def conv_logits_tap_group(d, k):   # one of the two filter buffers: 18 KiB
    per_tap = kKeys * 2 * (d + 8)
    return min(max(18 * 1024 // per_tap, 1), max(k * k, 1))


def stage_filters(w_s, ld, wh, tap0, group, key0, a):   # taps [tap0, tap0 + group), 80 keys
    def w_row(r):
        tap = tap0 + r // kKeys; j = key0 + r % kKeys
        ok = j < a.keys
        return a.w_mem, wh + (tap * a.keys + j) * a.d, ok
    stage(w_s, ld, group * kKeys, 0, a.d, a.d, w_row)


def conv_logits_direct_fits(d, width, k):
    if d < 16 or d > 128 or d % 16 != 0 or k < 1 or k % 2 == 0: return False
    span = 64 + 2 * ((k // 2) * width + k // 2); padded = 2 * (d + 8)
    group = conv_logits_tap_group(d, k) * kKeys * padded
    filters = 2 * ((group + 127) // 128 * 128)   # two buffers, each 128-byte aligned
    forward = span * padded + 128 + filters
    grad_q = span * 2 * (kKeys + 8) + 128 + filters
    return max(forward, grad_q) <= 96 * 1024


def conv_logits_chunks(geo):
    rows = geo.batch * geo.height * geo.width
    per_chunk = max(geo.heads * geo.kernel * geo.kernel * geo.keys * geo.d, 1)
    chunks = min((rows + 511) // 512, (8 << 20) // per_chunk)
    chunks = min(max(chunks, 1), 256)
    chunk_rows = max(((rows + chunks - 1) // chunks + 63) // 64 * 64, 64)
    return max((rows + chunk_rows - 1) // chunk_rows, 1), chunk_rows


def tiles_smem(per, tile_bytes, filter_bytes):   # a forward or grad_q block's shared memory
    carve = Carver()
    for _ in range(per): carve.take(tile_bytes)
    for _ in range(2): carve.take(filter_bytes)
    return carve.bytes


PER_BLOCK = {}   # the last launches' tiles a block, by kernel (printed with each case)
GRAD_W_ACROSS = [1]   # the last grad_w launch's taps a block


def per_block(kernel, pairs, tile_bytes, filter_bytes):   # dispatch_per_block: the kernels' kPer
    PER_BLOCK[kernel] = 2 if pairs and tiles_smem(2, tile_bytes, filter_bytes) <= 64 * 1024 else 1
    return PER_BLOCK[kernel]


def args_of(geo, q, w):
    a = SimpleNamespace(bias=None, bias_mem=None, g=None, g_mem=None, out=None, out_mem=None,
                        partial=None, partial_mem=None, chunks=0, chunk_rows=0)
    a.q_mem, a.q, (a.qb, a.qh, a.qp) = q.mem, q.offset, q.strides[:3]
    a.w_mem, a.w = w.mem, w.offset
    a.heads = geo.heads; a.height = geo.height; a.width = geo.width
    a.positions = geo.height * geo.width
    a.keys = geo.keys; a.d = geo.d; a.k = geo.kernel
    a.taps = a.k * a.k
    a.radius = a.k // 2
    a.halo = a.radius * a.width + a.radius
    a.group = conv_logits_tap_group(geo.d, geo.kernel)
    a.tiles = (a.positions + kTile - 1) // kTile
    a.units = geo.batch * a.tiles
    a.key_chunks = (a.keys + kKeys - 1) // kKeys
    a.rows = geo.batch * a.positions
    a.ldsm = geo.ldsm   # dispatch_loads: fragments by ldmatrix (attention_loads: async) or not
    return a


def conv_logits_even_layout(t):   # backend/conv_logits_geometry.h
    return t.offset % 2 == 0 and all(n <= 1 or st % 2 == 0
                                      for n, st in zip(t.shape[:-1], t.strides[:-1]))


def dispatch_head_dim(d): return 32 if d <= 32 else 64 if d <= 64 else 128


def conv_logits_forward(geo, q, w, bias, logits):
    if geo.batch == 0 or geo.heads == 0 or geo.keys == 0: return
    assert conv_logits_direct_fits(geo.d, geo.width, geo.kernel)
    a = args_of(geo, q, w)
    if bias is not None: a.bias_mem, a.bias = bias.mem, bias.offset
    a.out_mem, a.out = logits.mem, logits.offset
    a.ob, a.oh, a.op = logits.strides[:3]
    a.pairs = conv_logits_even_layout(logits)
    tile_bytes = (kTile + 2 * a.halo) * ld16(a.d) * 2
    filter_bytes = a.group * kKeys * ld16(a.d) * 2
    kPer = per_block("forward", True, tile_bytes, filter_bytes)
    grid = ((a.units + kPer - 1) // kPer * a.key_chunks, geo.heads)
    conv_logits_forward_kernel(kPer, a, grid, tiles_smem(kPer, tile_bytes, filter_bytes))


def conv_logits_backward(geo, grad, q, w, grad_q, grad_w, grad_bias):
    assert geo.batch and geo.heads and geo.keys and geo.d
    assert conv_logits_direct_fits(geo.d, geo.width, geo.kernel)
    a = args_of(geo, q, w)
    a.g_mem, a.g, (a.gb, a.gh, a.gp) = grad.mem, grad.offset, grad.strides[:3]
    kD = dispatch_head_dim(geo.d)
    if grad_q is not None:
        qa = SimpleNamespace(**vars(a))
        qa.out_mem, qa.out = grad_q.mem, grad_q.offset
        qa.ob, qa.oh, qa.op = grad_q.strides[:3]
        tile_bytes = (kTile + 2 * a.halo) * ld16(kKeys) * 2
        filter_bytes = a.group * kKeys * ld16(a.d) * 2
        kPer = per_block("grad_q", kD <= 64, tile_bytes, filter_bytes)
        grid = ((a.units + kPer - 1) // kPer, geo.heads)
        conv_logits_grad_q_kernel(kD, kPer, qa, grid, tiles_smem(kPer, tile_bytes, filter_bytes))
    if grad_w is not None or grad_bias is not None:
        wa = SimpleNamespace(**vars(a))
        wa.chunks, wa.chunk_rows = conv_logits_chunks(geo)
        per = geo.keys * geo.d; slices = geo.heads * a.taps
        wa.partial_mem = Mem("partial", np.full(slices * wa.chunks * per, np.nan), count=True)
        wa.partial = 0 if grad_w is not None else None
        wa.bias_partial_mem = Mem("bias_partial", np.full(geo.heads * wa.chunks * geo.keys, np.nan),
                                  count=True)
        wa.bias_partial = 0 if grad_bias is not None else None
        # dispatch_grad_w_across: a block per filter row with 3x3 filters at head dims up to 64
        kAcross = 3 if geo.grad_w_rows and geo.kernel == 3 and kD <= 64 else 1
        kStep = grad_w_step_rows(kAcross)
        carve = Carver()   # the kernel's two buffers of the gradient's rows, then the queries'
        for _ in range(2): carve.take(kStep * ld16(kKeys) * 2)
        carve.take(2 * kAcross * kStep * ld16(a.d) * 2)
        grid = (wa.chunks * (a.taps // kAcross), a.key_chunks, geo.heads)
        GRAD_W_ACROSS[0] = kAcross
        conv_logits_grad_w_kernel(kD, kAcross, wa, grid, carve.bytes)
        if grad_w is not None:
            conv_logits_sum_partials_kernel(wa.partial_mem, wa.chunks, per, slices * per, grad_w.mem)
        if grad_bias is not None:
            conv_logits_sum_partials_kernel(wa.bias_partial_mem, wa.chunks, geo.keys,
                                            geo.heads * geo.keys, grad_bias.mem)
        return wa.partial_mem, wa.bias_partial_mem
    return None, None


# --- Operands, the dense reference and the cases ---

class View:   # a strided tensor in a Mem: element [i0, i1, i2, i3] at offset + sum(i * stride)
    def __init__(self, mem, offset, shape, strides):
        self.mem, self.offset, self.shape, self.strides = mem, offset, shape, strides

    def dense(self):
        idx = self.offset + sum(np.arange(n).reshape([-1 if i == k else 1 for i in range(len(self.shape))]) * s
                                for k, (n, s) in enumerate(zip(self.shape, self.strides)))
        return self.mem.v[idx]


def output(name, shape):
    return View(Mem(name, np.full(int(np.prod(shape)), np.nan), count=True), 0, shape,
                tuple(int(np.prod(shape[i + 1:])) for i in range(len(shape))))


def output_logits(name, B, h, P, K, layout):
    """The logits [B, h, P, K] in `layout`: a tensor of their own, the rows below a class row of a
    [B, h, 1 + P, K] tensor, the same with rows padded to a multiple of 8 keys (CSKA-ViT's,
    empty_aligned_rows), or the first K columns of a [B, h, P, K + 1] one (an odd row stride for
    an even K); the rest of the buffer must stay unwritten."""
    if layout == "own":
        return output(name, (B, h, P, K))
    if layout == "below a class row":
        buf = Mem(name, np.full(B * h * (1 + P) * K, np.nan), count=True)
        return View(buf, K, (B, h, P, K), (h * (1 + P) * K, (1 + P) * K, K, 1))
    if layout == "padded below a class row":   # CSKA-ViT's: rows padded to 16 bytes
        ld = (K + 7) // 8 * 8
        buf = Mem(name, np.full(B * h * (1 + P) * ld, np.nan), count=True)
        return View(buf, ld, (B, h, P, K), (h * (1 + P) * ld, (1 + P) * ld, ld, 1))
    assert layout == "in wider rows"
    buf = Mem(name, np.full(B * h * P * (K + 1), np.nan), count=True)
    return View(buf, 0, (B, h, P, K), (h * P * (K + 1), P * (K + 1), K + 1, 1))


def output_heads(name, B, h, P, d):
    """grad_q [B, h, P, d] as the first piece of a [B, P, 2 h d] projection's gradient split into
    heads (CSKA's q), 2 elements in: the rest of the buffer must stay unwritten."""
    buf = Mem(name, np.full(2 + B * P * 2 * h * d, np.nan), count=True)
    return View(buf, 2, (B, h, P, d), (P * 2 * h * d, d, 2 * h * d, 1))


def written_once_view(name, view):
    """Every element of `view` written once, nothing else in its buffer."""
    want = np.zeros(view.mem.v.size, np.int64)
    idx = view.offset + sum(np.arange(n).reshape([-1 if i == k else 1 for i in range(len(view.shape))]) * s
                            for k, (n, s) in enumerate(zip(view.shape, view.strides)))
    want[idx.ravel()] = 1
    bad = np.flatnonzero(view.mem.writes != want)
    if bad.size:
        raise Mismatch("%s: %d elements written other than once in the view, never outside it "
                       "(first at %d)" % (name, bad.size, bad[0]))


def gradient_view(rng, B, h, P, K, layout):
    """The logits' gradient [B, h, P, K] in `layout`; elements outside the view are NaN."""
    if layout == "contiguous":
        buf = rng.uniform(-1, 1, B * h * P * K)
        return View(Mem("g", buf), 0, (B, h, P, K), (h * P * K, P * K, K, 1))
    if layout == "padded rows":   # rows of K + 3, a leading offset of 5
        ld = K + 3
        buf = np.full(5 + B * h * P * ld, np.nan)
        view = View(Mem("g", buf), 5, (B, h, P, K), (h * P * ld, P * ld, ld, 1))
        full = np.full((B, h, P, ld), np.nan); full[..., :K] = rng.uniform(-1, 1, (B, h, P, K))
        buf[5:] = full.ravel()
        return view
    if layout == "aligned rows below a class row":   # CSKA-ViT's: rows of 16 bytes a multiple
        ld = (K + 7) // 8 * 8
        buf = np.full(B * h * (1 + P) * ld, np.nan)
        full = np.full((B, h, 1 + P, ld), np.nan); full[..., 1:, :K] = rng.uniform(-1, 1, (B, h, P, K))
        buf[:] = full.ravel()
        return View(Mem("g", buf), ld, (B, h, P, K), (h * (1 + P) * ld, (1 + P) * ld, ld, 1))
    assert layout == "heads interleaved"   # [B, P, h, K] viewed as [B, h, P, K]
    buf = rng.uniform(-1, 1, B * P * h * K)
    return View(Mem("g", buf), 0, (B, h, P, K), (P * h * K, K, h * K, 1))


def neighbour_index(height, width, k):   # nb[tap, p]: p's neighbour at the tap, or -1
    r = k // 2; P = height * width
    y, x = np.divmod(np.arange(P), width)
    nb = np.full((k * k, P), -1)
    for tap in range(k * k):
        yy, xx = y + tap // k - r, x + tap % k - r
        on = (yy >= 0) & (yy < height) & (xx >= 0) & (xx < width)
        nb[tap, on] = (yy * width + xx)[on]
    return nb


def reference(q, w, bias, g, height, width, k):
    B, h, P, d = q.shape; K = w.shape[2]
    nb = neighbour_index(height, width, k)
    logits = np.zeros((B, h, P, K)) + (bias[None, :, None, :] if bias is not None else 0)
    gq = np.zeros_like(q); gw = np.zeros_like(w)
    for tap in range(k * k):
        on = nb[tap] >= 0
        shifted = np.zeros_like(q); shifted[:, :, on] = q[:, :, nb[tap, on]]
        logits += np.einsum("bhpc,hjc->bhpj", shifted, w[:, tap])
        gw[:, tap] = np.einsum("bhpj,bhpc->hjc", g, shifted)
        back = np.einsum("bhpj,hjc->bhpc", g, w[:, tap])
        gq[:, :, nb[tap, on]] += back[:, :, on]   # nb is one-to-one where on
    return logits, gq, gw


def written_once(name, mem):
    bad = np.flatnonzero(mem.writes != 1)
    if bad.size:
        raise Mismatch("%s: %d elements written %s times (first at %d)" %
                       (name, bad.size, sorted(set(mem.writes[bad].tolist())), bad[0]))


def run_case(rng, B, h, H, W, K, d, k, use_bias, layout, q_in_projection, logits_layout, ldsm,
             grad_w_rows=False):
    P = H * W
    geo = SimpleNamespace(batch=B, heads=h, height=H, width=W, keys=K, d=d, kernel=k, ldsm=ldsm,
                          grad_w_rows=grad_w_rows)
    # q: the first half of a [B, P, 2 h d] projection split into heads; the second half NaN.
    proj = np.full((B, P, 2 * h * d), np.nan)
    proj[..., :h * d] = rng.uniform(-1, 1, (B, P, h * d))
    q = View(Mem("q", proj.ravel()), 0, (B, h, P, d), (P * 2 * h * d, d, 2 * h * d, 1))
    wv = rng.uniform(-0.2, 0.2, h * k * k * K * d)
    w = View(Mem("w", wv), 0, (h, k * k, K, d), (k * k * K * d, K * d, d, 1))
    bias = View(Mem("bias", rng.uniform(-1, 1, h * K)), 0, (h, K), (K, 1)) if use_bias else None
    g = gradient_view(rng, B, h, P, K, layout)

    logits = output_logits("logits", B, h, P, K, logits_layout)
    grad_q = output_heads("grad_q", B, h, P, d) if q_in_projection else output("grad_q", (B, h, P, d))
    grad_w = output("grad_w", (h, k * k, K, d))
    grad_bias = output("grad_bias", (h, K)) if use_bias else None
    conv_logits_forward(geo, q, w, bias, logits)
    partial, bias_partial = conv_logits_backward(geo, g, q, w, grad_q, grad_w, grad_bias)

    written_once_view("grad_q", grad_q)
    written_once_view("logits", logits)
    written = [("partial", partial), ("grad_w", grad_w.mem)]
    if use_bias: written += [("bias_partial", bias_partial), ("grad_bias", grad_bias.mem)]
    for name, mem in written:
        written_once(name, mem)
    ref = list(reference(q.dense(), w.dense(), bias.dense() if bias else None, g.dense(), H, W, k))
    names, outs = ["logits", "grad_q", "grad_w"], [logits, grad_q, grad_w]
    if use_bias:   # the bias gradient: the logits' gradient summed over the images and positions
        names.append("grad_bias"); outs.append(grad_bias)
        ref.append(g.dense().sum(axis=(0, 2)))
    errs = []
    for name, got, want in zip(names, outs, ref):
        got = got.dense()
        if np.isnan(got).any(): raise Mismatch("%s: %d NaN" % (name, np.isnan(got).sum()))
        errs.append(np.abs(got - want).max() / max(1.0, np.abs(want).max()))
    if use_bias and B * P <= 256:   # the bias gradient alone (frozen filters): grad_w's blocks sum it
        grad_bias_alone = output("grad_bias alone", (h, K))
        _, bias_partial = conv_logits_backward(geo, g, q, w, None, None, grad_bias_alone)
        written_once("bias_partial alone", bias_partial)
        written_once("grad_bias alone", grad_bias_alone.mem)
        if np.abs(grad_bias_alone.dense() - ref[-1]).max() > 1e-12 * max(1.0, np.abs(ref[-1]).max()):
            raise Mismatch("grad_bias alone differs")
    return errs, conv_logits_chunks(geo), [o.dense() for o in outs]


CASES = [  # B, h, H, W, K, d, k, bias
    (2, 2, 8, 8, 65, 64, 3, True),
    (1, 1, 28, 28, 170, 16, 3, True),   # keys in three chunks, the last of 10
    (2, 1, 7, 7, 50, 32, 3, False),
    (1, 2, 5, 9, 13, 48, 3, True),
    (1, 1, 14, 14, 90, 128, 5, False),   # two key chunks; one tap a group
    (2, 1, 6, 6, 9, 16, 1, True),
    (21, 1, 7, 7, 10, 16, 3, True),    # grad_w: 3 chunks of 384 rows, the last 261, mid-image
    (41, 1, 8, 8, 10, 16, 3, False),   # grad_w: 6 chunks of 448 rows, the last 384
    (40, 2, 8, 8, 65, 64, 3, True),    # the [cuda] test's case of several chunks
    (3, 1, 8, 8, 65, 64, 3, False),    # an odd number of tiles: the last block of two holds one
]
LAYOUTS = ["aligned rows below a class row", "contiguous", "padded rows", "heads interleaved"]
# CASES[0] is CSKA-ViT-S's, in the mixer's layouts.
LOGITS_LAYOUTS = ["padded below a class row", "own", "in wider rows", "below a class row"]


def main():
    failed = 0; start = time.time()
    # Each case twice on the same operands: fragments by ldmatrix, then by 32- and 16-bit loads;
    # the same registers, so the same values to the bit. Then, where grad_w takes a block per
    # filter row (3x3 filters, head dims up to 64), by ldmatrix with those blocks: the same partial
    # sums, so the same values to the bit again.
    runs = [(c, ldsm, False) for c in enumerate(CASES) for ldsm in (True, False)]
    runs += [(c, True, True) for c in enumerate(CASES) if c[1][6] == 3 and c[1][5] <= 64]
    by_ldmatrix = {}
    for (i, (B, h, H, W, K, d, k, use_bias)), ldsm, rows in runs:
        rng = np.random.default_rng(i)
        layout = LAYOUTS[i % len(LAYOUTS)]
        q_in_projection = i % 2 == 0   # grad_q into the projection's heads, or contiguous
        logits_layout = LOGITS_LAYOUTS[i % len(LOGITS_LAYOUTS)]
        what = "B=%d h=%d %dx%d K=%d d=%d k=%d%s, logits %s, g %s, grad_q %s, %s%s" % (
            B, h, H, W, K, d, k, " bias" if use_bias else "", logits_layout, layout,
            "in the projection" if q_in_projection else "contiguous",
            "ldmatrix" if ldsm else "32- and 16-bit loads",
            ", grad_w by filter rows" if rows else "")
        t0 = time.time()
        try:
            errs, (chunks, chunk_rows), outs = run_case(rng, B, h, H, W, K, d, k, use_bias, layout,
                                                        q_in_projection, logits_layout, ldsm, rows)
        except Mismatch as e:
            print("%s: FAIL %s" % (what, e)); failed += 1; continue
        ok = max(errs) < 1e-12
        if ldsm and not rows:
            by_ldmatrix[i] = outs
        elif i in by_ldmatrix and not all(np.array_equal(x, y) for x, y in zip(outs, by_ldmatrix[i])):
            print("%s: FAIL the outputs differ from ldmatrix's per-tap run" % what); ok = False
        failed += not ok
        names = ["logits", "grad_q", "grad_w", "grad_bias"][:len(errs)]
        print("%s (tiles a block: forward %d, grad_q %d; grad_w %d chunk%s of %d rows, %d tap%s a block): %s %s (%.1fs)" %
              (what, PER_BLOCK["forward"], PER_BLOCK["grad_q"], chunks, "s" if chunks > 1 else "", chunk_rows,
               GRAD_W_ACROSS[0], "s" if GRAD_W_ACROSS[0] > 1 else "",
               " ".join("%s %.1e" % ne for ne in zip(names, errs)), "ok" if ok else "FAIL",
               time.time() - t0))
    print("%d of %d cases pass (%.1fs)" % (len(runs) - failed, len(runs), time.time() - start))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
