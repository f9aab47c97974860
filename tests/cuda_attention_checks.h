/*
 * tests/cuda_attention_checks.h — the CUDA attention kernels (src/kernels/cuda/attention.cu)
 * against the CPU kernels (src/kernels/cpu/attention.c, which tests/test_kernels.c checks
 * against double references and finite differences), run on the same random inputs.
 *
 *   1. forward: out and lse, every element, and nothing written past either;
 *   2. backward: dq, dk and dv accumulate into a gradient that starts random (a kernel that
 *      overwrote instead of adding would be off by that start), in a buffer with its own row
 *      stride whose padding columns must come back bit for bit (the tensor-core kernels'
 *      D workspace too: nothing written past it);
 *   3. determinism: two runs give the same bits (no atomics, no dependence on the order in
 *      which blocks run);
 *   4. a long sequence (T = 2048), and the shapes the kernels refuse;
 *   5. the same for the tensor-core kernels (attention_tc.cu, the bf16 policy's), on bf16
 *      inputs and within per-element bounds of their own bf16 rounding ("tensor cores",
 *      near the end, says how they are derived); their bf16 form (q, k, v and out in bf16)
 *      gives their fp32 form's bits, out rounded, dq, dk, dv rotated back by RoPE and
 *      rounded.
 *
 * Shapes are awkward on purpose: T = 1, 7, 13, 70 (two 64-key tiles), 97, 300 (partial last
 * tiles of 32 and 64); HS = 6, 8, 64, 128, 200 and 256 (the kernels' three instances, with
 * columns past HS in each); NH = 1 and 3; GQA (NH = 6, NKV = 2; NH = 3, NKV = 1); B = 1 and 2;
 * q/k/v inside a wider row with padding, and a gradient stride different from the input's.
 *
 * Included by tests/test_cuda.c, which defines before it the harness (harness.h), a check that
 * a GPU exists before any test runs, and the helpers used here: dev_upload (cudaMalloc + copy;
 * NULL after a recorded failure), dev_download (synchronous), their u16 forms, dev_put,
 * dev_free and fill_uniform.
 * Everything here is static and named cuda_att_*, apart from the test functions.
 *
 * Tolerances (of the fp32 kernels). u = 2^-24 ~ 6e-8. Both sides compute the same fp32 formulas with their sums in
 * other orders (the GPU's dot products in column order with fmaf, the CPU's in 8 or 16 lanes;
 * the GPU's online softmax rescales per 64 keys, the CPU's per 64 or 16), so they differ by
 * about the sum of two rounding errors, ~sqrt(K) u times the size of the partial sums of a
 * K-term sum, never by a different formula. The inputs: q and v in [-2, 2], k in [-2, 2] and
 * x3 past position 64 (|q_c k_c| up to 12, about 4 on average), dout in [-1, 1].
 *   - A score is scale = 1/sqrt(HS) times an HS-term dot whose partial sums random-walk to
 *     ~4 sqrt(HS), so it errs by ~sqrt(HS) u 4 sqrt(HS) scale = 4 sqrt(HS) u: 2e-6 at
 *     HS = 64, 4e-6 at 256. lse carries that as an absolute error (plus u |lse|, |lse| up to
 *     ~20), each softmax weight as a relative one, and out, their average of |v| <= 2, as up
 *     to twice that: lse 2e-5 absolute + 1e-6 relative, out 2e-5 absolute + 1e-5 relative.
 *   - A gradient sums up to T terms p (dp - D) times k, q or dout (dp and D are HS-term dots
 *     of ~sqrt(HS) in size), reaching ~6 here: each term carries the score's relative error
 *     and dp - D's absolute one (~HS u): 5e-5 absolute + 2e-5 relative.
 *   - Longer rows add their own rounding: the T-term sums of out, lse's sum and the gradients
 *     err by ~sqrt(T) u |sum|, and every online-softmax rescale (each 64 keys here, each 16
 *     on the CPU's AVX-512 path) by u relative. So every tolerance above, set for T <= 64, is
 *     multiplied by sqrt(T / 64) past T = 64 (cuda_att_length_factor).
 * Each sits at least 6x above the largest difference measured against the CPU's AVX-512
 * and portable paths (at T = 2048, HS = 128: out 9e-6 and lse 1e-5 against 1.1e-4), on a
 * CPU model of the kernels: this code, an OS thread per GPU thread, the host's expf (within
 * 2 ulp of the GPU's).
 */
#ifndef FLATSHARD_TESTS_CUDA_ATTENTION_CHECKS_H
#define FLATSHARD_TESTS_CUDA_ATTENTION_CHECKS_H

#include <cuda_runtime_api.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../src/kernels/cuda/cuda_kernels.h"
#include "flatshard/kernels.h"
#include "harness.h"

#define CUDA_ATT_GUARD 67 /* floats after each output, which the kernels must leave alone */

/* See the header comment for where each comes from. */
#define CUDA_ATT_OUT_ATOL 2e-5
#define CUDA_ATT_OUT_RTOL 1e-5
#define CUDA_ATT_LSE_ATOL 2e-5
#define CUDA_ATT_LSE_RTOL 1e-6
#define CUDA_ATT_GRAD_ATOL 5e-5
#define CUDA_ATT_GRAD_RTOL 2e-5
#define CUDA_ATT_BF16_U 0x1p-8 /* bf16's unit roundoff (8 significant bits, to nearest) */
#define CUDA_ATT_TC_FP32_FACTOR 4.0 /* the fp32 tolerances' factor for the tensor cores */

/* Which CUDA attention a check runs: the fp32 kernels (attention.cu) or the tensor-core ones
 * (attention_tc.cu; "tensor cores", near the end, says how their bounds are derived). */
typedef enum cuda_att_kind { CUDA_ATT_FP32, CUDA_ATT_TC } cuda_att_kind;

static const char *cuda_att_prefix(cuda_att_kind kind) { return kind == CUDA_ATT_TC ? "tc " : ""; }

/* The factor on the fp32 tolerances (header comment) for a kind. */
static double cuda_att_factor(cuda_att_kind kind) {
    return kind == CUDA_ATT_TC ? CUDA_ATT_TC_FP32_FACTOR : 1.0;
}

typedef struct cuda_att_shape {
    int64_t B, T, NH, NKV, HS;
    int64_t pad;  /* floats after v in each input row */
    int64_t dpad; /* floats after dv in each gradient row (its own stride) */
} cuda_att_shape;

static const cuda_att_shape cuda_att_shapes[] = {
    {1, 1, 1, 1, 8, 0, 0},    /* T = 1: a single key, p = 1 */
    {2, 7, 3, 1, 8, 0, 2},    /* NH = 3 sharing one kv head; one partial tile */
    {2, 13, 6, 2, 6, 5, 0},   /* GQA 6/2, HS = 6, padded input rows */
    {1, 70, 1, 1, 8, 3, 1},   /* two 64-key tiles: the online softmax rescales */
    {2, 300, 6, 2, 64, 7, 3}, /* GQA at HS = 64, five query tiles, partial last tiles */
    {1, 97, 3, 1, 128, 0, 5}, /* HS = 128 */
    {1, 45, 2, 2, 200, 1, 0}, /* HS = 200: the widest instance with columns past HS */
    {1, 33, 2, 1, 256, 0, 0}, /* HS = 256, the largest */
};

/* One shape's inputs, and the CPU forward, which both backward kernels take as their input
 * (so that the backward comparison sees only the backward's differences). */
typedef struct cuda_att_case {
    cuda_att_shape s;
    int64_t N, C, ld, ldd; /* N = B T rows, C = NH HS; row strides of qkv and the gradient */
    float *qkv;            /* (N, ld): q at column 0, k at C, v at (NH + NKV) HS */
    float *out, *lse;      /* the CPU forward: (N, C) and (B, NH, T) */
    float *dout;           /* (N, C) */
    float *g0;             /* (N, ldd) the gradient's starting values, random */
} cuda_att_case;

static float *cuda_att_alloc(int64_t n) {
    float *p = malloc((size_t)(n > 0 ? n : 1) * sizeof(float));
    if (!p) {
        fprintf(stderr, "test_cuda: out of memory\n");
        exit(2);
    }
    return p;
}

/* x rounded to bf16 in place (to nearest even, as the tensor-core kernels stage their inputs):
 * the inputs the tensor-core checks give both sides, so that the staging is exact and only
 * the kernels' own roundings (of p and ds) differ from the CPU. */
static void cuda_att_round_bf16(float *x, int64_t n) {
    for (int64_t i = 0; i < n; i++) x[i] = fs_bf16_to_fp32(fs_fp32_to_bf16(x[i]));
}

static void cuda_att_make(cuda_att_case *c, cuda_att_shape s, int bf16) {
    c->s = s;
    c->N = s.B * s.T;
    c->C = s.NH * s.HS;
    c->ld = (s.NH + 2 * s.NKV) * s.HS + s.pad;
    c->ldd = (s.NH + 2 * s.NKV) * s.HS + s.dpad;
    c->qkv = cuda_att_alloc(c->N * c->ld);
    fill_uniform(c->qkv, c->N * c->ld, -2.0f, 2.0f);
    /* keys past the first 64-key tile score higher, so that rows there find a larger max in a
     * later tile and the online softmax must rescale what it summed before */
    for (int64_t n = 0; n < c->N; n++)
        if (n % s.T >= 64)
            for (int64_t col = c->C; col < (s.NH + s.NKV) * s.HS; col++)
                c->qkv[n * c->ld + col] *= 3.0f;
    if (bf16) cuda_att_round_bf16(c->qkv, c->N * c->ld);
    c->out = cuda_att_alloc(c->N * c->C);
    c->lse = cuda_att_alloc(s.B * s.NH * s.T);
    fs_attention_forward(NULL, c->out, c->lse, c->qkv, c->qkv + c->C,
                         c->qkv + (s.NH + s.NKV) * s.HS, c->ld, s.B, s.T, s.NH, s.NKV, s.HS);
    c->dout = cuda_att_alloc(c->N * c->C);
    fill_uniform(c->dout, c->N * c->C, -1.0f, 1.0f);
    if (bf16) cuda_att_round_bf16(c->dout, c->N * c->C);
    c->g0 = cuda_att_alloc(c->N * c->ldd);
    fill_uniform(c->g0, c->N * c->ldd, -1.0f, 1.0f);
}

static void cuda_att_free(cuda_att_case *c) {
    free(c->qkv), free(c->out), free(c->lse), free(c->dout), free(c->g0);
}

static void cuda_att_name(char *name, size_t size, const char *what, const cuda_att_shape *s) {
    snprintf(name, size, "cuda attention %s B=%lld T=%lld NH=%lld NKV=%lld HS=%lld", what,
             (long long)s->B, (long long)s->T, (long long)s->NH, (long long)s->NKV,
             (long long)s->HS);
}

/* got against the CPU's float results want, both n long, with CHECK_CLOSE's rule. */
static void cuda_att_close(const char *what, const cuda_att_shape *s, const float *got,
                           const float *want, int64_t n, double atol, double rtol) {
    double *w = malloc((size_t)(n > 0 ? n : 1) * sizeof(double));
    if (!w) {
        fprintf(stderr, "test_cuda: out of memory\n");
        exit(2);
    }
    for (int64_t i = 0; i < n; i++) w[i] = (double)want[i];
    char name[192];
    cuda_att_name(name, sizeof name, what, s);
    CHECK_CLOSE(name, got, w, n, atol, rtol);
    free(w);
}

/* got against want, element i within bound[i] + atol + rtol |want[i]|; the worst element is
 * reported with its bound. */
static void cuda_att_close_bounded(const char *what, const cuda_att_shape *s, const float *got,
                                   const float *want, const double *bound, int64_t n,
                                   double atol, double rtol) {
    int64_t worst = -1;
    double worst_excess = 0.0, max_err = 0.0, max_ratio = 0.0;
    for (int64_t i = 0; i < n; i++) {
        const double g = got[i], w = want[i], tol = bound[i] + atol + rtol * fabs(w);
        const double err = fabs(g - w);
        const double excess = isfinite(g) ? err - tol : INFINITY;
        if (isfinite(err) && err > max_err) max_err = err;
        if (isfinite(err) && err / tol > max_ratio) max_ratio = err / tol;
        if (excess > 0 && (worst < 0 || excess > worst_excess)) worst = i, worst_excess = excess;
    }
    char name[192];
    cuda_att_name(name, sizeof name, what, s);
    if (worst >= 0)
        CHECK(0,
              "%s: element %lld is %.9g, expected %.9g (|err| %.3g > bf16 bound %.3g + atol %.3g "
              "+ rtol %.3g*|want|); max |err| %.3g over %lld elements",
              name, (long long)worst, (double)got[worst], (double)want[worst],
              fabs((double)got[worst] - want[worst]), bound[worst], atol, rtol, max_err,
              (long long)n);
    else
        printf("     (%s: max |err| %.3g, at most %.2f of its tolerance)\n", name, max_err,
               max_ratio);
}

/* got against want: with cuda_att_close's rule where bound is NULL, else with
 * cuda_att_close_bounded's. */
static void cuda_att_compare(const char *what, const cuda_att_shape *s, const float *got,
                             const float *want, const double *bound, int64_t n, double atol,
                             double rtol) {
    if (bound)
        cuda_att_close_bounded(what, s, got, want, bound, n, atol, rtol);
    else
        cuda_att_close(what, s, got, want, n, atol, rtol);
}

/* Columns [col0, col0 + width) of the rows of x (row stride ld) into dense (N, width). */
static float *cuda_att_columns(const float *x, int64_t N, int64_t ld, int64_t col0,
                               int64_t width) {
    float *d = cuda_att_alloc(N * width);
    for (int64_t n = 0; n < N; n++)
        memcpy(d + n * width, x + n * ld + col0, (size_t)width * sizeof(float));
    return d;
}

/* n + CUDA_ATT_GUARD floats: x's n (random where x is NULL), then random guard floats. */
static float *cuda_att_guarded(const float *x, int64_t n) {
    float *g = cuda_att_alloc(n + CUDA_ATT_GUARD);
    if (x)
        memcpy(g, x, (size_t)n * sizeof(float));
    else
        fill_uniform(g, n, -1.0f, 1.0f);
    fill_uniform(g + n, CUDA_ATT_GUARD, 10.0f, 20.0f);
    return g;
}

/* The tolerances' growth with the row length: sums of up to T terms and up to T / 16 softmax
 * rescales, whose rounding grows like sqrt(T); the base tolerances hold up to T = 64 (see the
 * header comment). */
static double cuda_att_length_factor(int64_t T) {
    return T > 64 ? sqrt((double)T / 64.0) : 1.0;
}

static void cuda_att_sync(void) {
    cudaError_t err = cudaDeviceSynchronize();
    CHECK(err == cudaSuccess, "cudaDeviceSynchronize: %s", cudaGetErrorString(err));
}

/* The CUDA forward of c on device copies: out (N C + guard) and lse (B NH T + guard) are
 * uploaded from the host buffers (their starting values and guards) and downloaded back
 * into them. Returns 0 if an upload failed (recorded by dev_upload). */
static int cuda_att_run_forward(const cuda_att_case *c, float *out, float *lse,
                                cuda_att_kind kind) {
    const cuda_att_shape s = c->s;
    const int64_t nout = c->N * c->C + CUDA_ATT_GUARD, nlse = s.B * s.NH * s.T + CUDA_ATT_GUARD;
    float *d_qkv = dev_upload(c->qkv, c->N * c->ld);
    float *d_out = dev_upload(out, nout), *d_lse = dev_upload(lse, nlse);
    const int ok = d_qkv && d_out && d_lse;
    if (ok) {
        fs_status (*forward)(void *, float *, float *, const float *, const float *,
                             const float *, int64_t, int64_t, int64_t, int64_t, int64_t,
                             int64_t) =
            kind == CUDA_ATT_TC ? fs_cuda_attention_tc_forward : fs_cuda_attention_forward;
        CHECK_OK(forward(NULL, d_out, d_lse, d_qkv, d_qkv + c->C, d_qkv + (s.NH + s.NKV) * s.HS,
                         c->ld, s.B, s.T, s.NH, s.NKV, s.HS));
        cuda_att_sync();
        dev_download(out, d_out, nout);
        dev_download(lse, d_lse, nlse);
    }
    if (d_qkv) dev_free(d_qkv);
    if (d_out) dev_free(d_out);
    if (d_lse) dev_free(d_lse);
    return ok;
}

/* The CUDA backward of c from the CPU forward's out and lse, into g (N ldd + guard), which is
 * uploaded (the starting gradient and guard) and downloaded back. The tensor-core kernels
 * also get their D workspace (B NH T), followed by a guard they must leave alone. Returns 0
 * if an upload failed (recorded by dev_upload). */
static int cuda_att_run_backward(const cuda_att_case *c, float *g, cuda_att_kind kind) {
    const cuda_att_shape s = c->s;
    const int64_t kcol = c->C, vcol = (s.NH + s.NKV) * s.HS, nd = s.B * s.NH * s.T;
    float *d_qkv = dev_upload(c->qkv, c->N * c->ld), *d_out = dev_upload(c->out, c->N * c->C);
    float *d_lse = dev_upload(c->lse, nd);
    float *d_dout = dev_upload(c->dout, c->N * c->C);
    float *d_g = dev_upload(g, c->N * c->ldd + CUDA_ATT_GUARD);
    const int tc = kind == CUDA_ATT_TC;
    float *delta = tc ? cuda_att_guarded(NULL, nd) : NULL;
    float *d_delta = tc ? dev_upload(delta, nd + CUDA_ATT_GUARD) : NULL;
    const int ok = d_qkv && d_out && d_lse && d_dout && d_g && (d_delta || !tc);
    if (ok) {
        if (tc)
            CHECK_OK(fs_cuda_attention_tc_backward(NULL, d_g, d_g + kcol, d_g + vcol, c->ldd,
                                                   d_delta, d_dout, d_qkv, d_qkv + kcol,
                                                   d_qkv + vcol, c->ld, d_out, d_lse, s.B, s.T,
                                                   s.NH, s.NKV, s.HS));
        else
            CHECK_OK(fs_cuda_attention_backward(NULL, d_g, d_g + kcol, d_g + vcol, c->ldd, d_dout,
                                                d_qkv, d_qkv + kcol, d_qkv + vcol, c->ld, d_out,
                                                d_lse, s.B, s.T, s.NH, s.NKV, s.HS));
        cuda_att_sync();
        dev_download(g, d_g, c->N * c->ldd + CUDA_ATT_GUARD);
    }
    if (ok && tc) {
        float *after = cuda_att_alloc(nd + CUDA_ATT_GUARD);
        dev_download(after, d_delta, nd + CUDA_ATT_GUARD);
        char name[192];
        cuda_att_name(name, sizeof name, "tc backward", &s);
        CHECK(memcmp(after + nd, delta + nd, CUDA_ATT_GUARD * sizeof(float)) == 0,
              "%s: wrote past the end of its D workspace", name);
        free(after);
    }
    if (d_qkv) dev_free(d_qkv);
    if (d_out) dev_free(d_out);
    if (d_lse) dev_free(d_lse);
    if (d_dout) dev_free(d_dout);
    if (d_g) dev_free(d_g);
    if (d_delta) dev_free(d_delta);
    free(delta);
    return ok;
}

/* The forward of one case through kind's kernel against the CPU: every element of out
 * (within bout, per element, where it is not NULL: the tensor cores' bf16 bounds) and lse,
 * and the guards after them untouched. */
static void cuda_att_check_forward(const cuda_att_case *c, cuda_att_kind kind,
                                   const double *bout) {
    const cuda_att_shape s = c->s;
    const int64_t nout = c->N * c->C, nlse = s.B * s.NH * s.T;
    const double f = cuda_att_length_factor(s.T) * cuda_att_factor(kind);
    const char *pre = cuda_att_prefix(kind);
    float *out = cuda_att_guarded(NULL, nout), *lse = cuda_att_guarded(NULL, nlse);
    float *out0 = cuda_att_alloc(nout + CUDA_ATT_GUARD);
    float *lse0 = cuda_att_alloc(nlse + CUDA_ATT_GUARD);
    memcpy(out0, out, (size_t)(nout + CUDA_ATT_GUARD) * sizeof(float));
    memcpy(lse0, lse, (size_t)(nlse + CUDA_ATT_GUARD) * sizeof(float));
    if (cuda_att_run_forward(c, out, lse, kind)) {
        char what[32], name[192];
        snprintf(what, sizeof what, "%sout", pre);
        cuda_att_compare(what, &s, out, c->out, bout, nout, CUDA_ATT_OUT_ATOL * f,
                         CUDA_ATT_OUT_RTOL * f);
        snprintf(what, sizeof what, "%slse", pre);
        cuda_att_close(what, &s, lse, c->lse, nlse, CUDA_ATT_LSE_ATOL * f, CUDA_ATT_LSE_RTOL * f);
        snprintf(what, sizeof what, "%sforward", pre);
        cuda_att_name(name, sizeof name, what, &s);
        CHECK(memcmp(out + nout, out0 + nout, CUDA_ATT_GUARD * sizeof(float)) == 0,
              "%s: wrote past the end of out", name);
        CHECK(memcmp(lse + nlse, lse0 + nlse, CUDA_ATT_GUARD * sizeof(float)) == 0,
              "%s: wrote past the end of lse", name);
    }
    free(out), free(lse), free(out0), free(lse0);
}

/* The backward of one case through kind's kernels against the CPU's, both accumulating into
 * the same random start: dq, dk and dv element by element (within bg, in the gradient's
 * layout, where it is not NULL); the gradient's padding columns and the guard after it bit
 * for bit. */
static void cuda_att_check_backward(const cuda_att_case *c, cuda_att_kind kind,
                                    const double *bg) {
    const cuda_att_shape s = c->s;
    const int64_t ng = c->N * c->ldd, kv = s.NKV * s.HS;
    const int64_t kcol = c->C, vcol = (s.NH + s.NKV) * s.HS, width = vcol + kv;
    const double f = cuda_att_length_factor(s.T) * cuda_att_factor(kind);
    const char *pre = cuda_att_prefix(kind);
    float *want = cuda_att_alloc(ng);
    memcpy(want, c->g0, (size_t)ng * sizeof(float));
    fs_attention_backward(NULL, want, want + kcol, want + vcol, c->ldd, c->dout, c->qkv,
                          c->qkv + kcol, c->qkv + vcol, c->ld, c->out, c->lse, s.B, s.T, s.NH,
                          s.NKV, s.HS);
    float *g = cuda_att_guarded(c->g0, ng), *g0 = cuda_att_alloc(ng + CUDA_ATT_GUARD);
    memcpy(g0, g, (size_t)(ng + CUDA_ATT_GUARD) * sizeof(float));
    if (cuda_att_run_backward(c, g, kind)) {
        const struct {
            const char *what;
            int64_t col, width;
        } parts[3] = {{"dq", 0, c->C}, {"dk", kcol, kv}, {"dv", vcol, kv}};
        char what[32], name[192];
        for (int p = 0; p < 3; p++) {
            const int64_t n = c->N * parts[p].width;
            float *got_p = cuda_att_columns(g, c->N, c->ldd, parts[p].col, parts[p].width);
            float *want_p = cuda_att_columns(want, c->N, c->ldd, parts[p].col, parts[p].width);
            double *b_p = NULL;
            if (bg) {
                b_p = malloc((size_t)(n > 0 ? n : 1) * sizeof(double));
                if (!b_p) {
                    fprintf(stderr, "test_cuda: out of memory\n");
                    exit(2);
                }
                for (int64_t r = 0; r < c->N; r++)
                    memcpy(b_p + r * parts[p].width, bg + r * c->ldd + parts[p].col,
                           (size_t)parts[p].width * sizeof(double));
            }
            snprintf(what, sizeof what, "%s%s", pre, parts[p].what);
            cuda_att_compare(what, &s, got_p, want_p, b_p, n, CUDA_ATT_GRAD_ATOL * f,
                             CUDA_ATT_GRAD_RTOL * f);
            free(got_p), free(want_p), free(b_p);
        }
        snprintf(what, sizeof what, "%sbackward", pre);
        cuda_att_name(name, sizeof name, what, &s);
        int64_t touched = 0;
        for (int64_t n = 0; n < c->N; n++)
            if (memcmp(g + n * c->ldd + width, g0 + n * c->ldd + width,
                       (size_t)s.dpad * sizeof(float)) != 0)
                touched++;
        CHECK(touched == 0, "%s: the padding columns of %lld gradient rows changed", name,
              (long long)touched);
        CHECK(memcmp(g + ng, g0 + ng, CUDA_ATT_GUARD * sizeof(float)) == 0,
              "%s: wrote past the end of the gradient", name);
    }
    free(want), free(g), free(g0);
}

/* check on each of n shapes, made with inputs rounded to bf16 where bf16 is set. */
static void cuda_att_each(const cuda_att_shape *shapes, size_t n, int bf16,
                          void (*check)(const cuda_att_case *)) {
    for (size_t i = 0; i < n; i++) {
        cuda_att_case c;
        cuda_att_make(&c, shapes[i], bf16);
        check(&c);
        cuda_att_free(&c);
    }
}

static void cuda_att_fp32_forward(const cuda_att_case *c) {
    cuda_att_check_forward(c, CUDA_ATT_FP32, NULL);
}
static void cuda_att_fp32_backward(const cuda_att_case *c) {
    cuda_att_check_backward(c, CUDA_ATT_FP32, NULL);
}
static void cuda_att_fp32_both(const cuda_att_case *c) {
    cuda_att_fp32_forward(c);
    cuda_att_fp32_backward(c);
}

/* Two runs of kind's kernels on c's inputs give the same bits in out, lse and the gradient;
 * for a kind other than fp32, out is also near the fp32 kernel's (the inputs are not bf16
 * numbers there, so that the staging's rounding runs too). */
static void cuda_att_check_twice(const cuda_att_case *c, cuda_att_kind kind) {
    const cuda_att_shape s = c->s;
    const int64_t nout = c->N * c->C, nlse = s.B * s.NH * s.T, ng = c->N * c->ldd;
    float *out[2], *lse[2], *g[2];
    int ok = 1;
    for (int r = 0; r < 2; r++) {
        out[r] = cuda_att_guarded(NULL, nout);
        lse[r] = cuda_att_guarded(NULL, nlse);
        g[r] = cuda_att_guarded(c->g0, ng);
        ok = ok && cuda_att_run_forward(c, out[r], lse[r], kind) &&
             cuda_att_run_backward(c, g[r], kind);
    }
    char what[32], name[192];
    snprintf(what, sizeof what, "%srun twice", cuda_att_prefix(kind));
    cuda_att_name(name, sizeof name, what, &s);
    /* the first n elements: the guards were drawn at random per run */
    CHECK(!ok || memcmp(out[0], out[1], (size_t)nout * sizeof(float)) == 0, "%s: out differs",
          name);
    CHECK(!ok || memcmp(lse[0], lse[1], (size_t)nlse * sizeof(float)) == 0, "%s: lse differs",
          name);
    CHECK(!ok || memcmp(g[0], g[1], (size_t)ng * sizeof(float)) == 0, "%s: dq, dk, dv differ",
          name);
    /* and they are the attention at all: near the fp32 kernel's output. The inputs are not
     * bf16 numbers here, so the staging's rounding of q and k moves each score by ~2^-8
     * |q_c k_c| scale sqrt(HS) / sqrt(3), ~1e-2 at the k x 3 past position 64, and out by
     * less than that relative (4.5e-3 in the host emulation of the tensor-core kernels);
     * 5e-2 of the norm leaves 10x, and anything but attention (a wrong head, mask or scale)
     * is off by a large fraction of it */
    if (ok && kind != CUDA_ATT_FP32) {
        float *ref = cuda_att_guarded(NULL, nout), *rlse = cuda_att_guarded(NULL, nlse);
        if (cuda_att_run_forward(c, ref, rlse, CUDA_ATT_FP32)) {
            double dd = 0.0, rr = 0.0;
            for (int64_t e = 0; e < nout; e++) {
                const double d = (double)out[0][e] - ref[e];
                dd += d * d;
                rr += (double)ref[e] * ref[e];
            }
            const double rel = sqrt(dd / (rr > 0.0 ? rr : 1.0));
            CHECK(rel < 0.05, "%s: out is %.3g (relative, L2) from the fp32 kernel's", name, rel);
        }
        free(ref), free(rlse);
    }
    for (int r = 0; r < 2; r++) free(out[r]), free(lse[r]), free(g[r]);
}

static void cuda_att_fp32_twice(const cuda_att_case *c) { cuda_att_check_twice(c, CUDA_ATT_FP32); }

#define CUDA_ATT_COUNT(a) (sizeof(a) / sizeof((a)[0]))

static void test_cuda_attention_forward(void) {
    cuda_att_each(cuda_att_shapes, CUDA_ATT_COUNT(cuda_att_shapes), 0, cuda_att_fp32_forward);
}

static void test_cuda_attention_backward(void) {
    cuda_att_each(cuda_att_shapes, CUDA_ATT_COUNT(cuda_att_shapes), 0, cuda_att_fp32_backward);
}

/* A training-length row at each of the models' head sizes: 32 key tiles per row, the
 * dk/dv blocks walk 64 query tiles. */
static void test_cuda_attention_long(void) {
    static const cuda_att_shape shapes[] = {{1, 2048, 2, 1, 64, 0, 0}, {1, 2048, 2, 2, 128, 4, 0}};
    cuda_att_each(shapes, CUDA_ATT_COUNT(shapes), 0, cuda_att_fp32_both);
}

/* Two runs of each kernel on the same inputs give the same bits: GQA (three query heads per
 * kv head summed into dk, dv), several tiles each way, both common head sizes. */
static void test_cuda_attention_deterministic(void) {
    static const cuda_att_shape shapes[] = {{2, 300, 6, 2, 64, 3, 1}, {1, 200, 3, 1, 128, 0, 0}};
    cuda_att_each(shapes, CUDA_ATT_COUNT(shapes), 0, cuda_att_fp32_twice);
}

/* Shapes outside what the kernels handle are refused before anything is launched, and an
 * empty batch launches nothing (an empty grid would be a CUDA error). */
static void test_cuda_attention_shapes(void) {
    /* HS 257 > 256; NH not a multiple of NKV; NKV 0 */
    CHECK(fs_cuda_attention_forward(NULL, NULL, NULL, NULL, NULL, NULL, 771, 1, 4, 1, 1, 257) ==
              FS_ERR_USAGE,
          "HS = 257 accepted");
    CHECK(strstr(fs_error_message(), "attention") != NULL, "message '%s' names no kernel",
          fs_error_message());
    CHECK(fs_cuda_attention_backward(NULL, NULL, NULL, NULL, 56, NULL, NULL, NULL, NULL, 56,
                                     NULL, NULL, 1, 4, 3, 2, 8) == FS_ERR_USAGE,
          "NH = 3, NKV = 2 accepted");
    CHECK(fs_cuda_attention_forward(NULL, NULL, NULL, NULL, NULL, NULL, 24, 1, 4, 1, 0, 8) ==
              FS_ERR_USAGE,
          "NKV = 0 accepted");
    CHECK_OK(fs_cuda_attention_forward(NULL, NULL, NULL, NULL, NULL, NULL, 24, 1, 0, 1, 1, 8));
    CHECK_OK(fs_cuda_attention_backward(NULL, NULL, NULL, NULL, 24, NULL, NULL, NULL, NULL, 24,
                                        NULL, NULL, 0, 5, 1, 1, 8));
    cuda_att_sync();
}

/* ------------------------------------------------------------------ tensor cores
 * The tensor-core kernels (attention_tc.cu, the bf16 policy's) against the CPU kernels on
 * inputs that are bf16 numbers already: q, k, v and dout are rounded to bf16 here, before
 * the CPU forward and backward see them, so the kernels' staging (which rounds to bf16) is
 * exact and the CPU computes in fp32 exactly what an exact kernel would. What is left is
 * what the kernels round themselves, and the order of their fp32 sums:
 *   - out = sum_u p_u v_u / l with each (unnormalised) p_u rounded to bf16 before the
 *     product: bf16 keeps 8 significant bits, so rounding to nearest moves p_u by at most
 *     2^-8 p_u, and |out err| <= 2^-8 sum_u p_u |v_u| (p normalised), per element;
 *   - dv = sum_t p_tu dout_t with p rounded: |err| <= 2^-8 sum_t p_tu |dout_t|;
 *   - dq = scale sum_u ds_tu k_u and dk = scale sum_t ds_tu q_t with ds (fp32, from the fp32
 *     p, dp and D) rounded to bf16: |err| <= 2^-8 scale sum |ds| |k| (resp. |q|);
 *   - lse, and the scores, p, dp and D under everything above, differ from the CPU only by
 *     fp32 rounding in other orders: the fp32 kernel's tolerances (header comment), times 4,
 *     since the tensor cores' fp32 accumulation is not specified to round to nearest like an
 *     IEEE add (its alignment may truncate), and the kernels use exp2 of a score scaled by
 *     log2(e), which adds a few fp32 ulps of the exponent.
 * The first four bounds are computed per element in double (cuda_att_tc_bounds, from the
 * exact softmax of the same inputs) and added to the fp32 part. They are worst cases (every
 * rounding in the same direction), nearly reached only by rows with a few keys, where one
 * rounding dominates: a host emulation of these kernels (tools/attention_tc_emu: one
 * thread per GPU thread, the PTX fragment layouts) on shapes like those below came to
 * 0.36-0.80 of them, and 0.01 of the lse tolerance. Still ~2^-8 of the result's scale: a
 * wrong mask, head, tile offset or rescale moves an element by a large fraction of its
 * size and fails.
 */
static const cuda_att_shape cuda_att_tc_shapes[] = {
    {1, 1, 1, 1, 64, 0, 0},    /* T = 1: one key, p = 1 */
    {2, 7, 3, 1, 64, 0, 2},    /* GQA 3/1, B = 2, one partial tile */
    {1, 70, 4, 1, 128, 3, 1},  /* GQA 4/1 at HS = 128, a second tile of 6 keys */
    {2, 300, 6, 2, 64, 7, 3},  /* GQA 3/1 twice, five tiles, the last one partial */
    {1, 97, 3, 3, 128, 0, 5},  /* GQA 1/1 (plain multi-head) at HS = 128 */
    {2, 129, 4, 4, 64, 1, 0},  /* one row past two full tiles */
    {1, 64, 2, 1, 128, 0, 0},  /* exactly one tile: the diagonal mask alone */
};

/* The per-element bounds of what the tensor-core kernels round (see above), in double:
 * bout (N, C) for out, bg (N, ldd) for dq, dk, dv in the gradient's layout (padding 0). */
static void cuda_att_tc_bounds(const cuda_att_case *c, double *bout, double *bg) {
    const cuda_att_shape s = c->s;
    const int64_t HS = s.HS, T = s.T, group = s.NH / s.NKV, ld = c->ld, ldd = c->ldd;
    const int64_t kcol = c->C, vcol = (s.NH + s.NKV) * HS;
    const double scale = 1.0 / sqrt((double)HS), ub = CUDA_ATT_BF16_U;
    memset(bout, 0, (size_t)(c->N * c->C) * sizeof(double));
    memset(bg, 0, (size_t)(c->N * ldd) * sizeof(double));
    double *p = malloc((size_t)T * sizeof(double)), *ds = malloc((size_t)T * sizeof(double));
    double *o = malloc((size_t)HS * sizeof(double));
    if (!p || !ds || !o) {
        fprintf(stderr, "test_cuda: out of memory\n");
        exit(2);
    }
    for (int64_t b = 0; b < s.B; b++)
        for (int64_t h = 0; h < s.NH; h++) {
            const int64_t kv = h / group;
            for (int64_t t = 0; t < T; t++) {
                const float *qt = c->qkv + (b * T + t) * ld + h * HS;
                const float *dot = c->dout + (b * T + t) * c->C + h * HS;
                double mx = -INFINITY, sum = 0.0, D = 0.0;
                for (int64_t u = 0; u <= t; u++) {
                    const float *ku = c->qkv + (b * T + u) * ld + kcol + kv * HS;
                    double d = 0.0;
                    for (int64_t col = 0; col < HS; col++) d += (double)qt[col] * ku[col];
                    p[u] = scale * d;
                    if (p[u] > mx) mx = p[u];
                }
                for (int64_t u = 0; u <= t; u++) sum += exp(p[u] - mx);
                const double lse = mx + log(sum);
                for (int64_t col = 0; col < HS; col++) o[col] = 0.0;
                for (int64_t u = 0; u <= t; u++) {
                    p[u] = exp(p[u] - lse);
                    const float *vu = c->qkv + (b * T + u) * ld + vcol + kv * HS;
                    for (int64_t col = 0; col < HS; col++) o[col] += p[u] * vu[col];
                }
                for (int64_t col = 0; col < HS; col++) D += (double)dot[col] * o[col];
                double *bo = bout + (b * T + t) * c->C + h * HS;
                double *bq = bg + (b * T + t) * ldd + h * HS;
                for (int64_t u = 0; u <= t; u++) {
                    const float *ku = c->qkv + (b * T + u) * ld + kcol + kv * HS;
                    const float *vu = c->qkv + (b * T + u) * ld + vcol + kv * HS;
                    double dp = 0.0;
                    for (int64_t col = 0; col < HS; col++) dp += (double)dot[col] * vu[col];
                    ds[u] = fabs(p[u] * (dp - D));
                    double *bk = bg + (b * T + u) * ldd + kcol + kv * HS;
                    double *bv = bg + (b * T + u) * ldd + vcol + kv * HS;
                    for (int64_t col = 0; col < HS; col++) {
                        bo[col] += ub * p[u] * fabs((double)vu[col]);
                        bq[col] += ub * scale * ds[u] * fabs((double)ku[col]);
                        bk[col] += ub * scale * ds[u] * fabs((double)qt[col]);
                        bv[col] += ub * p[u] * fabs((double)dot[col]);
                    }
                }
            }
        }
    free(p), free(ds), free(o);
}

/* One case (made with bf16 inputs) through the tensor-core forward and backward, against the
 * CPU: out, lse, dq, dk, dv within their bounds; the guards and the gradient's padding
 * columns untouched. */
static void cuda_att_tc_check(const cuda_att_case *c) {
    const int64_t nout = c->N * c->C, ng = c->N * c->ldd;
    double *bout = malloc((size_t)(nout > 0 ? nout : 1) * sizeof(double));
    double *bg = malloc((size_t)(ng > 0 ? ng : 1) * sizeof(double));
    if (!bout || !bg) {
        fprintf(stderr, "test_cuda: out of memory\n");
        exit(2);
    }
    cuda_att_tc_bounds(c, bout, bg);
    cuda_att_check_forward(c, CUDA_ATT_TC, bout);
    cuda_att_check_backward(c, CUDA_ATT_TC, bg);
    free(bout), free(bg);
}

static void cuda_att_tc_twice(const cuda_att_case *c) { cuda_att_check_twice(c, CUDA_ATT_TC); }

static void test_cuda_attention_tc(void) {
    cuda_att_each(cuda_att_tc_shapes, CUDA_ATT_COUNT(cuda_att_tc_shapes), 1, cuda_att_tc_check);
}

/* Training lengths at both head sizes: 32 (16) key tiles per row, the dk/dv blocks walk 64
 * (32) query tiles per head. */
static void test_cuda_attention_tc_long(void) {
    static const cuda_att_shape shapes[] = {{1, 2048, 2, 1, 64, 0, 0}, {1, 1024, 2, 2, 128, 4, 0}};
    cuda_att_each(shapes, CUDA_ATT_COUNT(shapes), 1, cuda_att_tc_check);
}

/* Two runs of the tensor-core kernels give the same bits (on inputs that are not bf16
 * numbers, so the staging's rounding runs too), and near the fp32 kernel's. */
static void test_cuda_attention_tc_deterministic(void) {
    static const cuda_att_shape shapes[] = {{2, 300, 6, 2, 64, 3, 1}, {1, 200, 4, 1, 128, 0, 0}};
    cuda_att_each(shapes, CUDA_ATT_COUNT(shapes), 0, cuda_att_tc_twice);
}

/* The kernels' bf16 form (q, k, v and out in bf16: the bf16 route's entries) against their
 * fp32 form on the same values widened: out is the fp32 form's rounded (fs_fp32_to_bf16), lse
 * and the D workspace are its bits, and dq, dk, dv (written in bf16, rotated back by RoPE) are
 * the fp32 form's added into zeros, then fs_rope_backward on dq and dk (the CPU's, the bits of
 * fs_cuda_rope_backward), then rounded; the gradient rows' padding is left as it was. The
 * inputs are bf16 numbers (cuda_att_each's bf16 = 1) and the backward reads the CPU forward's
 * out rounded to bf16, in both forms. */
static void cuda_att_tc_bf16_form(const cuda_att_case *c) {
    const cuda_att_shape s = c->s;
    const int64_t nqkv = c->N * c->ld, nout = c->N * c->C, nd = s.B * s.NH * s.T;
    const int64_t ng = c->N * c->ldd, kcol = c->C, vcol = (s.NH + s.NKV) * s.HS;
    const int64_t ntab = s.T * (s.HS / 2), width = (s.NH + 2 * s.NKV) * s.HS;
    uint16_t *qkv16 = malloc((size_t)(nqkv > 0 ? nqkv : 1) * sizeof(uint16_t));
    uint16_t *o16 = malloc((size_t)(nout > 0 ? nout : 1) * sizeof(uint16_t));
    uint16_t *got16 = malloc((size_t)(nout > 0 ? nout : 1) * sizeof(uint16_t));
    uint16_t *g16 = malloc((size_t)(ng > 0 ? ng : 1) * sizeof(uint16_t));
    float *ow = cuda_att_alloc(nout), *out32 = cuda_att_alloc(nout);
    float *lse[2] = {cuda_att_alloc(nd), cuda_att_alloc(nd)}, *g = cuda_att_alloc(ng);
    float *delta[2] = {cuda_att_alloc(nd), cuda_att_alloc(nd)};
    float *cs = cuda_att_alloc(ntab), *sn = cuda_att_alloc(ntab);
    if (!qkv16 || !o16 || !got16 || !g16) {
        fprintf(stderr, "test_cuda: out of memory\n");
        exit(2);
    }
    fs_rope_table(cs, sn, s.T, s.HS, 10000.0f);
    memset(g16, 0xff, (size_t)(ng > 0 ? ng : 1) * sizeof(uint16_t)); /* overwritten on the GPU too */
    for (int64_t i = 0; i < nqkv; i++) qkv16[i] = fs_fp32_to_bf16(c->qkv[i]);
    for (int64_t i = 0; i < nout; i++) o16[i] = fs_fp32_to_bf16(c->out[i]), ow[i] = fs_bf16_to_fp32(o16[i]);
    float *d_qkv = dev_upload(c->qkv, nqkv), *d_ow = dev_upload(ow, nout);
    uint16_t *d_qkv16 = dev_upload_u16(qkv16, nqkv), *d_o16 = dev_upload_u16(o16, nout);
    float *d_dout = dev_upload(c->dout, nout), *d_lse = dev_upload(c->lse, nd);
    float *d_out32 = dev_upload(ow, nout), *d_lseo = dev_upload(c->lse, nd); /* NaN-filled below */
    uint16_t *d_out16 = dev_upload_u16(o16, nout);
    float *d_g = dev_upload(c->g0, ng), *d_delta = dev_upload(c->lse, nd); /* NaN-filled below */
    uint16_t *d_g16 = dev_upload_u16(g16, ng);                            /* 0xffff-filled below */
    float *d_cs = dev_upload(cs, ntab), *d_sn = dev_upload(sn, ntab);
    if (d_qkv && d_ow && d_qkv16 && d_o16 && d_dout && d_lse && d_out32 && d_lseo && d_out16 && d_g &&
        d_delta && d_g16 && d_cs && d_sn) {
        for (int form = 0; form < 2; form++) { /* 0: fp32, 1: bf16 */
            /* what each form must write starts as NaN (bf16: 0xffff), so that an element left
             * over from the other form, or never written, shows */
            dev_fill(d_lseo, nd, NAN);
            dev_fill(d_delta, nd, NAN);
            if (form == 0) dev_fill(d_out32, nout, NAN); /* read after both forms */
            CHECK(cudaMemset(d_out16, 0xff, (size_t)nout * sizeof(uint16_t)) == cudaSuccess,
                  "cudaMemset of the bf16 output");
            if (form == 0)
                CHECK_OK(fs_cuda_attention_tc_forward(NULL, d_out32, d_lseo, d_qkv, d_qkv + kcol, d_qkv + vcol,
                                                      c->ld, s.B, s.T, s.NH, s.NKV, s.HS));
            else
                CHECK_OK(fs_cuda_attention_tc_forward_bf16(NULL, d_out16, d_lseo, d_qkv16, d_qkv16 + kcol,
                                                           d_qkv16 + vcol, c->ld, s.B, s.T, s.NH, s.NKV,
                                                           s.HS));
            dev_download(lse[form], d_lseo, nd);
            if (form == 0) {
                CHECK(cudaMemset(d_g, 0, (size_t)ng * sizeof(float)) == cudaSuccess, "cudaMemset of dqkv");
                CHECK_OK(fs_cuda_attention_tc_backward(NULL, d_g, d_g + kcol, d_g + vcol, c->ldd, d_delta, d_dout,
                                                       d_qkv, d_qkv + kcol, d_qkv + vcol, c->ld, d_ow, d_lse,
                                                       s.B, s.T, s.NH, s.NKV, s.HS));
                dev_download(g, d_g, ng);
            } else {
                CHECK(cudaMemset(d_g16, 0xff, (size_t)ng * sizeof(uint16_t)) == cudaSuccess,
                      "cudaMemset of the bf16 dqkv");
                CHECK_OK(fs_cuda_attention_tc_rope_backward_bf16(
                    NULL, d_g16, d_g16 + kcol, d_g16 + vcol, c->ldd, d_delta, d_dout, d_qkv16, d_qkv16 + kcol,
                    d_qkv16 + vcol, c->ld, d_o16, d_lse, d_cs, d_sn, s.B, s.T, s.NH, s.NKV, s.HS));
                dev_download_u16(g16, d_g16, ng);
            }
            dev_download(delta[form], d_delta, nd);
        }
        dev_download(out32, d_out32, nout);
        dev_download_u16(got16, d_out16, nout);
        int64_t bad = 0;
        for (int64_t i = 0; i < nout; i++) bad += got16[i] != fs_fp32_to_bf16(out32[i]);
        char name[192];
        cuda_att_name(name, sizeof name, "tc bf16 form", &s);
        CHECK(bad == 0, "%s: %lld of %lld out elements are not the fp32 form's rounded", name,
              (long long)bad, (long long)nout);
        CHECK(memcmp(lse[0], lse[1], (size_t)nd * sizeof(float)) == 0, "%s: lse differs from the fp32 form's",
              name);
        /* the fp32 form's gradients rotated back and rounded; padding untouched */
        fs_rope_backward(NULL, g, c->ldd, cs, sn, s.B, s.T, s.NH, s.HS);
        fs_rope_backward(NULL, g + kcol, c->ldd, cs, sn, s.B, s.T, s.NKV, s.HS);
        int64_t gbad = 0, padbad = 0;
        for (int64_t i = 0; i < ng; i++) {
            if (i % c->ldd < width) gbad += g16[i] != fs_fp32_to_bf16(g[i]);
            else padbad += g16[i] != 0xffff;
        }
        CHECK(gbad == 0, "%s: %lld of %lld dq, dk, dv elements are not the fp32 form's rotated back and rounded",
              name, (long long)gbad, (long long)(c->N * width));
        CHECK(padbad == 0, "%s: %lld padding elements of the bf16 dqkv rows written", name, (long long)padbad);
        CHECK(memcmp(delta[0], delta[1], (size_t)nd * sizeof(float)) == 0,
              "%s: the stored D differs from the fp32 form's", name);
    }
    void *dev[] = {d_qkv, d_ow, d_qkv16, d_o16, d_dout, d_lse, d_out32, d_lseo,
                   d_out16, d_g, d_delta, d_g16, d_cs, d_sn};
    for (size_t i = 0; i < sizeof dev / sizeof *dev; i++)
        if (dev[i]) dev_free(dev[i]);
    free(qkv16), free(o16), free(got16), free(g16), free(ow), free(out32), free(cs), free(sn);
    free(lse[0]), free(lse[1]), free(g), free(delta[0]), free(delta[1]);
}

static void test_cuda_attention_tc_bf16_form(void) {
    cuda_att_each(cuda_att_tc_shapes, CUDA_ATT_COUNT(cuda_att_tc_shapes), 1, cuda_att_tc_bf16_form);
}

/* The tensor-core kernels take head sizes 64 and 128 only, and refuse the rest before
 * launching anything; an empty batch launches nothing. */
static void test_cuda_attention_tc_shapes(void) {
    CHECK(fs_cuda_attention_tc_supported(64) && fs_cuda_attention_tc_supported(128) &&
              !fs_cuda_attention_tc_supported(96) && !fs_cuda_attention_tc_supported(8) &&
              !fs_cuda_attention_tc_supported(256),
          "fs_cuda_attention_tc_supported: 64 and 128 only");
    CHECK(fs_cuda_attention_tc_forward(NULL, NULL, NULL, NULL, NULL, NULL, 288, 1, 4, 1, 1, 96) ==
              FS_ERR_USAGE,
          "tc: HS = 96 accepted");
    CHECK(strstr(fs_error_message(), "attention_tc") != NULL, "message '%s' names no kernel",
          fs_error_message());
    CHECK(fs_cuda_attention_tc_backward(NULL, NULL, NULL, NULL, 448, NULL, NULL, NULL, NULL, NULL,
                                        448, NULL, NULL, 1, 4, 3, 2, 64) == FS_ERR_USAGE,
          "tc: NH = 3, NKV = 2 accepted");
    CHECK(fs_cuda_attention_tc_forward_bf16(NULL, NULL, NULL, NULL, NULL, NULL, 288, 1, 4, 1, 1, 96) ==
              FS_ERR_USAGE,
          "tc bf16: HS = 96 accepted");
    CHECK(strstr(fs_error_message(), "attention_tc_forward_bf16") != NULL, "message '%s' names no kernel",
          fs_error_message());
    CHECK(fs_cuda_attention_tc_rope_backward_bf16(NULL, NULL, NULL, NULL, 448, NULL, NULL, NULL, NULL,
                                                  NULL, 448, NULL, NULL, NULL, NULL, 1, 4, 3, 2, 64) ==
              FS_ERR_USAGE,
          "tc bf16: NH = 3, NKV = 2 accepted");
    CHECK(strstr(fs_error_message(), "attention_tc_rope_backward_bf16") != NULL, "message '%s' names no kernel",
          fs_error_message());
    /* the form that rotates needs the RoPE tables: refused before anything is launched */
    CHECK(fs_cuda_attention_tc_rope_backward_bf16(NULL, NULL, NULL, NULL, 448, NULL, NULL, NULL, NULL,
                                                  NULL, 448, NULL, NULL, NULL, NULL, 1, 4, 2, 1, 64) ==
              FS_ERR_USAGE,
          "tc bf16: no RoPE tables accepted");
    CHECK(strstr(fs_error_message(), "no RoPE tables") != NULL, "message '%s' does not say what is missing",
          fs_error_message());
    CHECK_OK(fs_cuda_attention_tc_forward_bf16(NULL, NULL, NULL, NULL, NULL, NULL, 192, 1, 0, 1, 1, 64));
    CHECK_OK(fs_cuda_attention_tc_rope_backward_bf16(NULL, NULL, NULL, NULL, 512, NULL, NULL, NULL, NULL,
                                                     NULL, 512, NULL, NULL, NULL, NULL, 0, 5, 1, 1, 128));
    CHECK_OK(fs_cuda_attention_tc_forward(NULL, NULL, NULL, NULL, NULL, NULL, 192, 1, 0, 1, 1, 64));
    CHECK_OK(fs_cuda_attention_tc_backward(NULL, NULL, NULL, NULL, 512, NULL, NULL, NULL, NULL,
                                           NULL, 512, NULL, NULL, 0, 5, 1, 1, 128));
    cuda_att_sync();
}

#endif /* FLATSHARD_TESTS_CUDA_ATTENTION_CHECKS_H */
