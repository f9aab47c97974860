/*
 * gemm_onednn.c — the bf16 GEMM's oneDNN path, and the choice between paths (contract in
 * kernels.h, "bf16 GEMM paths").
 *
 * Why oneDNN: on a CPU with AMX, a bf16 product runs on 16 x 32 tile registers
 * (tdpbf16ps), several times the rate vdpbf16ps reaches; oneDNN's brgemm kernels are the
 * maintained way to drive them, and Debian ships the library (libdnnl-dev, 2.6). Without AMX
 * its AVX512-BF16 brgemm still beat flatshard's own kernel where measured (1.13x on a step's
 * GEMMs on an AMD Zen 4, 1.06x on a Xeon with AMX masked off: BENCHMARKS.md), though on an
 * Intel core both lose to sgemm (the rule below takes the sgemm path there). It is used
 * through its C API as a matmul primitive: bf16 source and weights, fp32 destination, a sum
 * post-op for "accumulate" (C = C + A B, in fp32).
 *
 * How a product runs:
 *   1. Every fp32 operand is rounded to bf16 (fs_fp32_to_bf16, the flatshard path's rounding)
 *      into the staging buffer; bf16 operands (the weights) are read in place, except the
 *      forward's (a transposed bf16 B no larger than C), which is copied into oneDNN's blocked
 *      bf16 weights layout (BA16a64b2a, which its AMX and its AVX512-BF16 brgemm both read)
 *      before the tiles. An fp32 B (the weight gradient's inp) is rounded before the tiles,
 *      over the pool, straight into that layout, so that no tile repacks it. An fp32 A is rounded tile by tile, each tile's rows on the tile's thread
 *      just before its oneDNN call (still in that core's cache when oneDNN reads them), a
 *      transposed one (the weight gradient's dout^T) transposed on the way; a transposed
 *      bf16 A (dgu^T from fs_swiglu_backward_bf16) is only transposed, a plain one read in
 *      place.
 *   2. C is cut into tiles of FS_GEMM_ONEDNN_TILE rows (the last one shorter); each tile is
 *      one oneDNN call on one thread, the tiles spread over the pool. oneDNN is told to use
 *      one thread (omp_set_num_threads(1) on each thread that calls it: Debian's build
 *      threads with OpenMP, whose workers would otherwise compete with the pool's), so the
 *      order in which it sums a tile depends only on the tile's shape: the bits depend
 *      neither on the pool size nor on which thread ran which tile.
 *   3. Each call has its own scratchpad (the thread's fs_cpu_scratch: user scratchpad mode, so
 *      that one primitive runs on several threads at once) and its own stream per thread.
 *
 * Primitives are created once per (tile shape, strides or B's blocked layout, accumulate),
 * cached for the life of the process and looked up once per product; fs_gemm_prepare_linear
 * creates a model's before its first step, so a step never JIT-compiles anything. The cache is a fixed open-addressing table under a mutex
 * (a lookup costs a lock and a few compares; a product runs for tens of microseconds at
 * least).
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cpu_common.h"

#if FS_HAVE_ONEDNN
#include <oneapi/dnnl/dnnl.h>
#endif

/* ------------------------------------------------------------------ the choice of path */

static const char *const path_names[FS_GEMM_PATH_N] = {
    [FS_GEMM_PATH_FLATSHARD] = "flatshard",
    [FS_GEMM_PATH_ONEDNN] = "onednn",
    [FS_GEMM_PATH_SGEMM] = "sgemm",
};

/* -1: not chosen yet. Stored with release and loaded with acquire: a thread that reads the
 * oneDNN path chosen by another must also see what probe() wrote before it (the engine,
 * onednn_kernel_class), since it never calls pthread_once itself. Relaxed was a data race
 * ThreadSanitizer caught in CI (lookup reading onednn_kernel_class on an in-process rank). */
static atomic_int path_in_use = -1;

const char *fs_gemm_path_name(fs_gemm_path path) {
    return (int)path >= 0 && path < FS_GEMM_PATH_N ? path_names[path] : "?";
}

#if FS_HAVE_ONEDNN

static pthread_once_t probe_once = PTHREAD_ONCE_INIT;
static dnnl_engine_t engine;
static int onednn_works, onednn_kernel_class;
/* the implementation of a probe product: "brg:avx512_core_amx_bf16" (AMX tiles),
 * "brg:avx512_core_bf16" (vdpbf16ps), "gemm:jit" or "ref" where the CPU has neither */
static char onednn_impl[96];

static fs_status make_primitive(dnnl_primitive_t *out, dnnl_primitive_desc_t *pd_out, int64_t M,
                                int64_t N, int64_t K, int a_trans, int64_t lda, int b_trans,
                                int64_t ldb, int64_t ldc, int accumulate);

/* How fast a kind of oneDNN bf16 matmul kernel is, from its implementation name: 2 a brgemm on
 * AMX tiles, 1 a brgemm on AVX512-BF16, 0 anything else (gemm:jit, ref: emulated bf16). By
 * kind rather than by exact name, so that another spelling of the same ISA in another oneDNN
 * release does not count as another kernel. */
static int kernel_class(const char *impl) {
    if (!impl || strncmp(impl, "brg", 3) != 0) return 0;
    return strstr(impl, "amx") ? 2 : strstr(impl, "bf16") ? 1 : 0;
}

static void probe(void) {
    if (dnnl_engine_create(&engine, dnnl_cpu, 0) != dnnl_success) return;
    dnnl_primitive_t p;
    dnnl_primitive_desc_t pd;
    if (make_primitive(&p, &pd, 64, 64, 64, 0, 64, 1, 64, 64, 0) != FS_OK) return;
    const char *impl = NULL;
    if (dnnl_primitive_desc_query(pd, dnnl_query_impl_info_str, 0, &impl) == dnnl_success && impl)
        snprintf(onednn_impl, sizeof onednn_impl, "%s", impl);
    dnnl_primitive_destroy(p);
    dnnl_primitive_desc_destroy(pd);
    onednn_works = 1;
    onednn_kernel_class = kernel_class(onednn_impl);
}

int fs_gemm_path_available(fs_gemm_path path) {
    if (path == FS_GEMM_PATH_FLATSHARD || path == FS_GEMM_PATH_SGEMM) return 1;
    if (path != FS_GEMM_PATH_ONEDNN) return 0;
    pthread_once(&probe_once, probe);
    return onednn_works;
}

#else

int fs_gemm_path_available(fs_gemm_path path) { return path == FS_GEMM_PATH_FLATSHARD || path == FS_GEMM_PATH_SGEMM; }

#endif

/* Whether this CPU's vdpbf16ps outruns its fp32 FMAs, by vendor: on AMD's Zen 4 it does twice
 * an FMA's work at the FMA's rate (236 against 118 GFLOP/s a core, `bench kernels`' measured
 * peaks); an Intel core issues it on one port where it issues FMAs on two (85.5 against 162.8
 * on a Xeon of family 6 model 207). */
static int bf16_dot_outruns_fma(void) {
    return fs_kernels_cpu_isa() == FS_ISA_AVX512_BF16 && __builtin_cpu_is("amd");
}

static int path_from_env(void) {
    const char *s = getenv("FLATSHARD_GEMM");
    if (s && strcmp(s, "flatshard") == 0) return FS_GEMM_PATH_FLATSHARD;
    if (s && strcmp(s, "sgemm") == 0) return FS_GEMM_PATH_SGEMM;
    if (s && strcmp(s, "onednn") == 0 && fs_gemm_path_available(FS_GEMM_PATH_ONEDNN))
        return FS_GEMM_PATH_ONEDNN;
    /* auto, unset, or a value fs_gemm_env_error names */
#if FS_HAVE_ONEDNN
    /* AMX tiles anywhere; a brgemm on vdpbf16ps where that instruction outruns FMAs */
    if (fs_gemm_path_available(FS_GEMM_PATH_ONEDNN) &&
        (onednn_kernel_class == 2 || (onednn_kernel_class == 1 && bf16_dot_outruns_fma())))
        return FS_GEMM_PATH_ONEDNN;
#endif
    /* sgemm only on an OpenBLAS core of the CPU's level: on the SSE3 core OpenBLAS 0.3.21
     * falls back to (a program that links the library and does not restart itself as
     * flatshard's does: the test programs) it would be slower than flatshard's kernel */
    const int blas_below_cpu = fs_kernels_blas_core_for(fs_kernels_blas_corename(), fs_kernels_cpu_isa()) != NULL;
    return bf16_dot_outruns_fma() || blas_below_cpu ? FS_GEMM_PATH_FLATSHARD : FS_GEMM_PATH_SGEMM;
}

const char *fs_gemm_env_error(void) {
    const char *s = getenv("FLATSHARD_GEMM");
    if (!s || !*s || strcmp(s, "auto") == 0 || strcmp(s, "flatshard") == 0 || strcmp(s, "sgemm") == 0) return NULL;
    if (strcmp(s, "onednn") == 0)
        return fs_gemm_path_available(FS_GEMM_PATH_ONEDNN)
                   ? NULL
                   : (FS_HAVE_ONEDNN ? "FLATSHARD_GEMM=onednn: oneDNN cannot run a bf16 matmul on this CPU"
                                     : "FLATSHARD_GEMM=onednn: this build has no oneDNN (make ONEDNN=0, or "
                                       "libdnnl-dev was missing)");
    return "FLATSHARD_GEMM must be auto, onednn, flatshard or sgemm";
}

fs_gemm_path fs_gemm_path_in_use(void) {
    int p = atomic_load_explicit(&path_in_use, memory_order_acquire);
    if (p >= 0) return (fs_gemm_path)p;
    p = path_from_env();
    atomic_store_explicit(&path_in_use, p, memory_order_release);
    return (fs_gemm_path)p;
}

fs_gemm_path fs_gemm_set_path(fs_gemm_path path) {
    fs_gemm_path before = fs_gemm_path_in_use();
    FS_ASSERT(fs_gemm_path_available(path));
    atomic_store_explicit(&path_in_use, (int)path, memory_order_release);
    return before;
}

const char *fs_gemm_path_detail(void) {
    static _Thread_local char detail[160]; /* each thread's own: rank threads may ask at once */
#if FS_HAVE_ONEDNN
    if (fs_gemm_path_in_use() == FS_GEMM_PATH_ONEDNN)
        snprintf(detail, sizeof detail, "onednn (%s)", onednn_impl);
    else
#endif
    if (fs_gemm_path_in_use() == FS_GEMM_PATH_SGEMM)
        snprintf(detail, sizeof detail, "sgemm (OpenBLAS %s)", fs_kernels_blas_corename());
    else
        snprintf(detail, sizeof detail, "flatshard (%s)",
                 fs_kernels_isa() == FS_ISA_AVX512_BF16 ? "avx512bf16" : "portable");
    return detail;
}

/* ------------------------------------------------------------------ the staging */

/* Whether B is staged packed in the blocked layout (B_BLOCKED) once per product: with a plain
 * B, every oneDNN call copies the B blocks it reads into that layout itself, so a product of T
 * row tiles repacked all of B T times (24 times for `small`'s gate_up weight gradient); packed
 * once, every tile reads it as it is. Packed: an fp32 B stored (K, N) (the weight gradient's
 * inp; rounded on the way, the cost of the plain cast it replaces), and a bf16 B stored
 * transposed (the forward's weight) where the packed copy is no larger than C (M x N), so that
 * the product's staging stays within A + C: `small`'s forward ran 1.1-1.25x faster (gate_up
 * 18.5 -> 14.5 ms, one thread, CPU time). A plain bf16 B (the input gradient's weight) is read
 * in place: packed with oneDNN's reorder it ran slower (gate_up 19.4 -> 21.3 ms), and
 * flatshard's own pack of that layout was not measured. A plain bf16 B marked .pack (the weight
 * gradient's bf16 inp, fs_swiglu_forward_bf16's h; pack_b) is packed as its fp32 form would be:
 * the same staging bytes. */
static int stage_packs(fs_gemm_operand o, int is_a, int64_t rows, int64_t cols, int64_t m, int pack) {
    if (is_a) return 0;
    if (o.dtype == FS_GEMM_F32) return !o.trans;
    if (pack && !o.trans) return 1; /* a plain bf16 B the caller marks (the weight gradient's inp) */
    return o.trans && (double)((rows + 31) / 32 * 32) * (double)((cols + 63) / 64 * 64) <= (double)m * (double)cols;
}

static int64_t round_up(int64_t n, int64_t to) { return (n + to - 1) / to * to; }

/* Whether a staged operand is also transposed while it is rounded: a transposed A (the
 * weight gradient's dout^T, fp32, or bf16 from fs_swiglu_backward_bf16, only transposed).
 * oneDNN 2.6's AMX brgemm matmul takes no transposed source: with one it falls back to
 * "gemm:jit", which ran the weight-gradient tiles at a third of the AMX rate (ONEDNN_VERBOSE,
 * `small`: 2.4 ms against ~0.8 ms per 256 x 768 x 1024 tile). Staged as (M, K), every product
 * runs on brgemm (on AVX512-BF16's brgemm too: test_gemm counts any product that leaves the
 * probe's kind of kernel). Only A: a transposed B ("ba" weights) runs on brgemm as it is.
 * Outside the oneDNN part: the staging sizes below are counted in every build (ONEDNN=0 too). */
static int stage_transposes(fs_gemm_operand o, int is_a) { return is_a && o.trans; }

/* Bytes of an operand's staged copy, a multiple of 64 (the next one starts 64-aligned). */

static size_t staged_bytes(fs_gemm_operand o, int64_t rows, int64_t cols, int is_a, int64_t m, int pack) {
    const int packs = stage_packs(o, is_a, rows, cols, m, pack);
    if (o.dtype != FS_GEMM_F32 && !packs && !stage_transposes(o, is_a)) return 0;
    const int64_t n = packs ? round_up(rows, 32) * round_up(cols, 64) : rows * cols;
    return ((size_t)n * sizeof(uint16_t) + 63) / 64 * 64;
}

static size_t stage_need(fs_gemm_operand A, fs_gemm_operand B, int64_t M, int64_t N, int64_t K, int pack_b) {
    return staged_bytes(A, M, K, 1, M, 0) + staged_bytes(B, K, N, 0, M, pack_b);
}

/* A pure function of the shape (the plan calls it with no oneDNN in the build or on the CPU):
 * the largest of the three products' needs, in practice the weight gradient's (dout^T staged
 * as (OC, N), inp packed with its rows padded to 32 and its columns to 64; the forward packs
 * its weight only where the copy is no larger than its output, so it stays within about the
 * same bytes). */
size_t fs_gemm_stage_bytes(int64_t N, int64_t IC, int64_t OC) {
    size_t most = 0;
    static const float f[1];
    static const uint16_t h[1];
    for (int pass = FS_CPU_LINEAR_FWD; pass <= FS_CPU_LINEAR_DW; pass++) {
        fs_cpu_linear_gemm g = fs_cpu_linear_product(pass, f, 0, h, f, 0, N, IC, OC);
        const size_t need = g.M > 0 && g.N > 0 && g.K > 0 ? stage_need(g.A, g.B, g.M, g.N, g.K, g.pack_b) : 0;
        if (need > most) most = need;
    }
    return most;
}

#if !FS_HAVE_ONEDNN

fs_status fs_gemm_prepare_linear(int64_t N, int64_t IC, int64_t OC) { return FS_OK; }
uint64_t fs_gemm_primitives_created(void) { return 0; }
uint64_t fs_gemm_primitives_off_kernel(void) { return 0; }
const char *fs_gemm_first_off_kernel(void) { return ""; }
void fs_cpu_onednn_gemm(fs_pool *pool, const fs_gemm_stage *stage, float *C, uint16_t *C16, int64_t ldc,
                        int accumulate, fs_gemm_operand A, fs_gemm_operand B, int64_t M,
                        int64_t N, int64_t K, int pack_b) {
    FS_ASSERT(!"the oneDNN GEMM path in a build without oneDNN");
}

#else

/* ------------------------------------------------------------------ primitives */

static fs_status dnnl_failed(dnnl_status_t s, const char *what, int64_t M, int64_t N, int64_t K) {
    return fs_errorf(FS_ERR_INTERNAL, "oneDNN %s for the bf16 matmul %lld x %lld x %lld failed (status %d)",
                     what, (long long)M, (long long)N, (long long)K, (int)s);
}

/* How the tiles read B (bf16_operand.trans): plain, transposed, or packed in oneDNN's
 * blocked layout for bf16 weights (AMX and AVX512-BF16 brgemm alike), BA16a64b2a: blocks of
 * 32 rows (k) x 64 columns (n), column blocks outermost; in a block, row pairs, then the 64
 * columns, then the pair's 2 rows (the VNNI pairs tdpbf16ps and vdpbf16ps read), each block
 * 4 KiB; k padded to 32 and n to 64 with zeros. */
enum { B_PLAIN, B_TRANS, B_BLOCKED };

/* C (M, N) f32 = A (M, K) bf16 @ B (K, N) bf16 (+ C when accumulating); an operand stored
 * transposed has strides (1, ld), else (ld, 1); b_trans B_BLOCKED: B packed (ldb unused). */
static fs_status make_primitive(dnnl_primitive_t *out, dnnl_primitive_desc_t *pd_out, int64_t M,
                                int64_t N, int64_t K, int a_trans, int64_t lda, int b_trans,
                                int64_t ldb, int64_t ldc, int accumulate) {
    dnnl_dims_t a_dims = {M, K}, b_dims = {K, N}, c_dims = {M, N};
    dnnl_dims_t a_str = {a_trans ? 1 : lda, a_trans ? lda : 1};
    dnnl_dims_t b_str = {b_trans ? 1 : ldb, b_trans ? ldb : 1};
    dnnl_dims_t c_str = {ldc, 1};
    dnnl_memory_desc_t a, b, c;
    dnnl_matmul_desc_t md;
    dnnl_status_t s;
    if ((s = dnnl_memory_desc_init_by_strides(&a, 2, a_dims, dnnl_bf16, a_str)) != dnnl_success ||
        (s = b_trans == B_BLOCKED ? dnnl_memory_desc_init_by_tag(&b, 2, b_dims, dnnl_bf16, dnnl_BA16a64b2a)
                                  : dnnl_memory_desc_init_by_strides(&b, 2, b_dims, dnnl_bf16, b_str)) != dnnl_success ||
        (s = dnnl_memory_desc_init_by_strides(&c, 2, c_dims, dnnl_f32, c_str)) != dnnl_success ||
        (s = dnnl_matmul_desc_init(&md, &a, &b, NULL, &c)) != dnnl_success)
        return dnnl_failed(s, "descriptor", M, N, K);
    dnnl_primitive_attr_t attr = NULL;
    dnnl_post_ops_t po = NULL;
    s = dnnl_primitive_attr_create(&attr);
    if (s == dnnl_success) s = dnnl_primitive_attr_set_scratchpad_mode(attr, dnnl_scratchpad_mode_user);
    if (s == dnnl_success && accumulate) {
        s = dnnl_post_ops_create(&po);
        if (s == dnnl_success) s = dnnl_post_ops_append_sum(po, 1.0f);
        if (s == dnnl_success) s = dnnl_primitive_attr_set_post_ops(attr, po);
    }
    dnnl_primitive_desc_t pd = NULL;
    if (s == dnnl_success) s = dnnl_primitive_desc_create(&pd, &md, attr, engine, NULL);
    if (po) dnnl_post_ops_destroy(po);
    if (attr) dnnl_primitive_attr_destroy(attr);
    if (s != dnnl_success) return dnnl_failed(s, "primitive descriptor", M, N, K);
    s = dnnl_primitive_create(out, pd);
    if (s != dnnl_success) {
        dnnl_primitive_desc_destroy(pd);
        return dnnl_failed(s, "primitive", M, N, K);
    }
    *pd_out = pd;
    return FS_OK;
}

typedef struct prim_key {
    int64_t M, N, K, lda, ldb, ldc;
    int a_trans, b_trans, accumulate;
} prim_key;

typedef struct prim_entry {
    prim_key key;
    int used;
    dnnl_primitive_t prim;
    dnnl_primitive_desc_t pd;
    size_t scratchpad_bytes;
} prim_entry;

/* A model has a handful of linear shapes, each with 3 products x 2 betas x 2 tile heights;
 * 4096 entries hold dozens of models' worth (tests build many). */
#define PRIM_CACHE 4096
static prim_entry cache[PRIM_CACHE];
static int cache_used;
static pthread_mutex_t cache_mu = PTHREAD_MUTEX_INITIALIZER;
static atomic_uint_fast64_t primitives_created, primitives_off_kernel;
static char first_off_kernel[128]; /* written under cache_mu, once, before the count */

uint64_t fs_gemm_primitives_created(void) { return atomic_load(&primitives_created); }
uint64_t fs_gemm_primitives_off_kernel(void) { return atomic_load(&primitives_off_kernel); }
const char *fs_gemm_first_off_kernel(void) { return first_off_kernel; }

static uint64_t key_hash(const prim_key *k) {
    const int64_t f[9] = {k->M, k->N, k->K, k->lda, k->ldb, k->ldc, k->a_trans, k->b_trans, k->accumulate};
    uint64_t h = 1469598103934665603ull;
    for (int i = 0; i < 9; i++) h = (h ^ (uint64_t)f[i]) * 1099511628211ull;
    return h;
}

static int key_eq(const prim_key *a, const prim_key *b) {
    return a->M == b->M && a->N == b->N && a->K == b->K && a->lda == b->lda && a->ldb == b->ldb &&
           a->ldc == b->ldc && a->a_trans == b->a_trans && a->b_trans == b->b_trans &&
           a->accumulate == b->accumulate;
}

/* The cached primitive for `k`, created if it is not there yet. */
static fs_status lookup(const prim_key *k, const prim_entry **out) {
    pthread_mutex_lock(&cache_mu);
    size_t i = (size_t)(key_hash(k) % PRIM_CACHE);
    fs_status st = FS_OK;
    while (cache[i].used && !key_eq(&cache[i].key, k)) i = (i + 1) % PRIM_CACHE;
    if (!cache[i].used) {
        if (cache_used >= PRIM_CACHE * 3 / 4) {
            st = fs_errorf(FS_ERR_INTERNAL, "the oneDNN primitive cache is full (%d shapes)", cache_used);
        } else {
            prim_entry *e = &cache[i];
            st = make_primitive(&e->prim, &e->pd, k->M, k->N, k->K, k->a_trans, k->lda, k->b_trans,
                                k->ldb, k->ldc, k->accumulate);
            if (st == FS_OK) {
                const dnnl_memory_desc_t *sp = dnnl_primitive_desc_query_md(e->pd, dnnl_query_scratchpad_md, 0);
                e->scratchpad_bytes = sp ? dnnl_memory_desc_get_size(sp) : 0;
                e->key = *k;
                e->used = 1;
                cache_used++;
                atomic_fetch_add(&primitives_created, 1);
                const char *impl = NULL;
                if (dnnl_primitive_desc_query(e->pd, dnnl_query_impl_info_str, 0, &impl) != dnnl_success)
                    impl = NULL;
                if (kernel_class(impl) < onednn_kernel_class) {
                    /* the name before the count (under cache_mu, so one writer): a thread
                     * that reads a count above 0 reads the name too */
                    if (atomic_load(&primitives_off_kernel) == 0)
                        snprintf(first_off_kernel, sizeof first_off_kernel, "%s (M %lld N %lld K %lld)",
                                 impl ? impl : "?", (long long)k->M, (long long)k->N, (long long)k->K);
                    atomic_fetch_add(&primitives_off_kernel, 1);
                }
            }
        }
    }
    *out = st == FS_OK ? &cache[i] : NULL;
    pthread_mutex_unlock(&cache_mu);
    return st;
}

/* ------------------------------------------------------------------ one product */

/* An operand as oneDNN reads it: bf16, with the layout it is stored in. */
typedef struct bf16_operand {
    const uint16_t *data;
    int trans;
    int64_t ld;
} bf16_operand;

/* Stored rows and columns of an operand whose op() is (rows, cols). */
static void stored_dims(fs_gemm_operand o, int64_t rows, int64_t cols, int64_t *sr, int64_t *sc) {
    *sr = o.trans ? cols : rows;
    *sc = o.trans ? rows : cols;
}

/* The operand as the tiles read it: staged (compact, ld = stored columns, or op() columns when
 * staging transposes it) when fp32. */
static bf16_operand staged_layout(fs_gemm_operand o, int64_t rows, int64_t cols, const void *at, int is_a,
                                  int64_t m, int pack) {
    int64_t sr, sc;
    stored_dims(o, rows, cols, &sr, &sc);
    if (stage_packs(o, is_a, rows, cols, m, pack)) return (bf16_operand){at, B_BLOCKED, 0};
    if (stage_transposes(o, is_a)) return (bf16_operand){at, B_PLAIN, cols < 1 ? 1 : cols};
    if (o.dtype == FS_GEMM_BF16) return (bf16_operand){o.data, o.trans, o.ld};
    return (bf16_operand){at, o.trans, sc < 1 ? 1 : sc};
}

typedef struct cast_job {
    const float *in;
    uint16_t *out;
    int64_t ld, cols;
} cast_job;

/* One row, with vcvtne2ps2bf16 where the CPU has it (round to nearest even like
 * fs_fp32_to_bf16, as the flatshard path's AVX512-BF16 packing does; a scalar loop is 4x
 * slower and the staging is a visible share of a weight-gradient product). */
FS_TARGET_AVX512BF16 static void cast_row_avx512bf16(uint16_t *restrict out, const float *restrict in, int64_t n) {
    int64_t c = 0;
    for (; c + 32 <= n; c += 32)
        _mm512_storeu_si512((void *)(out + c),
                            (__m512i)_mm512_cvtne2ps_pbh(_mm512_loadu_ps(in + c + 16), _mm512_loadu_ps(in + c)));
    for (; c < n; c++) out[c] = fs_fp32_to_bf16(in[c]);
}

static void cast_rows(void *arg, int64_t begin, int64_t end, int thread) {
    const cast_job *j = arg;
    const int fast = fs_kernels_isa() == FS_ISA_AVX512_BF16;
    for (int64_t r = begin; r < end; r++) {
        const float *restrict in = j->in + r * j->ld;
        uint16_t *restrict out = j->out + r * j->cols;
        if (fast) cast_row_avx512bf16(out, in, j->cols);
        else
            for (int64_t c = 0; c < j->cols; c++) out[c] = fs_fp32_to_bf16(in[c]);
    }
}

/* The transposing stage: op() rows [r0, r1) of a transposed operand stored (cols, rows) with
 * leading dimension ld, written as out (rows, cols) compact. 32 stored rows x 16 stored
 * columns at a time: two 16 x 16 fp32 transposes in registers, then each op() row's 32 values
 * rounded with one vcvtne2ps2bf16 and stored as 64 bytes; the edges one value at a time. */
FS_TARGET_AVX512BF16 static inline void transpose16(__m512 r[16]) {
    __m512 t[16];
    for (int i = 0; i < 16; i += 2) {
        t[i] = _mm512_unpacklo_ps(r[i], r[i + 1]);
        t[i + 1] = _mm512_unpackhi_ps(r[i], r[i + 1]);
    }
    for (int i = 0; i < 16; i += 4) {
        r[i] = _mm512_shuffle_ps(t[i], t[i + 2], _MM_SHUFFLE(1, 0, 1, 0));
        r[i + 1] = _mm512_shuffle_ps(t[i], t[i + 2], _MM_SHUFFLE(3, 2, 3, 2));
        r[i + 2] = _mm512_shuffle_ps(t[i + 1], t[i + 3], _MM_SHUFFLE(1, 0, 1, 0));
        r[i + 3] = _mm512_shuffle_ps(t[i + 1], t[i + 3], _MM_SHUFFLE(3, 2, 3, 2));
    }
    /* r[4a + b] now holds, in each 128-bit lane L, rows 4a..4a+3 of column 4L + b' (b' the
     * order above); two rounds of 128-bit lane shuffles gather the columns */
    for (int i = 0; i < 8; i++) {
        const int a = (i / 4) * 8 + i % 4;
        t[a] = _mm512_shuffle_f32x4(r[a], r[a + 4], 0x88);
        t[a + 4] = _mm512_shuffle_f32x4(r[a], r[a + 4], 0xdd);
    }
    for (int i = 0; i < 8; i++) {
        r[i] = _mm512_shuffle_f32x4(t[i], t[i + 8], 0x88);
        r[i + 8] = _mm512_shuffle_f32x4(t[i], t[i + 8], 0xdd);
    }
}

typedef struct tcast_job {
    const float *in;
    const uint16_t *in16; /* or a bf16 source (then only transposed: bf16 -> fp32 -> bf16 is exact) */
    uint16_t *out;
    int64_t ld, rows, cols; /* op() shape; stored (cols, rows) */
} tcast_job;

FS_TARGET_AVX512BF16 static void tcast_block_avx512bf16(const tcast_job *j, int64_t r0, int64_t c0) {
    __m512 lo[16], hi[16];
    for (int i = 0; i < 16; i++) {
        lo[i] = _mm512_loadu_ps(j->in + (c0 + i) * j->ld + r0);
        hi[i] = _mm512_loadu_ps(j->in + (c0 + 16 + i) * j->ld + r0);
    }
    transpose16(lo);
    transpose16(hi);
    for (int i = 0; i < 16; i++)
        _mm512_storeu_si512((void *)(j->out + (r0 + i) * j->cols + c0), (__m512i)_mm512_cvtne2ps_pbh(hi[i], lo[i]));
}

/* The same for a bf16 source (nothing to round: bits moved only), 32 op() rows x 32 op()
 * columns at a time, as 32-bit words: a stored row's 64 bytes at column r0 are the value pairs
 * (r0 + 2w, r0 + 2w + 1), w < 16, so two transpose16 of 16 stored rows each leave in word
 * row w the pairs of 16 op() columns; one vpermt2w per op() row then takes the even (or odd)
 * halves of both into that row's 32 values. */
FS_TARGET_AVX512BF16 static void tcast_block16_avx512(const tcast_job *j, int64_t r0, int64_t c0) {
    static const uint16_t even[32] = {0,  2,  4,  6,  8,  10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30,
                                      32, 34, 36, 38, 40, 42, 44, 46, 48, 50, 52, 54, 56, 58, 60, 62};
    const __m512i ie = _mm512_loadu_si512((const void *)even), io = _mm512_add_epi16(ie, _mm512_set1_epi16(1));
    __m512 lo[16], hi[16];
    for (int i = 0; i < 16; i++) {
        lo[i] = _mm512_loadu_ps((const void *)(j->in16 + (c0 + i) * j->ld + r0));
        hi[i] = _mm512_loadu_ps((const void *)(j->in16 + (c0 + 16 + i) * j->ld + r0));
    }
    transpose16(lo);
    transpose16(hi);
    for (int w = 0; w < 16; w++) {
        const __m512i a = _mm512_castps_si512(lo[w]), b = _mm512_castps_si512(hi[w]);
        _mm512_storeu_si512((void *)(j->out + (r0 + 2 * w) * j->cols + c0), _mm512_permutex2var_epi16(a, ie, b));
        _mm512_storeu_si512((void *)(j->out + (r0 + 2 * w + 1) * j->cols + c0), _mm512_permutex2var_epi16(a, io, b));
    }
}

/* op() rows [r_begin, r_end) of the transposed operand (a tile's); r_begin a multiple of 16.
 * The 32 x 16 blocks go column block by column block (the source read as 32 runs of
 * contiguous values); row blocks outermost measured the same. Either way this stage runs at
 * about a third of the plain cast's rate per value. */
static void tcast_range(const tcast_job *j, int64_t r_begin, int64_t r_end) {
    int64_t r_full = r_begin, c_full = 0; /* rows [r_begin, r_full) x columns [0, c_full) in blocks */
    if (fs_kernels_isa() == FS_ISA_AVX512_BF16) {
        const int64_t rb = j->in16 ? 32 : 16; /* op() rows per block */
        r_full = r_begin + (r_end - r_begin) / rb * rb;
        c_full = j->cols / 32 * 32;
        for (int64_t c = 0; c < c_full; c += 32)
            for (int64_t r0 = r_begin; r0 < r_full; r0 += rb)
                if (j->in16) tcast_block16_avx512(j, r0, c);
                else tcast_block_avx512bf16(j, r0, c);
    }
    for (int64_t r = r_begin; r < r_end; r++)
        for (int64_t c = r < r_full ? c_full : 0; c < j->cols; c++)
            j->out[r * j->cols + c] = j->in16 ? j->in16[c * j->ld + r] : fs_fp32_to_bf16(j->in[c * j->ld + r]);
}

/* The packing stage (B_BLOCKED): block i = (column block) x kb + (row block) of an fp32 B
 * stored (K, N), 32 x 64 values, 2048 bf16 at out + 2048 i. */
typedef struct pack_job {
    const float *in;     /* an fp32 B stored (K, N) */
    const uint16_t *in16; /* or a bf16 B stored transposed, (N, K) */
    const uint16_t *in16p; /* or a bf16 B stored (K, N) (operand.pack) */
    uint16_t *out;
    int64_t ld, K, N, kb;
} pack_job;

/* A whole block: per row pair, 4 x 16 columns of both rows rounded by one vcvtne2ps2bf16
 * (the same rounding as cast_row_avx512bf16) and their words interleaved by one vpermw. */
FS_TARGET_AVX512BF16 static void pack_block_avx512bf16(const pack_job *j, uint16_t *out, int64_t k0, int64_t n0) {
    static const uint16_t order[32] = {0, 16, 1, 17, 2,  18, 3,  19, 4,  20, 5,  21, 6,  22, 7,  23,
                                       8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31};
    const __m512i idx = _mm512_loadu_si512((const void *)order);
    for (int64_t p = 0; p < 16; p++) {
        const float *r0 = j->in + (k0 + 2 * p) * j->ld + n0, *r1 = r0 + j->ld;
        for (int q = 0; q < 4; q++) {
            const __m512i v = (__m512i)_mm512_cvtne2ps_pbh(_mm512_loadu_ps(r1 + 16 * q), _mm512_loadu_ps(r0 + 16 * q));
            _mm512_storeu_si512((void *)(out + (p * 64 + 16 * q) * 2), _mm512_permutexvar_epi16(idx, v));
        }
    }
}

/* A bf16 B stored transposed (the forward's weight, (N, K)): a row pair of B at column n is
 * the 32-bit word at k of the weight's row n, so a block is a 64 x 16 -> 16 x 64 transpose of
 * 32-bit words, four transpose16 of whole 64-byte rows (bits moved, none changed). */
FS_TARGET_AVX512BF16 static void pack_block_bf16t_avx512(const pack_job *j, uint16_t *out, int64_t k0, int64_t n0) {
    for (int t = 0; t < 4; t++) {
        __m512 r[16];
        for (int i = 0; i < 16; i++) r[i] = _mm512_loadu_ps((const void *)(j->in16 + (n0 + 16 * t + i) * j->ld + k0));
        transpose16(r);
        for (int p = 0; p < 16; p++) _mm512_storeu_ps((void *)(out + (p * 64 + 16 * t) * 2), r[p]);
    }
}

/* A plain bf16 B (K, N): per row pair, the 64 columns of both rows interleaved word by word
 * by two vpermt2w per 32 columns (bits moved, none changed). */
FS_TARGET_AVX512BF16 static void pack_block_bf16p_avx512(const pack_job *j, uint16_t *out, int64_t k0, int64_t n0) {
    static const uint16_t lo[32] = {0, 32, 1, 33, 2,  34, 3,  35, 4,  36, 5,  37, 6,  38, 7,  39,
                                    8, 40, 9, 41, 10, 42, 11, 43, 12, 44, 13, 45, 14, 46, 15, 47};
    const __m512i il = _mm512_loadu_si512((const void *)lo), ih = _mm512_add_epi16(il, _mm512_set1_epi16(16));
    for (int64_t p = 0; p < 16; p++) {
        const uint16_t *r0 = j->in16p + (k0 + 2 * p) * j->ld + n0, *r1 = r0 + j->ld;
        for (int q = 0; q < 2; q++) {
            const __m512i a = _mm512_loadu_si512((const void *)(r0 + 32 * q)), b = _mm512_loadu_si512((const void *)(r1 + 32 * q));
            _mm512_storeu_si512((void *)(out + (p * 64 + 32 * q) * 2), _mm512_permutex2var_epi16(a, il, b));
            _mm512_storeu_si512((void *)(out + (p * 64 + 32 * q + 16) * 2), _mm512_permutex2var_epi16(a, ih, b));
        }
    }
}

/* B's value at (k, n) as bf16: rounded from an fp32 B, or read from a bf16 one */
static inline uint16_t pack_value(const pack_job *j, int64_t k, int64_t n) {
    if (j->in16p) return j->in16p[k * j->ld + n];
    return j->in16 ? j->in16[n * j->ld + k] : fs_fp32_to_bf16(j->in[k * j->ld + n]);
}

static void pack_blocks(void *arg, int64_t begin, int64_t end, int thread) {
    const pack_job *j = arg;
    const int fast = fs_kernels_isa() == FS_ISA_AVX512_BF16;
    for (int64_t i = begin; i < end; i++) {
        const int64_t k0 = i % j->kb * 32, n0 = i / j->kb * 64;
        uint16_t *out = j->out + i * 2048;
        if (fast && k0 + 32 <= j->K && n0 + 64 <= j->N) {
            if (j->in16) pack_block_bf16t_avx512(j, out, k0, n0);
            else if (j->in16p) pack_block_bf16p_avx512(j, out, k0, n0);
            else pack_block_avx512bf16(j, out, k0, n0);
            continue;
        }
        for (int64_t k = 0; k < 32; k++) /* an edge block, zero-padded */
            for (int64_t n = 0; n < 64; n++)
                out[(k / 2 * 64 + n) * 2 + k % 2] =
                    k0 + k < j->K && n0 + n < j->N ? pack_value(j, k0 + k, n0 + n) : 0;
    }
}

/* Stages an fp32 B (the weight gradient's inp) before the tiles, over the pool: every tile
 * reads all of it. */
static void stage_b(fs_pool *pool, fs_gemm_operand o, int64_t rows, int64_t cols, uint16_t *at, int64_t m,
                    int pack) {
    if (o.dtype == FS_GEMM_BF16 && stage_packs(o, 0, rows, cols, m, pack)) {
        pack_job j = {.in16 = o.trans ? o.data : NULL, .in16p = o.trans ? NULL : o.data, .out = at, .ld = o.ld,
                      .K = rows, .N = cols, .kb = (rows + 31) / 32};
        fs_pool_parallel_for(pool, j.kb * ((cols + 63) / 64), 1, pack_blocks, &j);
        return;
    }
    if (o.dtype != FS_GEMM_F32) return;
    if (stage_packs(o, 0, rows, cols, m, 0)) {
        pack_job j = {.in = o.data, .out = at, .ld = o.ld, .K = rows, .N = cols, .kb = (rows + 31) / 32};
        fs_pool_parallel_for(pool, j.kb * ((cols + 63) / 64), 1, pack_blocks, &j);
        return;
    }
    int64_t sr, sc;
    stored_dims(o, rows, cols, &sr, &sc);
    cast_job j = {.in = o.data, .out = at, .ld = o.ld, .cols = sc};
    fs_pool_parallel_for(pool, sr, fs_cpu_row_grain(sc), cast_rows, &j);
}

/* Stages op() rows [m0, m0 + mt) of an fp32 A inside the tile that reads them, on the tile's
 * thread, so that they are still in its cache when oneDNN reads them (a pass over all of A
 * before the tiles wrote it out to memory and read it back). */
static void stage_a_rows(fs_gemm_operand o, int64_t M, int64_t K, uint16_t *at, int64_t m0, int64_t mt) {
    if (stage_transposes(o, 1)) {
        const int f32 = o.dtype == FS_GEMM_F32;
        tcast_job j = {.in = f32 ? o.data : NULL, .in16 = f32 ? NULL : o.data, .out = at, .ld = o.ld,
                       .rows = M, .cols = K};
        tcast_range(&j, m0, m0 + mt);
        return;
    }
    if (o.dtype != FS_GEMM_F32) return;
    cast_job j = {.in = o.data, .out = at, .ld = o.ld, .cols = K};
    cast_rows(&j, m0, m0 + mt, 0);
}

/* The key of tile rows [m0, m0 + mt) of the product. */
static prim_key tile_key(const bf16_operand *a, const bf16_operand *b, int64_t mt, int64_t N,
                         int64_t K, int64_t ldc, int accumulate) {
    return (prim_key){.M = mt, .N = N, .K = K, .lda = a->ld, .ldb = b->ld, .ldc = ldc,
                      .a_trans = a->trans, .b_trans = b->trans, .accumulate = accumulate != 0};
}

typedef struct tile_job {
    fs_gemm_operand a_src; /* A as the caller gave it: staged tile by tile when fp32 */
    bf16_operand a, b;
    float *C;
    uint16_t *C16; /* or C in bf16 (accumulate 0): each tile's fp32 result rounded */
    int64_t ldc, M, N, K;
    int accumulate;
    const prim_entry *full, *tail; /* the primitives of a full tile and of the short last one */
} tile_job;

extern void omp_set_num_threads(int n); /* libgomp, which Debian's libdnnl threads with */

typedef struct thread_ctx {
    dnnl_stream_t stream;
} thread_ctx;

static pthread_key_t ctx_key;
static pthread_once_t ctx_once = PTHREAD_ONCE_INIT;

static void ctx_free(void *p) {
    thread_ctx *c = p;
    if (c->stream) dnnl_stream_destroy(c->stream);
    free(c);
}
static void ctx_key_init(void) { FS_ASSERT(pthread_key_create(&ctx_key, ctx_free) == 0); }

/* This thread's oneDNN stream; the first call on a thread also caps OpenMP at one thread. */
static dnnl_stream_t thread_stream(void) {
    pthread_once(&ctx_once, ctx_key_init);
    thread_ctx *c = pthread_getspecific(ctx_key);
    if (!c) {
        omp_set_num_threads(1);
        c = calloc(1, sizeof *c);
        FS_ASSERT(c);
        FS_ASSERT(dnnl_stream_create(&c->stream, engine, dnnl_stream_default_flags) == dnnl_success);
        FS_ASSERT(pthread_setspecific(ctx_key, c) == 0);
    }
    return c->stream;
}

static void run_tile(const tile_job *j, int64_t m0) {
    const int64_t mt = j->M - m0 < FS_GEMM_ONEDNN_TILE ? j->M - m0 : FS_GEMM_ONEDNN_TILE;
    const prim_entry *e = mt == FS_GEMM_ONEDNN_TILE || j->M < FS_GEMM_ONEDNN_TILE ? j->full : j->tail;
    stage_a_rows(j->a_src, j->M, j->K, (uint16_t *)(void *)j->a.data, m0, mt);
    dnnl_stream_t stream = thread_stream();
    /* tile rows m0.. of op(A): rows of A stored (M, K), columns of A stored transposed */
    const uint16_t *a = j->a.data + (j->a.trans ? m0 : m0 * j->a.ld);
    /* a bf16 C: the tile's fp32 result goes to the thread's scratch after the scratchpad
     * (the same primitive, ldc and sums as an fp32 C), then is rounded into C16, so that C16
     * is fs_fp32_to_bf16 of the fp32 product bit for bit */
    const size_t pad = (e->scratchpad_bytes + 63) / 64 * 64;
    char *scratch = e->scratchpad_bytes || j->C16
                        ? fs_cpu_scratch(pad + (j->C16 ? (size_t)(mt * j->ldc) * sizeof(float) : 0))
                        : NULL;
    float *c = j->C16 ? (float *)(void *)(scratch + pad) : j->C + m0 * j->ldc;
    void *handles[4] = {(void *)a, (void *)j->b.data, c, e->scratchpad_bytes ? scratch : NULL};
    const dnnl_query_t q[4] = {dnnl_query_src_md, dnnl_query_weights_md, dnnl_query_dst_md,
                               dnnl_query_scratchpad_md};
    const int arg[4] = {DNNL_ARG_SRC, DNNL_ARG_WEIGHTS, DNNL_ARG_DST, DNNL_ARG_SCRATCHPAD};
    dnnl_exec_arg_t args[4];
    dnnl_memory_t mem[4] = {0};
    int n = 0;
    dnnl_status_t s = dnnl_success;
    for (int i = 0; i < 4 && s == dnnl_success; i++) {
        if (!handles[i]) continue;
        s = dnnl_memory_create(&mem[n], dnnl_primitive_desc_query_md(e->pd, q[i], 0), engine, handles[i]);
        if (s == dnnl_success) args[n] = (dnnl_exec_arg_t){arg[i], mem[n]}, n++;
    }
    if (s == dnnl_success) s = dnnl_primitive_execute(e->prim, stream, n, args);
    if (s == dnnl_success) s = dnnl_stream_wait(stream);
    for (int i = 0; i < n; i++) dnnl_memory_destroy(mem[i]);
    if (s != dnnl_success) {
        dnnl_failed(s, "execution", mt, j->N, j->K);
        fs_assert_fail(fs_error_message(), __FILE__, __LINE__);
    }
    if (j->C16)
        for (int64_t r = 0; r < mt; r++) fs_cpu_narrow(j->C16 + (m0 + r) * j->ldc, c + r * j->ldc, j->N);
}

static void tile_range(void *arg, int64_t begin, int64_t end, int thread) {
    const tile_job *j = arg;
    for (int64_t t = begin; t < end; t++) run_tile(j, t * FS_GEMM_ONEDNN_TILE);
}

void fs_cpu_onednn_gemm(fs_pool *pool, const fs_gemm_stage *stage, float *C, uint16_t *C16, int64_t ldc,
                        int accumulate, fs_gemm_operand A, fs_gemm_operand B, int64_t M,
                        int64_t N, int64_t K, int pack_b) {
    const size_t a_bytes = staged_bytes(A, M, K, 1, M, 0), need = stage_need(A, B, M, N, K, pack_b);
    uint16_t *base = NULL;
    if (need) {
        if (stage && stage->data) {
            if (stage->bytes < need) {
                fs_errorf(FS_ERR_INTERNAL, "the bf16 GEMM %lld x %lld x %lld needs %zu bytes of staging, the "
                          "caller reserved %zu", (long long)M, (long long)N, (long long)K, need, stage->bytes);
                fs_assert_fail(fs_error_message(), __FILE__, __LINE__);
            }
            base = stage->data;
        } else {
            base = fs_cpu_scratch_stage(need);
        }
    }
    tile_job j = {.a_src = A, .a = staged_layout(A, M, K, base, 1, M, 0),
                  .b = staged_layout(B, K, N, (char *)base + a_bytes, 0, M, pack_b),
                  .C = C, .C16 = C16, .ldc = ldc, .M = M, .N = N, .K = K, .accumulate = accumulate};
    FS_ASSERT(!C16 || !accumulate);
    const int64_t full = M < FS_GEMM_ONEDNN_TILE ? M : FS_GEMM_ONEDNN_TILE, rest = M % FS_GEMM_ONEDNN_TILE;
    prim_key kf = tile_key(&j.a, &j.b, full, N, K, ldc, accumulate), kt = kf;
    kt.M = rest;
    fs_status st = lookup(&kf, &j.full);
    if (st == FS_OK && M > FS_GEMM_ONEDNN_TILE && rest) st = lookup(&kt, &j.tail);
    if (st != FS_OK) fs_assert_fail(fs_error_message(), __FILE__, __LINE__);
    stage_b(pool, B, K, N, (uint16_t *)(void *)((char *)base + a_bytes), M, pack_b);
    const int64_t tiles = (M + FS_GEMM_ONEDNN_TILE - 1) / FS_GEMM_ONEDNN_TILE;
    fs_pool_parallel_for(pool, tiles, 1, tile_range, &j);
}

/* ------------------------------------------------------------------ preparing a model's */

fs_status fs_gemm_prepare_linear(int64_t N, int64_t IC, int64_t OC) {
    if (fs_gemm_path_in_use() != FS_GEMM_PATH_ONEDNN || N < 1 || IC < 1 || OC < 1) return FS_OK;
    /* the same operands the products build (data pointers do not enter the keys; a
     * non-NULL staging address stands in for the staged ones) */
    static const uint16_t dummy[1];
    for (int pass = FS_CPU_LINEAR_FWD; pass <= FS_CPU_LINEAR_DW; pass++) {
        fs_cpu_linear_gemm g = fs_cpu_linear_product(pass, (const float *)dummy, 0, dummy,
                                                     (const float *)dummy, 0, N, IC, OC);
        bf16_operand a = staged_layout(g.A, g.M, g.K, dummy, 1, g.M, 0),
                     b = staged_layout(g.B, g.K, g.N, dummy, 0, g.M, g.pack_b);
        for (int acc = 0; acc <= 1; acc++) {
            const int64_t full = g.M < FS_GEMM_ONEDNN_TILE ? g.M : FS_GEMM_ONEDNN_TILE;
            const int64_t rest = g.M % FS_GEMM_ONEDNN_TILE;
            const int64_t heights[2] = {full, g.M > FS_GEMM_ONEDNN_TILE ? rest : 0};
            for (int h = 0; h < 2; h++) {
                if (heights[h] == 0) continue;
                prim_key k = tile_key(&a, &b, heights[h], g.N, g.K, g.ldc, acc);
                const prim_entry *e;
                FS_TRY(lookup(&k, &e));
            }
        }
    }
    return FS_OK;
}

#endif /* FS_HAVE_ONEDNN */
