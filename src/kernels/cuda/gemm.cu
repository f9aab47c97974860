/*
 * gemm.cu — fs_gemm_bf16's product on the GPU, with cuBLASLt (contract in cuda_kernels.h).
 *
 * Row-major to column-major. cuBLASLt is column-major; a row-major matrix with leading
 * dimension ld is, read column-major, its own transpose with the same ld. So the row-major
 *   C (M, N) = op(A) (M, K) @ op(B) (K, N)
 * is the column-major
 *   C^T (N, M) = op(B)^T (N, K) @ op(A)^T (K, M)
 * and cuBLASLt's first operand is our B, its second our A, each with the transpose flag it
 * already has: a row-major B stored (K, N) (trans 0) is column-major (N, K), exactly op(B)^T
 * (cuBLASLt op N); stored (N, K) (trans 1) it is column-major (K, N), whose transpose is
 * wanted (op T). The same for A. C is column-major (N, M) with ld = ldc.
 *
 * Precision: fp32 x fp32 runs CUBLAS_COMPUTE_32F (plain fp32 FMA, no TF32: that would be
 * CUBLAS_COMPUTE_32F_FAST_TF32); bf16 x bf16 reads CUDA_R_16BF and accumulates in fp32 into
 * an fp32 C. Each product of two bf16 is exact in fp32, so only the order of the sums
 * differs from the CPU's fs_gemm_bf16. fs_cuda_gemm_bf16_out is the bf16 x bf16 product
 * with C (and D) of type CUDA_R_16BF: the same fp32 accumulation, rounded to bf16 by
 * cuBLASLt's epilogue as it writes (beta 0 only, so C is never read), and a split-K
 * algorithm only if it sums its partials in fp32 (CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE).
 *
 * Plans. The descriptors, the layouts and the heuristic's algorithm are built once per
 * (shape, leading dimensions, transposes, dtype, accumulate, pointer alignments) and kept in
 * a fixed table inside the handle, in cuBLASLt's semi-opaque structs (initialised in place
 * with the *Init calls, so no descriptor is ever allocated or destroyed); a call whose key
 * is in the table does no set-up at all. A model has a handful of shapes; should more ever
 * turn up than the table holds, the oldest plan is replaced. The pointer alignments are
 * part of the key because the heuristic picks an algorithm for the alignment it is told
 * (default 256 bytes): a plan chosen for aligned pointers must never run on a column offset
 * inside a wider activation that is only 4-byte aligned.
 *
 * Determinism: an algorithm of cuBLASLt gives the same bits for the same inputs on the same
 * GPU (its split-k reductions are ordered, by counters or by a separate pass), and the plan
 * for a key is chosen once, so every call with the same key runs the same algorithm.
 *
 * What it does not do: alpha other than 1, beta other than 0 or 1, batched products, other
 * dtypes, or thread safety (a handle belongs to one device thread, like its stream).
 */
#include <cublasLt.h>
#include <cuda_runtime.h>

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_kernels.h"

/* Plans kept per handle: a model's linear layers use a handful of shapes (forward, the two
 * backward products, per distinct layer width), each perhaps in two alignments. */
#define GEMM_PLANS 64

namespace { /* types private to this file (one definition per name across the program) */
typedef struct gemm_key {
    int64_t M, N, K, lda, ldb, ldc;
    int trans_a, trans_b, bf16, c_bf16, accumulate;
    uint32_t align_a, align_b, align_c, align_d;
} gemm_key;

typedef struct gemm_plan {
    int used;
    gemm_key key;
    cublasLtMatmulDescOpaque_t desc;
    /* in cuBLASLt's terms: its A is our B, its B our A (see the top of the file) */
    cublasLtMatrixLayoutOpaque_t layout_a, layout_b, layout_c;
    cublasLtMatmulAlgo_t algo;
} gemm_plan;
} // namespace

struct fs_cuda_blas {
    cublasLtHandle_t lt;
    void *workspace;
    size_t workspace_bytes;
    cublasLtMatmulPreferenceOpaque_t pref; /* workspace limit set once; alignments per query */
    int next_victim;                       /* the slot a new plan replaces when all are used */
    gemm_plan plans[GEMM_PLANS];
};

/* call: the function's name, or the text of the whole call (named up to its parenthesis). */
static fs_status lt_error(const char *call, cublasStatus_t st, int64_t M, int64_t N, int64_t K) {
    return fs_errorf(FS_ERR_INTERNAL, "cublasLt %.*s: %s (%d) (M=%lld N=%lld K=%lld)",
                     (int)strcspn(call, "("), call, cublasLtGetStatusName(st), (int)st,
                     (long long)M, (long long)N, (long long)K);
}

/* Checks a cuBLASLt call; the shape names the product in the message. */
#define LT_TRY(call, M, N, K)                                                                      \
    do {                                                                                           \
        cublasStatus_t lt_try_st_ = (call);                                                        \
        if (lt_try_st_ != CUBLAS_STATUS_SUCCESS) return lt_error(#call, lt_try_st_, M, N, K);      \
    } while (0)

fs_status fs_cuda_blas_init(fs_cuda_blas **out, void *workspace, size_t workspace_bytes) {
    *out = NULL;
    fs_cuda_blas *h = (fs_cuda_blas *)calloc(1, sizeof *h);
    if (!h) return fs_errorf(FS_ERR_NOMEM, "fs_cuda_blas_init: cannot allocate the handle");
    h->workspace = workspace;
    h->workspace_bytes = workspace ? workspace_bytes : 0;
    cublasStatus_t st = cublasLtCreate(&h->lt);
    if (st != CUBLAS_STATUS_SUCCESS) {
        free(h);
        return lt_error("cublasLtCreate", st, 0, 0, 0);
    }
    const uint64_t ws = h->workspace_bytes;
    st = cublasLtMatmulPreferenceInit(&h->pref);
    if (st == CUBLAS_STATUS_SUCCESS)
        st = cublasLtMatmulPreferenceSetAttribute(
            &h->pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws);
    if (st != CUBLAS_STATUS_SUCCESS) {
        cublasLtDestroy(h->lt);
        free(h);
        return lt_error("cublasLtMatmulPreference", st, 0, 0, 0);
    }
    *out = h;
    return FS_OK;
}

void fs_cuda_blas_free(fs_cuda_blas *h) {
    if (!h) return;
    /* the plans live in the handle's own memory (Init, not Create): nothing to destroy */
    cublasLtDestroy(h->lt);
    free(h);
}

/* The largest power of two dividing the address, up to 256 (cuBLASLt's largest need). */
static uint32_t alignment_of(const void *p) {
    const uintptr_t a = (uintptr_t)p;
    uint32_t align = 256;
    while (align > 1 && (a & (uintptr_t)(align - 1)) != 0) align >>= 1;
    return align;
}

static int same_key(const gemm_key *a, const gemm_key *b) {
    return a->M == b->M && a->N == b->N && a->K == b->K && a->lda == b->lda && a->ldb == b->ldb &&
           a->ldc == b->ldc && a->trans_a == b->trans_a && a->trans_b == b->trans_b &&
           a->bf16 == b->bf16 && a->c_bf16 == b->c_bf16 && a->accumulate == b->accumulate &&
           a->align_a == b->align_a && a->align_b == b->align_b && a->align_c == b->align_c &&
           a->align_d == b->align_d;
}

/* Builds the plan for key k in slot p: descriptors, layouts, and the heuristic's first
 * choice. p->used is set only once everything succeeded. */
static fs_status build_plan(fs_cuda_blas *h, gemm_plan *p, const gemm_key *k) {
    const int64_t M = k->M, N = k->N, K = k->K;
    p->used = 0;
    p->key = *k;
    const cudaDataType_t in_type = k->bf16 ? CUDA_R_16BF : CUDA_R_32F;
    LT_TRY(cublasLtMatmulDescInit(&p->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F), M, N, K);
    /* cuBLASLt's A = our B: trans 0 stores (K, N) row-major = (N, K) column-major, as op wants */
    const int32_t op_a = k->trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
    const int32_t op_b = k->trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
    LT_TRY(
        cublasLtMatmulDescSetAttribute(&p->desc, CUBLASLT_MATMUL_DESC_TRANSA, &op_a, sizeof op_a),
        M, N, K);
    LT_TRY(
        cublasLtMatmulDescSetAttribute(&p->desc, CUBLASLT_MATMUL_DESC_TRANSB, &op_b, sizeof op_b),
        M, N, K);
    /* Layouts describe the stored matrices (before op), column-major:
     *   our B, trans 0: (N rows, K cols); trans 1: (K rows, N cols); ld = ldb
     *   our A, trans 0: (K rows, M cols); trans 1: (M rows, K cols); ld = lda
     *   C: (N rows, M cols), ld = ldc */
    LT_TRY(cublasLtMatrixLayoutInit(&p->layout_a, in_type, (uint64_t)(k->trans_b ? K : N),
                                    (uint64_t)(k->trans_b ? N : K), k->ldb),
           M, N, K);
    LT_TRY(cublasLtMatrixLayoutInit(&p->layout_b, in_type, (uint64_t)(k->trans_a ? M : K),
                                    (uint64_t)(k->trans_a ? K : M), k->lda),
           M, N, K);
    LT_TRY(cublasLtMatrixLayoutInit(&p->layout_c, k->c_bf16 ? CUDA_R_16BF : CUDA_R_32F, (uint64_t)N,
                                    (uint64_t)M, k->ldc),
           M, N, K);

    /* cuBLASLt's A is our B and its B our A, so the alignments swap too; C (the addend) and D
     * (the output) are ours */
    const uint32_t al_a = k->align_b, al_b = k->align_a, al_c = k->align_c, al_d = k->align_d;
    LT_TRY(cublasLtMatmulPreferenceSetAttribute(
               &h->pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &al_a, sizeof al_a),
           M, N, K);
    LT_TRY(cublasLtMatmulPreferenceSetAttribute(
               &h->pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &al_b, sizeof al_b),
           M, N, K);
    LT_TRY(cublasLtMatmulPreferenceSetAttribute(
               &h->pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &al_c, sizeof al_c),
           M, N, K);
    LT_TRY(cublasLtMatmulPreferenceSetAttribute(
               &h->pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &al_d, sizeof al_d),
           M, N, K);
    /* split-K: a bf16 C must not hold the partial sums (the in-place and output-type schemes
     * keep them in the output's type, rounding each to bf16): only the fp32 workspace scheme,
     * so the fp32 sums are rounded once; an fp32 C may take any (the preference is shared:
     * set for every plan) */
    const uint32_t reduction = k->c_bf16 ? (uint32_t)CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE
                                         : (uint32_t)CUBLASLT_REDUCTION_SCHEME_MASK;
    LT_TRY(cublasLtMatmulPreferenceSetAttribute(
               &h->pref, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK, &reduction, sizeof reduction),
           M, N, K);

    cublasLtMatmulHeuristicResult_t result;
    int found = 0;
    LT_TRY(cublasLtMatmulAlgoGetHeuristic(h->lt, &p->desc, &p->layout_a, &p->layout_b, &p->layout_c,
                                          &p->layout_c, &h->pref, 1, &result, &found),
           M, N, K);
    if (found < 1)
        return fs_errorf(FS_ERR_INTERNAL,
                         "cublasLt cublasLtMatmulAlgoGetHeuristic: no algorithm (M=%lld N=%lld "
                         "K=%lld)",
                         (long long)M, (long long)N, (long long)K);
    if (result.state != CUBLAS_STATUS_SUCCESS)
        return lt_error("cublasLtMatmulAlgoGetHeuristic (result)", result.state, M, N, K);
    p->algo = result.algo;
    p->used = 1;
    return FS_OK;
}

/* The plan for key k: found in the table, or built into a free slot (the oldest when full). */
static fs_status find_plan(fs_cuda_blas *h, const gemm_key *k, gemm_plan **out) {
    for (int i = 0; i < GEMM_PLANS; i++)
        if (h->plans[i].used && same_key(&h->plans[i].key, k)) {
            *out = &h->plans[i];
            return FS_OK;
        }
    gemm_plan *p = NULL;
    for (int i = 0; i < GEMM_PLANS && !p; i++)
        if (!h->plans[i].used) p = &h->plans[i];
    if (!p) { /* full: replace in round-robin order, which is the order they were built */
        p = &h->plans[h->next_victim];
        h->next_victim = (h->next_victim + 1) % GEMM_PLANS;
    }
    FS_TRY(build_plan(h, p, k));
    *out = p;
    return FS_OK;
}

static const char *dtype_name(fs_gemm_dtype d) { return d == FS_GEMM_BF16 ? "bf16" : "fp32"; }

/* Both entries below: D (fp32, or bf16 where c_bf16) of the product, C the fp32 addend or
 * NULL (fs_cuda_gemm's contract; always NULL for a bf16 D); `name` is the entry's name in the
 * messages. */
static fs_status gemm(const char *name, fs_cuda_blas *h, void *stream, void *D, int c_bf16,
                      int64_t ldc, const float *C, fs_gemm_operand A, fs_gemm_operand B, int64_t M,
                      int64_t N, int64_t K) {
    if (!h) return fs_errorf(FS_ERR_USAGE, "%s: no cuBLASLt handle", name);
    if (M < 0 || N < 0 || K < 0)
        return fs_errorf(FS_ERR_USAGE, "%s: negative size (M=%lld N=%lld K=%lld)", name,
                         (long long)M, (long long)N, (long long)K);
    if (A.dtype != B.dtype)
        return fs_errorf(FS_ERR_USAGE,
                         "%s: operands of different types (A %s, B %s; M=%lld N=%lld "
                         "K=%lld): both fp32 or both bf16",
                         name, dtype_name(A.dtype), dtype_name(B.dtype), (long long)M,
                         (long long)N, (long long)K);
    if (c_bf16 && A.dtype != FS_GEMM_BF16)
        return fs_errorf(FS_ERR_USAGE, "%s: a bf16 C takes bf16 operands (A and B are fp32)", name);
    if (M == 0 || N == 0) return FS_OK;
    /* each stored row must hold its columns: A stores (M, K) or (K, M), B (K, N) or (N, K) */
    const int64_t a_width = A.trans ? M : K, b_width = B.trans ? K : N;
    if (ldc < N || (K > 0 && (A.ld < a_width || B.ld < b_width)))
        return fs_errorf(FS_ERR_USAGE,
                         "%s: leading dimension too small (lda=%lld ldb=%lld ldc=%lld; "
                         "M=%lld N=%lld K=%lld)",
                         name, (long long)A.ld, (long long)B.ld, (long long)ldc, (long long)M,
                         (long long)N, (long long)K);
    cudaStream_t s = (cudaStream_t)stream;
    const size_t c_size = c_bf16 ? sizeof(uint16_t) : sizeof(float);
    const size_t pitch = (size_t)ldc * c_size, width = (size_t)N * c_size;
    if (K == 0) { /* an empty sum: D = 0 when writing, unchanged when accumulating, C added */
        if ((const void *)C == D) return FS_OK;
        cudaError_t err = C ? cudaMemcpy2DAsync(D, pitch, C, pitch, width, (size_t)M, cudaMemcpyDeviceToDevice, s)
                            : cudaMemset2DAsync(D, pitch, 0, width, (size_t)M, s);
        if (err != cudaSuccess)
            return fs_errorf(FS_ERR_INTERNAL, "cuda kernel %s (K=0 %s): %s", name, C ? "copy of C" : "zero fill",
                             cudaGetErrorString(err));
        return FS_OK;
    }
    gemm_key key;
    key.M = M;
    key.N = N;
    key.K = K;
    key.lda = A.ld;
    key.ldb = B.ld;
    key.ldc = ldc;
    key.trans_a = A.trans != 0;
    key.trans_b = B.trans != 0;
    key.bf16 = A.dtype == FS_GEMM_BF16;
    key.c_bf16 = c_bf16 != 0;
    key.accumulate = C != NULL;
    key.align_a = alignment_of(A.data);
    key.align_b = alignment_of(B.data);
    key.align_d = alignment_of(D);
    key.align_c = C ? alignment_of(C) : key.align_d; /* beta 0: C is not read; D stands in */
    gemm_plan *p;
    FS_TRY(find_plan(h, &key, &p));
    const float alpha = 1.0f, beta = C ? 1.0f : 0.0f;
    /* cuBLASLt's A is our B, its B our A; its C our addend (D itself where there is none: beta
     * 0 never reads it), its D ours, both with C's layout */
    LT_TRY(cublasLtMatmul(h->lt, &p->desc, &alpha, B.data, &p->layout_a, A.data, &p->layout_b,
                          &beta, C ? (const void *)C : D, &p->layout_c, D, &p->layout_c, &p->algo,
                          h->workspace, h->workspace_bytes, s),
           M, N, K);
    return FS_OK;
}

fs_status fs_cuda_gemm(fs_cuda_blas *h, void *stream, float *D, int64_t ldc, const float *C,
                       fs_gemm_operand A, fs_gemm_operand B, int64_t M, int64_t N, int64_t K) {
    return gemm("fs_cuda_gemm", h, stream, D, 0, ldc, C, A, B, M, N, K);
}

fs_status fs_cuda_gemm_bf16_out(fs_cuda_blas *h, void *stream, uint16_t *C, int64_t ldc,
                                fs_gemm_operand A, fs_gemm_operand B, int64_t M, int64_t N,
                                int64_t K) {
    return gemm("fs_cuda_gemm_bf16_out", h, stream, C, 1, ldc, NULL, A, B, M, N, K);
}
