/*
 * tools/attention_tc_emu/shim.h — what attention_tc.cu's device code needs, on the host: a
 * block is 128 std::threads with a std::barrier for __syncthreads; a warp shares exchange
 * slots and a 32-thread barrier for __shfl_xor_sync and mma.sync; mma.sync.m16n8k16 (bf16 in,
 * fp32 accumulate) rebuilds A (16 x 16) and B (16 x 8) from the 32 lanes' registers by the PTX
 * ISA's fragment layouts and sums in fp32; bf16 rounds to nearest even. Blocks run one after
 * another; shared memory starts as 0xff bytes (NaN) so a read of an unwritten element shows.
 */
#include <algorithm>
#include <barrier>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <thread>
#include <vector>
using std::min;
struct dim3 {
    unsigned x, y, z;
    dim3(unsigned a = 1, unsigned b = 1, unsigned c = 1) : x(a), y(b), z(c) {}
};
inline thread_local dim3 threadIdx, blockIdx;
inline dim3 gridDim;
inline thread_local unsigned char *emu_smem_ptr;
inline std::barrier<> *emu_block_bar;
inline std::barrier<> *emu_warp_bar[4];
inline float emu_xf[4][32];
inline uint32_t emu_xa[4][32][4], emu_xb[4][32][2];
#define __global__
#define __device__
#define __forceinline__ inline
#define __launch_bounds__(x)
#define __restrict__ __restrict
#define __syncthreads() emu_block_bar->arrive_and_wait()
struct __nv_bfloat16 {
    uint16_t x;
};
struct __nv_bfloat162 {
    __nv_bfloat16 x, y;
};
struct alignas(16) uint4 {
    unsigned x, y, z, w;
};
struct alignas(16) float4 {
    float x, y, z, w;
};
static inline uint4 make_uint4(unsigned x, unsigned y, unsigned z, unsigned w) { return {x, y, z, w}; }
static inline uint16_t emu_f2b(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u)
        return (uint16_t)((u >> 16) | 0x40);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}
static inline float emu_b2f(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}
static inline __nv_bfloat16 __float2bfloat16_rn(float f) { return {emu_f2b(f)}; }
static inline float __bfloat162float(__nv_bfloat16 h) { return emu_b2f(h.x); }
static inline __nv_bfloat162 __floats2bfloat162_rn(float a, float b) {
    return {{emu_f2b(a)}, {emu_f2b(b)}};
}
static inline float __shfl_xor_sync(unsigned, float x, int off) {
    const int w = threadIdx.x / 32, l = threadIdx.x % 32;
    emu_xf[w][l] = x;
    emu_warp_bar[w]->arrive_and_wait();
    const float r = emu_xf[w][l ^ off];
    emu_warp_bar[w]->arrive_and_wait();
    return r;
}
// mma.sync.m16n8k16 bf16 -> f32 with the PTX fragment layouts
static inline void emu_mma(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                           uint32_t b0, uint32_t b1) {
    const int w = threadIdx.x / 32, l = threadIdx.x % 32;
    emu_xa[w][l][0] = a0;
    emu_xa[w][l][1] = a1;
    emu_xa[w][l][2] = a2;
    emu_xa[w][l][3] = a3;
    emu_xb[w][l][0] = b0;
    emu_xb[w][l][1] = b1;
    emu_warp_bar[w]->arrive_and_wait();
    float A[16][16], B[16][8];
    for (int L = 0; L < 32; L++) {
        const int g = L / 4, t = L % 4;
        auto lo = [](uint32_t r) { return emu_b2f((uint16_t)(r & 0xffff)); };
        auto hi = [](uint32_t r) { return emu_b2f((uint16_t)(r >> 16)); };
        A[g][2 * t] = lo(emu_xa[w][L][0]);
        A[g][2 * t + 1] = hi(emu_xa[w][L][0]);
        A[g + 8][2 * t] = lo(emu_xa[w][L][1]);
        A[g + 8][2 * t + 1] = hi(emu_xa[w][L][1]);
        A[g][2 * t + 8] = lo(emu_xa[w][L][2]);
        A[g][2 * t + 9] = hi(emu_xa[w][L][2]);
        A[g + 8][2 * t + 8] = lo(emu_xa[w][L][3]);
        A[g + 8][2 * t + 9] = hi(emu_xa[w][L][3]);
        B[2 * t][g] = lo(emu_xb[w][L][0]);
        B[2 * t + 1][g] = hi(emu_xb[w][L][0]);
        B[2 * t + 8][g] = lo(emu_xb[w][L][1]);
        B[2 * t + 9][g] = hi(emu_xb[w][L][1]);
    }
    emu_warp_bar[w]->arrive_and_wait();
    const int g = l / 4, t = l % 4;
    for (int i = 0; i < 4; i++) {
        const int r = g + 8 * (i / 2), n = 2 * t + (i & 1);
        float s = d[i];
        for (int k = 0; k < 16; k++)
            s += A[r][k] * B[k][n];
        d[i] = s;
    }
}
template <class F> void emu_launch(dim3 grid, F kernel) {
    gridDim = grid;
    std::vector<unsigned char> smem(256 * 1024);
    for (unsigned by = 0; by < grid.y; by++)
        for (unsigned bx = 0; bx < grid.x; bx++) {
            std::barrier<> bb(128), w0(32), w1(32), w2(32), w3(32);
            emu_block_bar = &bb;
            emu_warp_bar[0] = &w0;
            emu_warp_bar[1] = &w1;
            emu_warp_bar[2] = &w2;
            emu_warp_bar[3] = &w3;
            // fill shared memory with NaN bytes: a read of something never written shows
            memset(smem.data(), 0xff, smem.size());
            std::vector<std::thread> th;
            for (unsigned t = 0; t < 128; t++)
                th.emplace_back([&, t] {
                    threadIdx = dim3(t);
                    blockIdx = dim3(bx, by);
                    emu_smem_ptr = smem.data();
                    kernel();
                });
            for (auto &x : th)
                x.join();
        }
}
