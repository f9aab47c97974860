/*
 * tools/attention_tc_emu/main.cpp — runs the device code of src/kernels/cuda/attention_tc.cu
 * on the host (shim.h: one OS thread per GPU thread, mma.sync by the PTX ISA's fragment
 * layouts) and checks it against a double-precision reference on bf16 inputs, with the
 * per-element bounds of tests/cuda_attention_checks.h (2^-8 of the rounded p and ds, plus 4x
 * the fp32 tolerances; what is written in bf16, half an ulp more). A check of the kernels'
 * index arithmetic, masks, tiles, GQA mapping and fragment plumbing without a GPU; not of the
 * hardware's arithmetic, timing or memory model. The kernels' bf16 form (q, k, v and out in
 * bf16: the bf16 route's) runs on every shape: out, lse, and dq, dk, dv written in bf16 and
 * rotated back by RoPE (dq, dk), against the reference's gradients rotated back with the same
 * tables (in double) and bounds that combine each element's and its RoPE partner's. The fp32
 * form runs on four shapes, twice: added into random rows, its dq, dk, dv against the
 * reference (unrotated); added into zeros, where the bf16 form must give the same bits (out
 * rounded; dq, dk, dv after RoPE backward on the host and rounding). Also that the D the dq
 * kernel stores for the dk/dv kernel is, bit for bit, what tc_row_d sums for each real row
 * (what the dk/dv kernel once summed itself), and that the padding columns of the gradient
 * rows and the guards past every array are untouched. Tiles are staged 8 columns at a time
 * where the rows allow it and element by element elsewhere (stage_vec): each shape's line
 * says which, and both run for q/k/v and for dout.
 * Built and run by run.sh; exits 1 if an element is outside its bound, non-finite, or written
 * where it must not be, if a stored D differs, or if the two forms differ.
 */
#include "kernels.h"
#include <atomic>
#include <cstdio>
#include <random>
#include <type_traits>
static int failures;
struct Shape {
    int B, T, NH, NKV, HS, pad, dpad, fp32_form; // fp32_form: run that form too
};
static float rb(float x) { return emu_b2f(emu_f2b(x)); }
template <typename X> static X to_x(float f);
template <> float to_x<float>(float f) { return f; }
template <> __nv_bfloat16 to_x<__nv_bfloat16>(float f) { return __float2bfloat16_rn(f); }
static bool is7(float x) { return x == 7; }
static bool is7(__nv_bfloat16 x) { return emu_b2f(x.x) == 7; }
static float widen(float x) { return x; }
static float widen(__nv_bfloat16 x) { return emu_b2f(x.x); }
// The kernels' vec flags: the staging's 8-wide path where the launches would take it (rows
// of a multiple of 8 elements, 16-byte aligned: q, k and v on the shapes whose pad keeps
// that), except that dout (always aligned) takes the element path on the shapes with an odd
// dpad, so that both paths of both arrays run.
static int stage_vec(const Shape &s, int ld, const void *qkv, const void *dout) {
    const bool al = ((uintptr_t)qkv & 15) == 0 && ((uintptr_t)dout & 15) == 0;
    return (ld % 8 == 0 && al ? TC_VEC_QKV : 0) | (s.dpad % 2 == 0 && al ? TC_VEC_DOUT : 0);
}
// What one form of the kernels gives: out (N C, then G guards), lse, the gradient rows
// (N ldd, then G guards: the fp32 form's g0 plus dq, dk, dv; the bf16 form's 7s with dq, dk,
// dv written over them), the D workspace; guards changed; stored D differing from tc_row_d's
// own sum.
template <typename X> struct Emu {
    std::vector<X> out, g;
    std::vector<float> lse, d;
    int guard;
    size_t dbad;
};
// The forward, then the backward from the reference's out and lse (ro, rl), as the kernels
// are launched (attention_tc.cu's launches), q, k, v and out in X: the fp32 form adds into
// g0 and gets no RoPE tables; the bf16 form gets the tables (rc, rs: (T, HS/2)) and writes
// over gradient rows of 7s, so that an unwritten column shows. out, lse and the D workspace
// start as NaN so that an unwritten element shows.
template <int HS, typename X>
static Emu<X> emulate(const Shape &s, const std::vector<float> &qkvf, const std::vector<float> &dout,
                      const std::vector<float> &g0, const std::vector<float> &rof,
                      const std::vector<float> &rl, const float *rc, const float *rs) {
    constexpr bool fp32 = std::is_same_v<X, float>;
    const int N = s.B * s.T, C = s.NH * HS, ld = (s.NH + 2 * s.NKV) * HS + s.pad,
              ldd = (s.NH + 2 * s.NKV) * HS + s.dpad;
    const int kcol = C, vcol = (s.NH + s.NKV) * HS, group = s.NH / s.NKV, G = 64;
    const size_t nrows = (size_t)s.B * s.NH * s.T;
    std::vector<X> qkv(qkvf.size()), ro(rof.size());
    for (size_t i = 0; i < qkv.size(); i++)
        qkv[i] = to_x<X>(qkvf[i]);
    for (size_t i = 0; i < ro.size(); i++)
        ro[i] = to_x<X>(rof[i]);
    Emu<X> e;
    e.out.assign((size_t)N * C + G, to_x<X>(NAN));
    e.lse.assign(nrows + G, NAN);
    e.d.assign(nrows + G, NAN);
    e.g.assign((size_t)N * ldd + G, to_x<X>(7));
    if (fp32)
        for (size_t i = 0; i < g0.size(); i++)
            e.g[i] = to_x<X>(g0[i]);
    const float *cs = fp32 ? nullptr : rc, *sn = fp32 ? nullptr : rs;
    for (int i = 0; i < G; i++)
        e.out[(size_t)N * C + i] = to_x<X>(7), e.lse[nrows + i] = 7, e.d[nrows + i] = 7;
    const float sc = (float)(1.0 / sqrt((double)HS)), sl = sc * TC_LOG2E;
    const int qt = (s.T + TC_BQ - 1) / TC_BQ;
    const int vec = stage_vec(s, ld, qkv.data(), dout.data());
    emu_launch(dim3(s.B * s.NH, qt), [&] {
        tc_forward_kernel<HS, X>(e.out.data(), e.lse.data(), qkv.data(), qkv.data() + kcol,
                                 qkv.data() + vcol, ld, s.T, s.NH, group, sl, vec);
    });
    emu_launch(dim3(s.B * s.NH, qt), [&] {
        tc_dq_kernel<HS, X>(e.g.data(), ldd, e.d.data(), dout.data(), qkv.data(), qkv.data() + kcol,
                            qkv.data() + vcol, ld, ro.data(), rl.data(), cs, sn, s.T, s.NH, group,
                            sc, sl, vec);
    });
    emu_launch(dim3(s.B * s.NKV, (s.T + TC_BK - 1) / TC_BK), [&] {
        tc_dkdv_kernel<HS, X>(e.g.data() + kcol, e.g.data() + vcol, ldd, dout.data(), qkv.data(),
                              qkv.data() + kcol, qkv.data() + vcol, ld, e.d.data(), rl.data(), cs,
                              sn, s.T, s.NH, s.NKV, group, sc, sl, vec);
    });
    // the stored D against tc_row_d's own sum, one warp per row as the kernels run it
    std::atomic<size_t> dbad{0};
    emu_launch(dim3(s.B * s.NH), [&] {
        const int b = (int)blockIdx.x / s.NH, h = (int)blockIdx.x % s.NH;
        const int warp = (int)threadIdx.x / 32, lane = (int)threadIdx.x % 32;
        const size_t row0 = ((size_t)b * s.NH + h) * s.T;
        for (int t = warp; t < s.T; t += 4) {
            const float d = tc_row_d<HS, X>(dout.data() + (size_t)b * s.T * C + h * HS,
                                            ro.data() + (size_t)b * s.T * C + h * HS, C, t, s.T, lane);
            if (lane == 0 && memcmp(&d, &e.d[row0 + t], sizeof d) != 0)
                dbad++;
        }
    });
    e.dbad = dbad.load();
    e.guard = 0;
    for (int i = 0; i < G; i++)
        e.guard += !is7(e.out[(size_t)N * C + i]) || e.lse[nrows + i] != 7 ||
                   !is7(e.g[(size_t)N * ldd + i]) || e.d[nrows + i] != 7;
    return e;
}
template <int HS> static void run(Shape s, unsigned seed) {
    const int N = s.B * s.T, C = s.NH * HS, ld = (s.NH + 2 * s.NKV) * HS + s.pad,
              ldd = (s.NH + 2 * s.NKV) * HS + s.dpad;
    const int kcol = C, vcol = (s.NH + s.NKV) * HS, group = s.NH / s.NKV;
    std::mt19937 rng(seed);
    std::uniform_real_distribution<float> U(-2, 2), U1(-1, 1);
    std::vector<float> qkv((size_t)N * ld), dout((size_t)N * C), g0((size_t)N * ldd);
    for (auto &x : qkv)
        x = rb(U(rng));
    for (int n = 0; n < N; n++)
        if (n % s.T >= 64)
            for (int c = C; c < vcol; c++)
                qkv[(size_t)n * ld + c] = rb(qkv[(size_t)n * ld + c] * 3);
    for (auto &x : dout)
        x = rb(U1(rng));
    for (auto &x : g0)
        x = U1(rng);
    // double reference
    const double scale = 1.0 / sqrt((double)HS);
    std::vector<double> out((size_t)N * C), lse((size_t)s.B * s.NH * s.T), gr((size_t)N * ldd, 0.0);
    std::vector<double> p(s.T), o(HS);
    std::vector<double> bo((size_t)N * C, 0.0), bgr((size_t)N * ldd, 0.0);
    const double ub = 1.0 / 256;
    for (int b = 0; b < s.B; b++)
        for (int h = 0; h < s.NH; h++) {
            const int kv = h / group;
            for (int t = 0; t < s.T; t++) {
                const float *q = &qkv[(size_t)(b * s.T + t) * ld + h * HS];
                const float *dO = &dout[(size_t)(b * s.T + t) * C + h * HS];
                double mx = -INFINITY, sum = 0;
                for (int u = 0; u <= t; u++) {
                    const float *k = &qkv[(size_t)(b * s.T + u) * ld + kcol + kv * HS];
                    double d = 0;
                    for (int c = 0; c < HS; c++)
                        d += (double)q[c] * k[c];
                    p[u] = d * scale;
                    mx = std::max(mx, p[u]);
                }
                for (int u = 0; u <= t; u++)
                    sum += exp(p[u] - mx);
                const double L = mx + log(sum);
                lse[((size_t)b * s.NH + h) * s.T + t] = L;
                for (int c = 0; c < HS; c++)
                    o[c] = 0;
                for (int u = 0; u <= t; u++) {
                    p[u] = exp(p[u] - L);
                    const float *v = &qkv[(size_t)(b * s.T + u) * ld + vcol + kv * HS];
                    for (int c = 0; c < HS; c++)
                        o[c] += p[u] * v[c];
                }
                double D = 0;
                for (int c = 0; c < HS; c++) {
                    out[(size_t)(b * s.T + t) * C + h * HS + c] = o[c];
                    D += dO[c] * (double)rb((float)o[c]);
                }
                for (int u = 0; u <= t; u++) {
                    const float *k = &qkv[(size_t)(b * s.T + u) * ld + kcol + kv * HS],
                                *v = &qkv[(size_t)(b * s.T + u) * ld + vcol + kv * HS];
                    double dp = 0;
                    for (int c = 0; c < HS; c++)
                        dp += (double)dO[c] * v[c];
                    const double ds = p[u] * (dp - D) * scale;
                    for (int c = 0; c < HS; c++) {
                        bo[(size_t)(b * s.T + t) * C + h * HS + c] += ub * p[u] * fabs(v[c]);
                        bgr[(size_t)(b * s.T + t) * ldd + h * HS + c] += ub * fabs(ds) * fabs(k[c]);
                        bgr[(size_t)(b * s.T + u) * ldd + kcol + kv * HS + c] +=
                            ub * fabs(ds) * fabs(q[c]);
                        bgr[(size_t)(b * s.T + u) * ldd + vcol + kv * HS + c] +=
                            ub * p[u] * fabs(dO[c]);
                        gr[(size_t)(b * s.T + t) * ldd + h * HS + c] += ds * k[c];
                        gr[(size_t)(b * s.T + u) * ldd + kcol + kv * HS + c] += ds * q[c];
                        gr[(size_t)(b * s.T + u) * ldd + vcol + kv * HS + c] += p[u] * dO[c];
                    }
                }
            }
        }
    // the backward reads the reference's out rounded to bf16 (as the bf16 route keeps it) and
    // lse rounded to float; the reference's D above summed that out
    std::vector<float> ro(out.size()), rl(lse.begin(), lse.end());
    for (size_t i = 0; i < out.size(); i++)
        ro[i] = rb((float)out[i]);
    // the RoPE tables, (T, HS/2), as fs_rope_table builds them (theta 10000)
    const int half = HS / 2, nrot = s.NH + s.NKV; // dq's and dk's heads, side by side
    std::vector<float> rc((size_t)s.T * half), rs((size_t)s.T * half);
    for (int i = 0; i < half; i++) {
        const float inv = 1.0f / (float)pow(10000.0, (double)((float)(2 * i) / (float)HS));
        for (int t = 0; t < s.T; t++) {
            const float a = (float)t * inv;
            rc[(size_t)t * half + i] = (float)cos((double)a);
            rs[(size_t)t * half + i] = (float)sin((double)a);
        }
    }
    const int vec = stage_vec(s, ld, qkv.data(), dout.data()); // the bf16 form's (same alignment)
    printf("B=%d T=%d NH=%d NKV=%d HS=%d pad=%d dpad=%d (staging q, k, v %s, dout %s)\n", s.B, s.T,
           s.NH, s.NKV, HS, s.pad, s.dpad, vec & TC_VEC_QKV ? "8 wide" : "by element",
           vec & TC_VEC_DOUT ? "8 wide" : "by element");
    // the bf16 form, which the bf16 route runs, on every shape; the fp32 form where asked:
    // added into g0 (checked against the reference below), and added into zeros, which after
    // RoPE backward and rounding must give the bf16 form's bits on these bf16 values
    const Emu<tc_bf16> e = emulate<HS, tc_bf16>(s, qkv, dout, g0, ro, rl, rc.data(), rs.data());
    std::vector<float> eo(e.out.size()), eg(e.g.size());
    for (size_t i = 0; i < eo.size(); i++)
        eo[i] = widen(e.out[i]);
    for (size_t i = 0; i < eg.size(); i++)
        eg[i] = widen(e.g[i]);
    const std::vector<float> &el = e.lse;
    std::vector<float> fg;
    size_t fbad = 0, padbad = 0;
    if (s.fp32_form) {
        const Emu<float> f = emulate<HS, float>(s, qkv, dout, g0, ro, rl, rc.data(), rs.data());
        const Emu<float> z = emulate<HS, float>(s, qkv, dout, std::vector<float>(g0.size(), 0.0f),
                                                ro, rl, rc.data(), rs.data());
        fg = f.g;
        for (size_t i = 0; i < z.out.size(); i++)
            fbad += emu_f2b(z.out[i]) != e.out[i].x;
        fbad += memcmp(z.lse.data(), e.lse.data(), e.lse.size() * sizeof(float)) != 0;
        fbad += memcmp(z.d.data(), e.d.data(), e.d.size() * sizeof(float)) != 0;
        fbad += f.guard + f.dbad + z.guard + z.dbad;
        // RoPE backward on dq's and dk's heads as rope_kernel does it (sin negated, each
        // product rounded), then the cast's rounding: the bits the bf16 form writes
        std::vector<float> zg = z.g;
        for (int n = 0; n < N; n++) {
            const int t = n % s.T;
            for (int hh = 0; hh < nrot; hh++)
                for (int i = 0; i < half; i++) {
                    float *x = &zg[(size_t)n * ldd + hh * HS + i];
                    const size_t r = (size_t)t * half + i;
                    const float cs = rc[r], sn = -1.0f * rs[r];
                    const float a = x[0], b = x[half];
                    x[0] = a * cs - b * sn;
                    x[half] = b * cs + a * sn;
                }
        }
        size_t shown = 0;
        for (int n = 0; n < N; n++)
            for (int c = 0; c < ldd; c++) {
                const size_t i = (size_t)n * ldd + c;
                if (c >= vcol + s.NKV * HS) {
                    padbad += f.g[i] != g0[i] || z.g[i] != 0;
                    continue;
                }
                const uint16_t want = emu_f2b(zg[i]);
                if (want == e.g[i].x)
                    continue;
                fbad++;
                if (shown++ < 8)
                    printf("  row %d col %d: the bf16 form 0x%04x (%.9g), the fp32 form's rotated "
                           "0x%04x (%.9g, %.9g before the rounding, %.9g before RoPE)\n",
                           n, c, e.g[i].x, emu_b2f(e.g[i].x), want, emu_b2f(want), zg[i], z.g[i]);
            }
    }
    const size_t nrows = (size_t)s.B * s.NH * s.T;
    const double lf = s.T > 64 ? sqrt(s.T / 64.0) : 1.0;
    auto cmp = [&](const char *w, const float *got, const double *want, size_t n,
                   const double *base, const double *bnd, double atol, double rtol) {
        double me = 0, mw = 0, mr = 0;
        size_t bad = 0, worst = 0;
        for (size_t i = 0; i < n; i++) {
            double g = got[i] - (base ? base[i] : 0);
            double e = fabs(g - want[i]);
            double tol = (bnd ? bnd[i] : 0) + 4 * lf * (atol + rtol * fabs(want[i]));
            if (std::isfinite(e))
                mr = std::max(mr, e / tol);
            if (!std::isfinite(e)) {
                bad++;
                continue;
            }
            if (e > me)
                me = e, worst = i;
            mw = std::max(mw, fabs(want[i]));
        }
        printf("  %-4s max|err| %.3g (at %zu) max|want| %.3g rel %.3g nonfinite %zu  max err/tol "
               "%.3f\n",
               w, me, worst, mw, me / (mw > 0 ? mw : 1), bad, mr);
        if (bad || !(mr <= 1.0))
            failures++;
    };
    // out is written rounded to bf16: half an ulp more, at most 2^-8 of the fp32 value, whose
    // magnitude is within the bound so far of the reference's
    for (size_t i = 0; i < bo.size(); i++)
        bo[i] += (fabs(out[i]) + bo[i] + 4 * lf * (2e-5 + 1e-5 * fabs(out[i]))) / 256;
    cmp("out", eo.data(), out.data(), (size_t)N * C, nullptr, bo.data(), 2e-5, 1e-5);
    cmp("lse", el.data(), lse.data(), lse.size(), nullptr, nullptr, 2e-5, 1e-6);
    // the bf16 form's gradients: the reference's (base 0: written, not added) rotated back by
    // RoPE on dq's and dk's heads, in double with the same tables. After the rotation an
    // element's error is at most |cs| err_a + |sn| err_b (a: its own, b: its partner's, before
    // the rotation), so its whole bound (the reference's bound plus the tolerance) is the
    // partners' whole bounds combined that way, which also covers the fp32 rotation's own
    // rounding; then half an ulp of the bf16 store, as for out. The tolerance is in the bound:
    // cmp gets 0 for it.
    std::vector<double> wr(gr), br(gr.size());
    for (size_t i = 0; i < gr.size(); i++)
        br[i] = bgr[i] + 4 * lf * (5e-5 + 2e-5 * fabs(gr[i]));
    for (int n = 0; n < N; n++) {
        const int t = n % s.T;
        for (int hh = 0; hh < nrot; hh++)
            for (int i = 0; i < half; i++) {
                const size_t ja = (size_t)n * ldd + hh * HS + i, jb = ja + half;
                const double cs = rc[(size_t)t * half + i], sn = -(double)rs[(size_t)t * half + i];
                const double a = gr[ja], b = gr[jb], ba = br[ja], bb = br[jb];
                wr[ja] = a * cs - b * sn;
                wr[jb] = b * cs + a * sn;
                br[ja] = ba * fabs(cs) + bb * fabs(sn);
                br[jb] = bb * fabs(cs) + ba * fabs(sn);
            }
    }
    for (size_t i = 0; i < br.size(); i++)
        br[i] += (fabs(wr[i]) + br[i]) / 256;
    // split the gradients into dq, dk, dv and padding: the bf16 form's (rotated back, padding
    // still 7) and the fp32 form's (g0 base, unrotated)
    std::vector<float> gq, gk, gv, fq, fk, fv;
    std::vector<double> wq, wk, wv, bq, bk, bv, wq2, wk2, wv2, oq, ok, ov, tq, tk, tv;
    for (int n = 0; n < N; n++)
        for (int c = 0; c < ldd; c++) {
            size_t i = (size_t)n * ldd + c;
            if (c >= vcol + s.NKV * HS) {
                padbad += !is7(e.g[i]);
                continue;
            }
            std::vector<float> &gx = c < kcol ? gq : c < vcol ? gk : gv;
            std::vector<double> &wx = c < kcol ? wq : c < vcol ? wk : wv;
            std::vector<double> &bx = c < kcol ? bq : c < vcol ? bk : bv;
            gx.push_back(eg[i]), wx.push_back(wr[i]), bx.push_back(br[i]);
            if (s.fp32_form) {
                std::vector<float> &fx = c < kcol ? fq : c < vcol ? fk : fv;
                std::vector<double> &w2 = c < kcol ? wq2 : c < vcol ? wk2 : wv2;
                std::vector<double> &ox = c < kcol ? oq : c < vcol ? ok : ov;
                std::vector<double> &tx = c < kcol ? tq : c < vcol ? tk : tv;
                fx.push_back(fg[i]), w2.push_back(gr[i]), ox.push_back(g0[i]), tx.push_back(bgr[i]);
            }
        }
    cmp("dq", gq.data(), wq.data(), gq.size(), nullptr, bq.data(), 0, 0);
    cmp("dk", gk.data(), wk.data(), gk.size(), nullptr, bk.data(), 0, 0);
    cmp("dv", gv.data(), wv.data(), gv.size(), nullptr, bv.data(), 0, 0);
    if (s.fp32_form) {
        cmp("dq32", fq.data(), wq2.data(), fq.size(), oq.data(), tq.data(), 5e-5, 2e-5);
        cmp("dk32", fk.data(), wk2.data(), fk.size(), ok.data(), tk.data(), 5e-5, 2e-5);
        cmp("dv32", fv.data(), wv2.data(), fv.size(), ov.data(), tv.data(), 5e-5, 2e-5);
    }
    printf("  padding changed %zu, guards changed %d, stored D differing from tc_row_d %zu of %zu\n",
           padbad, e.guard, e.dbad, nrows);
    if (s.fp32_form)
        printf("  the fp32 form against the bf16 form: %zu arrays or elements differ\n", fbad);
    if (padbad || e.guard || e.dbad || fbad)
        failures++;
}
int main(int argc, char **argv) {
    int which = argc > 1 ? atoi(argv[1]) : -1;
    // the fp32 form (FLATSHARD_CUDA_ATTENTION=tc under fp32) on the four cheapest shapes
    Shape sh[] = {{1, 1, 1, 1, 64, 0, 0, 1},    {2, 7, 3, 1, 64, 0, 2, 1},
                  {1, 70, 4, 1, 128, 3, 1, 1},  {2, 130, 6, 2, 64, 7, 3, 0},
                  {1, 97, 3, 3, 128, 0, 5, 0},  {1, 64, 2, 1, 128, 0, 0, 1},
                  {1, 200, 4, 1, 128, 0, 0, 0}, {2, 300, 6, 2, 64, 3, 1, 0}};
    for (int i = 0; i < 8; i++) {
        if (which >= 0 && i != which)
            continue;
        if (sh[i].HS == 64)
            run<64>(sh[i], 1 + i);
        else
            run<128>(sh[i], 1 + i);
    }
    printf("%s\n", failures ? "FAILED" : "ok: every element within its bound");
    return failures ? 1 : 0;
}
