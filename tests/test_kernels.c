/*
 * tests/test_kernels.c — the CPU fp32 kernels against naive double-precision references.
 *
 *   1. forward kernels against references written here in double;
 *   2. backward kernels against central finite differences of those references, with the
 *      loss sum_i w_i out_i for random w (a wrong gradient that sum(out) cannot see, such as
 *      a swapped pair of rows, still fails);
 *   3. the semantics the rest of flatshard relies on: backward kernels accumulate, matmul's
 *      write/accumulate flags, vocabulary chunking of the cross-entropy, bitwise independence
 *      of the pool size, RoPE's round trip, and AdamW's rounding (against double for several
 *      steps, and bit for bit against PyTorch 1.13).
 *
 * Shapes are awkward on purpose: T = 1, 7, 13 and 70 (more than one 64-key softmax block),
 * C not a multiple of 16, NH = 1 and 3, GQA (NH = 6, NKV = 2; NH = 3, NKV = 1), B = 1 and 2,
 * q/k/v inside a wider row with padding; every kernel runs on pools of 1 and 3 threads.
 *
 * Tolerances. u = 2^-24 ~ 6e-8 is float's unit roundoff. A float sum of K terms of size s
 * errs by about sqrt(K) u s typically and K u s at worst. Each tolerance below says where it
 * comes from; all sit 3x to 10x above the largest error measured on these inputs (the few
 * set from a worst-case bound sit further). Finite differences are taken in double on the
 * double reference with h = 1e-4: truncation h^2/6 |f'''| ~ 1e-9, and the rounding of a loss
 * of up to ~10^3 terms, ~10^3 * 1e-16 * |loss| / h ~ 1e-9: both below the fp32 errors under
 * test.
 */
#include "flatshard/kernels.h"
#include "harness.h"

#include <stdint.h>

#define SEED 0x5eedULL
#define FD_H 1e-4
#define N_POOLS 2

static fs_pool *pools[N_POOLS];
static const int pool_sizes[N_POOLS] = {1, 3};
#include "seeded.h" /* next_stream, RUN_SEEDED */

/* ------------------------------------------------------------------ helpers */

static void *xcalloc(int64_t n, size_t size) {
    void *p = calloc((size_t)(n > 0 ? n : 1), size);
    if (!p) {
        fprintf(stderr, "test_kernels: out of memory\n");
        exit(2);
    }
    return p;
}
static float *fnew(int64_t n) { return xcalloc(n, sizeof(float)); }
static double *dnew(int64_t n) { return xcalloc(n, sizeof(double)); }

static void fill_normal(float *x, int64_t n, float scale) {
    uint64_t s = next_stream++;
    for (int64_t i = 0; i < n; i++) x[i] = scale * fs_rand_normal(SEED, s, (uint64_t)i);
}

static void fill_tokens(int32_t *t, int64_t n, int64_t V) {
    uint64_t s = next_stream++;
    for (int64_t i = 0; i < n; i++)
        t[i] = (int32_t)fs_rand_below(SEED, s, (uint64_t)i, (uint64_t)V);
}

static double *dcopy(const float *x, int64_t n) {
    double *d = dnew(n);
    for (int64_t i = 0; i < n; i++) d[i] = (double)x[i];
    return d;
}

static float *fcopy(const float *x, int64_t n) {
    float *f = fnew(n);
    memcpy(f, x, (size_t)n * sizeof(float));
    return f;
}

static int same_bits(const float *a, const float *b, int64_t n) {
    return memcmp(a, b, (size_t)n * sizeof(float)) == 0;
}

/* Distance in units in the last place between two finite floats of the same sign. */
static int64_t ulps_apart(float a, float b) {
    int32_t ia, ib;
    memcpy(&ia, &a, sizeof ia);
    memcpy(&ib, &b, sizeof ib);
    return ia > ib ? (int64_t)ia - ib : (int64_t)ib - ia;
}

static double weighted_sum(const double *out, const float *w, int64_t n) {
    double s = 0.0;
    for (int64_t i = 0; i < n; i++) s += (double)w[i] * out[i];
    return s;
}

/* d loss / d x[i] by central differences; x is perturbed in place and restored. */
static void fd_gradient(double *grad, double *x, int64_t n, double (*loss)(void *), void *ctx) {
    for (int64_t i = 0; i < n; i++) {
        double saved = x[i];
        x[i] = saved + FD_H;
        double lp = loss(ctx);
        x[i] = saved - FD_H;
        double lm = loss(ctx);
        x[i] = saved;
        grad[i] = (lp - lm) / (2.0 * FD_H);
    }
}

/* ------------------------------------------------------------------ dispatch paths */

/* Kernels with copies for wider vectors (attention: avx2, avx512; AdamW: avx2; SwiGLU:
 * avx512) are tested on every copy this CPU can run, each capped in turn with
 * fs_kernels_set_isa (which overrides FLATSHARD_KERNELS), and each test's "ok" line names
 * the paths that ran and the ones the CPU lacks, so that a CPU without an ISA never passes
 * the portable path off as the fast one. */
typedef struct isa_paths {
    fs_kernel_isa before;   /* the level to restore */
    unsigned ran, missing;  /* bit i: level i */
} isa_paths;

static isa_paths paths_begin(void) {
    isa_paths ps = {fs_kernels_isa(), 0, 0};
    return ps;
}

/* Caps dispatch at `level`; 1 when the kernels now run exactly that level, 0 (and the level
 * recorded as missing) when the CPU does not have it. */
static int paths_use(isa_paths *ps, fs_kernel_isa level) {
    fs_kernels_set_isa(level);
    const int ok = fs_kernels_isa() == level;
    if (ok) ps->ran |= 1u << level;
    else ps->missing |= 1u << level;
    return ok;
}

static void paths_list(char *out, size_t cap, unsigned mask) {
    out[0] = '\0';
    for (int i = 0; i < FS_ISA_N; i++)
        if (mask >> i & 1u) {
            size_t used = strlen(out);
            snprintf(out + used, cap - used, "%s%s", used ? ", " : "", fs_kernels_isa_name((fs_kernel_isa)i));
        }
}

/* Restores the level and notes "paths: portable, avx2; avx512 not on this CPU". */
static void paths_end(isa_paths *ps) {
    fs_kernels_set_isa(ps->before);
    char ran[96], missing[96];
    paths_list(ran, sizeof ran, ps->ran);
    paths_list(missing, sizeof missing, ps->missing);
    CHECK(ps->ran != 0, "no dispatch path ran");
    if (ps->missing) fs_test_note("paths: %s; %s not on this CPU", ran, missing);
    else fs_test_note("paths: %s", ran);
}

/* ------------------------------------------------------------------ matmul */

static void ref_matmul(double *out, const double *inp, const double *w, int64_t N, int64_t IC,
                       int64_t OC) {
    for (int64_t n = 0; n < N; n++)
        for (int64_t o = 0; o < OC; o++) {
            double s = 0.0;
            for (int64_t i = 0; i < IC; i++) s += inp[n * IC + i] * w[o * IC + i];
            out[n * OC + o] = s;
        }
}

typedef struct mm_shape {
    int64_t N, IC, OC;
    int fd; /* small enough for finite differences */
} mm_shape;

static const mm_shape mm_shapes[] = {
    {1, 24, 40, 1},    /* N = 1 */
    {2, 40, 24, 1},    /* N smaller than the pool */
    {7, 24, 40, 1},
    {13, 40, 24, 1},
    {64, 33, 3, 1},    /* OC smaller than the pool */
    {1, 512, 520, 0},  /* N = 1 above the threading threshold: columns split over the pool */
    {2, 256, 600, 0},  /* N < threads, columns split */
    {1000, 160, 2, 0}, /* OC = 2 < threads: rows split; dweight's tiles ten columns of 16 */
    {37, 50, 300, 0},  /* dweight's fixed tiles a 7 x 2 grid of 48 x 32, the last 12 x 18 */
    {19, 1100, 500, 0}, /* dweight's tiles a 2 x 4 grid of 256 x 288, the last 244 x 236 */
};
#define N_MM_SHAPES ((int)(sizeof mm_shapes / sizeof mm_shapes[0]))

/* fp32 GEMM against double, inputs ~N(0,1), weights ~N(0,1/IC) so outputs are O(1): the
 * error of a K-term dot product is about sqrt(K) u; 1e-6 * sqrt(K) is ~10x that, and the
 * relative part covers the larger outputs. */
static double mm_atol(int64_t K) { return 1e-6 * sqrt((double)(K > 0 ? K : 1)); }
#define MM_RTOL 1e-6

static void test_matmul_forward_vs_reference(void) {
    for (int s = 0; s < N_MM_SHAPES; s++) {
        mm_shape sh = mm_shapes[s];
        float *inp = fnew(sh.N * sh.IC), *w = fnew(sh.OC * sh.IC), *prefill = fnew(sh.N * sh.OC);
        float *out = fnew(sh.N * sh.OC);
        fill_normal(inp, sh.N * sh.IC, 1.0f);
        fill_normal(w, sh.OC * sh.IC, 1.0f / sqrtf((float)sh.IC));
        fill_normal(prefill, sh.N * sh.OC, 1.0f);
        double *di = dcopy(inp, sh.N * sh.IC), *dw = dcopy(w, sh.OC * sh.IC);
        double *want = dnew(sh.N * sh.OC);
        ref_matmul(want, di, dw, sh.N, sh.IC, sh.OC);
        char name[96];
        for (int p = 0; p < N_POOLS; p++) {
            /* write: the previous contents (NaN here) must not leak into the result */
            for (int64_t i = 0; i < sh.N * sh.OC; i++) out[i] = NAN;
            fs_matmul_forward(pools[p], out, inp, w, sh.N, sh.IC, sh.OC, 0);
            snprintf(name, sizeof name, "forward N=%lld IC=%lld OC=%lld pool=%d",
                     (long long)sh.N, (long long)sh.IC, (long long)sh.OC, pool_sizes[p]);
            CHECK_CLOSE(name, out, want, sh.N * sh.OC, mm_atol(sh.IC), MM_RTOL);
            /* accumulate: out = prefill + inp @ w^T */
            memcpy(out, prefill, (size_t)(sh.N * sh.OC) * sizeof(float));
            fs_matmul_forward(pools[p], out, inp, w, sh.N, sh.IC, sh.OC, 1);
            double *want_acc = dnew(sh.N * sh.OC);
            for (int64_t i = 0; i < sh.N * sh.OC; i++) want_acc[i] = prefill[i] + want[i];
            snprintf(name, sizeof name, "forward accumulate N=%lld IC=%lld OC=%lld pool=%d",
                     (long long)sh.N, (long long)sh.IC, (long long)sh.OC, pool_sizes[p]);
            CHECK_CLOSE(name, out, want_acc, sh.N * sh.OC, mm_atol(sh.IC), MM_RTOL);
            free(want_acc);
        }
        free(inp), free(w), free(prefill), free(out), free(di), free(dw), free(want);
    }
}

/* The backward against its analytic double form (dinp = dout @ W, dweight = dout^T @ inp)
 * on every shape, with both flags, and with one of the two outputs NULL. */
static void test_matmul_backward_vs_reference(void) {
    for (int s = 0; s < N_MM_SHAPES; s++) {
        mm_shape sh = mm_shapes[s];
        const int64_t N = sh.N, IC = sh.IC, OC = sh.OC;
        float *inp = fnew(N * IC), *w = fnew(OC * IC), *dout = fnew(N * OC);
        float *g0_in = fnew(N * IC), *g0_w = fnew(OC * IC);
        float *dinp = fnew(N * IC), *dw = fnew(OC * IC);
        fill_normal(inp, N * IC, 1.0f);
        fill_normal(w, OC * IC, 1.0f);
        fill_normal(dout, N * OC, 1.0f / sqrtf((float)(OC > N ? OC : N)));
        fill_normal(g0_in, N * IC, 1.0f);
        fill_normal(g0_w, OC * IC, 1.0f);
        double *want_in = dnew(N * IC), *want_w = dnew(OC * IC);
        for (int64_t n = 0; n < N; n++)
            for (int64_t i = 0; i < IC; i++) {
                double acc = 0.0;
                for (int64_t o = 0; o < OC; o++) acc += (double)dout[n * OC + o] * w[o * IC + i];
                want_in[n * IC + i] = acc;
            }
        for (int64_t o = 0; o < OC; o++)
            for (int64_t i = 0; i < IC; i++) {
                double acc = 0.0;
                for (int64_t n = 0; n < N; n++) acc += (double)dout[n * OC + o] * inp[n * IC + i];
                want_w[o * IC + i] = acc;
            }
        double *want_in_acc = dnew(N * IC), *want_w_acc = dnew(OC * IC);
        for (int64_t i = 0; i < N * IC; i++) want_in_acc[i] = g0_in[i] + want_in[i];
        for (int64_t i = 0; i < OC * IC; i++) want_w_acc[i] = g0_w[i] + want_w[i];
        char name[96];
        for (int p = 0; p < N_POOLS; p++) {
            for (int acc = 0; acc <= 1; acc++) {
                for (int64_t i = 0; i < N * IC; i++) dinp[i] = acc ? g0_in[i] : NAN;
                for (int64_t i = 0; i < OC * IC; i++) dw[i] = acc ? g0_w[i] : NAN;
                fs_matmul_backward(pools[p], dinp, dw, dout, inp, w, N, IC, OC, acc, acc);
                snprintf(name, sizeof name, "dinp N=%lld IC=%lld OC=%lld pool=%d acc=%d",
                         (long long)N, (long long)IC, (long long)OC, pool_sizes[p], acc);
                CHECK_CLOSE(name, dinp, acc ? want_in_acc : want_in, N * IC, mm_atol(OC), MM_RTOL);
                snprintf(name, sizeof name, "dweight N=%lld IC=%lld OC=%lld pool=%d acc=%d",
                         (long long)N, (long long)IC, (long long)OC, pool_sizes[p], acc);
                CHECK_CLOSE(name, dw, acc ? want_w_acc : want_w, OC * IC, mm_atol(N), MM_RTOL);
            }
            /* one output at a time; mixed flags */
            memcpy(dinp, g0_in, (size_t)(N * IC) * sizeof(float));
            fs_matmul_backward(pools[p], dinp, NULL, dout, inp, w, N, IC, OC, 1, 0);
            CHECK_CLOSE("dinp alone, accumulate", dinp, want_in_acc, N * IC, mm_atol(OC), MM_RTOL);
            for (int64_t i = 0; i < OC * IC; i++) dw[i] = NAN;
            fs_matmul_backward(pools[p], NULL, dw, dout, inp, w, N, IC, OC, 1, 0);
            CHECK_CLOSE("dweight alone, write", dw, want_w, OC * IC, mm_atol(N), MM_RTOL);
        }
        free(inp), free(w), free(dout), free(g0_in), free(g0_w), free(dinp), free(dw);
        free(want_in), free(want_w), free(want_in_acc), free(want_w_acc);
    }
}

typedef struct mm_fd_ctx {
    double *inp, *w, *out;
    const float *weights;
    int64_t N, IC, OC;
} mm_fd_ctx;

static double mm_loss(void *p) {
    mm_fd_ctx *c = p;
    ref_matmul(c->out, c->inp, c->w, c->N, c->IC, c->OC);
    return weighted_sum(c->out, c->weights, c->N * c->OC);
}

/* fp32 backward vs finite differences: inputs, weights and dout ~N(0,1), so gradients are
 * O(sqrt(K)) and their float error about K u; 2e-6 sqrt(K) is ~6x the largest measured. */
static void test_matmul_backward_fd(void) {
    for (int s = 0; s < N_MM_SHAPES; s++) {
        mm_shape sh = mm_shapes[s];
        if (!sh.fd) continue;
        const int64_t N = sh.N, IC = sh.IC, OC = sh.OC;
        float *inp = fnew(N * IC), *w = fnew(OC * IC), *wl = fnew(N * OC);
        fill_normal(inp, N * IC, 1.0f);
        fill_normal(w, OC * IC, 1.0f);
        fill_normal(wl, N * OC, 1.0f);
        mm_fd_ctx c = {dcopy(inp, N * IC), dcopy(w, OC * IC), dnew(N * OC), wl, N, IC, OC};
        double *fd_in = dnew(N * IC), *fd_w = dnew(OC * IC);
        fd_gradient(fd_in, c.inp, N * IC, mm_loss, &c);
        fd_gradient(fd_w, c.w, OC * IC, mm_loss, &c);
        float *dinp = fnew(N * IC), *dw = fnew(OC * IC);
        for (int p = 0; p < N_POOLS; p++) {
            fs_matmul_backward(pools[p], dinp, dw, wl, inp, w, N, IC, OC, 0, 0);
            CHECK_CLOSE("matmul dinp vs FD", dinp, fd_in, N * IC, 2e-6 * sqrt((double)OC), 1e-6);
            CHECK_CLOSE("matmul dweight vs FD", dw, fd_w, OC * IC, 2e-6 * sqrt((double)N), 1e-6);
        }
        free(inp), free(w), free(wl), free(c.inp), free(c.w), free(c.out), free(fd_in), free(fd_w);
        free(dinp), free(dw);
    }
}

/* ------------------------------------------------------------------ embedding */

typedef struct emb_ctx {
    double *wte, *out;
    const int32_t *tokens;
    const float *weights;
    int64_t N, C, V;
} emb_ctx;

static double emb_loss(void *p) {
    emb_ctx *c = p;
    for (int64_t n = 0; n < c->N; n++)
        for (int64_t i = 0; i < c->C; i++) c->out[n * c->C + i] = c->wte[c->tokens[n] * c->C + i];
    return weighted_sum(c->out, c->weights, c->N * c->C);
}

/* The forward is a copy (bitwise). The backward sums a few dout terms per element (a few
 * roundings, 1e-6 relative covers them); the FD of this linear loss carries the rounding of
 * a 312-term loss, ~3e-8, hence 1e-7 absolute. */
static void test_embedding(void) {
    const int64_t N = 13, C = 24, V = 11;
    int32_t tokens[13];
    fill_tokens(tokens, N, V);
    tokens[3] = tokens[9] = 4; /* a repeated token: its row receives two contributions */
    float *wte = fnew(V * C), *out = fnew(N * C), *sentinel = fnew(N * C), *wl = fnew(N * C);
    fill_normal(wte, V * C, 1.0f);
    fill_normal(sentinel, N * C, 1.0f);
    fill_normal(wl, N * C, 1.0f);
    emb_ctx c = {dcopy(wte, V * C), dnew(N * C), tokens, wl, N, C, V};
    double *fd = dnew(V * C);
    fd_gradient(fd, c.wte, V * C, emb_loss, &c);
    const int64_t row0 = 4, rows = 5; /* the chunk [4, 9) */
    float *dwte = fnew(V * C);
    for (int p = 0; p < N_POOLS; p++) {
        memcpy(out, sentinel, (size_t)(N * C) * sizeof(float));
        fs_embedding_forward(pools[p], out, tokens, wte, N, C, 0, V);
        int ok = 1;
        for (int64_t n = 0; n < N; n++) ok &= same_bits(out + n * C, wte + tokens[n] * C, C);
        CHECK(ok, "embedding forward, whole table, pool %d", pool_sizes[p]);
        /* a chunk: rows outside it untouched, rows inside from the chunk's local row */
        memcpy(out, sentinel, (size_t)(N * C) * sizeof(float));
        fs_embedding_forward(pools[p], out, tokens, wte + row0 * C, N, C, row0, rows);
        ok = 1;
        for (int64_t n = 0; n < N; n++) {
            int in = tokens[n] >= row0 && tokens[n] < row0 + rows;
            ok &= same_bits(out + n * C, in ? wte + tokens[n] * C : sentinel + n * C, C);
        }
        CHECK(ok, "embedding forward, chunk, pool %d", pool_sizes[p]);

        memset(dwte, 0, (size_t)(V * C) * sizeof(float));
        fs_embedding_backward(pools[p], dwte, wl, tokens, N, C, 0, V);
        CHECK_CLOSE("embedding dwte vs FD", dwte, fd, V * C, 1e-7, 1e-6);
        /* the chunk's backward gives the chunk's rows of the full gradient */
        memset(dwte, 0, (size_t)(V * C) * sizeof(float));
        fs_embedding_backward(pools[p], dwte, wl, tokens, N, C, row0, rows);
        CHECK_CLOSE("embedding dwte chunk vs FD", dwte, fd + row0 * C, rows * C, 1e-7, 1e-6);
        int untouched = 1;
        for (int64_t i = rows * C; i < V * C; i++) untouched &= dwte[i] == 0.0f;
        CHECK(untouched, "embedding backward wrote outside its chunk");
    }
    free(wte), free(out), free(sentinel), free(wl), free(c.wte), free(c.out), free(fd), free(dwte);
}

/* ------------------------------------------------------------------ RMSNorm */

static void ref_rmsnorm(double *out, double *rstd, const double *inp, const double *w,
                        int64_t N, int64_t C, double eps) {
    for (int64_t n = 0; n < N; n++) {
        double ss = 0.0;
        for (int64_t i = 0; i < C; i++) ss += inp[n * C + i] * inp[n * C + i];
        double r = 1.0 / sqrt(ss / (double)C + eps);
        if (rstd) rstd[n] = r;
        for (int64_t i = 0; i < C; i++) out[n * C + i] = inp[n * C + i] * r * w[i];
    }
}

typedef struct rms_ctx {
    double *inp, *w, *out;
    const float *weights;
    int64_t N, C;
    double eps;
} rms_ctx;

static double rms_loss(void *p) {
    rms_ctx *c = p;
    ref_rmsnorm(c->out, NULL, c->inp, c->w, c->N, c->C, c->eps);
    return weighted_sum(c->out, c->weights, c->N * c->C);
}

typedef struct nc_shape {
    int64_t N, C;
} nc_shape;
static const nc_shape rms_shapes[] = {{1, 24}, {7, 40}, {13, 20}, {5, 3}};

/* Forward: a C-term float sum of squares and a handful of rounded operations per element:
 * relative error ~ (sqrt(C) + 4) u, under 1e-6 here; 2e-6 relative. The backward's dinp is
 * a difference of two O(1) terms (w dout and x r^2 s / C) that may cancel, so its error is
 * absolute, a few u of the terms: 1e-6 absolute + 2e-6 relative, for dweight too. */
static void test_rmsnorm(void) {
    const float eps = 1e-5f;
    for (size_t s = 0; s < sizeof rms_shapes / sizeof rms_shapes[0]; s++) {
        const int64_t N = rms_shapes[s].N, C = rms_shapes[s].C;
        float *inp = fnew(N * C), *w = fnew(C), *wl = fnew(N * C), *out = fnew(N * C);
        float *rstd = fnew(N), *dinp = fnew(N * C), *dw = fnew(C);
        fill_normal(inp, N * C, 2.0f);
        for (int64_t i = 0; i < N * C; i++) inp[i] += 0.5f; /* not zero-mean */
        fill_normal(w, C, 1.0f);
        fill_normal(wl, N * C, 1.0f);
        rms_ctx c = {dcopy(inp, N * C), dcopy(w, C), dnew(N * C), wl, N, C, (double)eps};
        double *want = dnew(N * C), *want_rstd = dnew(N);
        ref_rmsnorm(want, want_rstd, c.inp, c.w, N, C, c.eps);
        double *fd_in = dnew(N * C), *fd_w = dnew(C);
        fd_gradient(fd_in, c.inp, N * C, rms_loss, &c);
        fd_gradient(fd_w, c.w, C, rms_loss, &c);
        for (int p = 0; p < N_POOLS; p++) {
            fs_rmsnorm_forward(pools[p], out, rstd, inp, w, N, C, eps);
            CHECK_CLOSE("rmsnorm out", out, want, N * C, 1e-7, 2e-6);
            CHECK_CLOSE("rmsnorm rstd", rstd, want_rstd, N, 0.0, 2e-6);
            memset(dinp, 0, (size_t)(N * C) * sizeof(float));
            memset(dw, 0, (size_t)C * sizeof(float));
            fs_rmsnorm_backward(pools[p], dinp, dw, wl, inp, w, rstd, N, C);
            CHECK_CLOSE("rmsnorm dinp vs FD", dinp, fd_in, N * C, 1e-6, 2e-6);
            CHECK_CLOSE("rmsnorm dweight vs FD", dw, fd_w, C, 1e-6, 2e-6);
        }
        free(inp), free(w), free(wl), free(out), free(rstd), free(dinp), free(dw);
        free(c.inp), free(c.w), free(c.out), free(want), free(want_rstd), free(fd_in), free(fd_w);
    }
}

/* The bf16 forward (the bf16 route's norms) writes fs_fp32_to_bf16 of the fp32 forward's
 * values, bit for bit, and the same rstd, on every pool size: widths short of, equal to and
 * across its 256-column rounding pieces, a row holding a NaN (the rounding's NaN branch) and
 * a row of zeros; nothing written past the output. */
static void test_rmsnorm_bf16_output(void) {
    static const nc_shape shapes[] = {{9, 600}, {4, 256}, {6, 3}, {3, 257}};
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        const int64_t N = shapes[s].N, C = shapes[s].C;
        float *inp = fnew(N * C), *w = fnew(C), *out = fnew(N * C), *rstd = fnew(N), *rstd16 = fnew(N);
        uint16_t *o16 = xcalloc(N * C + 8, sizeof(uint16_t));
        fill_normal(inp, N * C, 3.0f);
        fill_normal(w, C, 1.0f);
        const uint32_t nan_bits = 0x7fffffffu; /* rounds into -0 without the NaN branch */
        memcpy(&inp[1 * C + C / 2], &nan_bits, sizeof nan_bits);
        memset(&inp[2 * C], 0, (size_t)C * sizeof(float)); /* rstd = 1 / sqrt(eps) */
        for (int p = 0; p < N_POOLS; p++) {
            memset(o16, 0xab, (size_t)(N * C + 8) * sizeof(uint16_t));
            fs_rmsnorm_forward(pools[p], out, rstd, inp, w, N, C, 1e-5f);
            fs_rmsnorm_forward_bf16(pools[p], o16, rstd16, inp, w, N, C, 1e-5f);
            int64_t bad = 0, past = 0;
            for (int64_t i = 0; i < N * C; i++)
                if (o16[i] != fs_fp32_to_bf16(out[i]) && bad++ < 3)
                    CHECK(0, "N=%lld C=%lld pool %d: out[%lld] = 0x%04x, want 0x%04x (fp32 %.9g)", (long long)N,
                          (long long)C, p, (long long)i, o16[i], fs_fp32_to_bf16(out[i]), out[i]);
            for (int i = 0; i < 8; i++) past += o16[N * C + i] != 0xabab;
            CHECK(bad == 0 && past == 0, "N=%lld C=%lld pool %d: %lld values not the rounded fp32 ones, %lld written "
                  "past out", (long long)N, (long long)C, p, (long long)bad, (long long)past);
            CHECK(memcmp(rstd, rstd16, (size_t)N * sizeof(float)) == 0, "N=%lld C=%lld pool %d: rstd differs",
                  (long long)N, (long long)C, p);
        }
        free(inp), free(w), free(out), free(rstd), free(rstd16), free(o16);
    }
}

/* ------------------------------------------------------------------ RoPE */

/* Against the exact table: the float angle t * inv_freq carries up to ~3 roundings of
 * relative size u, so |angle error| <= 3 u t; for t < 16 that is < 3e-6. */
static void test_rope_table(void) {
    const int64_t T = 13, HS = 20, half = HS / 2;
    const float theta = 10000.0f;
    float *cs = fnew(T * half), *sn = fnew(T * half);
    fs_rope_table(cs, sn, T, HS, theta);
    double *want_c = dnew(T * half), *want_s = dnew(T * half);
    for (int64_t t = 0; t < T; t++)
        for (int64_t i = 0; i < half; i++) {
            double a = (double)t * pow((double)theta, -2.0 * (double)i / (double)HS);
            want_c[t * half + i] = cos(a);
            want_s[t * half + i] = sin(a);
        }
    CHECK_CLOSE("rope cos table", cs, want_c, T * half, 4e-6, 0.0);
    CHECK_CLOSE("rope sin table", sn, want_s, T * half, 4e-6, 0.0);
    free(cs), free(sn), free(want_c), free(want_s);

    /* Hugging Face's LlamaRotaryEmbedding in float32 (torch 1.13, HS = 64, theta = 1e4) at
     * large t, where rounding the angle to float matters: an angle taken in double gives
     * cos = -0.08991 at (4095, 1) instead of -0.09005. PyTorch's SLEEF cos/sin are within
     * 1 ulp of ours, hence the 1-ulp tolerance. */
    static const struct { int64_t t, i; float cos, sin; } hf[] = {
        {4095, 0, -0.065975994f, -0.9978212f}, {4095, 1, -0.09004636f, -0.9959376f},
        {4095, 5, -0.9475278f, -0.31967333f},  {3001, 2, -0.8519759f, -0.523581f},
        {1234, 0, -0.7985506f, 0.60192764f},   {2047, 3, -0.7483594f, 0.6632935f},
        {4000, 31, 0.8610789f, 0.50847137f},   {777, 7, -0.9983219f, 0.05790876f},
    };
    const int64_t T2 = 4096, half2 = 32;
    cs = fnew(T2 * half2), sn = fnew(T2 * half2);
    fs_rope_table(cs, sn, T2, 2 * half2, 10000.0f);
    for (size_t k = 0; k < sizeof hf / sizeof hf[0]; k++) {
        float c = cs[hf[k].t * half2 + hf[k].i], s = sn[hf[k].t * half2 + hf[k].i];
        CHECK(ulps_apart(c, hf[k].cos) <= 1 && ulps_apart(s, hf[k].sin) <= 1,
              "rope table at t=%lld i=%lld: (%.9g, %.9g), Hugging Face has (%.9g, %.9g)",
              (long long)hf[k].t, (long long)hf[k].i, (double)c, (double)s,
              (double)hf[k].cos, (double)hf[k].sin);
    }
    free(cs), free(sn);
}

static void ref_rope(double *x, int64_t ld, const float *cs, const float *sn, int64_t B,
                     int64_t T, int64_t nh, int64_t HS) {
    const int64_t half = HS / 2;
    for (int64_t n = 0; n < B * T; n++)
        for (int64_t h = 0; h < nh; h++)
            for (int64_t i = 0; i < half; i++) {
                double *x1 = x + n * ld + h * HS + i, *x2 = x1 + half;
                double c = cs[(n % T) * half + i], s = sn[(n % T) * half + i];
                double a = *x1, b = *x2;
                *x1 = a * c - b * s;
                *x2 = b * c + a * s;
            }
}

typedef struct rope_ctx {
    double *x, *work;
    const float *cs, *sn, *weights;
    int64_t n, ld, B, T, nh, HS;
} rope_ctx;

static double rope_loss(void *p) {
    rope_ctx *c = p;
    memcpy(c->work, c->x, (size_t)c->n * sizeof(double));
    ref_rope(c->work, c->ld, c->cs, c->sn, c->B, c->T, c->nh, c->HS);
    return weighted_sum(c->work, c->weights, c->n);
}

typedef struct rope_shape {
    int64_t B, T, nh, HS, pad;
} rope_shape;
static const rope_shape rope_shapes[] = {{2, 7, 3, 8, 6}, {1, 13, 1, 20, 0}, {2, 1, 2, 4, 3}};

/* Each output is a*c - b*s with three roundings, at most ~2u (|a| + |b|) <= 1e-6 for inputs
 * ~N(0,1) (|x| < 4): 2e-6 absolute; the round trip doubles the roundings, still within it.
 * The padding columns of the wider rows must come back unchanged. */
static void test_rope(void) {
    for (size_t s = 0; s < sizeof rope_shapes / sizeof rope_shapes[0]; s++) {
        rope_shape sh = rope_shapes[s];
        const int64_t ld = sh.nh * sh.HS + sh.pad, n = sh.B * sh.T * ld, half = sh.HS / 2;
        float *cs = fnew(sh.T * half), *sn = fnew(sh.T * half);
        fs_rope_table(cs, sn, sh.T, sh.HS, 10000.0f);
        float *x0 = fnew(n), *x = fnew(n), *wl = fnew(n);
        fill_normal(x0, n, 1.0f);
        fill_normal(wl, n, 1.0f);
        rope_ctx c = {dcopy(x0, n), dnew(n), cs, sn, wl, n, ld, sh.B, sh.T, sh.nh, sh.HS};
        double *want = dcopy(x0, n);
        ref_rope(want, ld, cs, sn, sh.B, sh.T, sh.nh, sh.HS);
        double *fd = dnew(n);
        fd_gradient(fd, c.x, n, rope_loss, &c);
        for (int p = 0; p < N_POOLS; p++) {
            memcpy(x, x0, (size_t)n * sizeof(float));
            fs_rope_forward(pools[p], x, ld, cs, sn, sh.B, sh.T, sh.nh, sh.HS);
            CHECK_CLOSE("rope forward", x, want, n, 2e-6, 0.0);
            /* the backward of the forward: the inverse rotation brings x back (cos^2 + sin^2
             * is 1 within a few u, so a few u of error, 1e-6 absolute) */
            fs_rope_backward(pools[p], x, ld, cs, sn, sh.B, sh.T, sh.nh, sh.HS);
            double *x0d = dcopy(x0, n);
            CHECK_CLOSE("rope forward then backward", x, x0d, n, 2e-6, 0.0);
            free(x0d);
            /* gradient: dx = R^T w */
            memcpy(x, wl, (size_t)n * sizeof(float));
            fs_rope_backward(pools[p], x, ld, cs, sn, sh.B, sh.T, sh.nh, sh.HS);
            CHECK_CLOSE("rope backward vs FD", x, fd, n, 1e-6, 1e-6);
        }
        free(cs), free(sn), free(x0), free(x), free(wl), free(c.x), free(c.work), free(want);
        free(fd);
    }
}

/* ------------------------------------------------------------------ attention */

typedef struct att_shape {
    int64_t B, T, NH, NKV, HS, pad; /* pad: extra floats at the end of each qkv row */
    int fd;
} att_shape;

static const att_shape att_shapes[] = {
    {1, 1, 1, 1, 8, 0, 1},  /* T = 1: the softmax is a single 1 */
    {2, 7, 3, 1, 8, 0, 1},  /* NH = 3 sharing one kv head */
    {2, 13, 6, 2, 4, 5, 1}, /* GQA 6/2, padded rows */
    {1, 13, 3, 3, 20, 0, 1},/* multi-head, HS = 20 */
    {1, 70, 2, 1, 8, 3, 0}, /* T = 70 > 64: the online softmax rescales between key blocks */
    /* head sizes the AVX-512 copy takes (multiples of 16): partial 16-key blocks, GQA */
    {2, 37, 4, 2, 16, 0, 1},
    {1, 21, 2, 1, 32, 7, 1},
    {1, 150, 4, 2, 64, 0, 0},
};

/* One output row of the double reference: query t of head h in sequence b (o: HS values);
 * returns its log-sum-exp. */
static double ref_attention_row(double *o, const double *qkv, int64_t ld, att_shape s, int64_t b, int64_t h,
                                int64_t t) {
    const int64_t T = s.T, HS = s.HS, g = h / (s.NH / s.NKV);
    const double scale = 1.0 / sqrt((double)HS);
    double sc[256]; /* T <= 256 */
    const double *q = qkv + (b * T + t) * ld + h * HS;
    double mx = -INFINITY;
    for (int64_t u = 0; u <= t; u++) {
        const double *k = qkv + (b * T + u) * ld + (s.NH + g) * HS;
        double d = 0.0;
        for (int64_t i = 0; i < HS; i++) d += q[i] * k[i];
        sc[u] = d * scale;
        if (sc[u] > mx) mx = sc[u];
    }
    double z = 0.0;
    for (int64_t u = 0; u <= t; u++) z += exp(sc[u] - mx);
    for (int64_t i = 0; i < HS; i++) o[i] = 0.0;
    for (int64_t u = 0; u <= t; u++) {
        const double *v = qkv + (b * T + u) * ld + (s.NH + s.NKV + g) * HS;
        double pu = exp(sc[u] - mx) / z;
        for (int64_t i = 0; i < HS; i++) o[i] += pu * v[i];
    }
    return mx + log(z);
}

static void ref_attention(double *out, double *lse, const double *qkv, int64_t ld, att_shape s) {
    const int64_t T = s.T, C = s.NH * s.HS;
    for (int64_t b = 0; b < s.B; b++)
        for (int64_t h = 0; h < s.NH; h++)
            for (int64_t t = 0; t < T; t++) {
                double l = ref_attention_row(out + (b * T + t) * C + h * s.HS, qkv, ld, s, b, h, t);
                if (lse) lse[(b * s.NH + h) * T + t] = l;
            }
}

/* The part of the reference loss sum(weights * out) that element i of qkv reaches: its own
 * row of its own head for a q column, the rows t' >= t of the group's heads for a k
 * or v column, none for a padding column. */
static double att_loss_reached(const double *qkv, const float *weights, int64_t ld, att_shape s, int64_t i) {
    const int64_t T = s.T, HS = s.HS, C = s.NH * HS, group = s.NH / s.NKV;
    const int64_t b = i / (T * ld), t = (i / ld) % T, col = i % ld;
    int64_t h0, h1, t1 = T; /* heads [h0, h1), rows [t, t1) */
    if (col < C) {
        h0 = col / HS, h1 = h0 + 1, t1 = t + 1;
    } else if (col < C + 2 * s.NKV * HS) {
        const int64_t g = (col - C) / HS % s.NKV; /* k or v of kv head g */
        h0 = g * group, h1 = h0 + group;
    } else {
        return 0.0;
    }
    double o[256], sum = 0.0; /* HS <= 256 */
    for (int64_t h = h0; h < h1; h++)
        for (int64_t r = t; r < t1; r++) {
            ref_attention_row(o, qkv, ld, s, b, h, r);
            const float *w = weights + (b * T + r) * C + h * HS;
            for (int64_t j = 0; j < HS; j++) sum += (double)w[j] * o[j];
        }
    return sum;
}

/* fd_gradient of the reference loss sum(weights * out) with respect to qkv, each difference
 * taken over the rows the element reaches (att_loss_reached) instead of the whole loss: the
 * rows it does not reach are the same in both terms, and recomputing them made the attention
 * tests take minutes in the -O0 and ThreadSanitizer builds. */
static void att_fd_gradient(double *grad, double *qkv, const float *weights, int64_t ld, att_shape s) {
    for (int64_t i = 0; i < s.B * s.T * ld; i++) {
        double saved = qkv[i];
        qkv[i] = saved + FD_H;
        double lp = att_loss_reached(qkv, weights, ld, s, i);
        qkv[i] = saved - FD_H;
        double lm = att_loss_reached(qkv, weights, ld, s, i);
        qkv[i] = saved;
        grad[i] = (lp - lm) / (2.0 * FD_H);
    }
}

/* Forward: HS-term dot products (scores up to ~10 with the doubled q), exp, and a T-term
 * weighted average of O(1) values: a few u of the scores' size, 4e-6 absolute + 1e-6
 * relative. Backward vs FD: each gradient sums up to T products of such terms, O(1) in
 * size: 2e-6 absolute + 2e-5 relative. */
static void test_attention(void) {
    /* portable; avx2 (every head size); avx512 (head sizes that are multiples of 16, the
     * others fall back to avx2 at that level) */
    static const fs_kernel_isa att_levels[3] = {FS_ISA_PORTABLE, FS_ISA_AVX2, FS_ISA_AVX512};
    isa_paths ps = paths_begin();
    for (size_t si = 0; si < sizeof att_shapes / sizeof att_shapes[0]; si++) {
        att_shape s = att_shapes[si];
        const int64_t ld = (s.NH + 2 * s.NKV) * s.HS + s.pad, N = s.B * s.T, C = s.NH * s.HS;
        float *qkv = fnew(N * ld), *out = fnew(N * C), *lse = fnew(s.B * s.NH * s.T);
        float *wl = fnew(N * C), *dqkv = fnew(N * ld);
        fill_normal(qkv, N * ld, 1.0f);
        for (int64_t i = 0; i < N * ld; i++) {
            int64_t t = (i / ld) % s.T, col = i % ld;
            if (col < s.NH * s.HS) qkv[i] *= 2.0f; /* peakier softmax */
            /* keys past the first 64-key block score higher, so that the online softmax must
             * rescale what it summed over the first block */
            if (t >= 64 && col >= s.NH * s.HS && col < (s.NH + s.NKV) * s.HS) qkv[i] *= 3.0f;
        }
        fill_normal(wl, N * C, 1.0f);
        double *qkvd = dcopy(qkv, N * ld);
        double *want = dnew(N * C), *want_lse = dnew(s.B * s.NH * s.T);
        ref_attention(want, want_lse, qkvd, ld, s);
        double *fd = NULL;
        if (s.fd) {
            fd = dnew(N * ld);
            att_fd_gradient(fd, qkvd, wl, ld, s);
        }
        const float *q = qkv, *k = qkv + s.NH * s.HS, *v = qkv + (s.NH + s.NKV) * s.HS;
        char name[128];
        for (int li = 0; li < 3; li++) {
            if (!paths_use(&ps, att_levels[li])) continue;
            const char *path = fs_kernels_isa_name(att_levels[li]);
            for (int p = 0; p < N_POOLS; p++) {
                fs_attention_forward(pools[p], out, lse, q, k, v, ld, s.B, s.T, s.NH, s.NKV, s.HS);
                snprintf(name, sizeof name, "%s attention out B=%lld T=%lld NH=%lld NKV=%lld HS=%lld",
                         path, (long long)s.B, (long long)s.T, (long long)s.NH, (long long)s.NKV,
                         (long long)s.HS);
                CHECK_CLOSE(name, out, want, N * C, 4e-6, 1e-6);
                CHECK_CLOSE("attention lse (shape above)", lse, want_lse, s.B * s.NH * s.T, 2e-6, 1e-6);
                if (!fd) continue;
                memset(dqkv, 0, (size_t)(N * ld) * sizeof(float));
                fs_attention_backward(pools[p], dqkv, dqkv + s.NH * s.HS,
                                      dqkv + (s.NH + s.NKV) * s.HS, ld, wl, q, k, v, ld, out, lse,
                                      s.B, s.T, s.NH, s.NKV, s.HS);
                /* covers dq, dk, dv and the padding columns (gradient 0, never written) */
                snprintf(name, sizeof name, "%s attention dqkv vs FD B=%lld T=%lld NH=%lld NKV=%lld",
                         path, (long long)s.B, (long long)s.T, (long long)s.NH, (long long)s.NKV);
                CHECK_CLOSE(name, dqkv, fd, N * ld, 2e-6, 2e-5);
            }
        }
        free(qkv), free(out), free(lse), free(wl), free(dqkv), free(qkvd);
        free(want), free(want_lse), free(fd);
    }
    paths_end(&ps);
}

/* The bf16 policy's attention (fs_attention_forward_bf16 / _backward_bf16). The reference is
 * the double one on q, k, v already rounded to bf16, so what is left to bound is what the
 * kernel rounds beyond its operands, each rounding to bf16 a relative error of at most
 * u = 2^-8 (8 significant bits, round to nearest even):
 *   out: P.V takes p rounded, so |d out| <= u sum_u p_u |v_u| / sum_u p_u <= u max|v|; plus
 *        the fp32 kernel's 4e-6 + 1e-6 relative for the sums. lse: the scores are sums of
 *        exact products in fp32, the fp32 kernel's 2e-6 + 1e-6 relative.
 *   gradients vs FD of the reference loss: every term of dq, dk, dv has at most two rounded
 *        factors (dout, and p or ds) and ds's dp sums products of rounded dout, so the error is
 *        below 3u times the sum of the terms' magnitudes M (computed below in double:
 *        dv: sum_t p |dout_t|; dq, dk: scale sum p (|dout|.|v| + |dout|.|o|) |k| or |q|) plus
 *        the fp32 kernel's 2e-6 + 2e-5 relative (FD error included). M, not |gradient|,
 *        because ds = p (dp - D) cancels. */
static void ref_attention_bwd_magnitude(double *M, const double *qkv, const float *dy, int64_t ld, att_shape s) {
    const int64_t T = s.T, HS = s.HS, C = s.NH * HS, group = s.NH / s.NKV;
    const double scale = 1.0 / sqrt((double)HS);
    memset(M, 0, (size_t)(s.B * T * ld) * sizeof(double));
    double *out = dnew(s.B * T * C), *lse = dnew(s.B * s.NH * T);
    ref_attention(out, lse, qkv, ld, s);
    for (int64_t b = 0; b < s.B; b++)
        for (int64_t h = 0; h < s.NH; h++)
            for (int64_t t = 0; t < T; t++) {
                const int64_t g = h / group;
                const double *q = qkv + (b * T + t) * ld + h * HS, *o = out + (b * T + t) * C + h * HS;
                const float *y = dy + (b * T + t) * C + h * HS;
                double yo = 0.0;
                for (int64_t c = 0; c < HS; c++) yo += fabs(y[c] * o[c]);
                for (int64_t u = 0; u <= t; u++) {
                    const double *k = qkv + (b * T + u) * ld + (s.NH + g) * HS, *v = k + s.NKV * HS;
                    double sc = 0.0, yv = 0.0;
                    for (int64_t c = 0; c < HS; c++) sc += q[c] * k[c], yv += fabs(y[c] * v[c]);
                    const double p = exp(sc * scale - lse[(b * s.NH + h) * T + t]), ds = scale * p * (yv + yo);
                    double *mq = M + (b * T + t) * ld + h * HS, *mk = M + (b * T + u) * ld + (s.NH + g) * HS;
                    double *mv = mk + s.NKV * HS;
                    for (int64_t c = 0; c < HS; c++) {
                        mq[c] += ds * fabs(k[c]);
                        mk[c] += ds * fabs(q[c]);
                        mv[c] += p * fabs(y[c]);
                    }
                }
            }
    free(out), free(lse);
}

/* The kernel the rule of kernels.h gives this head size on this CPU, AMX allowed or not. */
static const char *att_bf16_expected(int64_t HS, int amx_allowed) {
    if (fs_kernels_isa() < FS_ISA_AVX512_BF16) return "fp32";
    if (amx_allowed && fs_attention_amx_available() && HS % 32 == 0 && HS <= 128) return "amx";
    return HS % 16 == 0 && HS <= 64 ? "avx512bf16" : "fp32";
}

static void test_attention_bf16(void) {
    /* beside att_shapes: shapes for the AMX kernel's 32 x 32 blocks (HS 32, 64, 96, 128):
     * T = 1, T one past a block, T a whole number of blocks, several key blocks (keys past
     * 64 score higher: the online softmax rescales), GQA 1, 3 and 4, B 1 and 2, padded rows */
    static const att_shape extra[] = {
        {1, 23, 2, 1, 64, 0, 1}, {2, 66, 4, 2, 64, 3, 0}, {1, 1, 3, 1, 64, 0, 1}, {2, 33, 4, 1, 32, 5, 0},
        {1, 70, 3, 3, 64, 0, 0}, {2, 100, 4, 4, 128, 0, 0}, {1, 64, 3, 1, 96, 2, 0}, {1, 40, 2, 2, 32, 0, 1},
    };
    const double u = 1.0 / 256.0;
    const int fast = fs_kernels_isa() >= FS_ISA_AVX512_BF16; /* the CPU's, capped by FLATSHARD_KERNELS */
    const int amx = fast && fs_attention_amx_available();
    const int amx_before = fs_attention_set_amx(1);
    int ran_fast = 0, ran_amx = 0, ran_fp32 = 0;
    const size_t n_main = sizeof att_shapes / sizeof att_shapes[0];
    for (size_t si = 0; si < n_main + sizeof extra / sizeof extra[0]; si++) {
        att_shape s = si < n_main ? att_shapes[si] : extra[si - n_main];
        const int64_t ld = (s.NH + 2 * s.NKV) * s.HS + s.pad, N = s.B * s.T, C = s.NH * s.HS;
        float *qkv = fnew(N * ld), *out = fnew(N * C), *lse = fnew(s.B * s.NH * s.T);
        float *wl = fnew(N * C), *dqkv = fnew(N * ld), *out32 = fnew(N * C), *lse32 = fnew(s.B * s.NH * s.T);
        float *dqkv32 = fnew(N * ld);
        fill_normal(qkv, N * ld, 1.0f);
        for (int64_t i = 0; i < N * ld; i++) {
            int64_t t = (i / ld) % s.T, col = i % ld;
            if (col < s.NH * s.HS) qkv[i] *= 2.0f;
            if (t >= 64 && col >= s.NH * s.HS && col < (s.NH + s.NKV) * s.HS) qkv[i] *= 3.0f;
        }
        fill_normal(wl, N * C, 1.0f);
        const float *q = qkv, *k = qkv + s.NH * s.HS, *v = qkv + (s.NH + s.NKV) * s.HS;
        /* the reference on the operands the kernel sees: double, and FD of it (small shapes)
         * or the fp32 kernel's backward on them (the others) for the gradients */
        double *r = dnew(N * ld), vmax = 0.0;
        float *rf = fnew(N * ld);
        for (int64_t i = 0; i < N * ld; i++) r[i] = rf[i] = fs_bf16_to_fp32(fs_fp32_to_bf16(qkv[i]));
        for (int64_t i = 0; i < N * ld; i++)
            if (i % ld >= (s.NH + s.NKV) * s.HS && fabs(r[i]) > vmax) vmax = fabs(r[i]);
        double *want = dnew(N * C), *want_lse = dnew(s.B * s.NH * s.T);
        ref_attention(want, want_lse, r, ld, s);
        double *gref = dnew(N * ld), *M = dnew(N * ld);
        ref_attention_bwd_magnitude(M, r, wl, ld, s);
        if (s.fd) {
            att_fd_gradient(gref, r, wl, ld, s);
        } else {
            float *o = fnew(N * C), *l = fnew(s.B * s.NH * s.T), *g = fnew(N * ld);
            fs_attention_forward(pools[1], o, l, rf, rf + C, rf + (s.NH + s.NKV) * s.HS, ld, s.B, s.T, s.NH, s.NKV, s.HS);
            memset(g, 0, (size_t)(N * ld) * sizeof(float));
            fs_attention_backward(pools[1], g, g + C, g + (s.NH + s.NKV) * s.HS, ld, wl, rf, rf + C,
                                  rf + (s.NH + s.NKV) * s.HS, ld, o, l, s.B, s.T, s.NH, s.NKV, s.HS);
            for (int64_t i = 0; i < N * ld; i++) gref[i] = g[i];
            free(o), free(l), free(g);
        }
        char name[200];
        for (int allow = amx; allow >= 0; allow--) { /* the amx kernel where it runs, then without it */
            fs_attention_set_amx(allow);
            const char *path = fs_attention_bf16_path(s.HS);
            CHECK(strcmp(path, att_bf16_expected(s.HS, allow)) == 0, "HS=%lld: path %s, the rule gives %s",
                  (long long)s.HS, path, att_bf16_expected(s.HS, allow));
            if (strcmp(path, "fp32") == 0) { /* the fallback is the fp32 kernel, bit for bit */
                ran_fp32 = 1;
                fs_attention_forward(pools[1], out32, lse32, q, k, v, ld, s.B, s.T, s.NH, s.NKV, s.HS);
                fs_attention_forward_bf16(pools[1], out, lse, q, k, v, ld, s.B, s.T, s.NH, s.NKV, s.HS);
                CHECK(same_bits(out, out32, N * C) && same_bits(lse, lse32, s.B * s.NH * s.T),
                      "HS=%lld: the bf16 attention's fp32 fallback is not the fp32 kernel", (long long)s.HS);
                memset(dqkv, 0, (size_t)(N * ld) * sizeof(float));
                memset(dqkv32, 0, (size_t)(N * ld) * sizeof(float));
                fs_attention_backward(pools[1], dqkv32, dqkv32 + C, dqkv32 + (s.NH + s.NKV) * s.HS, ld, wl, q, k, v,
                                      ld, out32, lse32, s.B, s.T, s.NH, s.NKV, s.HS);
                fs_attention_backward_bf16(pools[1], dqkv, dqkv + C, dqkv + (s.NH + s.NKV) * s.HS, ld, wl, q, k, v,
                                           ld, out, lse, s.B, s.T, s.NH, s.NKV, s.HS);
                CHECK(same_bits(dqkv, dqkv32, N * ld), "HS=%lld: the bf16 backward's fp32 fallback differs",
                      (long long)s.HS);
                continue;
            }
            if (strcmp(path, "amx") == 0) ran_amx = 1;
            else ran_fast = 1;
            for (int p = 0; p < N_POOLS; p++) {
                fs_attention_forward_bf16(pools[p], out, lse, q, k, v, ld, s.B, s.T, s.NH, s.NKV, s.HS);
                snprintf(name, sizeof name, "%s attention out B=%lld T=%lld NH=%lld NKV=%lld HS=%lld (u max|v| = %.2g)",
                         path, (long long)s.B, (long long)s.T, (long long)s.NH, (long long)s.NKV, (long long)s.HS,
                         u * vmax);
                CHECK_CLOSE(name, out, want, N * C, 4e-6 + u * vmax, 1e-6);
                CHECK_CLOSE("bf16 attention lse (shape above)", lse, want_lse, s.B * s.NH * s.T, 2e-6, 1e-6);
                double e2 = 0.0, w2 = 0.0; /* independent roundings: the rms error is 0.11-0.17 u of out's (measured) */
                for (int64_t i = 0; i < N * C; i++) e2 += (out[i] - want[i]) * (out[i] - want[i]), w2 += want[i] * want[i];
                CHECK(sqrt(e2) <= 0.5 * u * sqrt(w2), "%s attention out HS=%lld: rms error %.3g of out's rms, above u/2",
                      path, (long long)s.HS, sqrt(e2 / w2));
                if (p == 0) memcpy(out32, out, (size_t)(N * C) * sizeof(float)), memcpy(lse32, lse, (size_t)(s.B * s.NH * s.T) * sizeof(float));
                else CHECK(same_bits(out, out32, N * C) && same_bits(lse, lse32, s.B * s.NH * s.T),
                           "%s attention forward differs between pools (1 and %d threads)", path, pool_sizes[p]);
            }
            for (int p = 0; p < N_POOLS; p++) {
                memset(dqkv, 0, (size_t)(N * ld) * sizeof(float));
                fs_attention_backward_bf16(pools[p], dqkv, dqkv + C, dqkv + (s.NH + s.NKV) * s.HS, ld, wl, q, k,
                                           v, ld, out, lse, s.B, s.T, s.NH, s.NKV, s.HS);
                int64_t bad = -1;
                for (int64_t i = 0; i < N * ld && bad < 0; i++)
                    if (!(fabs(dqkv[i] - gref[i]) <= 3.0 * u * M[i] + 2e-6 + 2e-5 * fabs(gref[i]))) bad = i;
                CHECK(bad < 0, "%s attention dqkv B=%lld T=%lld NH=%lld NKV=%lld HS=%lld: [%lld] = %.7g, %s %.7g, "
                      "bound 3u M = %.3g", path, (long long)s.B, (long long)s.T, (long long)s.NH, (long long)s.NKV,
                      (long long)s.HS, (long long)bad, bad < 0 ? 0.0 : dqkv[bad], s.fd ? "FD" : "fp32 kernel",
                      bad < 0 ? 0.0 : gref[bad], bad < 0 ? 0.0 : 3.0 * u * M[bad]);
                /* the roundings are independent: the error's rms is about u times the
                 * gradient's (0.4-0.8 u measured on these shapes), far below the bound */
                double e2 = 0.0, f2 = 0.0;
                for (int64_t i = 0; i < N * ld; i++) e2 += (dqkv[i] - gref[i]) * (dqkv[i] - gref[i]), f2 += gref[i] * gref[i];
                CHECK(sqrt(e2) <= 2.0 * u * sqrt(f2), "%s attention dqkv HS=%lld: rms error %.3g of the "
                      "gradient's rms, above 2u = %.3g", path, (long long)s.HS, sqrt(e2 / f2), 2.0 * u);
                if (p == 0) memcpy(dqkv32, dqkv, (size_t)(N * ld) * sizeof(float));
                else CHECK(same_bits(dqkv, dqkv32, N * ld), "%s attention backward differs between pools (1 and %d "
                           "threads)", path, pool_sizes[p]);
            }
        }
        free(r), free(rf), free(want), free(want_lse), free(gref), free(M);
        free(qkv), free(out), free(lse), free(wl), free(dqkv), free(out32), free(lse32), free(dqkv32);
    }
    fs_attention_set_amx(amx_before);
    CHECK(ran_fp32, "no shape took the fp32 fallback (HS = 4, 8, 20 should)");
    if (fast) CHECK(ran_fast, "no shape ran the avx512bf16 path on a CPU that has it");
    if (amx) CHECK(ran_amx, "no shape ran the amx path on a CPU that grants it");
    fs_test_note("paths: %s%s%s", ran_amx ? "amx, " : "", ran_fast ? "avx512bf16, " : "", "fp32 fallback");
}

/* ------------------------------------------------------------------ SwiGLU */

static double ref_silu(double x) { return x / (1.0 + exp(-x)); }

typedef struct swiglu_ctx {
    double *gu, *out;
    const float *weights;
    int64_t N, FF;
} swiglu_ctx;

static double swiglu_loss(void *p) {
    swiglu_ctx *c = p;
    for (int64_t n = 0; n < c->N; n++)
        for (int64_t i = 0; i < c->FF; i++)
            c->out[n * c->FF + i] =
                ref_silu(c->gu[n * 2 * c->FF + i]) * c->gu[n * 2 * c->FF + c->FF + i];
    return weighted_sum(c->out, c->weights, c->N * c->FF);
}

static const nc_shape swiglu_shapes[] = {{1, 24}, {7, 40}, {13, 5}};

/* A few rounded operations and one expf (< 1 ulp) per element, ~4u: 1e-6 relative + 1e-7
 * absolute (outputs near 0 where silu crosses zero); the gradient has a few more
 * operations: 2e-6 relative. Gates include +-30 and -100, where exp(-x) underflows or
 * overflows. */
static void test_swiglu(void) {
    static const fs_kernel_isa swiglu_levels[2] = {FS_ISA_PORTABLE, FS_ISA_AVX512};
    isa_paths ps = paths_begin();
    for (size_t s = 0; s < sizeof swiglu_shapes / sizeof swiglu_shapes[0]; s++) {
        const int64_t N = swiglu_shapes[s].N, FF = swiglu_shapes[s].C;
        float *gu = fnew(N * 2 * FF), *out = fnew(N * FF), *wl = fnew(N * FF);
        float *dgu = fnew(N * 2 * FF);
        fill_normal(gu, N * 2 * FF, 2.0f);
        gu[0] = -100.0f;
        if (FF > 3) gu[1] = 30.0f, gu[2] = -30.0f;
        fill_normal(wl, N * FF, 1.0f);
        swiglu_ctx c = {dcopy(gu, N * 2 * FF), dnew(N * FF), wl, N, FF};
        swiglu_loss(&c);
        double *want = dnew(N * FF);
        memcpy(want, c.out, (size_t)(N * FF) * sizeof(double));
        double *fd = dnew(N * 2 * FF);
        fd_gradient(fd, c.gu, N * 2 * FF, swiglu_loss, &c);
        for (int li = 0; li < 2; li++) {
            if (!paths_use(&ps, swiglu_levels[li])) continue;
            char name[96];
            for (int p = 0; p < N_POOLS; p++) {
                fs_swiglu_forward(pools[p], out, gu, N, FF);
                snprintf(name, sizeof name, "%s swiglu out N=%lld FF=%lld",
                         fs_kernels_isa_name(swiglu_levels[li]), (long long)N, (long long)FF);
                CHECK_CLOSE(name, out, want, N * FF, 1e-7, 1e-6);
                memset(dgu, 0, (size_t)(N * 2 * FF) * sizeof(float));
                fs_swiglu_backward(pools[p], dgu, wl, gu, N, FF);
                snprintf(name, sizeof name, "%s swiglu dgu vs FD N=%lld FF=%lld",
                         fs_kernels_isa_name(swiglu_levels[li]), (long long)N, (long long)FF);
                CHECK_CLOSE(name, dgu, fd, N * 2 * FF, 1e-7, 2e-6);
            }
        }
        free(gu), free(out), free(wl), free(dgu), free(c.gu), free(c.out), free(want), free(fd);
    }
    paths_end(&ps);
}

/* ------------------------------------------------------------------ cross-entropy */

static void ref_xent(double *losses, double *lse, const double *logits, const int32_t *targets,
                     int64_t N, int64_t V) {
    for (int64_t n = 0; n < N; n++) {
        const double *x = logits + n * V;
        double mx = -INFINITY;
        for (int64_t j = 0; j < V; j++) mx = x[j] > mx ? x[j] : mx;
        double z = 0.0;
        for (int64_t j = 0; j < V; j++) z += exp(x[j] - mx);
        double l = mx + log(z);
        if (lse) lse[n] = l;
        losses[n] = l - x[targets[n]];
    }
}

typedef struct xent_ctx {
    double *logits, *losses;
    const int32_t *targets;
    int64_t N, V;
    double dloss;
} xent_ctx;

static double xent_loss(void *p) {
    xent_ctx *c = p;
    ref_xent(c->losses, NULL, c->logits, c->targets, c->N, c->V);
    double s = 0.0;
    for (int64_t n = 0; n < c->N; n++) s += c->dloss * c->losses[n];
    return s;
}

/* Runs forward over the chunks [bounds[i], bounds[i+1]) of the vocabulary, each chunk copied
 * to its own (N, Vc) buffer as the LM head would produce it, then finish and backward;
 * dlogits is assembled into (N, V). */
static double xent_chunked(fs_pool *pool, float *lse, float *losses, float *dlogits,
                           const float *logits, const int32_t *targets, int64_t N, int64_t V,
                           const int64_t *bounds, int n_chunks, float dloss, int in_place) {
    float *row_max = fnew(N), *row_sum = fnew(N), *target_logit = fnew(N);
    float *chunk = fnew(N * V), *dchunk = fnew(N * V);
    for (int c = 0; c < n_chunks; c++) {
        int64_t v0 = bounds[c], Vc = bounds[c + 1] - bounds[c];
        for (int64_t n = 0; n < N; n++)
            memcpy(chunk + n * Vc, logits + n * V + v0, (size_t)Vc * sizeof(float));
        fs_xent_chunk_forward(pool, row_max, row_sum, target_logit, chunk, targets, N, Vc, v0,
                              c == 0);
    }
    double mean = fs_xent_finish(lse, losses, row_max, row_sum, target_logit, N);
    for (int c = 0; c < n_chunks; c++) {
        int64_t v0 = bounds[c], Vc = bounds[c + 1] - bounds[c];
        for (int64_t n = 0; n < N; n++)
            memcpy(chunk + n * Vc, logits + n * V + v0, (size_t)Vc * sizeof(float));
        float *dst = in_place ? chunk : dchunk;
        fs_xent_chunk_backward(pool, dst, chunk, lse, targets, N, Vc, v0, dloss);
        for (int64_t n = 0; n < N; n++)
            memcpy(dlogits + n * V + v0, dst + n * Vc, (size_t)Vc * sizeof(float));
    }
    free(row_max), free(row_sum), free(target_logit), free(chunk), free(dchunk);
    return mean;
}

/* Forward vs double: V-term sums accumulated in double of float exps (< 1 ulp each), then
 * one float rounding of lse (~4, so 2.4e-7): 1e-6 relative + 1e-6 absolute, a bound rather
 * than a fit. Chunked vs one chunk: the running sum is rescaled in double, so lse agrees to
 * about one float rounding: 1e-6 absolute (it is in fact bitwise equal here). Gradients:
 * dloss * (p - y) with p = expf(x - lse), whose relative error is about |x - lse| u < 1e-6:
 * 1e-6 relative + 1e-8 absolute. */
static void test_xent(void) {
    const int64_t N = 7, V = 50;
    const int64_t one[] = {0, V}, three[] = {0, 7, 30, V}; /* uneven chunks */
    float *logits = fnew(N * V), *lse = fnew(N), *losses = fnew(N), *dl = fnew(N * V);
    float *lse3 = fnew(N), *losses3 = fnew(N), *dl3 = fnew(N * V), *dl_in = fnew(N * V);
    int32_t targets[7];
    fill_normal(logits, N * V, 3.0f);
    fill_tokens(targets, N, V);
    targets[0] = 0, targets[1] = 6, targets[2] = 7, targets[3] = V - 1; /* chunk edges */
    const float dloss = 0.37f;
    xent_ctx c = {dcopy(logits, N * V), dnew(N), targets, N, V, (double)dloss};
    double *want_losses = dnew(N), *want_lse = dnew(N);
    ref_xent(want_losses, want_lse, c.logits, targets, N, V);
    double want_mean = 0.0;
    for (int64_t n = 0; n < N; n++) want_mean += want_losses[n] / (double)N;
    double *fd = dnew(N * V);
    fd_gradient(fd, c.logits, N * V, xent_loss, &c);
    /* both paths (the AVX-512 one's exp is fs_cpu_exp16, within 2 ulp of expf: the bounds
     * above hold with room) */
    static const fs_kernel_isa xent_levels[2] = {FS_ISA_PORTABLE, FS_ISA_AVX512};
    isa_paths ps = paths_begin();
    for (int pi = 0; pi < 2 * N_POOLS; pi++) {
        const int p = pi % N_POOLS;
        if (p == 0 && !paths_use(&ps, xent_levels[pi / N_POOLS])) {
            pi++;
            continue;
        }
        double mean1 = xent_chunked(pools[p], lse, losses, dl, logits, targets, N, V, one, 1,
                                    dloss, 0);
        CHECK_CLOSE("xent lse, one chunk", lse, want_lse, N, 1e-6, 1e-6);
        CHECK_CLOSE("xent losses, one chunk", losses, want_losses, N, 1e-6, 1e-6);
        CHECK(fabs(mean1 - want_mean) < 1e-6, "xent mean %.9g, want %.9g", mean1, want_mean);
        CHECK_CLOSE("xent dlogits vs FD, one chunk", dl, fd, N * V, 1e-8, 1e-6);

        double mean3 = xent_chunked(pools[p], lse3, losses3, dl3, logits, targets, N, V, three,
                                    3, dloss, 0);
        double *lse1d = dcopy(lse, N), *losses1d = dcopy(losses, N), *dl1d = dcopy(dl, N * V);
        CHECK_CLOSE("xent lse, three chunks vs one", lse3, lse1d, N, 1e-6, 0.0);
        CHECK_CLOSE("xent losses, three chunks vs one", losses3, losses1d, N, 1e-6, 0.0);
        CHECK(fabs(mean3 - mean1) < 1e-6, "xent mean: three chunks %.9g, one %.9g", mean3, mean1);
        CHECK_CLOSE("xent dlogits, three chunks vs one", dl3, dl1d, N * V, 1e-7, 1e-6);
        CHECK_CLOSE("xent dlogits vs FD, three chunks", dl3, fd, N * V, 1e-8, 1e-6);
        free(lse1d), free(losses1d), free(dl1d);

        /* in place (dlogits aliasing logits) gives the same bits as out of place */
        xent_chunked(pools[p], lse3, losses3, dl_in, logits, targets, N, V, three, 3, dloss, 1);
        CHECK(same_bits(dl_in, dl3, N * V), "xent backward in place differs from out of place");
    }
    paths_end(&ps);
    /* a row whose target lies in no chunk seen (another rank's part of the vocabulary) has
     * target_logit 0, so that per-rank states can be summed */
    {
        float m1[7], s1[7], t1[7];
        for (int64_t n = 0; n < N; n++) t1[n] = NAN;
        fs_xent_chunk_forward(NULL, m1, s1, t1, logits, targets, N, 7, 0, 1);
        int ok = 1;
        for (int64_t n = 0; n < N; n++)
            ok &= targets[n] < 7 ? t1[n] == logits[n * 7 + targets[n]] : t1[n] == 0.0f;
        CHECK(ok, "xent target_logit of rows whose target is outside the chunk must be 0");
    }
    /* lse may alias row_max */
    float row_max[7], row_sum[7], tl[7];
    fs_xent_chunk_forward(NULL, row_max, row_sum, tl, logits, targets, N, V, 0, 1);
    fs_xent_finish(row_max, NULL, row_max, row_sum, tl, N);
    fs_xent_chunk_forward(NULL, lse3, row_sum, tl, logits, targets, N, V, 0, 1);
    fs_xent_finish(lse, NULL, lse3, row_sum, tl, N);
    CHECK(same_bits(row_max, lse, N), "fs_xent_finish with lse aliasing row_max");
    free(logits), free(lse), free(losses), free(dl), free(lse3), free(losses3), free(dl3);
    free(dl_in), free(c.logits), free(c.losses), free(want_losses), free(want_lse), free(fd);
}

/* ------------------------------------------------------------------ accumulation */

/* A backward kernel run on a gradient pre-filled with g0 must give g0 + (its result on a
 * zeroed gradient). Kernels that add row by row into the gradient (embedding, rmsnorm
 * dweight, attention) round each partial sum against g0 rather than against 0, so the two
 * differ by one rounding per added row, of the partial sum at that point. The partial sums
 * are not bounded by the final |g0| + |g| (the terms cancel: attention's dk and dv add T = 13
 * rows of O(1) products, partial sums up to ~4), so the tolerance is 1e-6 (|g0| + |g|) plus
 * 4e-6 absolute, the bound 13 u 4 ~ 3e-6 of those roundings (measured up to 1.7e-7). A write
 * instead of an add loses g0 ~ N(0, 1), 2.5e5 times the absolute part on a typical element. */
static void accumulates(const char *what, const float *g_from_zero, const float *g_from_g0,
                        const float *g0, int64_t n) {
    for (int64_t i = 0; i < n; i++) {
        double want = (double)g0[i] + (double)g_from_zero[i];
        double tol = 1e-6 * (fabs((double)g0[i]) + fabs((double)g_from_zero[i])) + 4e-6;
        if (!(fabs((double)g_from_g0[i] - want) <= tol)) {
            CHECK(0, "%s: element %lld is %.9g, g0 + g = %.9g", what, (long long)i,
                  (double)g_from_g0[i], want);
            return;
        }
    }
}

static void test_backward_kernels_accumulate(void) {
    fs_pool *pool = pools[1];
    /* embedding */
    {
        const int64_t N = 13, C = 24, V = 11;
        int32_t tokens[13];
        fill_tokens(tokens, N, V);
        float *dout = fnew(N * C), *g0 = fnew(V * C), *a = fnew(V * C), *b = fnew(V * C);
        fill_normal(dout, N * C, 1.0f);
        fill_normal(g0, V * C, 1.0f);
        memcpy(b, g0, (size_t)(V * C) * sizeof(float));
        fs_embedding_backward(pool, a, dout, tokens, N, C, 0, V);
        fs_embedding_backward(pool, b, dout, tokens, N, C, 0, V);
        accumulates("embedding dwte", a, b, g0, V * C);
        free(dout), free(g0), free(a), free(b);
    }
    /* rmsnorm, on one thread (dweight in the rows pass) and on three (by columns) */
    for (int p = 0; p < N_POOLS; p++) {
        fs_pool *rms_pool = pools[p];
        const int64_t N = 7, C = 40;
        float *inp = fnew(N * C), *w = fnew(C), *dout = fnew(N * C), *out = fnew(N * C);
        float *rstd = fnew(N), *g0i = fnew(N * C), *g0w = fnew(C);
        float *ai = fnew(N * C), *aw = fnew(C), *bi = fnew(N * C), *bw = fnew(C);
        fill_normal(inp, N * C, 1.0f), fill_normal(w, C, 1.0f), fill_normal(dout, N * C, 1.0f);
        fill_normal(g0i, N * C, 1.0f), fill_normal(g0w, C, 1.0f);
        fs_rmsnorm_forward(rms_pool, out, rstd, inp, w, N, C, 1e-5f);
        memcpy(bi, g0i, (size_t)(N * C) * sizeof(float));
        memcpy(bw, g0w, (size_t)C * sizeof(float));
        fs_rmsnorm_backward(rms_pool, ai, aw, dout, inp, w, rstd, N, C);
        fs_rmsnorm_backward(rms_pool, bi, bw, dout, inp, w, rstd, N, C);
        accumulates("rmsnorm dinp", ai, bi, g0i, N * C);
        accumulates("rmsnorm dweight", aw, bw, g0w, C);
        free(inp), free(w), free(dout), free(out), free(rstd), free(g0i), free(g0w);
        free(ai), free(aw), free(bi), free(bw);
    }
    /* attention: dq, dk, dv in one (N, ld) gradient */
    {
        att_shape s = {2, 13, 6, 2, 4, 5, 0};
        const int64_t ld = (s.NH + 2 * s.NKV) * s.HS + s.pad, N = s.B * s.T, C = s.NH * s.HS;
        float *qkv = fnew(N * ld), *out = fnew(N * C), *lse = fnew(s.B * s.NH * s.T);
        float *dout = fnew(N * C), *g0 = fnew(N * ld), *a = fnew(N * ld), *b = fnew(N * ld);
        fill_normal(qkv, N * ld, 1.0f), fill_normal(dout, N * C, 1.0f);
        fill_normal(g0, N * ld, 1.0f);
        const float *q = qkv, *k = qkv + s.NH * s.HS, *v = qkv + (s.NH + s.NKV) * s.HS;
        fs_attention_forward(pool, out, lse, q, k, v, ld, s.B, s.T, s.NH, s.NKV, s.HS);
        memcpy(b, g0, (size_t)(N * ld) * sizeof(float));
        float *bufs[2] = {a, b};
        for (int r = 0; r < 2; r++)
            fs_attention_backward(pool, bufs[r], bufs[r] + s.NH * s.HS,
                                  bufs[r] + (s.NH + s.NKV) * s.HS, ld, dout, q, k, v, ld, out,
                                  lse, s.B, s.T, s.NH, s.NKV, s.HS);
        accumulates("attention dqkv", a, b, g0, N * ld);
        free(qkv), free(out), free(lse), free(dout), free(g0), free(a), free(b);
    }
    /* swiglu */
    {
        const int64_t N = 7, FF = 40;
        float *gu = fnew(N * 2 * FF), *dout = fnew(N * FF), *g0 = fnew(N * 2 * FF);
        float *a = fnew(N * 2 * FF), *b = fnew(N * 2 * FF);
        fill_normal(gu, N * 2 * FF, 2.0f), fill_normal(dout, N * FF, 1.0f);
        fill_normal(g0, N * 2 * FF, 1.0f);
        memcpy(b, g0, (size_t)(N * 2 * FF) * sizeof(float));
        fs_swiglu_backward(pool, a, dout, gu, N, FF);
        fs_swiglu_backward(pool, b, dout, gu, N, FF);
        accumulates("swiglu dgu", a, b, g0, N * 2 * FF);
        free(gu), free(dout), free(g0), free(a), free(b);
    }
}

/* ------------------------------------------------------------------ pool-size independence */

/* Runs every kernel on pool 1 and pool 3 with shapes big enough that pool 3 really splits,
 * and compares the bits. Promised by the header: matmul dweight, embedding dwte, rmsnorm
 * dweight, fs_sum_squares. The others are per-row, per-element or per-(b, head) work done by
 * one thread each, so the split cannot change their bits either; a difference there would
 * mean a race or a split-dependent reduction. (matmul forward and dinp only promise the same
 * bits for the same pool size, so they are not compared.) */
static void test_pool_size_independence(void) {
    fs_pool *p1 = pools[0], *p3 = pools[1];
    /* matmul dweight: OC = 500, IC = 1100 is a 2 x 4 grid of fixed tiles (256 and 244 rows,
     * three of 288 columns and one of 236) */
    {
        const int64_t N = 61, IC = 1100, OC = 500;
        float *inp = fnew(N * IC), *w = fnew(OC * IC), *dout = fnew(N * OC);
        float *a = fnew(OC * IC), *b = fnew(OC * IC);
        fill_normal(inp, N * IC, 1.0f), fill_normal(w, OC * IC, 1.0f);
        fill_normal(dout, N * OC, 1.0f), fill_normal(a, OC * IC, 1.0f);
        memcpy(b, a, (size_t)(OC * IC) * sizeof(float));
        fs_matmul_backward(p1, NULL, a, dout, inp, w, N, IC, OC, 0, 1);
        fs_matmul_backward(p3, NULL, b, dout, inp, w, N, IC, OC, 0, 1);
        CHECK(same_bits(a, b, OC * IC), "matmul dweight differs between pools 1 and 3");
        free(inp), free(w), free(dout), free(a), free(b);
    }
    const int64_t N = 1000, C = 56, V = 50, FF = 56; /* C = 56: 16-column blocks 16,16,16,8 */
    float *x = fnew(N * 2 * FF), *w = fnew(C), *dout = fnew(N * 2 * FF);
    float *a = fnew(N * 2 * FF), *b = fnew(N * 2 * FF), *a2 = fnew(V * C), *b2 = fnew(V * C);
    float *r1 = fnew(N), *r3 = fnew(N);
    int32_t *tokens = xcalloc(N, sizeof(int32_t));
    fill_normal(x, N * 2 * FF, 1.0f), fill_normal(w, C, 1.0f), fill_normal(dout, N * 2 * FF, 1.0f);
    fill_tokens(tokens, N, V);

    memset(a2, 0, (size_t)(V * C) * sizeof(float)), memset(b2, 0, (size_t)(V * C) * sizeof(float));
    fs_embedding_backward(p1, a2, dout, tokens, N, C, 0, V);
    fs_embedding_backward(p3, b2, dout, tokens, N, C, 0, V);
    CHECK(same_bits(a2, b2, V * C), "embedding dwte differs between pools 1 and 3");
    fs_embedding_forward(p1, a, tokens, x, N, C, 0, V);
    fs_embedding_forward(p3, b, tokens, x, N, C, 0, V);
    CHECK(same_bits(a, b, N * C), "embedding forward differs between pools");

    fs_rmsnorm_forward(p1, a, r1, x, w, N, C, 1e-5f);
    fs_rmsnorm_forward(p3, b, r3, x, w, N, C, 1e-5f);
    CHECK(same_bits(a, b, N * C) && same_bits(r1, r3, N), "rmsnorm forward differs between pools");
    memset(a, 0, (size_t)(N * C) * sizeof(float)), memset(b, 0, (size_t)(N * C) * sizeof(float));
    memset(a2, 0, (size_t)C * sizeof(float)), memset(b2, 0, (size_t)C * sizeof(float));
    fs_rmsnorm_backward(p1, a, a2, dout, x, w, r1, N, C);
    fs_rmsnorm_backward(p3, b, b2, dout, x, w, r1, N, C);
    CHECK(same_bits(a2, b2, C), "rmsnorm dweight differs between pools 1 and 3");
    CHECK(same_bits(a, b, N * C), "rmsnorm dinp differs between pools");

    float *cs = fnew(N * 4), *sn = fnew(N * 4);
    fs_rope_table(cs, sn, N, 8, 10000.0f);
    memcpy(a, x, (size_t)(N * C) * sizeof(float)), memcpy(b, x, (size_t)(N * C) * sizeof(float));
    fs_rope_forward(p1, a, C, cs, sn, 1, N, 7, 8);
    fs_rope_forward(p3, b, C, cs, sn, 1, N, 7, 8);
    CHECK(same_bits(a, b, N * C), "rope forward differs between pools");
    fs_rope_backward(p1, a, C, cs, sn, 2, N / 2, 7, 8);
    fs_rope_backward(p3, b, C, cs, sn, 2, N / 2, 7, 8);
    CHECK(same_bits(a, b, N * C), "rope backward differs between pools");
    free(cs), free(sn);

    fs_swiglu_forward(p1, a, x, N, FF);
    fs_swiglu_forward(p3, b, x, N, FF);
    CHECK(same_bits(a, b, N * FF), "swiglu forward differs between pools");
    memset(a, 0, (size_t)(N * 2 * FF) * sizeof(float));
    memset(b, 0, (size_t)(N * 2 * FF) * sizeof(float));
    fs_swiglu_backward(p1, a, dout, x, N, FF);
    fs_swiglu_backward(p3, b, dout, x, N, FF);
    CHECK(same_bits(a, b, N * 2 * FF), "swiglu backward differs between pools");

    /* cross-entropy: x as (N, V) logits in two chunks */
    {
        float *m1 = fnew(N), *s1 = fnew(N), *t1 = fnew(N);
        float *m3 = fnew(N), *s3 = fnew(N), *t3 = fnew(N);
        fs_xent_chunk_forward(p1, m1, s1, t1, x, tokens, N, 20, 0, 1);
        fs_xent_chunk_forward(p1, m1, s1, t1, x + N * 20, tokens, N, 30, 20, 0);
        fs_xent_chunk_forward(p3, m3, s3, t3, x, tokens, N, 20, 0, 1);
        fs_xent_chunk_forward(p3, m3, s3, t3, x + N * 20, tokens, N, 30, 20, 0);
        CHECK(same_bits(m1, m3, N) && same_bits(s1, s3, N) && same_bits(t1, t3, N),
              "xent forward differs between pools");
        fs_xent_finish(m1, NULL, m1, s1, t1, N);
        fs_xent_chunk_backward(p1, a, x, m1, tokens, N, 20, 0, 0.001f);
        fs_xent_chunk_backward(p3, b, x, m1, tokens, N, 20, 0, 0.001f);
        CHECK(same_bits(a, b, N * 20), "xent backward differs between pools");
        free(m1), free(s1), free(t1), free(m3), free(s3), free(t3);
    }
    /* attention: B * NH = 6 forward items and B * NKV = 4 backward items over 3 threads */
    {
        att_shape s = {2, 13, 6, 2, 4, 5, 0};
        const int64_t ld = (s.NH + 2 * s.NKV) * s.HS + s.pad, NT = s.B * s.T, Ca = s.NH * s.HS;
        float *o1 = fnew(NT * Ca), *o3 = fnew(NT * Ca), *l1 = fnew(s.B * s.NH * s.T);
        float *l3 = fnew(s.B * s.NH * s.T), *g1 = fnew(NT * ld), *g3 = fnew(NT * ld);
        const float *q = x, *k = x + s.NH * s.HS, *v = x + (s.NH + s.NKV) * s.HS;
        fs_attention_forward(p1, o1, l1, q, k, v, ld, s.B, s.T, s.NH, s.NKV, s.HS);
        fs_attention_forward(p3, o3, l3, q, k, v, ld, s.B, s.T, s.NH, s.NKV, s.HS);
        CHECK(same_bits(o1, o3, NT * Ca) && same_bits(l1, l3, s.B * s.NH * s.T),
              "attention forward differs between pools");
        float *gs[2] = {g1, g3};
        fs_pool *ps[2] = {p1, p3};
        for (int r = 0; r < 2; r++)
            fs_attention_backward(ps[r], gs[r], gs[r] + s.NH * s.HS, gs[r] + (s.NH + s.NKV) * s.HS,
                                  ld, dout, q, k, v, ld, o1, l1, s.B, s.T, s.NH, s.NKV, s.HS);
        CHECK(same_bits(g1, g3, NT * ld), "attention backward differs between pools");
        free(o1), free(o3), free(l1), free(l3), free(g1), free(g3);
    }
    /* AdamW over 3 * 4096 + 17 elements (the 8-lane body and the scalar tail) */
    {
        const int64_t n = 3 * 4096 + 17;
        float *p = fnew(n), *g = fnew(n), *m = fnew(n), *vv = fnew(n);
        fill_normal(p, n, 1.0f), fill_normal(g, n, 0.01f);
        float *pp[2] = {fcopy(p, n), fcopy(p, n)}, *mm[2] = {fcopy(m, n), fcopy(m, n)};
        float *vs[2] = {fcopy(vv, n), fcopy(vv, n)};
        fs_adamw_params hp = {.lr = 1e-3, .beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8,
                              .weight_decay = 0.1, .step = 1};
        fs_adamw_update(p1, pp[0], NULL, mm[0], vs[0], g, 0.37f, n, hp);
        fs_adamw_update(p3, pp[1], NULL, mm[1], vs[1], g, 0.37f, n, hp);
        CHECK(same_bits(pp[0], pp[1], n) && same_bits(mm[0], mm[1], n) &&
                  same_bits(vs[0], vs[1], n),
              "adamw differs between pools");
        free(p), free(g), free(m), free(vv);
        for (int r = 0; r < 2; r++) free(pp[r]), free(mm[r]), free(vs[r]);
    }
    free(x), free(w), free(dout), free(a), free(b), free(a2), free(b2), free(r1), free(r3);
    free(tokens);
}

/* ------------------------------------------------------------------ AdamW */

/* torch.optim.AdamW in double, the textbook formula. */
static void ref_adamw(double *p, double *m, double *v, const float *g, int64_t n,
                      fs_adamw_params hp) {
    double bc1 = 1.0 - pow(hp.beta1, (double)hp.step), bc2 = 1.0 - pow(hp.beta2, (double)hp.step);
    for (int64_t i = 0; i < n; i++) {
        p[i] *= 1.0 - hp.lr * hp.weight_decay;
        m[i] = hp.beta1 * m[i] + (1.0 - hp.beta1) * g[i];
        v[i] = hp.beta2 * v[i] + (1.0 - hp.beta2) * (double)g[i] * g[i];
        p[i] -= hp.lr / bc1 * m[i] / (sqrt(v[i]) / sqrt(bc2) + hp.eps);
    }
}

/* Five steps against double. p is rounded twice per step (the decay product and the update
 * sum, each <= u |p|; the lr-sized update's own few-u error is negligible): at most 10 u |p|
 * = 6e-7 |p| after five steps, tolerance 1.2e-6 relative. m and v are rounded two or three
 * times per step relative to themselves: 1e-6 and 2e-6 relative. */
static void test_adamw_vs_double(void) {
    const int64_t n = 1037;
    for (int wd = 0; wd <= 1; wd++) {
        fs_adamw_params hp = {.lr = 1e-3, .beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8,
                              .weight_decay = wd ? 0.1 : 0.0, .step = 0};
        float *p = fnew(n), *m = fnew(n), *v = fnew(n), *g = fnew(n);
        fill_normal(p, n, 1.0f);
        double *dp = dcopy(p, n), *dm = dnew(n), *dv = dnew(n);
        for (int step = 1; step <= 5; step++) {
            fill_normal(g, n, 0.01f);
            hp.step = step;
            fs_adamw_update(pools[step % 2], p, NULL, m, v, g, 1.0f, n, hp);
            ref_adamw(dp, dm, dv, g, n, hp);
        }
        CHECK_CLOSE(wd ? "adamw param (wd 0.1)" : "adamw param (wd 0)", p, dp, n, 1e-8, 1.2e-6);
        CHECK_CLOSE("adamw m", m, dm, n, 1e-8, 1e-6);
        CHECK_CLOSE("adamw v", v, dv, n, 1e-12, 2e-6);
        free(p), free(m), free(v), free(g), free(dp), free(dm), free(dv);
    }
}

/* Golden data from torch 1.13.1 (Debian python3-torch, AVX2 kernels, one thread):
 *   torch.manual_seed(0); p = torch.randn(24); g = torch.randn(5, 24) * 0.01
 *   w = torch.nn.Parameter(p.clone())
 *   opt = torch.optim.AdamW([w], lr=1e-3, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)
 *   for s in range(5): w.grad = g[s].clone(); opt.step()
 * and printed with repr(np.float32(x)) (exact). 24 elements cover PyTorch's 16-wide vector
 * body and its scalar tail. */
static const float adamw_golden_p0[] = {
    -1.1258398f, -1.1523602f, -0.25057858f, -0.4338788f, 0.84871036f, 0.69200915f,
    -0.31601277f, -2.1152194f, 0.4680964f, -0.15771244f, 1.4436601f, 0.2660494f,
    0.16645534f, 0.87438184f, -0.14347385f, -0.11160933f, 0.9318266f, 1.2590092f,
    2.0049806f, 0.053736903f, 0.61805665f, -0.41280222f, -0.8410648f, -2.316042f};
static const float adamw_golden_g[] = {
    -0.0021586325f, -0.0074254815f, 0.0056272135f, 0.002596274f, -0.00173961f,
    -0.006787462f, 0.009382607f, 0.004888698f, 0.012032237f, 0.00084534695f, -0.012001393f,
    -4.785738e-05f, -0.005180748f, -0.003067042f, -0.015809938f, 0.017066432f,
    0.0020552566f, -0.0045032976f, -0.0057307705f, -0.005553584f, 0.0059432304f,
    0.015419425f, 0.005073344f, -0.0059103314f, -0.0132532595f, 0.0018855357f,
    -0.00069072685f, -0.0049492535f, -0.014959149f, -0.0019383712f, 0.0044551217f,
    0.013252748f, 0.015091219f, 0.020819554f, 0.017067116f, 0.023803676f, -0.011256016f,
    -0.0031699808f, -0.010924682f, -0.0008519429f, 0.003276143f, -0.0076070717f,
    -0.01599082f, 0.00018486667f, -0.007504268f, 0.0018540798f, 0.0062113833f,
    0.0063818153f, -3.3038727e-05f, -0.0053444067f, 0.011686878f, 0.0039450275f,
    0.01941462f, 0.007914981f, -0.00020251826f, -0.004371695f, -0.015352871f,
    -0.0041267914f, 0.009663032f, 0.016247831f, -0.0036561878f, -0.013024404f,
    0.0009940346f, 0.00441822f, 0.00073246047f, 0.011133184f, 0.0028226722f, 0.0043422566f,
    -0.008024929f, -0.012951861f, -0.007501815f, -0.013119657f, 0.002064163f,
    -0.0033344787f, -0.0042883f, 0.0023291828f, 0.007968872f, -0.0018484163f,
    -0.0037014724f, -0.012102814f, -0.0070152357f, 0.010366867f, -0.006036701f,
    -0.012787651f, 0.0009295023f, -0.006660997f, 0.006080472f, -0.0073001985f, 0.013750379f,
    0.0065963105f, 0.004765571f, -0.010163074f, 0.0018036697f, 0.0010833186f,
    -0.0075482326f, 0.0024431853f, 0.011403507f, -0.00089882064f, 0.007297962f,
    -0.01845319f, -0.0002501994f, 0.0136938095f, 0.02657023f, 0.009851194f, 0.009671456f,
    -0.0099108275f, 0.0030160542f, -0.0010731693f, 0.009984566f, -0.0049871476f,
    0.007611109f, 0.006183008f, 0.0031404856f, 0.0021333299f, -0.0012005083f, 0.0036045972f,
    -0.0031403499f, -0.01078708f, 0.0024081052f, -0.013962273f};
static const float adamw_golden_p[] = {
    -1.1224123f, -1.1482717f, -0.25376683f, -0.43437004f, 0.84948003f, 0.69316286f,
    -0.31945154f, -2.1167371f, 0.4654592f, -0.1607023f, 1.4428647f, 0.26465315f,
    0.17003155f, 0.878523f, -0.14018157f, -0.1144886f, 0.927053f, 1.2597641f, 2.0071354f,
    0.056061767f, 0.61816424f, -0.4142477f, -0.84242177f, -2.3126302f};
static const float adamw_golden_m[] = {
    0.00021565883f, -0.0011726123f, 0.0016093337f, -0.0015066044f, 0.0010601049f,
    0.0012575043f, 0.0032478578f, 0.0008286315f, 0.0009817766f, 0.001180874f, 0.0009977891f,
    0.001790017f, -0.00037451182f, -0.0025855012f, -0.000444829f, 0.0013767806f,
    0.001984588f, 0.00085877196f, -0.0010042394f, -0.00055338803f, -0.0009588497f,
    -0.00088347925f, -0.00026050545f, -0.0021615752f};
static const float adamw_golden_v[] = {
    1.44240485e-05f, 4.255337e-06f, 1.1009868e-05f, 1.9310584e-05f, 2.9744619e-05f,
    1.4402524e-05f, 4.038755e-05f, 2.1175005e-05f, 3.3310072e-05f, 2.9395365e-05f,
    2.4752217e-05f, 4.4027784e-05f, 1.21532885e-05f, 1.18197595e-05f, 1.9993004e-05f,
    1.7216658e-05f, 1.0130449e-05f, 1.1194092e-05f, 1.380965e-05f, 7.664208e-06f,
    7.406256e-06f, 2.3273713e-05f, 8.237962e-06f, 2.0966503e-05f};

/* Bit for bit: the kernel reproduces PyTorch's rounding points (see adamw.c). The 24
 * elements are updated in one call (all in the 8-lane AVX2 body on the avx2 path) and in
 * two calls of 13 and 11 (so that 8 of them go through the scalar tail): the portable and the
 * avx2 path must both give PyTorch's bits, on both pools. */
static void test_adamw_matches_pytorch(void) {
    enum { n = 24 };
    static const fs_kernel_isa adamw_levels[2] = {FS_ISA_PORTABLE, FS_ISA_AVX2};
    isa_paths ps = paths_begin();
    for (int li = 0; li < 2; li++) {
        if (!paths_use(&ps, adamw_levels[li])) continue;
        const char *path = fs_kernels_isa_name(adamw_levels[li]);
        for (int pi = 0; pi < N_POOLS; pi++)
            for (int split = 0; split <= 1; split++) {
                float p[n], m[n] = {0}, v[n] = {0};
                memcpy(p, adamw_golden_p0, sizeof p);
                fs_adamw_params hp = {.lr = 1e-3, .beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8,
                                      .weight_decay = 0.1, .step = 0};
                for (int step = 1; step <= 5; step++) {
                    const float *g = adamw_golden_g + (step - 1) * n;
                    hp.step = step;
                    if (split) {
                        fs_adamw_update(pools[pi], p, NULL, m, v, g, 1.0f, 13, hp);
                        fs_adamw_update(pools[pi], p + 13, NULL, m + 13, v + 13, g + 13, 1.0f, n - 13, hp);
                    } else {
                        fs_adamw_update(pools[pi], p, NULL, m, v, g, 1.0f, n, hp);
                    }
                }
                for (int i = 0; i < n; i++) {
                    CHECK(p[i] == adamw_golden_p[i], "%s split=%d param[%d] %.9g, PyTorch %.9g",
                          path, split, i, (double)p[i], (double)adamw_golden_p[i]);
                    CHECK(m[i] == adamw_golden_m[i], "%s split=%d m[%d] %.9g, PyTorch %.9g", path,
                          split, i, (double)m[i], (double)adamw_golden_m[i]);
                    CHECK(v[i] == adamw_golden_v[i], "%s split=%d v[%d] %.9g, PyTorch %.9g", path,
                          split, i, (double)v[i], (double)adamw_golden_v[i]);
                }
            }
    }
    paths_end(&ps);
}

/* ------------------------------------------------------------------ reductions */

/* grad_scale (the mean and clip factor the engine folds into AdamW): a step on g with scale s
 * has the bits of a step on the rounded products g * s with scale 1 — what the engine's
 * separate scaling pass gave before it was folded in — on every ISA path (vector bodies and
 * the scalar tail), and leaves g as it was. */
static void test_adamw_grad_scale(void) {
    const int64_t n = 3 * 4096 + 19;
    const float s = 0.3f; /* not a power of two: the product rounds */
    float *p = fnew(n), *m = fnew(n), *v = fnew(n), *g = fnew(n);
    fill_normal(p, n, 1.0f), fill_normal(m, n, 1e-3f), fill_normal(v, n, 1e-3f), fill_normal(g, n, 1e-2f);
    for (int64_t i = 0; i < n; i++) v[i] = fabsf(v[i]);
    float *gs = fcopy(g, n), *g0 = fcopy(g, n);
    for (int64_t i = 0; i < n; i++) gs[i] = g[i] * s;
    fs_adamw_params hp = {.lr = 1e-3, .beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8, .weight_decay = 0.1, .step = 3};
    isa_paths ps = paths_begin();
    const fs_kernel_isa levels[3] = {FS_ISA_PORTABLE, FS_ISA_AVX2, FS_ISA_AVX512};
    for (int li = 0; li < 3; li++) {
        if (!paths_use(&ps, levels[li])) continue;
        float *pa = fcopy(p, n), *ma = fcopy(m, n), *va = fcopy(v, n);
        float *pb = fcopy(p, n), *mb = fcopy(m, n), *vb = fcopy(v, n);
        fs_adamw_update(pools[1], pa, NULL, ma, va, g, s, n, hp);
        fs_adamw_update(pools[1], pb, NULL, mb, vb, gs, 1.0f, n, hp);
        CHECK(same_bits(pa, pb, n) && same_bits(ma, mb, n) && same_bits(va, vb, n),
              "isa %d: adamw on g with grad_scale %g differs from adamw on g * %g", (int)levels[li],
              (double)s, (double)s);
        CHECK(same_bits(g, g0, n), "isa %d: adamw wrote its gradient", (int)levels[li]);
        free(pa), free(ma), free(va), free(pb), free(mb), free(vb);
    }
    fs_kernels_set_isa(ps.before);
    free(p), free(m), free(v), free(g), free(gs), free(g0);
}

/* The bf16 copy AdamW writes in the same pass equals fs_fp32_to_bf16 of the new weights:
 * after a real step on random data, and, with lr = 0 (weights unchanged), on the values
 * where rounding is delicate — ties to even both ways, the largest value that rounds up to
 * infinity, infinities, NaN, subnormals, signed zeros. */
static void test_adamw_writes_the_bf16_copy(void) {
    const int64_t n = 4096 + 4099; /* vector bodies and a scalar tail */
    float *p = fnew(n), *m = fnew(n), *v = fnew(n), *g = fnew(n);
    uint16_t *copy = calloc((size_t)n, sizeof *copy);
    fill_normal(p, n, 1.0f), fill_normal(g, n, 1.0f);
    memset(m, 0, (size_t)n * sizeof *m), memset(v, 0, (size_t)n * sizeof *v);
    fs_adamw_params hp = {.lr = 1e-2, .beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8, .weight_decay = 0.1, .step = 1};
    fs_adamw_update(pools[1], p, copy, m, v, g, 1.0f, n, hp);
    int64_t bad = 0;
    for (int64_t i = 0; i < n; i++) bad += copy[i] != fs_fp32_to_bf16(p[i]);
    CHECK(bad == 0, "%lld of %lld bf16 copies differ from the cast of the new weights after a step",
          (long long)bad, (long long)n);
    static const uint32_t special[] = {0x3f808000u, 0x3f818000u, 0xbf808000u, 0x7f7fffffu, 0x7f7f8000u,
                                       0x7f800000u, 0xff800000u, 0x7fc00000u, 0x7f800001u, 0x00000001u,
                                       0x00808000u, 0x80000000u, 0x00000000u, 0x3f80ffffu, 0x3f807fffu};
    const int64_t ns = (int64_t)(sizeof special / sizeof special[0]);
    for (int64_t i = 0; i < n; i++) memcpy(&p[i], &special[i % ns], sizeof(float));
    memset(g, 0, (size_t)n * sizeof *g);
    hp.lr = 0.0;
    fs_adamw_update(pools[0], p, copy, m, v, g, 1.0f, n, hp);
    bad = 0;
    for (int64_t i = 0; i < n; i++) {
        uint32_t bits;
        memcpy(&bits, &p[i], sizeof bits);
        uint16_t want = fs_fp32_to_bf16(p[i]);
        if (copy[i] != want && bad++ < 3)
            CHECK(0, "element %lld (0x%08x): copy 0x%04x, cast 0x%04x", (long long)i, bits, copy[i], want);
    }
    CHECK(bad == 0, "%lld special values cast differently", (long long)bad);
    free(p), free(m), free(v), free(g), free(copy);
}

/* fs_cast_fp32_to_bf16 is fs_fp32_to_bf16 element by element on every path (the AVX-512 loop
 * rounds in integer steps: vcvtneps2bf16 would flush subnormal inputs): random values and the
 * delicate ones (ties both ways, overflow to infinity, infinities, NaNs, subnormals, signed
 * zeros), lengths that end inside a masked tail, offsets that split a vector between threads;
 * and the widening back is exact. */
static void test_cast_bf16(void) {
    static const uint32_t special[] = {0x3f808000u, 0x3f818000u, 0xbf808000u, 0x7f7fffffu, 0x7f7f8000u,
                                       0x7f800000u, 0xff800000u, 0x7fc00000u, 0x7f800001u, 0xff800001u,
                                       0x00000001u, 0x00808000u, 0x00018000u, 0x80000000u, 0x00000000u,
                                       0x3f80ffffu, 0x3f807fffu};
    static const fs_kernel_isa levels[2] = {FS_ISA_PORTABLE, FS_ISA_AVX512};
    static const int64_t lengths[] = {1, 15, 16, 17, 31, 32, 33, 47, 16384 * 3 + 37};
    const int64_t nmax = 16384 * 3 + 37, ns = (int64_t)(sizeof special / sizeof special[0]);
    float *x = fnew(nmax), *back = fnew(nmax);
    uint16_t *out = calloc((size_t)nmax, sizeof *out);
    fill_normal(x, nmax, 1.0f);
    for (int64_t i = 0; i < nmax; i += 3) memcpy(&x[i], &special[(i / 3) % ns], sizeof(float));
    isa_paths ps = paths_begin();
    for (int li = 0; li < 2; li++) {
        if (!paths_use(&ps, levels[li])) continue;
        for (size_t k = 0; k < sizeof lengths / sizeof lengths[0]; k++)
            for (int p = 0; p < N_POOLS; p++) {
                const int64_t n = lengths[k];
                memset(out, 0xab, (size_t)nmax * sizeof *out);
                fs_cast_fp32_to_bf16(pools[p], out, x, n);
                int64_t bad = 0, first = -1;
                for (int64_t i = 0; i < n; i++)
                    if (out[i] != fs_fp32_to_bf16(x[i]) && bad++ == 0) first = i;
                CHECK(bad == 0, "%s n=%lld pool %d: %lld casts differ (first [%lld]: 0x%04x, want 0x%04x)",
                      fs_kernels_isa_name(levels[li]), (long long)n, pool_sizes[p], (long long)bad, (long long)first,
                      first < 0 ? 0 : out[first], first < 0 ? 0 : fs_fp32_to_bf16(x[first]));
                CHECK(n == nmax || out[n] == 0xabab, "%s n=%lld: wrote past the end", fs_kernels_isa_name(levels[li]),
                      (long long)n);
                fs_cast_bf16_to_fp32(pools[p], back, out, n);
                bad = 0;
                for (int64_t i = 0; i < n; i++) {
                    const float want = fs_bf16_to_fp32(out[i]);
                    bad += memcmp(&back[i], &want, sizeof want) != 0;
                }
                CHECK(bad == 0, "n=%lld: %lld widened values differ", (long long)n, (long long)bad);
            }
    }
    paths_end(&ps);
    free(x), free(back), free(out);
}

/* The AVX-512 SwiGLU (vectorised exp) against the portable one (libm expf), over every
 * magnitude of the gate, -100 to 100, including where exp overflows: within 4 ulp of the
 * larger output (plus, for the gate gradient, 8 ulp of |dy u| where it cancels), and the
 * same zeros, signs and infinities. */
static void test_swiglu_paths_agree(void) {
    if (fs_kernels_cpu_isa() < FS_ISA_AVX512)
        SKIP(FS_SKIP_NOT_APPLICABLE, "the avx512 SwiGLU path is not available on this CPU (best: %s)",
             fs_kernels_isa_name(fs_kernels_cpu_isa()));
    const int64_t N = 3, FF = 20001; /* a masked tail */
    float *gu = fnew(N * 2 * FF), *o1 = fnew(N * FF), *o2 = fnew(N * FF), *dy = fnew(N * FF);
    float *d1 = fnew(N * 2 * FF), *d2 = fnew(N * 2 * FF);
    for (int64_t n = 0; n < N; n++)
        for (int64_t i = 0; i < FF; i++) {
            gu[n * 2 * FF + i] = -100.0f + 200.0f * (float)i / (float)(FF - 1) + 0.37f * (float)n;
            gu[n * 2 * FF + FF + i] = 1.0f + 0.001f * (float)i;
            dy[n * FF + i] = 0.5f - 0.0001f * (float)i;
        }
    memset(d1, 0, (size_t)(N * 2 * FF) * sizeof(float));
    memset(d2, 0, (size_t)(N * 2 * FF) * sizeof(float));
    fs_kernel_isa before = fs_kernels_set_isa(FS_ISA_PORTABLE);
    fs_swiglu_forward(pools[1], o1, gu, N, FF);
    fs_swiglu_backward(pools[1], d1, dy, gu, N, FF);
    fs_kernels_set_isa(FS_ISA_AVX512);
    const fs_kernel_isa fast = fs_kernels_isa();
    fs_swiglu_forward(pools[1], o2, gu, N, FF);
    fs_swiglu_backward(pools[1], d2, dy, gu, N, FF);
    fs_kernels_set_isa(before);
    CHECK(fast == FS_ISA_AVX512, "capping at avx512 ran %s", fs_kernels_isa_name(fast));
    fs_test_note("%s vs portable", fs_kernels_isa_name(fast));
    int64_t bad = 0;
    for (int pass = 0; pass < 2; pass++) {
        const float *a = pass ? d1 : o1, *b = pass ? d2 : o2;
        const int64_t n = pass ? N * 2 * FF : N * FF;
        for (int64_t i = 0; i < n; i++) {
            const double x = a[i], y = b[i], big = fmax(fabs(x), fabs(y));
            /* dgate = dy u sig (1 + g (1 - sig)) cancels where 1 + g (1 - sig) ~ 0 (g ~ -1.28):
             * there an ulp of exp moves it by ulps of |dy u|, not of the result */
            const int64_t row = i / (pass ? 2 * FF : FF), col = i % (pass ? 2 * FF : FF);
            const double scale = pass && col < FF ? fabs((double)dy[row * FF + col] * gu[row * 2 * FF + FF + col]) : 0.0;
            const double tol = 4.0 * 0x1p-23 * big + 8.0 * 0x1p-23 * scale;
            const int ok = x == y || (isfinite(x) && isfinite(y) && fabs(x - y) <= tol);
            if (!ok && bad++ < 3)
                CHECK(0, "%s[%lld]: portable %.9g, %s %.9g", pass ? "dgu" : "out", (long long)i, x,
                      fs_kernels_isa_name(fast), y);
        }
    }
    CHECK(bad == 0, "%lld outputs differ by more than the tolerance", (long long)bad);
    free(gu), free(o1), free(o2), free(dy), free(d1), free(d2);
}

/* RoPE: the AVX-512 copy runs the portable loop's operations in the same order, so the same
 * bits, forward and backward, on half head sizes that end inside a vector (not multiples of
 * 16), rows of several heads inside a wider row (ld), on one thread and three. */
/* fs_swiglu_forward_bf16 on a bf16 gu is bit for bit the rounding (fs_fp32_to_bf16) of
 * fs_swiglu_forward's h on that gu widened to fp32, and fs_swiglu_backward_bf16 that of what
 * fs_swiglu_backward leaves in a zeroed dgu (and its optional h that of
 * fs_swiglu_forward_bf16), on each path against the same path's fp32 kernel, on 1 and 3
 * threads: the gate over -100..100 (exp overflowing: silu = -0, which the
 * zeroed fp32 dgu turns into +0), a masked tail (FF = 1001), and NaN (one whose payload
 * needs the NaN rounding branch) and infinite gradients. */
static void test_swiglu_bf16_outputs(void) {
    static const fs_kernel_isa levels[2] = {FS_ISA_PORTABLE, FS_ISA_AVX512};
    const int64_t N = 5, FF = 1001;
    float *gu = fnew(N * 2 * FF), *dy = fnew(N * FF), *d32 = fnew(N * 2 * FF);
    uint16_t *d16 = xcalloc(N * 2 * FF, sizeof(uint16_t)), *d2 = xcalloc(N * 2 * FF, sizeof(uint16_t));
    uint16_t *h1 = xcalloc(N * FF, sizeof(uint16_t)), *h2 = xcalloc(N * FF, sizeof(uint16_t));
    for (int64_t n = 0; n < N; n++)
        for (int64_t i = 0; i < FF; i++) {
            gu[n * 2 * FF + i] = -100.0f + 200.0f * (float)i / (float)(FF - 1) + 0.37f * (float)n;
            gu[n * 2 * FF + FF + i] = (float)fs_rand_normal(0x5e, 1, (uint64_t)(n * FF + i));
            dy[n * FF + i] = (float)fs_rand_normal(0x5e, 2, (uint64_t)(n * FF + i));
        }
    /* a NaN whose payload would round up into -0 without fs_fp32_to_bf16's NaN branch */
    const uint32_t nan_bits = 0x7fffffffu;
    memcpy(&dy[3], &nan_bits, sizeof nan_bits);
    dy[FF + 7] = INFINITY, dy[2 * FF + 11] = -0.0f;
    /* gu in bf16 (as the gate/up GEMM writes it), and the fp32 kernels' gu its widened values */
    uint16_t *gu16 = xcalloc(N * 2 * FF, sizeof(uint16_t));
    for (int64_t i = 0; i < N * 2 * FF; i++) gu16[i] = fs_fp32_to_bf16(gu[i]), gu[i] = fs_bf16_to_fp32(gu16[i]);
    for (int li = 0; li < 2; li++) {
        if (fs_kernels_cpu_isa() < levels[li]) {
            fs_test_note("%s: not on this CPU", fs_kernels_isa_name(levels[li]));
            continue;
        }
        fs_kernel_isa before = fs_kernels_set_isa(levels[li]);
        for (int p = 0; p < 2; p++) {
            fs_pool *pool = pools[p];
            memset(d32, 0, (size_t)(N * 2 * FF) * sizeof(float));
            memset(d16, 0xab, (size_t)(N * 2 * FF) * sizeof(uint16_t));
            fs_swiglu_forward(pool, d32, gu, N, FF); /* h, and its bf16 form */
            fs_swiglu_forward_bf16(pool, d16, gu16, N, FF);
            memcpy(h1, d16, (size_t)(N * FF) * sizeof(uint16_t));
            int64_t hbad = 0;
            for (int64_t i = 0; i < N * FF; i++)
                if (d16[i] != fs_fp32_to_bf16(d32[i]) && hbad++ < 3)
                    CHECK(0, "%s, pool %d: h[%lld] = 0x%04x, want 0x%04x (fp32 %.9g)", fs_kernels_isa_name(levels[li]),
                          p ? 3 : 1, (long long)i, d16[i], fs_fp32_to_bf16(d32[i]), d32[i]);
            memset(d32, 0, (size_t)(N * 2 * FF) * sizeof(float));
            memset(d16, 0xab, (size_t)(N * 2 * FF) * sizeof(uint16_t));
            fs_swiglu_backward(pool, d32, dy, gu, N, FF);
            fs_swiglu_backward_bf16(pool, d16, NULL, dy, gu16, N, FF);
            int64_t bad = 0, zeros = 0;
            for (int64_t i = 0; i < N * 2 * FF; i++) {
                zeros += d16[i] == 0;
                if (d16[i] != fs_fp32_to_bf16(d32[i]) && bad++ < 3)
                    CHECK(0, "%s, pool %d: dgu[%lld] = 0x%04x, want 0x%04x (fp32 %.9g)",
                          fs_kernels_isa_name(levels[li]), p ? 3 : 1, (long long)i, d16[i],
                          fs_fp32_to_bf16(d32[i]), d32[i]);
            }
            CHECK(bad == 0, "%s, pool %d: %lld of %lld values differ", fs_kernels_isa_name(levels[li]), p ? 3 : 1,
                  (long long)bad, (long long)(N * 2 * FF));
            CHECK(zeros > 0, "the case never produced a zero gradient (the -0 -> +0 rule went untested)");
            /* with h: the same dgu, and h as fs_swiglu_forward_bf16 makes it */
            memset(d2, 0xcd, (size_t)(N * 2 * FF) * sizeof(uint16_t));
            memset(h2, 0xcd, (size_t)(N * FF) * sizeof(uint16_t));
            fs_swiglu_backward_bf16(pool, d2, h2, dy, gu16, N, FF);
            CHECK(memcmp(d2, d16, (size_t)(N * 2 * FF) * sizeof(uint16_t)) == 0, "%s, pool %d: dgu changed with h",
                  fs_kernels_isa_name(levels[li]), p ? 3 : 1);
            CHECK(memcmp(h2, h1, (size_t)(N * FF) * sizeof(uint16_t)) == 0,
                  "%s, pool %d: the backward's h differs from fs_swiglu_forward_bf16's", fs_kernels_isa_name(levels[li]),
                  p ? 3 : 1);
        }
        fs_kernels_set_isa(before);
    }
    free(gu), free(gu16), free(dy), free(d32), free(d16), free(d2), free(h1), free(h2);
}

static void test_rope_paths_same_bits(void) {
    if (fs_kernels_cpu_isa() < FS_ISA_AVX512)
        SKIP(FS_SKIP_NOT_APPLICABLE, "the avx512 RoPE path is not available on this CPU (best: %s)",
             fs_kernels_isa_name(fs_kernels_cpu_isa()));
    static const int64_t halves[] = {1, 7, 8, 9, 16, 24, 40, 100};
    const fs_kernel_isa before = fs_kernels_isa();
    for (size_t s = 0; s < sizeof halves / sizeof halves[0]; s++) {
        const int64_t T = 3, B = 4, nh = 3, HS = 2 * halves[s], ld = nh * HS + 5;
        float *cs = fnew(T * HS / 2), *sn = fnew(T * HS / 2), *q0 = fnew(B * T * ld), *q[2];
        fs_rope_table(cs, sn, T, HS, 10000.0f);
        fill_normal(q0, B * T * ld, 1.0f);
        for (int dir = 0; dir < 2; dir++)
            for (int p = 0; p < N_POOLS; p++) {
                for (int i = 0; i < 2; i++) {
                    fs_kernels_set_isa(i ? FS_ISA_AVX512 : FS_ISA_PORTABLE);
                    q[i] = fcopy(q0, B * T * ld);
                    (dir ? fs_rope_backward : fs_rope_forward)(pools[p], q[i], ld, cs, sn, B, T, nh, HS);
                }
                CHECK(same_bits(q[0], q[1], B * T * ld), "rope %s HS=%lld pool %d: avx512 differs from portable",
                      dir ? "backward" : "forward", (long long)HS, pool_sizes[p]);
                free(q[0]), free(q[1]);
            }
        free(cs), free(sn), free(q0);
    }
    fs_kernels_set_isa(before);
    fs_test_note("avx512 vs portable");
}

/* The cross-entropy's AVX-512 path (fs_cpu_exp16) against the portable one (libm expf), over
 * logits spread across -170 .. 80 and chunks that end inside a vector: the running max the
 * same bits (a max is exact), the running sums within 4 ulp (2 ulp of each exp; the lanes
 * are the same), the target logits the same bits, and each gradient within 4 ulp of the
 * larger value plus 4 ulp of dloss (the target's p - 1 cancels). */
static void test_xent_paths_agree(void) {
    if (fs_kernels_cpu_isa() < FS_ISA_AVX512)
        SKIP(FS_SKIP_NOT_APPLICABLE, "the avx512 cross-entropy path is not available on this CPU (best: %s)",
             fs_kernels_isa_name(fs_kernels_cpu_isa()));
    const int64_t N = 5, V = 301, bounds[] = {0, 13, 14, 150, V};
    float *logits = fnew(N * V), *st[2][3], *dl[2];
    int32_t targets[5] = {0, 13, 200, V - 1, 42};
    for (int64_t i = 0; i < N * V; i++) logits[i] = -80.0f + 160.0f * (float)((i * 7919) % 1009) / 1008.0f;
    for (int64_t i = 0; i < V; i++) logits[i] -= 90.0f; /* row 0 all negative: a tail must not count as 0 */
    for (int i = 0; i < 2; i++) {
        for (int k = 0; k < 3; k++) st[i][k] = fnew(N);
        dl[i] = fnew(N * V);
    }
    const fs_kernel_isa before = fs_kernels_isa();
    const float dloss = 0.37f;
    for (int i = 0; i < 2; i++) {
        fs_kernels_set_isa(i ? FS_ISA_AVX512 : FS_ISA_PORTABLE);
        float *chunk = fnew(N * V);
        for (int c = 0; c < 4; c++) {
            const int64_t v0 = bounds[c], Vc = bounds[c + 1] - v0;
            for (int64_t n = 0; n < N; n++) memcpy(chunk + n * Vc, logits + n * V + v0, (size_t)Vc * sizeof(float));
            fs_xent_chunk_forward(pools[1], st[i][0], st[i][1], st[i][2], chunk, targets, N, Vc, v0, c == 0);
        }
        float lse[5];
        for (int64_t n = 0; n < N; n++) lse[n] = st[0][0][n] + logf(st[0][1][n]); /* both: the portable state */
        for (int c = 0; c < 4; c++) {
            const int64_t v0 = bounds[c], Vc = bounds[c + 1] - v0;
            for (int64_t n = 0; n < N; n++) memcpy(chunk + n * Vc, logits + n * V + v0, (size_t)Vc * sizeof(float));
            fs_xent_chunk_backward(pools[1], chunk, chunk, lse, targets, N, Vc, v0, dloss);
            for (int64_t n = 0; n < N; n++) memcpy(dl[i] + n * V + v0, chunk + n * Vc, (size_t)Vc * sizeof(float));
        }
        free(chunk);
    }
    fs_kernels_set_isa(before);
    CHECK(same_bits(st[0][0], st[1][0], N), "xent running max: avx512 differs from portable");
    CHECK(same_bits(st[0][2], st[1][2], N), "xent target logits: avx512 differ from portable");
    for (int64_t n = 0; n < N; n++)
        CHECK(fabs((double)st[0][1][n] - (double)st[1][1][n]) <= 4.0 * 0x1p-23 * fabs((double)st[0][1][n]),
              "xent running sum row %lld: portable %.9g, avx512 %.9g", (long long)n, (double)st[0][1][n],
              (double)st[1][1][n]);
    int64_t bad = 0;
    for (int64_t i = 0; i < N * V; i++) {
        const double a = dl[0][i], b = dl[1][i];
        const double tol = 4.0 * 0x1p-23 * (fmax(fabs(a), fabs(b)) + dloss);
        if (!(fabs(a - b) <= tol) && bad++ < 3)
            CHECK(0, "xent dlogits[%lld]: portable %.9g, avx512 %.9g", (long long)i, a, b);
    }
    CHECK(bad == 0, "%lld xent gradients differ by more than the tolerance", (long long)bad);
    for (int i = 0; i < 2; i++) {
        for (int k = 0; k < 3; k++) free(st[i][k]);
        free(dl[i]);
    }
    free(logits);
    fs_test_note("avx512 vs portable");
}

/* The OpenBLAS core a CPU should get: OpenBLAS 0.3.21 took an Intel Xeon of family 6 model 207
 * (AVX512_BF16, AMX hidden) for a Prescott and ran sgemm on SSE3 (BENCHMARKS.md). A core
 * below the CPU's level gets the level's; one at it, above it, or unknown stays. */
static void test_blas_core_for_the_cpu(void) {
    static const struct {
        const char *picked;
        fs_kernel_isa cpu;
        const char *want; /* NULL: keep OpenBLAS's choice */
    } cases[] = {
        {"Prescott", FS_ISA_AVX512_BF16, "Cooperlake"}, {"Prescott", FS_ISA_AVX512, "SkylakeX"},
        {"Prescott", FS_ISA_AVX2, "Haswell"},           {"Prescott", FS_ISA_PORTABLE, NULL},
        {"Sandybridge", FS_ISA_AVX2, "Haswell"},        {"Haswell", FS_ISA_AVX512_BF16, "Cooperlake"},
        {"Zen", FS_ISA_AVX512, "SkylakeX"},             {"Zen", FS_ISA_AVX2, NULL},
        {"SkylakeX", FS_ISA_AVX512_BF16, NULL},         {"Cooperlake", FS_ISA_AVX512_BF16, NULL},
        {"SapphireRapids", FS_ISA_AVX512_BF16, NULL},   {"Cooperlake", FS_ISA_AVX2, NULL},
        {"PRESCOTT", FS_ISA_AVX512, "SkylakeX"},        {"Zen5", FS_ISA_AVX512_BF16, NULL},
        {"", FS_ISA_AVX512, NULL},                      {NULL, FS_ISA_AVX512, NULL},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const char *got = fs_kernels_blas_core_for(cases[i].picked, cases[i].cpu);
        CHECK(cases[i].want ? got && strcmp(got, cases[i].want) == 0 : got == NULL, "%s on a %s CPU: %s, want %s",
              cases[i].picked ? cases[i].picked : "(null)", fs_kernels_isa_name(cases[i].cpu), got ? got : "keep",
              cases[i].want ? cases[i].want : "keep");
    }
    /* the user's OPENBLAS_CORETYPE stands, whatever OpenBLAS picked */
    const char *before = getenv("OPENBLAS_CORETYPE");
    char *saved = before ? strdup(before) : NULL;
    setenv("OPENBLAS_CORETYPE", "Prescott", 1);
    CHECK(fs_kernels_blas_core_to_force() == NULL, "OPENBLAS_CORETYPE=Prescott was overridden");
    if (saved) setenv("OPENBLAS_CORETYPE", saved, 1);
    else unsetenv("OPENBLAS_CORETYPE");
    free(saved);
}

/* The sum of squares is accumulated in double: against a long double sum, 1e-13 relative.
 * Bits must not depend on the pool size (1, 2, 3 or 5 threads). */
static void test_sum_squares_and_scale(void) {
    static const int64_t sizes[] = {0, 1, 7, 63, 64, 65, 1000, 64 * 8192 + 4097};
    fs_pool *extra[2] = {NULL, NULL};
    CHECK_OK(fs_pool_init(&extra[0], 2));
    CHECK_OK(fs_pool_init(&extra[1], 5));
    fs_pool *all[4] = {pools[0], extra[0], pools[1], extra[1]};
    for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++) {
        const int64_t n = sizes[s];
        float *x = fnew(n);
        fill_normal(x, n, 3.0f);
        long double want = 0.0L;
        for (int64_t i = 0; i < n; i++) want += (long double)x[i] * (long double)x[i];
        double got[4];
        for (int p = 0; p < 4; p++) got[p] = fs_sum_squares(all[p], x, n);
        CHECK(fabs(got[0] - (double)want) <= 1e-13 * (double)want,
              "sum_squares n=%lld: %.17g, want %.17Lg", (long long)n, got[0], want);
        for (int p = 1; p < 4; p++)
            CHECK(memcmp(&got[p], &got[0], sizeof(double)) == 0,
                  "sum_squares n=%lld: pool %d gives %.17g, pool 1 gives %.17g", (long long)n,
                  fs_pool_size(all[p]), got[p], got[0]);
        /* the AVX-512 lanes are the portable loop's lanes: the same bits on both paths */
        isa_paths ps = paths_begin();
        double by_path[2] = {0, 0};
        const fs_kernel_isa levels[2] = {FS_ISA_PORTABLE, FS_ISA_AVX512};
        int ran = 0;
        for (int li = 0; li < 2; li++)
            if (paths_use(&ps, levels[li])) by_path[li] = fs_sum_squares(pools[1], x, n), ran |= 1 << li;
        fs_kernels_set_isa(ps.before);
        if (ran == 3)
            CHECK(memcmp(&by_path[0], &by_path[1], sizeof(double)) == 0,
                  "sum_squares n=%lld: avx512 %.17g, portable %.17g", (long long)n, by_path[1], by_path[0]);
        free(x);
    }
    fs_pool_free(extra[0]);
    fs_pool_free(extra[1]);
}

int main(void) {
    fs_kernels_init();
    for (int p = 0; p < N_POOLS; p++) {
        CHECK_OK(fs_pool_init(&pools[p], pool_sizes[p]));
        if (!pools[p]) return 2;
    }
    RUN_SEEDED(test_matmul_forward_vs_reference);
    RUN_SEEDED(test_matmul_backward_vs_reference);
    RUN_SEEDED(test_matmul_backward_fd);
    RUN_SEEDED(test_embedding);
    RUN_SEEDED(test_rmsnorm);
    RUN_SEEDED(test_rmsnorm_bf16_output);
    RUN_SEEDED(test_rope_table);
    RUN_SEEDED(test_rope);
    RUN_SEEDED(test_attention);
    RUN_SEEDED(test_attention_bf16);
    RUN(test_swiglu_bf16_outputs);
    RUN_SEEDED(test_cast_bf16);
    RUN_SEEDED(test_swiglu);
    RUN_SEEDED(test_xent);
    RUN_SEEDED(test_backward_kernels_accumulate);
    RUN_SEEDED(test_pool_size_independence);
    RUN_SEEDED(test_adamw_vs_double);
    RUN_SEEDED(test_adamw_matches_pytorch);
    RUN_SEEDED(test_adamw_grad_scale);
    RUN_SEEDED(test_adamw_writes_the_bf16_copy);
    RUN_SEEDED(test_swiglu_paths_agree);
    RUN_SEEDED(test_rope_paths_same_bits);
    RUN_SEEDED(test_xent_paths_agree);
    RUN_SEEDED(test_sum_squares_and_scale);
    RUN(test_blas_core_for_the_cpu);
    for (int p = 0; p < N_POOLS; p++) fs_pool_free(pools[p]);
    return fs_test_summary();
}
