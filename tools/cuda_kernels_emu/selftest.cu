/*
 * tools/cuda_kernels_emu/selftest.cu — the emulator's own checks (run.sh --selftest): CUDA
 * forms that kernels.cu does not use today but a rewrite may, made host C++ by prep.py and
 * run by shim.h, against values computed here. Each check prints "ok   ..." or "FAIL ...";
 * exits 1 on a failure.
 */
#include <cuda_runtime.h>

#include <stdint.h>
#include <stdio.h>
#include <string.h>

#define MAX_BLOCKS 65535 /* prep.py requires the define; unused here */

static int failures;
static void check(bool ok, const char *what) {
    printf("%s %s\n", ok ? "ok  " : "FAIL", what);
    failures += !ok;
}

/* a template kernel with __shared__ (one static per instantiation), extern __shared__, a
 * 2-D block, __launch_bounds__, a shuffle tree and a barrier */
template <typename T, int N>
static __global__ void __launch_bounds__(256, 2) tsum(T *out, const T *in) {
    __shared__ T buf[N];
    extern __shared__ __align__(16) unsigned char dyn[];
    float *d = (float *)dyn;
    const int t = threadIdx.x + threadIdx.y * blockDim.x;
    buf[t] = in[blockIdx.x * N + t];
    d[t] = 1.0f;
    __syncthreads();
    T v = buf[N - 1 - t] * (T)d[(t + 1) % N];
    for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
    if (t % 32 == 0) out[blockIdx.x * (N / 32) + t / 32] = v;
}

/* a read of shared memory another thread writes, with no barrier between */
static __global__ void racy(unsigned *out) {
    __shared__ unsigned s[64];
    s[threadIdx.x] = threadIdx.x;
    out[blockIdx.x * 64 + threadIdx.x] = s[(threadIdx.x + 1) % 64];
}

/* threads that return early leave the barrier (the others must not wait for them) */
static __global__ void early_exit(int *out) {
    __shared__ int s[32];
    if (threadIdx.x >= 16) return;
    s[threadIdx.x] = (int)threadIdx.x;
    __syncthreads();
    out[threadIdx.x] = s[15 - threadIdx.x];
}

/* a partial warp (40 threads: 32 + 8), shuffles down past its live lanes, and a ballot */
static __global__ void partial_warp(unsigned *out) {
    const unsigned b = __ballot_sync(0xffffffffu, threadIdx.x % 3 == 0);
    const unsigned v = __shfl_down_sync(0xffffffffu, threadIdx.x, 4);
    out[threadIdx.x] = v;
    if (threadIdx.x % 32 == 0) out[40 + threadIdx.x / 32] = b;
}

/* partial masks: the low half-warp sums by shuffles among itself while the high half does
 * its own, with a different number of exchanges; then a whole-warp shuffle */
static __global__ void half_warps(int *out) {
    const int l = (int)threadIdx.x;
    int v = l;
    if (l < 16) {
        for (int off = 8; off > 0; off >>= 1) v += __shfl_xor_sync(0x0000ffffu, v, off);
    } else {
        v += __shfl_down_sync(0xffff0000u, v, 1);
        __syncwarp(0xffff0000u);
    }
    out[l] = __shfl_sync(0xffffffffu, v, 31 - l);
}

/* a 3-D grid and block: each thread writes its linear ids */
static __global__ void ids(unsigned *out) {
    const unsigned b = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
    const unsigned t = threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
    out[b * blockDim.x * blockDim.y * blockDim.z + t] = b * 1000 + t;
}

int main() {
    int in[128], out[4];
    for (int i = 0; i < 128; i++) in[i] = i;
    tsum<int, 64>
        <<<dim3(2), dim3(32, 2),
           64 * sizeof(float) /* the dynamic part, <<< in a comment >>> */, nullptr>>>(out,
                                                                                       in);
    check(cudaGetLastError() == cudaSuccess && out[0] == 1520 && out[1] == 496 &&
              out[2] == 3568 && out[3] == 2544,
          "template kernel, __shared__, extern __shared__, 2-D block, shuffles, launch over lines");
    double din[64], dout[2];
    for (int i = 0; i < 64; i++) din[i] = i * 0.5;
    tsum<double, 32><<<2, 32, 32 * sizeof(float)>>>(dout, din);
    check(dout[0] == 248 && dout[1] == 760, "a second instantiation has its own __shared__");

    unsigned r[128];
    racy<<<2, 64>>>(r);
    bool stale0 = false, stale1 = false;
    for (int t = 0; t < 64; t++) {
        stale0 |= r[t] != (unsigned)((t + 1) % 64);
        stale1 |= r[64 + t] != (unsigned)((t + 1) % 64);
    }
    check(stale0 && stale1, "a missing barrier reads stale shared memory in both thread orders");

    int e[16];
    early_exit<<<1, 64>>>(e);
    bool ee = true;
    for (int t = 0; t < 16; t++) ee &= e[t] == 15 - t;
    check(ee, "threads that returned leave the block's barrier");

    unsigned p[42];
    partial_warp<<<1, 40>>>(p);
    bool pw = p[40] == 0x49249249u && p[41] == 0x92u;
    for (unsigned t = 0; t < 40; t++) {
        const unsigned lane = t % 32, lanes = t < 32 ? 32 : 8;
        pw &= p[t] == (lane + 4 < lanes ? t + 4 : t);
    }
    check(pw, "a partial warp: shuffles past its live lanes keep the caller's value, ballot");

    int hw[32];
    half_warps<<<1, 32>>>(hw);
    bool hok = true;
    for (int l = 0; l < 32; l++) {
        const int src = 31 - l; /* its value: 120 in the low half, src + (src + 1) in the high */
        const int want = src < 16 ? 120 : src + (src < 31 ? src + 1 : src);
        hok &= hw[l] == want;
    }
    check(hok, "partial masks: two half-warps exchange apart, then the whole warp");

    unsigned id[2 * 3 * 2 * 4 * 2 * 2];
    ids<<<dim3(2, 3, 2), dim3(4, 2, 2)>>>(id);
    bool ok = true;
    for (unsigned b = 0; b < 12; b++)
        for (unsigned t = 0; t < 16; t++) ok &= id[b * 16 + t] == b * 1000 + t;
    check(ok, "3-D grid and block: every (block, thread) once");

    ids<<<1, dim3(64, 32)>>>(id);
    const cudaError_t bad = cudaGetLastError();
    check(bad == cudaErrorInvalidConfiguration && cudaGetLastError() == cudaSuccess,
          "a 2048-thread block is refused (cudaErrorInvalidConfiguration, then cleared)");

    if (failures) {
        printf("FAILED: %d selftest checks\n", failures);
        return 1;
    }
    printf("ok: the emulator's selftest passed\n");
    return 0;
}
