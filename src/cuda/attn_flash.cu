// attn_flash.cu: causal softmax attention on the GPU, the forward of
// op_attention (attn_flash.c, FlashAttention-2 style, O(T) memory; the
// tiles and products are attn_flash.cuh's) and of a prefill window
// (cu_attn_prefix_forward): per query tile, with S = scale Q K^T masked to
// s <= t and s >= lo(t),
//   m' = max(m, rowmax S),  P = exp(S - m'),  l = exp(m - m') l + rowsum P,
//   A = diag(exp(m - m')) A + P V;  o = A / l,  lse = m + log l.
//
//   forward: Q of the tile; for each key tile some query of the tile sees,
//     K and V; S = scale Q K^T in registers (masked: s <= t and s >= lo(t),
//     lo(t) where t's document begins), the online softmax (row max across
//     the 16 threads of a row by shuffles; each thread keeps its part of the
//     row sum l, added up at the end), P^T to shared memory and
//     A = diag(alpha) A + P V. Then o = A / l and lse = m + log l (saved).
#include "attn_flash.cuh"

// Shared memory: Q (the block's queries), K, V (the key tile's) by rows,
// P^T (keys as rows).
static size_t fwd_smem(int dk, int dv) {
    return (size_t)FA_B * (2 * fa_ldr(dk) + fa_ldr(dv) + FA_LDT) * sizeof(real);
}

// grid (B*H, query tiles). lse (B, H, T) or NULL. Scores: queries ra + r,
// keys tx + c FA_TX.
template <int NG>
__global__ void __launch_bounds__(FA_THREADS, FA_MINB_FWD(NG))
    k_flash_fwd(FaDims d, const real *q, const real *k, const real *v, const int *first, real *o, real *lse) {
    extern __shared__ __align__(16) unsigned char fa_smem[];
    int bh = blockIdx.x, b = bh / d.H, h = bh % d.H;
    int ty = threadIdx.x / FA_TX, tx = threadIdx.x % FA_TX, ra = ty * FA_RM, cb = tx * FA_R;
    int dk = d.dk, dv = d.dv, ngv = fa_groups(dv), ldk_s = fa_ldr(dk), ldv_s = fa_ldr(dv);
    real sc2 = d.scale * FA_LOG2E;   // the scale in fa_exp's units
    int t0 = (gridDim.y - 1 - blockIdx.y) * FA_B, nq = min(FA_B, d.T - t0);
    int ta = d.qoff + t0;   // the key slot of the tile's first query
    int64_t ldq = (int64_t)d.H * dk, ldv = (int64_t)d.H * dv, row0 = (int64_t)b * d.T, row0k = (int64_t)b * d.Tk;
    const real *qh = q + row0 * ldq + h * dk, *kh = k + row0k * ldq + h * dk, *vh = v + row0k * ldv + h * dv;
    const int *fr = first ? first + row0 : NULL;
    real *Qs = (real *)fa_smem, *Ks = Qs + FA_B * ldk_s, *Vs = Ks + FA_B * ldk_s, *PT = Vs + FA_B * ldv_s;

    fa_load_rows(Qs, ldk_s, qh, ldq, t0, nq, dk);
    real acc[NG][FA_RM][FA_R], m[FA_RM], l[FA_RM];
    int lo[FA_RM];
#pragma unroll
    for (int r = 0; r < FA_RM; r++) {
        m[r] = -INFINITY;
        l[r] = 0;
        lo[r] = ra + r >= nq ? 0 : d.key0 ? d.key0[b] : fa_lo(fr, t0 + ra + r);
#pragma unroll
        for (int g = 0; g < NG; g++)
#pragma unroll
            for (int c = 0; c < FA_R; c++) acc[g][r][c] = 0;
    }
    // Keys from the start of the tile's first query's document (the earliest
    // any query of the tile sees) to its last query.
    // K of a key tile is loaded behind the previous tile's P V (which reads
    // P^T and V only), V at the start of its own.
    int s_end = ta + nq, s_first = d.key0 ? d.key0[b] : fa_lo(fr, t0);
    fa_load_rows(Ks, ldk_s, kh, ldq, s_first, min(FA_B, s_end - s_first), dk);
    for (int s0 = s_first; s0 < s_end; s0 += FA_B) {
        int nk = min(FA_B, s_end - s0);
        __syncthreads();   // the previous tile's V, P are read
        fa_load_rows(Vs, ldv_s, vh, ldv, s0, nk, dv);
        fa_cp_wait();
        __syncthreads();
        real s[FA_RM][FA_R];
        fa_tile_rows(s, Qs + ra * ldk_s, ldk_s, Ks + tx * ldk_s, ldk_s, dk);
        // S (in fa_exp's units: log2 in float32): -inf where query i does not
        // see key j (exp gives weight 0). The online softmax: m' = max(m,
        // rowmax S) over the row's 16 threads, P = exp(S - m'), alpha =
        // exp(m - m') (1 when the max did not move, also while the row has
        // seen no key: m = m' = -inf).
#pragma unroll
        for (int r = 0; r < FA_RM; r++) {
            int i = ra + r;
            real mx = m[r];
#pragma unroll
            for (int c = 0; c < FA_R; c++) {
                bool seen = fa_seen(i, tx + c * FA_TX, nq, nk, ta, s0, lo[r]);
                s[r][c] = seen ? sc2 * s[r][c] : (real)-INFINITY;
                mx = fa_max(mx, s[r][c]);
            }
#pragma unroll
            for (int off = FA_TX / 2; off > 0; off >>= 1) mx = fa_max(mx, __shfl_xor_sync(0xffffffffu, mx, off));
            real sum = 0;
#pragma unroll
            for (int c = 0; c < FA_R; c++) {
                s[r][c] = s[r][c] == -INFINITY ? (real)0 : fa_exp(s[r][c] - mx);
                sum += s[r][c];
            }
            real a = m[r] == mx ? (real)1 : fa_exp(m[r] - mx);
            l[r] = a * l[r] + sum;
            m[r] = mx;
#pragma unroll
            for (int g = 0; g < NG; g++)
#pragma unroll
                for (int c = 0; c < FA_R; c++) acc[g][r][c] *= a;
        }
        fa_store_t(PT + tx * FA_LDT + ra, s);
        __syncthreads();   // K is read: the next tile's may come
        if (s0 + FA_B < s_end) fa_load_rows(Ks, ldk_s, kh, ldq, s0 + FA_B, min(FA_B, s_end - s0 - FA_B), dk);
        // A += P V, over the keys this thread's last query sees (causal:
        // P is 0 from key t0 + ra + FA_RM - 1 - s0 on).
        fa_tile_acc<NG>(acc, PT + ra, Vs + cb, ldv_s, 0, min(nk, ta - s0 + ra + FA_RM), ngv);
    }
    // l: the row's 16 parts; every query sees itself, so l > 0.
#pragma unroll
    for (int r = 0; r < FA_RM; r++)
#pragma unroll
        for (int off = FA_TX / 2; off > 0; off >>= 1) l[r] += __shfl_xor_sync(0xffffffffu, l[r], off);
    // o = A / l, as the CPU: a division per element.
#pragma unroll
    for (int r = 0; r < FA_RM; r++) {
        if (ra + r >= nq) continue;
        real *orow = o + (row0 + t0 + ra + r) * ldv + h * dv;
#pragma unroll
        for (int g = 0; g < NG; g++)
#pragma unroll
            for (int c = 0; c < FA_R; c++) {
                int col = g * FA_B + cb + c;
                if (g < ngv && col < dv) orow[col] = acc[g][r][c] / l[r];
            }
        if (lse && tx == 0) lse[(int64_t)bh * d.T + t0 + ra + r] = m[r] * FA_LN2 + log(l[r]);
    }
}

template <int NG> static void fwd_launch(const FaDims &d, const real *q, const real *k, const real *v,
                                         const int *first, real *o, real *lse) {
    size_t smem = fwd_smem(d.dk, d.dv);
    cu_smem_prepare((const void *)k_flash_fwd<NG>, smem, "attention", d.dk, d.dv);
    dim3 grid((unsigned)(d.B * d.H), (unsigned)fa_tiles(&d));
    k_flash_fwd<NG><<<grid, FA_THREADS, smem, cu_stream>>>(d, q, k, v, first, o, lse);
    CU_LAUNCHED();
}

// iarg: 0 B, 1 T, 2 H, 3 dk, 4 dv (5, 6: the CPU's tiles), 7 bf16 products
// (set here); farg[0] scale;
// aux: first (B*T, docs.h) or NULL; saved: lse (B, H, T) or NULL.
extern "C" void cu_flash_forward(Node *n) {
    FaDims d = fa_dims(n);
    if ((int64_t)d.B * d.H * d.T == 0) return;
    const int *first = cu_first_to_device(n->tape, (const int *)n->aux, d.B, d.T);
    const real *q = n->in[0]->data, *k = n->in[1]->data, *v = n->in[2]->data;
#ifndef AG_DOUBLE
    // iarg[7], the CPU's choice of bf16 tiles, becomes the GPU's here (a
    // node on a GPU tape runs no CPU kernel): bf16 products if they are on
    // and the head dims have bf16 kernels, and the backward follows it.
    n->iarg[7] = cu_flash_bf16_takes(d.dk, d.dv);
    if (n->iarg[7]) {
        cu_flash_bf16_forward(n->tape, d, q, k, v, first, n->out[0]->data, (real *)n->saved);
        return;
    }
#endif
    if (fa_one_group(&d))
        fwd_launch<1>(d, q, k, v, first, n->out[0]->data, (real *)n->saved);
    else
        fwd_launch<FA_NG>(d, q, k, v, first, n->out[0]->data, (real *)n->saved);
}

// A prefill window (attn_prefix_forward's GPU twin): the forward above with
// the window's queries at slots pos .. pos+T0-1 of a decoding cache (kc, vc:
// (B, max_T, H*dk / H*dv)) whose keys and values are there already, row b
// from slot key0[b] on. No autograd.
extern "C" void cu_attn_prefix_forward(real *o, const real *q, const real *kc, const real *vc, int B, int max_T,
                                       int pos, int T0, const int *key0, const int *key0_dev, int H, int dk, int dv,
                                       double scale) {
    ASSERT(B >= 1 && T0 >= 1 && pos >= 0 && pos + T0 <= max_T && (key0 == NULL) == (key0_dev == NULL),
           "attn prefill (GPU): %d rows, a window of %d after %d of %d slots", B, T0, pos, max_T);
    for (int b = 0; key0 && b < B; b++)
        ASSERT(key0[b] >= 0 && key0[b] <= pos, "attn prefill (GPU): row %d starts at slot %d, after the window's %d",
               b, key0[b], pos);
    FaDims d = {B, T0, H, dk, dv, (real)scale, max_T, pos, key0_dev};
    ASSERT(d.dk <= FA_MAXD && d.dv <= FA_MAXD,
           "attention on the GPU: head dims dk %d, dv %d; the flash kernels take up to %d", d.dk, d.dv, FA_MAXD);
    if (fa_one_group(&d))
        fwd_launch<1>(d, q, kc, vc, NULL, o, NULL);
    else
        fwd_launch<FA_NG>(d, q, kc, vc, NULL, o, NULL);
}
