#!/usr/bin/env python3
"""Lane-level emulation of the mma.sync attention kernels (cuda/kernels/attention_mma.cu).

Checks their index arithmetic without a GPU: every fragment load, the C-to-A reuse of the
logits, the quad reductions, the tile and tail logic and the writes are mirrored line by line
(registers as numpy arrays over the 32 lanes of a warp), and mma is computed from the PTX
ISA's m16n8k16 fragment layouts (every fragment loaded by ldmatrix, as the kernels load them);
the forward tiled and, where it applies, in its one-block form,
the backward as two kernels, in one block, in one block computing each weight once (one pass),
and the one-block forward and backward as persistent kernels (blocks walking heads with two sets
of tiles: a race model of their copies and barriers). Values stay float64 (no bf16 rounding of P and dS), so every
output must match a dense float64 reference to ~1e-15; outputs start as NaN, so an element the
kernels never write shows up. Run: /usr/bin/python3 scripts/attention_mma_emulate.py (Debian's
python3-numpy). The [cuda] tests remain the real check on a GPU; keep this in step with the
kernels when they change.
"""
import numpy as np
L = np.arange(32); G = L >> 2; T = L & 3

def ld16(c): return c + 8

def mma(c, a, b0, b1):
    # a: list of 4 arrays [32,2] (pairs), b0,b1: [32,2], c: [4][32]
    A = np.zeros((16, 16)); B = np.zeros((16, 8))
    for lane in range(32):
        g, t = lane >> 2, lane & 3
        A[g, 2*t:2*t+2] = a[0][lane]; A[g+8, 2*t:2*t+2] = a[1][lane]
        A[g, 2*t+8:2*t+10] = a[2][lane]; A[g+8, 2*t+8:2*t+10] = a[3][lane]
        B[2*t:2*t+2, g] = b0[lane]; B[2*t+8:2*t+10, g] = b1[lane]
    C = A @ B
    out = [c[i].copy() for i in range(4)]
    for lane in range(32):
        g, t = lane >> 2, lane & 3
        out[0][lane] += C[g, 2*t]; out[1][lane] += C[g, 2*t+1]
        out[2][lane] += C[g+8, 2*t]; out[3][lane] += C[g+8, 2*t+1]
    return out

def pair(m, idx):  # m flat array, idx [32] -> [32,2] of m[idx], m[idx+1]
    return np.stack([m[idx], m[idx+1]], 1)
def pair2(m, lo, hi): return np.stack([m[lo], m[hi]], 1)

def load_a(m, base, ld):
    p = base + G*ld + 2*T
    return [pair(m, p), pair(m, p+8*ld), pair(m, p+8), pair(m, p+8*ld+8)]
def load_b_rows(m, base, ld):
    p = base + G*ld + 2*T
    return pair(m, p), pair(m, p+8)
def load_b_cols(m, base, ld):
    p = base + 2*T*ld + G
    return pair2(m, p, p+ld), pair2(m, p+8*ld, p+9*ld)
def ldmatrix(m, addr, count, trans):
    # PTX ldmatrix.m8n8.b16 with `count` matrices: thread 8j + r gives the address of row r of
    # matrix j (16 bytes: 8 elements); register j of thread i holds two elements of matrix j:
    # row i // 4, columns 2 (i % 4) and + 1; with .trans, column i // 4, rows 2 (i % 4) and + 1.
    regs = []
    for j in range(count):
        rows = [m[addr[8*j + r]:addr[8*j + r] + 8] for r in range(8)]
        mat = np.array(rows)  # [row, col]
        if trans:
            regs.append(np.stack([mat[2*T, G], mat[2*T + 1, G]], 1))
        else:
            regs.append(np.stack([mat[G, 2*T], mat[G, 2*T + 1]], 1))
    return regs
def load_b_cols_ldsm(m, base, ld):  # the kernels' ldmatrix.x2.trans: lane l addresses row l % 16
    b0, b1 = ldmatrix(m, base + (L & 15)*ld, 2, True)
    return b0, b1
def load_a_ldsm(m, base, ld):  # ldmatrix.x4: row l % 16, column 8 (l / 16)
    return ldmatrix(m, base + (L & 15)*ld + (L >> 4)*8, 4, False)
def load_b_rows_ldsm(m, base, ld):  # ldmatrix.x2: row l % 8, column 8 ((l / 8) % 2)
    b0, b1 = ldmatrix(m, base + (L & 7)*ld + ((L >> 3) & 1)*8, 2, False)
    return b0, b1
def load_a_trans(m, base, ld):  # A fragment of the transposed 16 x 16 block: a(r, c) = m[c][r]
    p = base + 2*T*ld + G
    return [pair2(m, p, p+ld), pair2(m, p+8, p+ld+8), pair2(m, p+8*ld, p+9*ld),
            pair2(m, p+8*ld+8, p+9*ld+8)]
def load_a_trans_ldsm(m, base, ld):  # ldmatrix.x4.trans: row l % 8 (+ 8 for l >= 16), column 8 ((l / 8) % 2)
    return ldmatrix(m, base + ((L & 7) + ((L >> 4) & 1)*8)*ld + ((L >> 3) & 1)*8, 4, True)
def a_from_c(c0, c1):
    return [np.stack([c0[0], c0[1]], 1), np.stack([c0[2], c0[3]], 1),
            np.stack([c1[0], c1[1]], 1), np.stack([c1[2], c1[3]], 1)]
def quad(v, f):
    v = v.reshape(8, 4)
    r = f(v, axis=1)
    return np.repeat(r, 4)

def load_tile(src, row0, rows, n, cols, ld):  # src [n, cols] -> flat tile
    tile = np.zeros(rows * ld)
    for r in range(rows):
        i = row0 + r
        if i < n and cols: tile[r*ld:r*ld+cols] = src[i]
    return tile

def multiply_rows(kN, a_m, a_base, lda, b_m, ldb, steps, live):
    acc = [[np.zeros(32) for _ in range(4)] for _ in range(kN)]
    tiles = (live + 7) // 8
    for ks in range(steps):
        fa = load_a_ldsm(a_m, a_base + ks*16, lda)
        for n in range(kN):
            if n >= tiles: break
            b0, b1 = load_b_rows_ldsm(b_m, n*8*ldb + ks*16, ldb)
            acc[n] = mma(acc[n], fa, b0, b1)
    return acc

def accumulate_weights(out, w, b_m, ldb, cols, live, kN, kOut):
    pieces = (live + 15)//16; tiles = cols // 8
    for kb in range(kN//2):
        if kb >= pieces: break
        fa = a_from_c(w[2*kb], w[2*kb+1])
        for nd in range(kOut):
            if nd >= tiles: break
            b0, b1 = load_b_cols_ldsm(b_m, kb*16*ldb + nd*8, ldb)
            out[nd] = mma(out[nd], fa, b0, b1)

def split_rows(n):
    pieces = max(1, (n + 15)//16); tiles = (pieces + 3)//4
    return (pieces + tiles - 1)//tiles, tiles

def head_of(d, dv):
    w = max(d, dv); return 32 if w <= 32 else 64 if w <= 64 else 128

def one_block_forward_fits(nq, nk, d, dv):  # mma_forward's one-block form
    return head_of(d, dv) <= 64 and 64 < max(nq, nk) <= 80

def forward_one_block_tiles(q, k, v):  # the one-block forward's q, k and v tiles
    nq, d = q.shape; nk, dv = v.shape; rows = max(1, (nq + 15)//16)*16
    return (load_tile(q, 0, rows, nq, d, ld16(d)), load_tile(k, 0, 80, nk, d, ld16(d)),
            load_tile(v, 0, 80, nk, dv, ld16(dv)))

def forward(q, k, v, bias, scale, one_block=False, staged=None):
    """mma_forward_kernel, tiled or (one_block) in its one-block form; with `staged`, the
    one-block form on tiles already staged (the persistent kernel)."""
    nq, d = q.shape; nk, dv = v.shape
    kHead = head_of(d, dv); kWidth = 32 if kHead > 64 else 64; kN = kWidth//8; kOut = kHead//8
    warps, tiles = split_rows(nq); rows = warps*16
    if one_block:  # one block of up to 5 warps per leading index, every key in an 80-wide tile
        assert one_block_forward_fits(nq, nk, d, dv)
        kWidth = 80; kN = kWidth//8; warps = max(1, (nq + 15)//16); tiles = 1; rows = warps*16
    out = np.full((nq, dv), np.nan); lse_out = np.full(nq, np.nan)
    ldd, ldv = ld16(d), ld16(dv)
    for tile in range(tiles):
        i0 = tile*rows
        q_s = load_tile(q, i0, rows, nq, d, ldd) if staged is None else staged[0]
        for warp in range(warps):
            w0 = i0 + warp*16
            if w0 >= nq: continue
            rows_of = [w0 + G, w0 + G + 8]
            o = [[np.zeros(32) for _ in range(4)] for _ in range(kOut)]
            m_run = [np.full(32, -np.inf)]*2; l_run = [np.zeros(32)]*2
            for j0 in range(0, nk, kWidth):
                if staged is None:
                    k_s = load_tile(k, j0, kWidth, nk, d, ldd); v_s = load_tile(v, j0, kWidth, nk, dv, ldv)
                else:
                    assert one_block and j0 == 0; k_s, v_s = staged[1], staged[2]
                live = min(kWidth, nk - j0)
                s = multiply_rows(kN, q_s, warp*16*ldd, ldd, k_s, ldd, d//16, live)
                tmax = [np.full(32, -np.inf), np.full(32, -np.inf)]
                for n in range(kN):
                    for e in range(4):
                        i = rows_of[e >> 1]; j = j0 + n*8 + 2*T + (e & 1)
                        z = np.where(j < nk, scale*s[n][e], -np.inf)
                        if bias is not None:
                            ok = (j < nk) & (i < nq)
                            z = z + np.where(ok, bias[np.minimum(i, nq-1), np.minimum(j, nk-1)], 0)
                        s[n][e] = z; tmax[e >> 1] = np.fmax(tmax[e >> 1], z)
                ref = [None]*2; alpha = [None]*2; m_new_l = [None]*2
                for r in range(2):
                    m_new = np.fmax(m_run[r], quad(tmax[r], np.max))
                    ref[r] = np.where(m_new == -np.inf, 0.0, m_new)
                    with np.errstate(invalid='ignore'):
                        alpha[r] = np.exp(m_run[r] - ref[r])
                    m_new_l[r] = m_new
                m_run = m_new_l
                sm = [np.zeros(32), np.zeros(32)]
                for n in range(kN):
                    for e in range(4):
                        s[n][e] = np.exp(s[n][e] - ref[e >> 1]); sm[e >> 1] = sm[e >> 1] + s[n][e]
                l_run = [l_run[r]*alpha[r] + quad(sm[r], np.sum) for r in range(2)]
                for nd in range(kOut):
                    for e in range(4): o[nd][e] = o[nd][e]*alpha[e >> 1]
                accumulate_weights(o, s, v_s, ldv, dv, live, kN, kOut)
            for r in range(2):
                for lane in range(32):
                    i = rows_of[r][lane]
                    if i >= nq: continue
                    l = l_run[r][lane]
                    if l > 0: inv = 1/l; ls = m_run[r][lane] + np.log(l)
                    elif nk == 0: inv = 0; ls = -np.inf
                    else: inv = np.nan; ls = np.nan
                    t = lane & 3
                    for nd in range(kOut):
                        if nd*8 >= dv: break
                        for e in range(2):
                            out[i, nd*8 + 2*t + e] = o[nd][2*r + e][lane]*inv
                    if t == 0: lse_out[i] = ls
    return out, lse_out

def write_rows(acc, cols, scale, out, row0, n, kOut):
    for nd in range(kOut):
        if nd*8 >= cols: break
        for e in range(4):
            for lane in range(32):
                i = row0 + (lane >> 2) + 8*(e >> 1); c = nd*8 + 2*(lane & 3) + (e & 1)
                if i < n: out[i, c] = scale*acc[nd][e][lane]

def backward(q, k, v, bias, scale, lse, delta, go):
    nq, d = q.shape; nk, dv = v.shape
    kHead = head_of(d, dv); kWidth = 32 if kHead > 64 else 64; kN = kWidth//8; kOut = kHead//8
    ldd, ldv = ld16(d), ld16(dv)
    gq = np.full((nq, d), np.nan); gk = np.full((nk, d), np.nan); gv = np.full((nk, dv), np.nan)
    gb = np.full((nq, nk), np.nan)
    def b_at(i, j): return bias[i, j] if bias is not None else 0.0
    if nk > 0:
        warps, tiles = split_rows(nk); rows = warps*16
        for tile in range(tiles):
            j0 = tile*rows
            k_s = load_tile(k, j0, rows, nk, d, ldd); v_s = load_tile(v, j0, rows, nk, dv, ldv)
            for warp in range(warps):
                w0 = j0 + warp*16
                if w0 >= nk: continue
                keys_of = [w0 + G, w0 + G + 8]
                dk = [[np.zeros(32) for _ in range(4)] for _ in range(kOut)]
                dvv = [[np.zeros(32) for _ in range(4)] for _ in range(kOut)]
                for i0 in range(0, nq, kWidth):
                    q_s = load_tile(q, i0, kWidth, nq, d, ldd); go_s = load_tile(go, i0, kWidth, nq, dv, ldv)
                    lse_s = np.array([lse[i0+e] if i0+e < nq else 0 for e in range(kWidth)])
                    delta_s = np.array([delta[i0+e] if i0+e < nq else 0 for e in range(kWidth)])
                    live = min(kWidth, nq - i0)
                    p = multiply_rows(kN, k_s, warp*16*ldd, ldd, q_s, ldd, d//16, live)
                    ds = multiply_rows(kN, v_s, warp*16*ldv, ldv, go_s, ldv, dv//16, live)
                    for n in range(kN):
                        for e in range(4):
                            j = keys_of[e >> 1]; ti = n*8 + 2*T + (e & 1); i = i0 + ti
                            pe = np.zeros(32); dse = np.zeros(32)
                            for lane in range(32):
                                if i[lane] < nq and j[lane] < nk:
                                    z = scale*p[n][e][lane] + b_at(i[lane], j[lane])
                                    pe[lane] = np.exp(z - lse_s[ti[lane]])
                                    dse[lane] = pe[lane]*(ds[n][e][lane] - delta_s[ti[lane]])
                            p[n][e] = pe; ds[n][e] = dse
                    accumulate_weights(dvv, p, go_s, ldv, dv, live, kN, kOut)
                    accumulate_weights(dk, ds, q_s, ldd, d, live, kN, kOut)
                write_rows(dk, d, scale, gk, w0, nk, kOut)
                write_rows(dvv, dv, 1.0, gv, w0, nk, kOut)
    if nq > 0:
        warps, tiles = split_rows(nq); rows = warps*16
        for tile in range(tiles):
            i0 = tile*rows
            q_s = load_tile(q, i0, rows, nq, d, ldd); go_s = load_tile(go, i0, rows, nq, dv, ldv)
            for warp in range(warps):
                w0 = i0 + warp*16
                if w0 >= nq: continue
                rows_of = [w0 + G, w0 + G + 8]
                lse_r = [np.array([lse[i] if i < nq else 0 for i in rows_of[r]]) for r in range(2)]
                del_r = [np.array([delta[i] if i < nq else 0 for i in rows_of[r]]) for r in range(2)]
                dq = [[np.zeros(32) for _ in range(4)] for _ in range(kOut)]
                for j0 in range(0, nk, kWidth):
                    k_s = load_tile(k, j0, kWidth, nk, d, ldd); v_s = load_tile(v, j0, kWidth, nk, dv, ldv)
                    live = min(kWidth, nk - j0)
                    ds = multiply_rows(kN, q_s, warp*16*ldd, ldd, k_s, ldd, d//16, live)
                    dp = multiply_rows(kN, go_s, warp*16*ldv, ldv, v_s, ldv, dv//16, live)
                    for n in range(kN):
                        for e in range(4):
                            r = e >> 1; i = rows_of[r]; j = j0 + n*8 + 2*T + (e & 1)
                            dse = np.zeros(32)
                            for lane in range(32):
                                if i[lane] < nq and j[lane] < nk:
                                    z = scale*ds[n][e][lane] + b_at(i[lane], j[lane])
                                    dse[lane] = np.exp(z - lse_r[r][lane])*(dp[n][e][lane] - del_r[r][lane])
                                    gb[i[lane], j[lane]] = dse[lane]
                            ds[n][e] = dse
                    accumulate_weights(dq, ds, k_s, ldd, d, live, kN, kOut)
                write_rows(dq, d, scale, gq, w0, nq, kOut)
    return gq, gk, gv, gb

def one_block_tiles(q, k, v, go, lse, delta):  # load_one_block_tiles: every operand once, 80 rows
    kShort = 80; nq, d = q.shape; nk, dv = v.shape
    ldd, ldv = ld16(d), ld16(dv)
    return (load_tile(q, 0, kShort, nq, d, ldd), load_tile(go, 0, kShort, nq, dv, ldv),
            load_tile(k, 0, kShort, nk, d, ldd), load_tile(v, 0, kShort, nk, dv, ldv),
            np.array([lse[i] if i < nq else 0 for i in range(kShort)]),
            np.array([delta[i] if i < nq else 0 for i in range(kShort)]))

def backward_one_block(q, k, v, bias, scale, lse, delta, go, tiles=None):
    """mma_one_block_backward_kernel: one block, every operand loaded once (80 rows); with
    `tiles`, one_block_backward_head on tiles already staged (the persistent kernel)."""
    nq, d = q.shape; nk, dv = v.shape
    kShort = 80; kN = kShort//8; kOut = head_of(d, dv)//8
    assert nq <= kShort and nk <= kShort and head_of(d, dv) <= 64
    ldd, ldv = ld16(d), ld16(dv)
    gq = np.full((nq, d), np.nan); gk = np.full((nk, d), np.nan); gv = np.full((nk, dv), np.nan)
    gb = np.full((nq, nk), np.nan)
    def b_at(i, j): return bias[i, j] if bias is not None else 0.0
    q_s, go_s, k_s, v_s, lse_s, delta_s = tiles if tiles is not None else one_block_tiles(q, k, v, go, lse, delta)
    pieces = (max(nq, nk, 1) + 15)//16
    for warp in range(pieces):
        w0 = warp*16
        if w0 < nk:
            keys_of = [w0 + G, w0 + G + 8]
            w = multiply_rows(kN, k_s, w0*ldd, ldd, q_s, ldd, d//16, nq)
            dw = multiply_rows(kN, v_s, w0*ldv, ldv, go_s, ldv, dv//16, nq)
            for n in range(kN):
                for e in range(4):
                    j = keys_of[e >> 1]; i = n*8 + 2*T + (e & 1)
                    pe = np.zeros(32); dse = np.zeros(32)
                    for lane in range(32):
                        if i[lane] < nq and j[lane] < nk:
                            z = scale*w[n][e][lane] + b_at(i[lane], j[lane])
                            pe[lane] = np.exp(z - lse_s[i[lane]])
                            dse[lane] = pe[lane]*(dw[n][e][lane] - delta_s[i[lane]])
                    w[n][e] = pe; dw[n][e] = dse
            dk = [[np.zeros(32) for _ in range(4)] for _ in range(kOut)]
            dvv = [[np.zeros(32) for _ in range(4)] for _ in range(kOut)]
            accumulate_weights(dvv, w, go_s, ldv, dv, nq, kN, kOut)
            accumulate_weights(dk, dw, q_s, ldd, d, nq, kN, kOut)
            write_rows(dk, d, scale, gk, w0, nk, kOut)
            write_rows(dvv, dv, 1.0, gv, w0, nk, kOut)
        if w0 < nq:
            rows_of = [w0 + G, w0 + G + 8]
            w = multiply_rows(kN, q_s, w0*ldd, ldd, k_s, ldd, d//16, nk)
            dw = multiply_rows(kN, go_s, w0*ldv, ldv, v_s, ldv, dv//16, nk)
            for n in range(kN):
                for e in range(4):
                    i = rows_of[e >> 1]; j = n*8 + 2*T + (e & 1)
                    dse = np.zeros(32)
                    for lane in range(32):
                        if i[lane] < nq and j[lane] < nk:
                            z = scale*w[n][e][lane] + b_at(i[lane], j[lane])
                            dse[lane] = np.exp(z - lse_s[i[lane]])*(dw[n][e][lane] - delta_s[i[lane]])
                            gb[i[lane], j[lane]] = dse[lane]
                    w[n][e] = dse
            dq = [[np.zeros(32) for _ in range(4)] for _ in range(kOut)]
            accumulate_weights(dq, w, k_s, ldd, d, nk, kN, kOut)
            write_rows(dq, d, scale, gq, w0, nq, kOut)
    return gq, gk, gv, gb

def backward_one_pass(q, k, v, bias, scale, lse, delta, go):
    """mma_one_pass_backward_kernel: the query side first (P and dS stored to shared tiles),
    then, after the barrier, dK and dV from the tiles read transposed."""
    nq, d = q.shape; nk, dv = v.shape
    kShort = 80; kN = kShort//8; kOut = head_of(d, dv)//8; kWeightLd = kShort + 8
    assert nq <= kShort and nk <= kShort and head_of(d, dv) <= 64
    ldd, ldv = ld16(d), ld16(dv)
    gq = np.full((nq, d), np.nan); gk = np.full((nk, d), np.nan); gv = np.full((nk, dv), np.nan)
    gb = np.full((nq, nk), np.nan)
    def b_at(i, j): return bias[i, j] if bias is not None else 0.0
    q_s, go_s, k_s, v_s, lse_s, delta_s = one_block_tiles(q, k, v, go, lse, delta)
    p_s = np.full(kShort*kWeightLd, np.nan); ds_s = np.full(kShort*kWeightLd, np.nan)  # never-written: NaN
    pieces = (max(nq, nk, 1) + 15)//16
    for warp in range(pieces):  # phase 1
        w0 = warp*16
        if w0 >= nq: continue
        rows_of = [w0 + G, w0 + G + 8]
        w = multiply_rows(kN, q_s, w0*ldd, ldd, k_s, ldd, d//16, nk)
        dw = multiply_rows(kN, go_s, w0*ldv, ldv, v_s, ldv, dv//16, nk)
        for n in range(kN):
            for e in range(4):
                i = rows_of[e >> 1]; j = n*8 + 2*T + (e & 1)
                pe = np.zeros(32); dse = np.zeros(32)
                for lane in range(32):
                    if i[lane] < nq and j[lane] < nk:
                        z = scale*w[n][e][lane] + b_at(i[lane], j[lane])
                        pe[lane] = np.exp(z - lse_s[i[lane]])
                        dse[lane] = pe[lane]*(dw[n][e][lane] - delta_s[i[lane]])
                        gb[i[lane], j[lane]] = dse[lane]
                w[n][e] = pe; dw[n][e] = dse
        for n in range(kN):
            for r in range(2):
                at = (w0 + G + 8*r)*kWeightLd + n*8 + 2*T
                p_s[at] = w[n][2*r]; p_s[at + 1] = w[n][2*r + 1]
                ds_s[at] = dw[n][2*r]; ds_s[at + 1] = dw[n][2*r + 1]
        dq = [[np.zeros(32) for _ in range(4)] for _ in range(kOut)]
        accumulate_weights(dq, dw, k_s, ldd, d, nk, kN, kOut)
        write_rows(dq, d, scale, gq, w0, nq, kOut)
    qpieces = (nq + 15)//16
    for warp in range(pieces):  # phase 2, after the barrier
        w0 = warp*16
        if w0 >= nk: continue
        dk = [[np.zeros(32) for _ in range(4)] for _ in range(kOut)]
        dvv = [[np.zeros(32) for _ in range(4)] for _ in range(kOut)]
        for kb in range(kN//2):
            if kb >= qpieces: break
            fp = load_a_trans_ldsm(p_s, kb*16*kWeightLd + w0, kWeightLd)
            fds = load_a_trans_ldsm(ds_s, kb*16*kWeightLd + w0, kWeightLd)
            for nd in range(kOut):
                if nd < dv//8:
                    b0, b1 = load_b_cols_ldsm(go_s, kb*16*ldv + nd*8, ldv)
                    dvv[nd] = mma(dvv[nd], fp, b0, b1)
                if nd < d//8:
                    b0, b1 = load_b_cols_ldsm(q_s, kb*16*ldd + nd*8, ldd)
                    dk[nd] = mma(dk[nd], fds, b0, b1)
        write_rows(dk, d, scale, gk, w0, nk, kOut)
        write_rows(dvv, dv, 1.0, gv, w0, nk, kOut)
    return gq, gk, gv, gb

def persistent(heads, grid, tiles_of, compute):
    """The persistent kernels' schedule (mma_persistent_backward_kernel and
    mma_persistent_forward_kernel): block b of `grid` takes heads b, b + grid, ... with two sets
    of tiles. A set's copies land only at the wait that covers their group (the latest they may)
    and the set is poisoned with NaN from their issue (the earliest they may overwrite it), so a
    read of a set in flight gives NaN; every shared-memory event is stamped with its phase (the
    barriers before it) to check that a set is restaged only in a phase after its last read, and
    read only in a phase after the wait for its copies. tiles_of(head) gives a head's staged
    tiles, compute(head, tiles) its results; returns each head's results."""
    groups = len(heads); out = [None]*groups
    for b in range(min(grid, groups)):
        phase = 0; sets = [None, None]; pending = []  # pending: committed groups, oldest first
        last_read = [-1, -1]; staged_at = [None, None]; landed_at = [None, None]
        def stage(st, grp):
            assert phase > last_read[st], ("restaged in the phase of its last read", b, grp)
            sets[st] = tuple(np.full_like(t, np.nan) for t in tiles_of(heads[grp]))
            staged_at[st] = phase; landed_at[st] = None
            return (st, tiles_of(heads[grp]))
        def commit(copy): pending.append(copy)  # copy: None for an empty group
        def wait_pending(n):
            while len(pending) > n:
                copy = pending.pop(0)
                if copy is not None:
                    st, tiles = copy; sets[st] = tiles; landed_at[st] = phase
        grp = b; st = 0
        commit(stage(0, grp))
        while grp < groups:
            nxt = grp + grid
            commit(stage(st ^ 1, nxt) if nxt < groups else None)
            wait_pending(1)
            phase += 1  # __syncthreads
            assert landed_at[st] is not None and landed_at[st] < phase, ("read before its wait", b, grp)
            out[grp] = compute(heads[grp], sets[st])
            last_read[st] = phase
            phase += 1  # __syncthreads
            grp = nxt; st ^= 1
        assert not [c for c in pending if c is not None], "copies left in flight"
    return out

def backward_persistent(heads, grid, bias, scale):
    """mma_persistent_backward_kernel. heads: (q, k, v, go, lse, delta) each; returns each
    head's (gq, gk, gv, gb)."""
    return persistent(heads, grid, lambda h: one_block_tiles(*h),
                      lambda h, t: backward_one_block(h[0], h[1], h[2], bias, scale, h[4], h[5],
                                                      h[3], tiles=t))

def forward_persistent(heads, grid, bias, scale):
    """mma_persistent_forward_kernel. heads: (q, k, v, ...) each; returns each head's
    (out, lse)."""
    return persistent(heads, grid, lambda h: forward_one_block_tiles(h[0], h[1], h[2]),
                      lambda h, t: forward(h[0], h[1], h[2], bias, scale, one_block=True,
                                           staged=t))

def reference(q, k, v, bias, scale, go):
    z = scale*q@k.T + (bias if bias is not None else 0)
    m = z.max(1, keepdims=True); p = np.exp(z - m); l = p.sum(1, keepdims=True); p /= l
    out = p@v; lse = (m + np.log(l))[:, 0]
    dp = go@v.T; delta = (go*out).sum(1)
    ds = p*(dp - delta[:, None])
    return out, lse, scale*ds@k, scale*ds.T@q, p.T@go, ds, delta

rng = np.random.default_rng(0)
# ldmatrix gives the registers of the 16- and 32-bit loads it replaced (any tile offset and row
# stride the kernels use: 8-wide pieces of tiles with rows of 16 * k + 8 elements).
for ld in (24, 40, 72, 136):
    tile = rng.uniform(-1, 1, 32 * ld)
    for base in (0, 8, 16 * ld + 8, 16 * ld + 16):
        if base + 15 * ld + 16 > tile.size: continue
        for got, want in zip(load_b_cols_ldsm(tile, base, ld), load_b_cols(tile, base, ld)):
            assert np.array_equal(got, want), ("b cols", ld, base)
        for got, want in zip(load_b_rows_ldsm(tile, base, ld), load_b_rows(tile, base, ld)):
            assert np.array_equal(got, want), ("b rows", ld, base)
        for got, want in zip(load_a_ldsm(tile, base, ld), load_a(tile, base, ld)):
            assert np.array_equal(got, want), ("a", ld, base)
        for got, want in zip(load_a_trans_ldsm(tile, base, ld), load_a_trans(tile, base, ld)):
            assert np.array_equal(got, want), ("a trans", ld, base)
# load_a_trans is the transpose's A fragment: the fragment load_a gives of the transposed block.
blk = rng.uniform(-1, 1, (16, 16)); ld = 24
tile = np.zeros(16 * ld); tile.reshape(16, ld)[:, :16] = blk
tile_t = np.zeros(16 * ld); tile_t.reshape(16, ld)[:, :16] = blk.T
for got, want in zip(load_a_trans(tile, 0, ld), load_a(tile_t, 0, ld)):
    assert np.array_equal(got, want), "a trans is not the transpose's fragment"
worst = 0.0
for (nq, nk, d, dv, use_bias) in [(65, 65, 64, 64, False), (65, 65, 32, 32, True), (1, 197, 48, 48, False),
                                  (33, 47, 16, 48, True), (40, 72, 128, 128, False), (65, 65, 0, 64, True),
                                  (8, 8, 16, 16, True), (150, 100, 32, 32, True),
                                  (49, 49, 32, 32, True), (196, 196, 32, 32, False),
                                  (1, 65, 48, 48, False), (80, 80, 64, 64, True), (65, 1, 32, 32, False),
                                  (72, 17, 48, 48, True)]:
    q = rng.uniform(-2, 2, (nq, d)); k = rng.uniform(-1, 1, (nk, d)); v = rng.uniform(-1, 1, (nk, dv))
    go = rng.uniform(-1, 1, (nq, dv)); bias = rng.uniform(-2, 2, (nq, nk)) if use_bias else None
    scale = 1/np.sqrt(max(d, 1))
    out, lse = forward(q, k, v, bias, scale)
    ro, rl, rgq, rgk, rgv, rgb, delta = reference(q, k, v, bias, scale, go)
    gq, gk, gv, gb = backward(q, k, v, bias, scale, rl, delta, go)
    errs = [np.abs(out-ro).max(), np.abs(lse-rl).max(), np.abs(gq-rgq).max() if d else 0,
            np.abs(gk-rgk).max() if d else 0, np.abs(gv-rgv).max(), np.abs(gb-rgb).max()]
    if one_block_forward_fits(nq, nk, d, dv):
        out1, lse1 = forward(q, k, v, bias, scale, one_block=True)
        errs += [np.abs(out1-ro).max(), np.abs(lse1-rl).max()]
    if nq <= 80 and nk <= 80 and head_of(d, dv) <= 64:  # the one-block backward's problems
        gq, gk, gv, gb = backward_one_block(q, k, v, bias, scale, rl, delta, go)
        errs += [np.abs(gq-rgq).max() if d else 0, np.abs(gk-rgk).max() if d else 0,
                 np.abs(gv-rgv).max(), np.abs(gb-rgb).max()]
        gq, gk, gv, gb = backward_one_pass(q, k, v, bias, scale, rl, delta, go)
        errs += [np.abs(gq-rgq).max() if d else 0, np.abs(gk-rgk).max() if d else 0,
                 np.abs(gv-rgv).max(), np.abs(gb-rgb).max()]
    print((nq, nk, d, dv, use_bias), ["%.1e" % e for e in errs])
    worst = max(worst, *errs)
# The persistent kernels: each head's gradients, and its output and log-sum-exps, equal to the
# one-block kernels' (the same operations on the same tiles), for grids smaller than the heads
# (blocks taking several in turn, some one fewer), as large, and larger.
for (nq, nk, d, dv, use_bias) in [(65, 65, 32, 32, True), (17, 80, 16, 48, False)]:
    heads = []
    for _ in range(7):
        q = rng.uniform(-2, 2, (nq, d)); k = rng.uniform(-1, 1, (nk, d)); v = rng.uniform(-1, 1, (nk, dv))
        go = rng.uniform(-1, 1, (nq, dv))
        heads.append([q, k, v, go])
    bias = rng.uniform(-2, 2, (nq, nk)) if use_bias else None
    scale = 1/np.sqrt(max(d, 1))
    for h in heads:
        _, rl, _, _, _, _, delta = reference(h[0], h[1], h[2], bias, scale, h[3])
        h += [rl, delta]
    def same_bits(persistent_kernel, want, what, written):
        # written: np.all (the forward writes every element) or np.any (a gradient may be unused)
        for grid in (1, 3, 7, 9):
            got = persistent_kernel(heads, grid, bias, scale)
            for h in range(len(heads)):
                for x, y in zip(got[h], want[h]):
                    assert np.array_equal(x, y, equal_nan=True) and written(~np.isnan(x)), \
                        (what, nq, nk, d, dv, grid, h)
    same_bits(backward_persistent, [backward_one_block(q, k, v, bias, scale, lse, delta, go)
                                    for (q, k, v, go, lse, delta) in heads], "backward", np.any)
    same_bits(forward_persistent, [forward(h[0], h[1], h[2], bias, scale, one_block=True)
                                   for h in heads], "forward", np.all)
    print("persistent backward and forward", (nq, nk, d, dv, use_bias),
          "grids 1, 3, 7, 9: the one-block bits")
print("worst abs error", worst)
raise SystemExit(0 if worst < 1e-12 else 1)
