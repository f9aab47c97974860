/*
 * tools/cuda_kernels_emu/main.cpp — the launchers of src/kernels/cuda/kernels.cu, run on the
 * host through shim.h (run.sh builds them), against the CPU kernels of libflatshard.a (pool
 * NULL) on the same inputs: tests/test_cuda.c's checks without a GPU.
 *
 * The comparison rule of each kernel is test_cuda.c's (the tolerance formulas and their
 * derivations are there, per kernel): bit for bit where the twin does the same IEEE operations
 * in the same order (casts, add, RoPE, embedding, AdamW, xent's row_max and target_logit, the
 * bf16 SwiGLU backward's h against the forward's); test_cuda.c's tolerance elsewhere (sums in
 * another order, and expf/logf, which are glibc's here but CUDA's on a GPU: the tolerances
 * already cover either). Shapes are test_cuda.c's, with MAX_BLOCKS = EMU_MAX_BLOCKS (run.sh:
 * 7) instead of 65535, so "one grid" is 7 x 256 elements and the sizes past several grids
 * are thousands of elements, not millions; row counts of 1000 are cut to 100 where each row
 * runs block reductions (their barriers are what costs time here), keeping N = 1 and 7 and
 * rows past several grids. Backward kernels start from random gradients (an overwrite where
 * the contract is += fails). Every output buffer has guard elements on both sides, filled
 * poisoned under ASan (any access to them is reported) and holding -0 patterns that must
 * survive ("guards changed 0"); inputs are exact allocations, so ASan catches reads past them.
 *
 * Last, every __global__ function of the .cu file (prep.py lists them) must have run in some
 * check: a kernel added to kernels.cu whose launcher is not called here fails that check.
 *
 * Prints one line per check ("ok   ..." or "FAIL ...: detail"), then "ok: every check
 * passed (...)" or "FAILED: n of m checks"; exits 1 on any failure.
 */
#include "shim.h"

#include "cuda_kernels.h"
#include "cuda_tolerances.h" /* U and test_cuda.c's rules, shared */

#include <cinttypes>
#include <cstdarg>
#include <random>
#include <string>
#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/asan_interface.h>
#endif

#ifndef EMU_MAX_BLOCKS
#error "run.sh passes -DEMU_MAX_BLOCKS"
#endif
static const int64_t THREADS = 256; /* kernels.cu's; the sizes below only need its order */
static const int64_t ONE_GRID = (int64_t)EMU_MAX_BLOCKS * THREADS;

extern const char *const emu_kernels_defined[]; /* prep.py's list, NULL-terminated */

static int n_checks, n_failed;
static std::mt19937_64 rng(0xc0da);

static void result(bool ok, const std::string &what, const std::string &detail) {
    n_checks++;
    if (ok) {
        printf("ok   %s\n", what.c_str());
    } else {
        n_failed++;
        printf("FAIL %s: %s\n", what.c_str(), detail.c_str());
    }
}
static std::string fmt(const char *f, ...) __attribute__((format(printf, 1, 2)));
static std::string fmt(const char *f, ...) {
    char b[512];
    va_list ap;
    va_start(ap, f);
    vsnprintf(b, sizeof b, f, ap);
    va_end(ap);
    return b;
}
static void status_ok(fs_status st, const std::string &what) {
    if (st != FS_OK)
        result(false, what + ": launcher status",
               fmt("status %d: %s", (int)st, fs_error_message()));
}

/* An output buffer: n elements between two guards of G elements each. Under ASan the guards
 * are poisoned, so any access to them, a read as much as a write, stops the run with ASan's
 * report; without it they hold negative zeros (each element's top byte 0x80, the rest 0),
 * which any store changes, and so does any += (-0 + +0 is +0), whose bits are checked. */
template <typename T> struct Out {
    static constexpr int64_t G = 40; /* a multiple of 8 elements: whole ASan granules */
    std::vector<T> mem;
    int64_t n;
    explicit Out(int64_t n_) : mem((size_t)(n_ + 2 * G)), n(n_) {
        fill_guard(mem.data());
        fill_guard(mem.data() + G + n);
        poison(true);
    }
    ~Out() { poison(false); }
    Out(const Out &) = delete;
    Out &operator=(const Out &) = delete;
    static void fill_guard(T *g) {
        unsigned char *b = (unsigned char *)g;
        memset(b, 0, G * sizeof(T));
        for (int64_t i = 0; i < G; i++)
            b[(i + 1) * (int64_t)sizeof(T) - 1] = 0x80;
    }
    void poison(bool on) {
#if defined(__SANITIZE_ADDRESS__)
        if (on) {
            ASAN_POISON_MEMORY_REGION(mem.data(), G * sizeof(T));
            ASAN_POISON_MEMORY_REGION(mem.data() + G + n, G * sizeof(T));
        } else {
            ASAN_UNPOISON_MEMORY_REGION(mem.data(), mem.size() * sizeof(T));
        }
#else
        (void)on;
#endif
    }
    T *p() {
        return mem.data() + G;
    }
    T &operator[](int64_t i) {
        return mem[(size_t)(G + i)];
    }
    void set(const T *src) {
        if (n > 0) memcpy(p(), src, (size_t)n * sizeof(T));
    }
    void fill_bytes(int b) {
        memset(p(), b, (size_t)n * sizeof(T));
    }
    int64_t guards_changed() {
        poison(false);
        std::vector<T> want((size_t)G);
        fill_guard(want.data());
        const int64_t bytes = G * (int64_t)sizeof(T);
        const unsigned char *w = (const unsigned char *)want.data(),
                            *lo = (const unsigned char *)mem.data(),
                            *hi = (const unsigned char *)(mem.data() + G + n);
        int64_t bad = 0;
        for (int64_t i = 0; i < bytes; i++)
            bad += (lo[i] != w[i]) + (hi[i] != w[i]);
        poison(true);
        return bad;
    }
};
template <typename... B> static void guards(const std::string &what, B &...bufs) {
    const int64_t changed = (bufs.guards_changed() + ... + 0);
    result(changed == 0, what + ": nothing written outside the outputs",
           fmt("guards changed %lld bytes", (long long)changed));
}

static std::vector<float> normal(int64_t n, float scale) {
    std::normal_distribution<float> d(0.0f, scale);
    std::vector<float> v((size_t)n);
    for (auto &x : v)
        x = d(rng);
    return v;
}
static std::vector<float> uniform(int64_t n, float lo, float hi) {
    std::uniform_real_distribution<float> d(lo, hi);
    std::vector<float> v((size_t)n);
    for (auto &x : v)
        x = d(rng);
    return v;
}
static std::vector<int32_t> tokens_below(int64_t n, int64_t V) {
    std::vector<int32_t> v((size_t)n);
    for (auto &x : v)
        x = (int32_t)(rng() % (uint64_t)V);
    return v;
}
static std::vector<uint16_t> bf16_normal(int64_t n, float scale) {
    std::vector<float> f = normal(n, scale);
    std::vector<uint16_t> v((size_t)n);
    for (int64_t i = 0; i < n; i++)
        v[(size_t)i] = fs_fp32_to_bf16(f[(size_t)i]);
    return v;
}

/* ------------------------------------------------------------------ comparisons (test_cuda.c's) */
static void check_bits(const std::string &what, const float *got, const float *want, int64_t n) {
    for (int64_t i = 0; i < n; i++)
        if (memcmp(&got[i], &want[i], 4) != 0) {
            result(false, what,
                   fmt("element %lld is %.9g, expected %.9g bit for bit (%lld elements)",
                       (long long)i, got[i], want[i], (long long)n));
            return;
        }
    result(true, what + " (bits)", "");
}
static void check_bits16(const std::string &what, const uint16_t *got, const uint16_t *want,
                         int64_t n) {
    for (int64_t i = 0; i < n; i++)
        if (got[i] != want[i]) {
            result(false, what,
                   fmt("element %lld is 0x%04x, expected 0x%04x (%lld elements)", (long long)i,
                       got[i], want[i], (long long)n));
            return;
        }
    result(true, what + " (bits)", "");
}
static void check_tol(const std::string &what, const float *got, const float *want,
                      const double *tol, int64_t n) {
    int64_t worst = -1;
    double worst_excess = 0.0, worst_ratio = 0.0;
    for (int64_t i = 0; i < n; i++) {
        const double g = got[i], w = want[i];
        double excess;
        if (!std::isfinite(w))
            excess = memcmp(&got[i], &want[i], 4) == 0 ? 0.0 : INFINITY;
        else if (!std::isfinite(g) || !(tol[i] >= 0.0))
            excess = INFINITY;
        else {
            excess = fabs(g - w) - tol[i];
            if (tol[i] > 0) worst_ratio = std::max(worst_ratio, fabs(g - w) / tol[i]);
        }
        if (excess > 0.0 && (worst < 0 || excess > worst_excess)) {
            worst = i;
            worst_excess = excess;
        }
    }
    if (worst < 0) {
        result(true, what + fmt(" (within tolerance, worst %.2f of it)", worst_ratio), "");
        return;
    }
    result(false, what,
           fmt("element %lld is %.9g, expected %.9g (|err| %.3g > tol %.3g; %lld elements)",
               (long long)worst, got[worst], want[worst], fabs((double)got[worst] - want[worst]),
               tol[worst], (long long)n));
}
static void check_bf16_band(const std::string &what, const uint16_t *got, const float *want,
                            const double *tol, int64_t n) {
    for (int64_t i = 0; i < n; i++) {
        if (!bf16_in_band(got[i], want[i], tol[i])) {
            result(false, what,
                   fmt("element %lld is %.9g (0x%04x), expected %.9g within %.3g, then rounded "
                       "to bf16 (%lld elements)",
                       (long long)i, fs_bf16_to_fp32(got[i]), got[i], want[i], tol[i],
                       (long long)n));
            return;
        }
    }
    result(true, what + " (within the bf16 band)", "");
}

/* ------------------------------------------------------------------ RMSNorm (test_cuda.c's rule)
 */
static void test_rmsnorm() {
    /* test_cuda.c's, its 1000 rows cut to 100 and 300 (past the weight gradient's 128 row
     * lanes, so each lane takes a second and third row) */
    static const int64_t cases[][2] = {{1, 37},   {7, 100}, {70, 37},  {100, 100},
                                       {7, 1000}, {70, 1},  {23, 300}, {300, 37}};
    const float eps = 1e-5f;
    for (auto &cs : cases) {
        const int64_t N = cs[0], C = cs[1];
        const std::string sh = fmt("N=%lld C=%lld", (long long)N, (long long)C);
        std::vector<float> inp = normal(N * C, 1.0f), w = uniform(C, 0.5f, 1.5f);
        std::vector<float> out((size_t)(N * C)), rstd((size_t)N);
        fs_rmsnorm_forward(NULL, out.data(), rstd.data(), inp.data(), w.data(), N, C, eps);
        Out<float> got(N * C), got_r(N);
        status_ok(
            fs_cuda_rmsnorm_forward(NULL, got.p(), got_r.p(), inp.data(), w.data(), N, C, eps),
            "rmsnorm forward " + sh);
        std::vector<double> tol((size_t)std::max(N * C, C));
        for (int64_t n = 0; n < N; n++)
            tol[(size_t)n] = (double)(C + 8) * U * fabs((double)rstd[(size_t)n]);
        check_tol("rmsnorm rstd " + sh, got_r.p(), rstd.data(), tol.data(), N);
        for (int64_t i = 0; i < N * C; i++)
            tol[(size_t)i] = (double)(C + 12) * U * fabs((double)out[(size_t)i]) + 1e-37;
        check_tol("rmsnorm out " + sh, got.p(), out.data(), tol.data(), N * C);
        guards("rmsnorm forward " + sh, got, got_r);
        /* the bf16 form (the bf16 route's norms): the fp32 form's values rounded, bit for
         * bit, and the same rstd */
        Out<uint16_t> got16(N * C);
        Out<float> got_r16(N);
        status_ok(fs_cuda_rmsnorm_forward_bf16(NULL, got16.p(), got_r16.p(), inp.data(), w.data(), N, C, eps),
                  "rmsnorm forward bf16 " + sh);
        std::vector<uint16_t> rounded((size_t)(N * C));
        for (int64_t i = 0; i < N * C; i++) rounded[(size_t)i] = fs_fp32_to_bf16(got.p()[i]);
        check_bits16("rmsnorm forward bf16: the fp32 form rounded " + sh, got16.p(), rounded.data(), N * C);
        check_bits("rmsnorm forward bf16: rstd " + sh, got_r16.p(), got_r.p(), N);
        guards("rmsnorm forward bf16 " + sh, got16, got_r16);

        std::vector<float> dy = normal(N * C, 1.0f), dx0 = normal(N * C, 1.0f),
                           dw0 = normal(C, 1.0f);
        std::vector<float> dx_want = dx0, dw_want = dw0;
        fs_rmsnorm_backward(NULL, dx_want.data(), dw_want.data(), dy.data(), inp.data(), w.data(),
                            rstd.data(), N, C);
        Out<float> dx(N * C), dw(C);
        dx.set(dx0.data());
        dw.set(dw0.data());
        status_ok(fs_cuda_rmsnorm_backward(NULL, dx.p(), dw.p(), dy.data(), inp.data(), w.data(),
                                           rstd.data(), N, C),
                  "rmsnorm backward " + sh);
        rmsnorm_backward_dinp_tol(tol.data(), dy.data(), inp.data(), w.data(), rstd.data(),
                                  dx_want.data(), N, C);
        check_tol("rmsnorm dinp " + sh, dx.p(), dx_want.data(), tol.data(), N * C);
        rmsnorm_backward_dweight_tol(tol.data(), dw0.data(), dy.data(), inp.data(), rstd.data(), N,
                                     C);
        check_tol("rmsnorm dweight " + sh, dw.p(), dw_want.data(), tol.data(), C);
        guards("rmsnorm backward " + sh, dx, dw);
        /* the same inputs again: the same bits (fixed reduction orders). Here the second launch
         * runs every block's threads in the other order (shim.h), so a result that depends on
         * which thread gets there first differs */
        Out<float> dx2(N * C), dw2(C);
        dx2.set(dx0.data());
        dw2.set(dw0.data());
        status_ok(fs_cuda_rmsnorm_backward(NULL, dx2.p(), dw2.p(), dy.data(), inp.data(), w.data(),
                                           rstd.data(), N, C),
                  "rmsnorm backward again " + sh);
        check_bits("rmsnorm backward run twice: dinp " + sh, dx2.p(), dx.p(), N * C);
        check_bits("rmsnorm backward run twice: dweight " + sh, dw2.p(), dw.p(), C);
    }
}

/* ------------------------------------------------------------------ SwiGLU (test_cuda.c's rule) */
/* test_cuda.c's, reduced; 2000 columns: past 7 blocks of 256, so the column loop goes round
 * too (and the row loop wherever N > 7) */
static const int64_t swiglu_cases[][2] = {{1, 37}, {7, 100}, {70, 37}, {1000, 100}, {13, 1001},
                                          {3, 2000}};

static void test_swiglu() {
    for (auto &cs : swiglu_cases) {
        const int64_t N = cs[0], FF = cs[1];
        const std::string sh = fmt("N=%lld FF=%lld", (long long)N, (long long)FF);
        std::vector<float> gu = normal(N * 2 * FF, 3.0f), out((size_t)(N * FF));
        static const float planted[4] = {-100.0f, 100.0f, 0.0f, -1.28f};
        for (int k = 0; k < 4 && k < FF; k++)
            gu[(size_t)k] = planted[k];
        fs_swiglu_forward(NULL, out.data(), gu.data(), N, FF);
        Out<float> got(N * FF);
        status_ok(fs_cuda_swiglu_forward(NULL, got.p(), gu.data(), N, FF), "swiglu forward " + sh);
        std::vector<double> tol((size_t)(N * 2 * FF));
        for (int64_t i = 0; i < N * FF; i++)
            tol[(size_t)i] = 24.0 * U * fabs((double)out[(size_t)i]) + 1e-37;
        check_tol("swiglu out " + sh, got.p(), out.data(), tol.data(), N * FF);
        guards("swiglu forward " + sh, got);

        std::vector<float> dy = normal(N * FF, 1.0f), g0 = normal(N * 2 * FF, 1.0f), want = g0;
        fs_swiglu_backward(NULL, want.data(), dy.data(), gu.data(), N, FF);
        Out<float> dg(N * 2 * FF);
        dg.set(g0.data());
        status_ok(fs_cuda_swiglu_backward(NULL, dg.p(), dy.data(), gu.data(), N, FF),
                  "swiglu backward " + sh);
        swiglu_backward_tol(tol.data(), gu.data(), dy.data(), want.data(), N, FF);
        check_tol("swiglu dgu " + sh, dg.p(), want.data(), tol.data(), N * 2 * FF);
        guards("swiglu backward " + sh, dg);
    }
}

static void test_swiglu_bf16() {
    for (auto &cs : swiglu_cases) {
        const int64_t N = cs[0], FF = cs[1];
        const std::string sh = fmt("N=%lld FF=%lld", (long long)N, (long long)FF);
        std::vector<uint16_t> gu16 = bf16_normal(N * 2 * FF, 3.0f);
        static const float planted[4] = {-100.0f, 100.0f, 0.0f, -1.28f};
        for (int k = 0; k < 4 && k < FF; k++)
            gu16[(size_t)k] = fs_fp32_to_bf16(planted[k]);
        std::vector<float> gu((size_t)(N * 2 * FF)), out((size_t)(N * FF));
        for (int64_t i = 0; i < N * 2 * FF; i++)
            gu[(size_t)i] = fs_bf16_to_fp32(gu16[(size_t)i]);
        fs_swiglu_forward(NULL, out.data(), gu.data(), N, FF);
        Out<uint16_t> h(N * FF);
        h.fill_bytes(0xff); /* NaNs: an unwritten element shows */
        status_ok(fs_cuda_swiglu_forward_bf16(NULL, h.p(), gu16.data(), N, FF),
                  "swiglu_bf16 forward " + sh);
        std::vector<double> tol((size_t)(N * 2 * FF));
        for (int64_t i = 0; i < N * FF; i++)
            tol[(size_t)i] = 24.0 * U * fabs((double)out[(size_t)i]) + 1e-37;
        check_bf16_band("swiglu_bf16 out " + sh, h.p(), out.data(), tol.data(), N * FF);
        guards("swiglu_bf16 forward " + sh, h);

        std::vector<float> dy = normal(N * FF, 1.0f), want((size_t)(N * 2 * FF), 0.0f);
        fs_swiglu_backward(NULL, want.data(), dy.data(), gu.data(), N, FF);
        Out<uint16_t> dgu(N * 2 * FF), hb(N * FF), dgu_noh(N * 2 * FF);
        dgu.fill_bytes(0xff);
        hb.fill_bytes(0xff);
        dgu_noh.fill_bytes(0xff);
        status_ok(
            fs_cuda_swiglu_backward_bf16(NULL, dgu.p(), hb.p(), dy.data(), gu16.data(), N, FF),
            "swiglu_bf16 backward " + sh);
        swiglu_backward_tol(tol.data(), gu.data(), dy.data(), want.data(), N, FF);
        check_bf16_band("swiglu_bf16 dgu " + sh, dgu.p(), want.data(), tol.data(), N * 2 * FF);
        check_bits16("swiglu_bf16 backward's h = forward's " + sh, hb.p(), h.p(), N * FF);
        status_ok(
            fs_cuda_swiglu_backward_bf16(NULL, dgu_noh.p(), NULL, dy.data(), gu16.data(), N, FF),
            "swiglu_bf16 backward, h NULL " + sh);
        check_bits16("swiglu_bf16 dgu with h NULL " + sh, dgu_noh.p(), dgu.p(), N * 2 * FF);
        guards("swiglu_bf16 backward " + sh, dgu, hb, dgu_noh);
    }
}

/* ------------------------------------------------------------------ embedding (bits) */
static void test_embedding() {
    struct C5 {
        int64_t N, C, V, row0, rows;
    };
    /* test_cuda.c's cases (the last two: more rows than the backward's 64 row ranges), plus C
     * past several grids of column tiles (7 x 64 columns) */
    static const C5 cases[] = {
        {1, 37, 50, 12, 25},      {7, 37, 50, 12, 25},    {70, 100, 50, 12, 25},
        {1000, 37, 50, 12, 25},   {1000, 100, 50, 0, 50}, {1000, 300, 3, 0, 3},
        {70, 1, 3, 1, 1},         {7, 100, 50, 0, 50},    {1000, 37, 200, 20, 150},
        {300, 70, 131, 0, 131},   {70, 1000, 50, 12, 25}, {130, 500, 3, 0, 3},
    };
    for (const C5 &e : cases) {
        const int64_t N = e.N, C = e.C;
        const std::string sh =
            fmt("N=%lld C=%lld rows=%lld", (long long)N, (long long)C, (long long)e.rows);
        std::vector<int32_t> tok = tokens_below(N, e.V);
        std::vector<float> wte = normal(e.rows * C, 1.0f), prefill = normal(N * C, 1.0f);
        std::vector<uint16_t> wte16 = bf16_normal(e.rows * C, 1.0f);

        std::vector<float> want = prefill;
        fs_embedding_forward(NULL, want.data(), tok.data(), wte.data(), N, C, e.row0, e.rows);
        Out<float> out(N * C);
        out.set(prefill.data());
        status_ok(
            fs_cuda_embedding_forward(NULL, out.p(), tok.data(), wte.data(), N, C, e.row0, e.rows),
            "embedding forward " + sh);
        check_bits("embedding forward " + sh, out.p(), want.data(), N * C);

        want = prefill;
        fs_embedding_forward_bf16(NULL, want.data(), tok.data(), wte16.data(), N, C, e.row0,
                                  e.rows);
        Out<float> out16(N * C);
        out16.set(prefill.data());
        status_ok(fs_cuda_embedding_forward_bf16(NULL, out16.p(), tok.data(), wte16.data(), N, C,
                                                 e.row0, e.rows),
                  "embedding forward bf16 " + sh);
        check_bits("embedding forward bf16 " + sh, out16.p(), want.data(), N * C);
        guards("embedding forward " + sh, out, out16);

        std::vector<float> dw_want = wte;
        fs_embedding_backward(NULL, dw_want.data(), prefill.data(), tok.data(), N, C, e.row0,
                              e.rows);
        Out<float> dw(e.rows * C);
        dw.set(wte.data());
        status_ok(fs_cuda_embedding_backward(NULL, dw.p(), prefill.data(), tok.data(), N, C, e.row0,
                                             e.rows),
                  "embedding backward " + sh);
        check_bits("embedding backward " + sh, dw.p(), dw_want.data(), e.rows * C);
        guards("embedding backward " + sh, dw);
    }
}

/* ------------------------------------------------------------------ RoPE (bits) */
static void test_rope() {
    struct R {
        int64_t B, T, heads, HS, col0, pad;
    };
    /* test_cuda.c's (but its 70000 rows: past 7, the rows loop goes round on any case here),
     * plus 29 heads of 64 pairs: 1856 pairs a row, past 7 blocks of 256, so the loop over a
     * row's pairs goes round too */
    static const R cases[] = {{1, 1, 1, 6, 0, 0},     {2, 7, 3, 6, 3, 5},   {2, 7, 2, 8, 0, 1},
                              {1, 70, 2, 64, 128, 7}, {3, 13, 1, 64, 0, 0}, {2, 5, 9, 64, 0, 3},
                              {4, 50, 3, 64, 5, 3},   {1, 3, 29, 128, 2, 1}};
    for (const R &r : cases) {
        const int64_t ld = r.col0 + r.heads * r.HS + r.pad, n = r.B * r.T * ld, half = r.HS / 2;
        std::vector<float> cs((size_t)(r.T * half)), sn((size_t)(r.T * half));
        fs_rope_table(cs.data(), sn.data(), r.T, r.HS, 10000.0f);
        for (int pass = 0; pass < 2; pass++) {
            const std::string sh =
                fmt("rope %s B=%lld T=%lld heads=%lld HS=%lld", pass ? "backward" : "forward",
                    (long long)r.B, (long long)r.T, (long long)r.heads, (long long)r.HS);
            std::vector<float> x = normal(n, 1.0f);
            Out<float> got(n);
            got.set(x.data());
            fs_status st;
            if (pass == 0) {
                fs_rope_forward(NULL, x.data() + r.col0, ld, cs.data(), sn.data(), r.B, r.T,
                                r.heads, r.HS);
                st = fs_cuda_rope_forward(NULL, got.p() + r.col0, ld, cs.data(), sn.data(), r.B,
                                          r.T, r.heads, r.HS);
            } else {
                fs_rope_backward(NULL, x.data() + r.col0, ld, cs.data(), sn.data(), r.B, r.T,
                                 r.heads, r.HS);
                st = fs_cuda_rope_backward(NULL, got.p() + r.col0, ld, cs.data(), sn.data(), r.B,
                                           r.T, r.heads, r.HS);
            }
            status_ok(st, sh);
            check_bits(sh, got.p(), x.data(), n);
            guards(sh, got);
        }
    }
    /* the bf16 route's forward (q and k rotated, every value rounded, qkv left as it was):
     * the CPU's rope_forward on q and on k, then its cast, bit for bit; NH + NKV heads of
     * pairs and NKV HS v values a row, 1856 + 512 items in the last case (past 7 blocks) */
    struct Q {
        int64_t B, T, NH, NKV, HS;
    };
    static const Q qcases[] = {{1, 1, 1, 1, 6}, {2, 7, 3, 1, 8}, {3, 13, 4, 2, 64},
                               {1, 70, 2, 2, 64}, {1, 3, 25, 4, 128}};
    for (const Q &r : qcases) {
        const int64_t QKV = (r.NH + 2 * r.NKV) * r.HS, n = r.B * r.T * QKV, half = r.HS / 2;
        const std::string sh = fmt("rope forward bf16_out B=%lld T=%lld NH=%lld NKV=%lld HS=%lld",
                                   (long long)r.B, (long long)r.T, (long long)r.NH,
                                   (long long)r.NKV, (long long)r.HS);
        std::vector<float> cs((size_t)(r.T * half)), sn((size_t)(r.T * half));
        fs_rope_table(cs.data(), sn.data(), r.T, r.HS, 10000.0f);
        const std::vector<float> x0 = normal(n, 1.0f);
        std::vector<float> x = x0;
        fs_rope_forward(NULL, x.data(), QKV, cs.data(), sn.data(), r.B, r.T, r.NH, r.HS);
        fs_rope_forward(NULL, x.data() + r.NH * r.HS, QKV, cs.data(), sn.data(), r.B, r.T, r.NKV,
                        r.HS);
        std::vector<uint16_t> want((size_t)n);
        fs_cast_fp32_to_bf16(NULL, want.data(), x.data(), n);
        Out<float> in(n);
        in.set(x0.data());
        Out<uint16_t> got(n);
        got.fill_bytes(0xff); /* NaNs: an element never written shows */
        status_ok(fs_cuda_rope_forward_bf16_out(NULL, got.p(), in.p(), cs.data(), sn.data(), r.B, r.T,
                                                r.NH, r.NKV, r.HS),
                  sh);
        check_bits16(sh, got.p(), want.data(), n);
        check_bits(sh + ": qkv unchanged", in.p(), x0.data(), n);
        guards(sh, got);
        guards(sh + ": qkv", in);
    }
}

/* ------------------------------------------------------------------ casts, add (bits) */
static float f32_of_bits(uint32_t u) {
    return __uint_as_float(u);
}
static void test_casts() {
    static const uint32_t specials[] = {
        0x00000000u, 0x80000000u, 0x7f800000u, 0xff800000u, 0x7fc00000u, 0xffc00000u, 0x7f800001u,
        0xff800001u, 0x7fbfffffu, 0x7fffffffu, 0x7f80ffffu, 0x7f810000u, 0xffff8000u, 0x00000001u,
        0x00007fffu, 0x00008000u, 0x00018000u, 0x807fffffu, 0x3f808000u, 0x3f818000u, 0x3f808001u,
        0x3f807fffu, 0xbf808000u, 0xbf818000u, 0x7f7fffffu, 0x7f7f8000u, 0x7f7e8000u, 0x7f7f7fffu,
        0xff7fffffu, 0x3f800000u, 0xbf800000u, 0x40490fdbu,
    };
    const int64_t n_specials = (int64_t)(sizeof specials / sizeof specials[0]);
    const int64_t n_max = 3 * ONE_GRID + 1001;
    std::vector<float> x((size_t)n_max);
    for (int64_t i = 0; i < n_max; i++)
        x[(size_t)i] = i < n_specials ? f32_of_bits(specials[i]) : f32_of_bits((uint32_t)rng());
    std::vector<uint16_t> want((size_t)n_max);
    for (int64_t i = 0; i < n_max; i++)
        want[(size_t)i] = fs_fp32_to_bf16(x[(size_t)i]);
    std::vector<uint16_t> cpu((size_t)n_max);
    fs_cast_fp32_to_bf16(NULL, cpu.data(), x.data(), n_max);
    check_bits16("CPU cast vs fs_fp32_to_bf16", cpu.data(), want.data(), n_max);
    static const int64_t sizes[] = {1, 7, 70, 1000, n_specials, 3 * ONE_GRID + 1001};
    for (int64_t n : sizes) {
        Out<uint16_t> y(n);
        status_ok(fs_cuda_cast_fp32_to_bf16(NULL, y.p(), x.data(), n),
                  fmt("fp32 -> bf16 n=%lld", (long long)n));
        check_bits16(fmt("fp32 -> bf16 n=%lld", (long long)n), y.p(), want.data(), n);
        guards(fmt("fp32 -> bf16 n=%lld", (long long)n), y);
    }
    std::vector<uint16_t> all(65536);
    for (int64_t i = 0; i < 65536; i++)
        all[(size_t)i] = (uint16_t)i;
    std::vector<float> wide_want(65536);
    fs_cast_bf16_to_fp32(NULL, wide_want.data(), all.data(), 65536);
    Out<float> wide(65536);
    status_ok(fs_cuda_cast_bf16_to_fp32(NULL, wide.p(), all.data(), 65536), "bf16 -> fp32");
    check_bits("bf16 -> fp32, every pattern", wide.p(), wide_want.data(), 65536);
    guards("bf16 -> fp32", wide);
}

static void test_add() {
    static const int64_t sizes[] = {1, 7, 70, 1000, 3 * ONE_GRID + 3};
    for (int64_t n : sizes) {
        std::vector<float> x = normal(n, 10.0f), y = normal(n, 1e-3f), want = x;
        for (int64_t i = 0; i < n; i++)
            want[(size_t)i] += y[(size_t)i];
        Out<float> d(n);
        d.set(x.data());
        status_ok(fs_cuda_add(NULL, d.p(), y.data(), n), fmt("add n=%lld", (long long)n));
        check_bits(fmt("add n=%lld", (long long)n), d.p(), want.data(), n);
        guards(fmt("add n=%lld", (long long)n), d);
    }
}

/* ------------------------------------------------------------------ sum of squares (1e-12
 * relative) */
static void test_sum_squares() {
    /* 1024 blocks per call whatever n is: the emulator's slowest launch, so fewer sizes than
     * test_cuda.c's (0, pieces of 0 and 1 element, and several elements per thread) */
    static const int64_t sizes[] = {0, 1, 1025, 300007};
    Out<double> out(1), parts(FS_CUDA_REDUCE_PARTS);
    for (int64_t n : sizes) {
        std::vector<float> x = normal(n, 3.0f);
        const double nan_bits = NAN;
        double got[2];
        for (int k = 0; k < (n == 1025 ? 2 : 1); k++) {
            *out.p() = nan_bits;
            status_ok(fs_cuda_sum_squares(NULL, out.p(), parts.p(), x.data(), n),
                      fmt("sum_squares n=%lld", (long long)n));
            got[k] = *out.p();
        }
        const double want = fs_sum_squares(NULL, x.data(), n);
        if (n == 0)
            result(got[0] == 0.0 && !std::signbit(got[0]), "sum_squares n=0 writes +0",
                   fmt("%.17g", got[0]));
        else
            result(fabs(got[0] - want) <= 1e-12 * want,
                   fmt("sum_squares n=%lld (relative 1e-12)", (long long)n),
                   fmt("%.17g, CPU %.17g (rel %.3g)", got[0], want, fabs(got[0] - want) / want));
        if (n == 1025)
            result(memcmp(&got[0], &got[1], 8) == 0, "sum_squares n=1025 twice: the same bits",
                   fmt("%.17g then %.17g", got[0], got[1]));
        guards(fmt("sum_squares n=%lld", (long long)n), out, parts);
    }
}

/* ------------------------------------------------------------------ cross-entropy (test_cuda.c's
 * rule) */
static void test_xent() {
    const int64_t V = 1000;
    static const int64_t chunk_lists[2][4] = {{0, 7, 300, 1000}, {0, 0, 400, 1000}};
    static const int64_t Ns[] = {1, 7, 23};
    for (int64_t N : Ns)
        for (int cl = 0; cl < 2; cl++) {
            const int64_t *bounds = chunk_lists[cl];
            std::vector<float> logits = normal(N * V, 4.0f);
            std::vector<int32_t> targets = tokens_below(N, V);
            static const int32_t planted[5] = {3, 999, 7, 300, 6};
            for (int k = 0; k < 5 && k < N; k++)
                targets[(size_t)k] = planted[k];
            std::vector<float> rm((size_t)N), rs((size_t)N), tl((size_t)N);
            Out<float> g_m(N), g_s(N), g_t(N);
            for (int64_t n = 0; n < N; n++)
                g_m[n] = g_s[n] = g_t[n] = NAN;
            std::vector<double> tol((size_t)(N * V));
            std::vector<std::vector<float>> chunk(3);
            const std::string sh =
                fmt("xent N=%lld chunks %lld/%lld/%lld", (long long)N, (long long)bounds[1],
                    (long long)bounds[2], (long long)bounds[3]);
            for (int c = 0; c < 3; c++) {
                const int64_t v0 = bounds[c], Vc = bounds[c + 1] - bounds[c];
                chunk[(size_t)c].resize((size_t)(N * Vc));
                for (int64_t n = 0; n < N; n++)
                    for (int64_t j = 0; j < Vc; j++)
                        chunk[(size_t)c][(size_t)(n * Vc + j)] = logits[(size_t)(n * V + v0 + j)];
                fs_xent_chunk_forward(NULL, rm.data(), rs.data(), tl.data(),
                                      chunk[(size_t)c].data(), targets.data(), N, Vc, v0, c == 0);
                status_ok(fs_cuda_xent_chunk_forward(NULL, g_m.p(), g_s.p(), g_t.p(),
                                                     chunk[(size_t)c].data(), targets.data(), N, Vc,
                                                     v0, c == 0),
                          sh + fmt(" chunk %d forward", c));
                check_bits(sh + fmt(" chunk %d: row_max", c), g_m.p(), rm.data(), N);
                check_bits(sh + fmt(" chunk %d: target_logit", c), g_t.p(), tl.data(), N);
                for (int64_t n = 0; n < N; n++)
                    tol[(size_t)n] = 24.0 * U * fabs((double)rs[(size_t)n]);
                check_tol(sh + fmt(" chunk %d: row_sum", c), g_s.p(), rs.data(), tol.data(), N);
            }
            /* finish, each side on its own state */
            std::vector<float> lse((size_t)N);
            const double mean =
                fs_xent_finish(lse.data(), NULL, rm.data(), rs.data(), tl.data(), N);
            Out<double> loss(1);
            *loss.p() = 0.25;
            Out<float> g_lse(N);
            status_ok(fs_cuda_xent_finish(NULL, g_lse.p(), g_m.p(), g_s.p(), g_t.p(), N, loss.p()),
                      sh + " finish");
            for (int64_t n = 0; n < N; n++)
                tol[(size_t)n] = 24.0 * U + 2.0 * U * fabs((double)lse[(size_t)n]);
            check_tol(sh + ": lse", g_lse.p(), lse.data(), tol.data(), N);
            result(fabs(*loss.p() - (0.25 + mean)) <= 24.0 * U + 1e-12, sh + ": loss_sum added to",
                   fmt("%.17g, want 0.25 + %.17g", *loss.p(), mean));
            /* finish on the CPU's state, lse aliasing row_max */
            Out<float> a_m(N);
            a_m.set(rm.data());
            *loss.p() = 0.25;
            status_ok(
                fs_cuda_xent_finish(NULL, a_m.p(), a_m.p(), rs.data(), tl.data(), N, loss.p()),
                sh + " finish aliased");
            for (int64_t n = 0; n < N; n++)
                tol[(size_t)n] = 2.0 * U * fabs((double)lse[(size_t)n]);
            check_tol(sh + ": lse from the CPU's state, aliasing row_max", a_m.p(), lse.data(),
                      tol.data(), N);
            result(fabs(*loss.p() - (0.25 + mean)) <= 1e-12 * (0.25 + mean),
                   sh + ": loss_sum from the CPU's state",
                   fmt("%.17g, want 0.25 + %.17g", *loss.p(), mean));
            guards(sh + " forward and finish", g_m, g_s, g_t, g_lse, a_m, loss);
            /* backward from the CPU's lse */
            const float dloss = 1.0f / (float)N;
            for (int c = 0; c < 3; c++) {
                const int64_t v0 = bounds[c], Vc = bounds[c + 1] - bounds[c];
                std::vector<float> want((size_t)(N * Vc));
                fs_xent_chunk_backward(NULL, want.data(), chunk[(size_t)c].data(), lse.data(),
                                       targets.data(), N, Vc, v0, dloss);
                Out<float> g(N * Vc), in(N * Vc);
                for (int64_t i = 0; i < N * Vc; i++)
                    g[i] = NAN;
                in.set(chunk[(size_t)c].data());
                status_ok(fs_cuda_xent_chunk_backward(NULL, g.p(), chunk[(size_t)c].data(),
                                                      lse.data(), targets.data(), N, Vc, v0, dloss),
                          sh + fmt(" chunk %d backward", c));
                for (int64_t n = 0; n < N; n++)
                    for (int64_t j = 0; j < Vc; j++) {
                        const double p = exp((double)chunk[(size_t)c][(size_t)(n * Vc + j)] -
                                             (double)lse[(size_t)n]);
                        tol[(size_t)(n * Vc + j)] =
                            (double)dloss * (8.0 * U * p + 2.0 * U) +
                            2.0 * U * fabs((double)want[(size_t)(n * Vc + j)]) + 1e-38;
                    }
                check_tol(sh + fmt(" chunk %d: dlogits", c), g.p(), want.data(), tol.data(),
                          N * Vc);
                status_ok(fs_cuda_xent_chunk_backward(NULL, in.p(), in.p(), lse.data(),
                                                      targets.data(), N, Vc, v0, dloss),
                          sh + fmt(" chunk %d backward in place", c));
                check_bits(sh + fmt(" chunk %d: dlogits in place vs out of place", c), in.p(),
                           g.p(), N * Vc);
                guards(sh + fmt(" chunk %d backward", c), g, in);
            }
        }
}

/* ------------------------------------------------------------------ AdamW (bits) */
static void test_adamw() {
    static const int64_t sizes[] = {1, 7, 70, 1000, 8195, 3 * ONE_GRID + 7};
    fs_adamw_params hps[2];
    hps[0] = fs_adamw_params{1e-3, 0.9, 0.95, 1e-8, 0.1, 1};
    hps[1] = fs_adamw_params{3e-4, 0.8, 0.999, 1e-6, 0.0, 1};
    for (int64_t n : sizes)
        for (int h = 0; h < 2; h++) {
            const bool with_copy = h == 0;
            std::vector<float> p = normal(n, 1.0f), m((size_t)n, 0.0f), v((size_t)n, 0.0f);
            static const float planted_p[2] = {-0.0f, 1e-40f};
            for (int k = 0; k < 2 && k < n; k++)
                p[(size_t)k] = planted_p[k];
            std::vector<uint16_t> copy((size_t)n);
            Out<float> dp(n), dm(n), dv(n);
            Out<uint16_t> dcopy(n);
            dp.set(p.data()), dm.set(m.data()), dv.set(v.data());
            for (int64_t step = 1; step <= 3; step++) {
                fs_adamw_params hp = hps[h];
                hp.step = step;
                std::vector<float> g = normal(n, 1e-2f);
                static const float planted_g[5] = {0.0f, 3e-39f, 1e-30f, -1e20f, 5.0f};
                for (int k = 0; k < 5 && k < n; k++)
                    g[(size_t)((k + step) % n)] = planted_g[k];
                const float grad_scale = step == 2 ? 0.3f : 1.0f;
                fs_adamw_update(NULL, p.data(), with_copy ? copy.data() : NULL, m.data(), v.data(),
                                g.data(), grad_scale, n, hp);
                const std::string sh =
                    fmt("adamw n=%lld hp %d step %lld", (long long)n, h, (long long)step);
                status_ok(fs_cuda_adamw_update(NULL, dp.p(), with_copy ? dcopy.p() : NULL, dm.p(),
                                               dv.p(), g.data(), grad_scale, n, hp),
                          sh);
                check_bits(sh + ": param", dp.p(), p.data(), n);
                check_bits(sh + ": m", dm.p(), m.data(), n);
                check_bits(sh + ": v", dv.p(), v.data(), n);
                if (with_copy) check_bits16(sh + ": bf16 copy", dcopy.p(), copy.data(), n);
            }
            guards(fmt("adamw n=%lld hp %d", (long long)n, h), dp, dm, dv, dcopy);
        }
}

/* ------------------------------------------------------------------ empty and bad sizes */
/* test_cuda.c's: empty inputs launch nothing (NULL pointers never touched) and succeed;
 * negative sizes, an odd head size, 2^31 RoPE items a row and AdamW step 0 are usage errors */
static void test_sizes() {
    fs_adamw_params hp{1e-3, 0.9, 0.95, 1e-8, 0.1, 1};
    const unsigned long long before = emu_launches;
    bool ok = true;
    ok &= fs_cuda_cast_fp32_to_bf16(NULL, NULL, NULL, 0) == FS_OK;
    ok &= fs_cuda_cast_bf16_to_fp32(NULL, NULL, NULL, 0) == FS_OK;
    ok &= fs_cuda_add(NULL, NULL, NULL, 0) == FS_OK;
    ok &= fs_cuda_embedding_forward(NULL, NULL, NULL, NULL, 0, 8, 0, 4) == FS_OK;
    ok &= fs_cuda_embedding_forward_bf16(NULL, NULL, NULL, NULL, 3, 0, 0, 4) == FS_OK;
    ok &= fs_cuda_embedding_backward(NULL, NULL, NULL, NULL, 0, 8, 0, 4) == FS_OK;
    ok &= fs_cuda_rmsnorm_forward(NULL, NULL, NULL, NULL, NULL, 0, 8, 1e-5f) == FS_OK;
    ok &= fs_cuda_rmsnorm_forward_bf16(NULL, NULL, NULL, NULL, NULL, 0, 8, 1e-5f) == FS_OK;
    ok &= fs_cuda_rmsnorm_backward(NULL, NULL, NULL, NULL, NULL, NULL, NULL, 0, 8) == FS_OK;
    ok &= fs_cuda_rope_forward(NULL, NULL, 8, NULL, NULL, 0, 4, 1, 8) == FS_OK;
    ok &= fs_cuda_rope_backward(NULL, NULL, 8, NULL, NULL, 2, 0, 1, 8) == FS_OK;
    ok &= fs_cuda_rope_forward_bf16_out(NULL, NULL, NULL, NULL, NULL, 2, 0, 1, 1, 8) == FS_OK;
    ok &= fs_cuda_swiglu_forward(NULL, NULL, NULL, 0, 8) == FS_OK;
    ok &= fs_cuda_swiglu_backward(NULL, NULL, NULL, NULL, 4, 0) == FS_OK;
    ok &= fs_cuda_swiglu_forward_bf16(NULL, NULL, NULL, 0, 8) == FS_OK;
    ok &= fs_cuda_swiglu_backward_bf16(NULL, NULL, NULL, NULL, NULL, 4, 0) == FS_OK;
    ok &= fs_cuda_xent_chunk_forward(NULL, NULL, NULL, NULL, NULL, NULL, 0, 8, 0, 1) == FS_OK;
    ok &= fs_cuda_xent_finish(NULL, NULL, NULL, NULL, NULL, 0, NULL) == FS_OK;
    ok &= fs_cuda_xent_chunk_backward(NULL, NULL, NULL, NULL, NULL, 0, 8, 0, 1.0f) == FS_OK;
    ok &= fs_cuda_adamw_update(NULL, NULL, NULL, NULL, NULL, NULL, 1.0f, 0, hp) == FS_OK;
    result(ok && emu_launches == before, "empty sizes: FS_OK, nothing launched",
           fmt("%s, %llu launches", ok ? "all FS_OK" : "a status not FS_OK",
               emu_launches - before));
    bool usage = true;
    usage &= fs_cuda_swiglu_forward_bf16(NULL, NULL, NULL, -1, 8) == FS_ERR_USAGE;
    usage &= fs_cuda_add(NULL, NULL, NULL, -1) == FS_ERR_USAGE;
    usage &= fs_cuda_rmsnorm_backward(NULL, NULL, NULL, NULL, NULL, NULL, NULL, 3, -2) ==
             FS_ERR_USAGE;
    usage &= fs_cuda_rmsnorm_forward_bf16(NULL, NULL, NULL, NULL, NULL, -1, 8, 1e-5f) == FS_ERR_USAGE;
    usage &= fs_cuda_rope_forward(NULL, NULL, 8, NULL, NULL, 1, 1, 1, 7) == FS_ERR_USAGE;
    usage &= fs_cuda_rope_forward_bf16_out(NULL, NULL, NULL, NULL, NULL, 1, 1, 1, 1, 7) == FS_ERR_USAGE;
    usage &= fs_cuda_rope_forward_bf16_out(NULL, NULL, NULL, NULL, NULL, 1, 1, 1, -1, 8) == FS_ERR_USAGE;
    usage &= fs_cuda_rope_forward_bf16_out(NULL, NULL, NULL, NULL, NULL, 1, 1, (int64_t)1 << 30, 0, 4) ==
             FS_ERR_USAGE; /* 2^31 items a row */
    hp.step = 0;
    usage &= fs_cuda_adamw_update(NULL, NULL, NULL, NULL, NULL, NULL, 1.0f, 0, hp) ==
             FS_ERR_USAGE;
    result(usage && emu_launches == before,
           "negative sizes, an odd head size, 2^31 RoPE items a row, AdamW step 0: FS_ERR_USAGE, nothing launched",
           usage ? "a launch happened" : "a status not FS_ERR_USAGE");
}

/* ------------------------------------------------------------------ main */
int main(int argc, char **argv) {
    struct T {
        const char *name;
        void (*fn)();
    };
    static const T tests[] = {
        {"rmsnorm", test_rmsnorm},
        {"swiglu", test_swiglu},
        {"swiglu_bf16", test_swiglu_bf16},
        {"embedding", test_embedding},
        {"rope", test_rope},
        {"casts", test_casts},
        {"add", test_add},
        {"sum_squares", test_sum_squares},
        {"xent", test_xent},
        {"adamw", test_adamw}, {"sizes", test_sizes},
    };
    /* arguments: the groups to run (all without any) */
    for (int a = 1; a < argc; a++) {
        bool known = false;
        for (const T &t : tests)
            known |= strcmp(argv[a], t.name) == 0;
        if (!known) {
            fprintf(stderr, "cuda_kernels_emu: no test group named %s\n", argv[a]);
            return 2;
        }
    }
    for (const T &t : tests) {
        bool chosen = argc == 1;
        for (int a = 1; a < argc; a++)
            chosen |= strcmp(argv[a], t.name) == 0;
        if (chosen) t.fn();
    }
    /* every __global__ function of the .cu file (prep.py lists them) must have run: a kernel
     * added or renamed in kernels.cu whose launcher nothing here calls shows, once every
     * group ran */
    if (argc == 1) {
        std::string missing;
        int n_kernels = 0;
        for (const char *const *k = emu_kernels_defined; *k; k++, n_kernels++)
            if (!emu_kernels_run.count(*k)) missing += std::string(" ") + *k;
        result(missing.empty(), fmt("every __global__ function of the .cu file ran (%d)", n_kernels),
               "never launched by any check:" + missing + " (add its launcher to main.cpp)");
    }
    if (n_failed) {
        printf("FAILED: %d of %d checks (%llu launches, %llu blocks, %llu GPU threads emulated)\n",
               n_failed, n_checks, emu_launches, emu_blocks_run, emu_threads_run);
        return 1;
    }
    printf("ok: every check passed (%d checks, %llu launches, %llu blocks, %llu GPU threads "
           "emulated)\n",
           n_checks, emu_launches, emu_blocks_run, emu_threads_run);
    return 0;
}
