/*
 * tools/cuda_kernels_emu/shim.h — what src/kernels/cuda/kernels.cu needs from CUDA, on the
 * host, so that its device code runs as ordinary C++ (run.sh builds it; main.cpp checks it).
 *
 * How a launch runs. Blocks run one after another (x fastest, then y, z). A block's threads
 * run as fibers (ucontext) on the calling OS thread, one fiber per GPU thread: a fiber runs
 * until it waits at a barrier or ends, then the next one runs. Fibers, not one std::thread
 * per GPU thread as tools/attention_tc_emu does: a barrier then costs a few hundred
 * nanoseconds per thread instead of an OS context switch, which is what lets 256- and
 * 1024-thread blocks with many barriers (block_reduce: 3 barriers and 10 shuffles per call,
 * sum_squares: 1024 blocks) run in seconds on 2 cores. The order is deterministic and chosen
 * to expose missing barriers: blocks run their threads in ascending and descending order by
 * turns (by linear block id plus the launch count, so a one-block launch goes either way and
 * a launch made again runs each block the other way), so a thread that reads shared memory
 * another thread writes without a barrier between reads it stale (or poisoned) in one of the
 * two, whichever the thread ids of writer and reader are.
 *   - __syncthreads: a barrier of the block's live threads; a thread that returns from the
 *     kernel leaves the block's barrier and its warp's (as a GPU's exited threads do).
 *   - warps: 32 consecutive linear thread ids (x + y bx + z bx by); __shfl_*_sync,
 *     __ballot_sync and __syncwarp write the caller's value to a slot and wait at a barrier
 *     of the mask's lanes, then read the source lane's slot (two slot sets used by turns, so
 *     one barrier per exchange suffices). The whole warp's barrier is left by lanes that
 *     return; a partial mask gets a barrier of its own lanes. A lane outside the mask as a
 *     source gives the caller's own value (on a GPU: undefined).
 *   - __shared__: run.sh turns `__shared__ T name[..];` into a static variable plus a call
 *     that fills it with 0xff bytes (a NaN pattern) the first time a thread of each block
 *     reaches it, so a read of an element no thread of this block wrote shows as NaN (or a
 *     huge index). One static per variable is right here because blocks run one at a time;
 *     a template kernel gets one per instantiation, as C++ statics in templates do.
 *   - a deadlock (every live thread waiting, no barrier complete: a __syncthreads some
 *     threads never reach while others wait at a shuffle) is reported and aborts.
 *   - launch configuration: a block of more than 1024 threads, a block dimension past
 *     1024/1024/64, an empty grid or one past 2^31-1 x 65535 x 65535 is not run and sets the
 *     error cudaGetLastError returns (cudaErrorInvalidConfiguration), like the runtime.
 *   - also provided, for kernels rewritten later: __shfl_sync/_up/_xor, __syncwarp,
 *     __ballot_sync/__any_sync/__all_sync (live lanes), __popc, __ffs, __clz, __ldg, the
 *     IEEE-rounded __f*_rn intrinsics, mixed-type integer min/max, integer atomicAdd/Max
 *     (plain updates: fibers never overlap), cudaMemsetAsync/cudaMemcpyAsync (at once),
 *     cudaFuncSetAttribute (a no-op), extern __shared__ (the launch's bytes, 0xff-filled).
 *     Anything else fails to compile, naming it.
 *   - math: expf, logf, sqrtf, exp, log, ... are the host's (glibc); CUDA's expf, logf and
 *     exp may differ by an ulp or two, so results involving them match the CPU kernels only
 *     within test_cuda.c's tolerances (main.cpp uses those, not bits, there). +, -, *, /,
 *     sqrtf and fmaf are IEEE on both sides (kernels.cu is compiled with -fmad=false; this
 *     with -ffp-contract=off), so the bit-for-bit checks stay bit for bit.
 * Not modelled: the GPU's arithmetic beyond that (fast-math intrinsics are not provided),
 * its speed, its memory model (everything here is sequentially consistent: a missing
 * __threadfence or a race between blocks never shows; blocks never run concurrently), warp
 * divergence and independent thread scheduling beyond the barriers above (a kernel relying
 * on implicit warp-synchronous execution without __syncwarp runs as if it were; a thread
 * spinning on a value another thread writes, without a barrier, never lets it run: run.sh's
 * timeout stops it), occupancy,
 * register and shared memory limits, streams (every launch runs at once, in order).
 */
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <set>
#include <string>
#include <sys/mman.h>
#include <type_traits>
#include <ucontext.h>
#include <vector>
#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/common_interface_defs.h>
#endif

struct dim3 {
    unsigned x, y, z;
    dim3(unsigned a = 1, unsigned b = 1, unsigned c = 1) : x(a), y(b), z(c) {}
};
/* all fibers of a launch share this OS thread: the scheduler sets these before it switches */
inline dim3 threadIdx, blockIdx, blockDim, gridDim;
constexpr int warpSize = 32;

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __noinline__
#define __launch_bounds__(...)
#define __restrict__ __restrict
#define __align__(n) alignas(n)
/* the forms prep.py does not rewrite (several declarators in one line): plain statics */
#define __shared__ static

typedef void *cudaStream_t;
enum cudaError_t { cudaSuccess = 0, cudaErrorInvalidValue = 1, cudaErrorInvalidConfiguration = 9 };
inline cudaError_t emu_last_error = cudaSuccess;
inline cudaError_t cudaGetLastError() {
    const cudaError_t e = emu_last_error;
    emu_last_error = cudaSuccess;
    return e;
}
inline cudaError_t cudaPeekAtLastError() {
    return emu_last_error;
}
inline const char *cudaGetErrorString(cudaError_t e) {
    switch (e) {
    case cudaSuccess:
        return "no error";
    case cudaErrorInvalidValue:
        return "invalid argument";
    case cudaErrorInvalidConfiguration:
        return "invalid configuration argument";
    }
    return "unknown error";
}
inline cudaError_t cudaMemsetAsync(void *p, int v, size_t n, cudaStream_t = nullptr) {
    memset(p, v, n);
    return cudaSuccess;
}
inline cudaError_t cudaMemcpyAsync(void *d, const void *s, size_t n, int = 0,
                                   cudaStream_t = nullptr) {
    memmove(d, s, n);
    return cudaSuccess;
}

/* bits and IEEE operations that CUDA spells as intrinsics (all exact or correctly rounded) */
inline unsigned __float_as_uint(float f) {
    unsigned u;
    memcpy(&u, &f, 4);
    return u;
}
inline float __uint_as_float(unsigned u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}
inline int __float_as_int(float f) {
    return (int)__float_as_uint(f);
}
inline float __int_as_float(int i) {
    return __uint_as_float((unsigned)i);
}
inline long long __double_as_longlong(double d) {
    long long u;
    memcpy(&u, &d, 8);
    return u;
}
inline double __longlong_as_double(long long u) {
    double d;
    memcpy(&d, &u, 8);
    return d;
}
inline float __fadd_rn(float a, float b) {
    return a + b;
}
inline float __fsub_rn(float a, float b) {
    return a - b;
}
inline float __fmul_rn(float a, float b) {
    return a * b;
}
inline float __fdiv_rn(float a, float b) {
    return a / b;
}
inline float __frcp_rn(float a) {
    return 1.0f / a;
}
inline float __fsqrt_rn(float a) {
    return sqrtf(a);
}
inline float __fmaf_rn(float a, float b, float c) {
    return fmaf(a, b, c);
}
template <typename T> inline T __ldg(const T *p) {
    return *p;
}

/* ------------------------------------------------------------------ fibers */
struct emu_bar { /* a barrier of fibers: expected participants, arrivals, generation */
    int expected = 0, arrived = 0;
    unsigned gen = 0;
};
struct emu_fiber {
    ucontext_t ctx;
    void *stack = nullptr;
    dim3 tid;
    int warp = 0, lane = 0;
    bool done = false;
};
constexpr size_t emu_stack_bytes =
    64 * 1024; /* per GPU thread: kernels.cu's frames are small, ASan's too; a deeper one segfaults
                  on the guard page below */
inline std::vector<emu_fiber> emu_fibers;
inline emu_fiber *emu_cur;
inline ucontext_t emu_sched_ctx;
inline emu_bar emu_block_bar;
inline int emu_warp_lanes[32]; /* lanes of each warp at the block's start */
inline bool emu_progress;
inline void (*emu_body)(void *);
inline void *emu_body_ctx;
inline const char *emu_kernel_name = "";
inline unsigned long long emu_launches, emu_blocks_run, emu_threads_run;
inline std::set<std::string> emu_kernels_run; /* names without template arguments */
#if defined(__SANITIZE_ADDRESS__)
inline void *emu_fake_stack;
inline const void *emu_sched_stack_bottom;
inline size_t emu_sched_stack_size;
#endif

/* From a fiber back to the scheduler. */
inline void emu_yield() {
    emu_fiber *f = emu_cur;
#if defined(__SANITIZE_ADDRESS__)
    void *fake = nullptr;
    __sanitizer_start_switch_fiber(f->done ? nullptr : &fake, emu_sched_stack_bottom,
                                   emu_sched_stack_size);
    swapcontext(&f->ctx, &emu_sched_ctx);
    __sanitizer_finish_switch_fiber(fake, nullptr, nullptr);
#else
    swapcontext(&f->ctx, &emu_sched_ctx);
#endif
}

inline void emu_bar_release_if_full(emu_bar &b) {
    if (b.arrived > 0 && b.arrived >= b.expected) {
        b.arrived = 0;
        b.gen++;
        emu_progress = true;
    }
}
inline void emu_bar_wait(emu_bar &b) {
    const unsigned g = b.gen;
    b.arrived++;
    emu_progress = true;
    emu_bar_release_if_full(b);
    while (b.gen == g)
        emu_yield();
}
inline void emu_bar_leave(emu_bar &b) {
    b.expected--;
    emu_bar_release_if_full(b);
}

#define __syncthreads() emu_bar_wait(emu_block_bar)

/* The lanes a warp-level call waits for: those of its mask that the warp had at the block's
 * start. The whole warp (the usual mask) uses the warp's barrier, which lanes leave when
 * they return; a partial mask its own barrier (of mask's lanes; a lane of the mask that
 * returned first is the kernel's bug, as on a GPU, and deadlocks here, reported). Each
 * barrier has its own two slot sets, used by the parity of its generation: a lane's next
 * write to a set needs every lane past the barrier between, so past its read. */
struct emu_warp_sync {
    emu_bar bar;
    uint64_t slots[2][32];
};
inline emu_warp_sync emu_warp_full[32];
inline std::deque<std::pair<unsigned, emu_warp_sync>> emu_warp_partial[32];
inline unsigned emu_lanes_mask(int w) {
    return emu_warp_lanes[w] == 32 ? 0xffffffffu : (1u << emu_warp_lanes[w]) - 1u;
}
inline emu_warp_sync &emu_sync_for(unsigned mask) {
    const int w = emu_cur->warp;
    const unsigned m = mask & emu_lanes_mask(w);
    if (m == emu_lanes_mask(w)) return emu_warp_full[w];
    for (auto &p : emu_warp_partial[w])
        if (p.first == m) return p.second;
    emu_warp_partial[w].emplace_back(m, emu_warp_sync{});
    emu_warp_sync &s = emu_warp_partial[w].back().second;
    s.bar.expected = __builtin_popcount(m);
    memset(s.slots, 0xff, sizeof s.slots);
    return s;
}
/* Every lane of mask publishes its value, then each reads lane src's (its own where src is
 * not a lane of the mask). */
template <typename T> inline T emu_exchange(unsigned mask, T v, int src) {
    static_assert(sizeof(T) <= 8, "shuffle of a type wider than 8 bytes");
    emu_warp_sync &s = emu_sync_for(mask);
    const unsigned set = s.bar.gen & 1u, m = mask & emu_lanes_mask(emu_cur->warp);
    uint64_t bits = 0;
    memcpy(&bits, &v, sizeof v);
    s.slots[set][emu_cur->lane] = bits;
    emu_bar_wait(s.bar);
    if (src < 0 || src >= 32 || !(m >> src & 1u)) return v;
    T r;
    memcpy(&r, &s.slots[set][src], sizeof r);
    return r;
}
inline void __syncwarp(unsigned mask = 0xffffffffu) {
    emu_bar_wait(emu_sync_for(mask).bar);
}
inline void __threadfence_block() {}
inline void __threadfence() {}

template <typename T> inline T __shfl_sync(unsigned mask, T v, int src, int width = 32) {
    const int l = emu_cur->lane;
    return emu_exchange(mask, v, (l / width) * width + (src % width));
}
template <typename T> inline T __shfl_down_sync(unsigned mask, T v, unsigned off, int width = 32) {
    const int l = emu_cur->lane;
    const int s = l + (int)off;
    return emu_exchange(mask, v, (s / width == l / width) ? s : -1);
}
template <typename T> inline T __shfl_up_sync(unsigned mask, T v, unsigned off, int width = 32) {
    const int l = emu_cur->lane;
    const int s = l - (int)off;
    return emu_exchange(mask, v, (s >= 0 && s / width == l / width) ? s : -1);
}
template <typename T> inline T __shfl_xor_sync(unsigned mask, T v, int lanemask, int width = 32) {
    const int l = emu_cur->lane;
    const int s = l ^ lanemask;
    return emu_exchange(mask, v, (s / width == l / width) ? s : -1);
}

/* vote: the predicates of the mask's lanes, gathered through the slots */
inline unsigned __ballot_sync(unsigned mask, int pred) {
    emu_warp_sync &s = emu_sync_for(mask);
    const unsigned set = s.bar.gen & 1u, m = mask & emu_lanes_mask(emu_cur->warp);
    s.slots[set][emu_cur->lane] = pred != 0;
    emu_bar_wait(s.bar);
    unsigned r = 0;
    for (int l = 0; l < 32; l++)
        if ((m >> l & 1u) && s.slots[set][l] == 1) r |= 1u << l;
    return r;
}
inline int __any_sync(unsigned mask, int pred) {
    return __ballot_sync(mask, pred) != 0;
}
inline int __all_sync(unsigned mask, int pred) {
    return __ballot_sync(mask, pred) == (mask & emu_lanes_mask(emu_cur->warp));
}
inline int __popc(unsigned x) {
    return __builtin_popcount(x);
}
inline int __popcll(unsigned long long x) {
    return __builtin_popcountll(x);
}
inline int __ffs(int x) {
    return __builtin_ffs(x);
}
inline int __clz(int x) {
    return x == 0 ? 32 : __builtin_clz((unsigned)x);
}
/* CUDA's integer min/max take mixed types; the host's std::min does not (floats: fminf) */
template <typename A, typename B,
          typename = std::enable_if_t<std::is_integral_v<A> && std::is_integral_v<B>>>
inline std::common_type_t<A, B> min(A a, B b) {
    return b < a ? (std::common_type_t<A, B>)b : (std::common_type_t<A, B>)a;
}
template <typename A, typename B,
          typename = std::enable_if_t<std::is_integral_v<A> && std::is_integral_v<B>>>
inline std::common_type_t<A, B> max(A a, B b) {
    return a < b ? (std::common_type_t<A, B>)b : (std::common_type_t<A, B>)a;
}
/* integer atomics: fibers never run at the same time, so a plain update is atomic (the
 * kernels use no floating-point atomics: their sums have fixed orders) */
template <typename T> inline T atomicAdd(T *p, T v) {
    static_assert(std::is_integral_v<T>, "floating-point atomics: not deterministic, not modelled");
    const T old = *p;
    *p = old + v;
    return old;
}
template <typename T> inline T atomicMax(T *p, T v) {
    const T old = *p;
    if (old < v) *p = v;
    return old;
}
enum cudaFuncAttribute { cudaFuncAttributeMaxDynamicSharedMemorySize = 8 };
template <typename F> inline cudaError_t cudaFuncSetAttribute(F, cudaFuncAttribute, int) {
    return cudaSuccess;
}

/* __shared__ variables: poisoned once per block, by the first thread that declares them */
inline std::vector<void *> emu_shared_seen;
inline void emu_shared_poison(void *p, size_t bytes) {
    for (void *q : emu_shared_seen)
        if (q == p) return;
    emu_shared_seen.push_back(p);
    memset(p, 0xff, bytes);
}
/* extern __shared__ (dynamic shared memory): the launch's third argument, in bytes */
inline std::vector<unsigned char> emu_dyn_smem;
inline void *emu_dynamic_shared() {
    return emu_dyn_smem.data();
}

inline void emu_fiber_entry() {
#if defined(__SANITIZE_ADDRESS__)
    __sanitizer_finish_switch_fiber(nullptr, &emu_sched_stack_bottom, &emu_sched_stack_size);
#endif
    emu_body(emu_body_ctx);
    emu_fiber *f = emu_cur;
    f->done = true;
    emu_progress = true;
    emu_bar_leave(emu_block_bar);
    emu_bar_leave(emu_warp_full[f->warp].bar);
    emu_yield(); /* never returns: a finished fiber is not resumed */
    abort();
}

inline void emu_run_block(unsigned nthreads, bool descending) {
    if (emu_fibers.size() < nthreads) emu_fibers.resize(nthreads);
    emu_block_bar = emu_bar{(int)nthreads, 0, 0};
    for (unsigned w = 0; w < 32; w++) {
        const int lanes = (int)std::min<unsigned>(32, nthreads > w * 32 ? nthreads - w * 32 : 0);
        emu_warp_full[w].bar = emu_bar{lanes, 0, 0};
        memset(emu_warp_full[w].slots, 0xff, sizeof emu_warp_full[w].slots);
        emu_warp_partial[w].clear();
        emu_warp_lanes[w] = lanes;
    }
    memset(emu_dyn_smem.data(), 0xff, emu_dyn_smem.size());
    emu_shared_seen.clear();
    for (unsigned t = 0; t < nthreads; t++) {
        emu_fiber &f = emu_fibers[t];
        if (!f.stack) {
            /* one more page below the stack, inaccessible: an overflow faults at once
             * instead of writing into the next fiber's stack */
            char *m = (char *)mmap(nullptr, emu_stack_bytes + 4096, PROT_READ | PROT_WRITE,
                                   MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
            if (m == MAP_FAILED || mprotect(m, 4096, PROT_NONE) != 0) {
                fprintf(stderr, "cuda_kernels_emu: cannot map a fiber stack\n");
                exit(2);
            }
            f.stack = m + 4096;
        }
        f.tid = dim3(t % blockDim.x, t / blockDim.x % blockDim.y, t / (blockDim.x * blockDim.y));
        f.warp = (int)(t / 32);
        f.lane = (int)(t % 32);
        f.done = false;
        getcontext(&f.ctx);
        f.ctx.uc_stack.ss_sp = f.stack;
        f.ctx.uc_stack.ss_size = emu_stack_bytes;
        f.ctx.uc_link = nullptr;
        makecontext(&f.ctx, emu_fiber_entry, 0);
    }
    unsigned live = nthreads;
    while (live > 0) {
        emu_progress = false;
        for (unsigned k = 0; k < nthreads; k++) {
            emu_fiber &f = emu_fibers[descending ? nthreads - 1 - k : k];
            if (f.done) continue;
            emu_cur = &f;
            threadIdx = f.tid;
#if defined(__SANITIZE_ADDRESS__)
            void *fake = nullptr;
            __sanitizer_start_switch_fiber(&fake, f.stack, emu_stack_bytes);
            swapcontext(&emu_sched_ctx, &f.ctx);
            __sanitizer_finish_switch_fiber(fake, nullptr, nullptr);
#else
            swapcontext(&emu_sched_ctx, &f.ctx);
#endif
            if (f.done) live--;
        }
        if (!emu_progress && live > 0) {
            fprintf(stderr,
                    "cuda_kernels_emu: kernel %s, block (%u,%u,%u): deadlock, %u threads wait "
                    "at barriers no other thread will reach (a __syncthreads or shuffle not "
                    "reached by every thread of the block or warp)\n",
                    emu_kernel_name, blockIdx.x, blockIdx.y, blockIdx.z, live);
            exit(3);
        }
    }
    emu_cur = nullptr;
}

/* A launch name<<<grid, block, smem, stream>>>(args), as run.sh rewrites it. */
template <class F>
void emu_launch(const char *name, dim3 grid, dim3 block, size_t smem, cudaStream_t, F &&body) {
    const unsigned long long threads = (unsigned long long)block.x * block.y * block.z;
    if (threads == 0 || threads > 1024 || block.x > 1024 || block.y > 1024 || block.z > 64 ||
        grid.x == 0 || grid.y == 0 || grid.z == 0 || grid.x > 2147483647u || grid.y > 65535 ||
        grid.z > 65535 || smem > 227 * 1024) {
        emu_last_error = cudaErrorInvalidConfiguration;
        return;
    }
    emu_launches++;
    emu_kernel_name = name;
    emu_kernels_run.insert(std::string(name).substr(0, std::string(name).find('<')));
    gridDim = grid;
    blockDim = block;
    emu_dyn_smem.assign(smem ? smem : 1, 0xff); /* refilled for every block */
    emu_body = [](void *ctx) { (*static_cast<F *>(ctx))(); };
    emu_body_ctx = &body;
    /* EMU_FAULT=drop_last_block: the harness's own check (tests/cli/test_kernels_emu.sh):
     * the last block of a launch of several is not run, which the checks must notice */
    static const bool drop_last =
        getenv("EMU_FAULT") && !strcmp(getenv("EMU_FAULT"), "drop_last_block");
    const unsigned long long n_blocks = (unsigned long long)grid.x * grid.y * grid.z;
    unsigned long long linear = 0;
    for (unsigned bz = 0; bz < grid.z; bz++)
        for (unsigned by = 0; by < grid.y; by++)
            for (unsigned bx = 0; bx < grid.x; bx++, linear++) {
                blockIdx = dim3(bx, by, bz);
                if (drop_last && n_blocks > 1 && linear == n_blocks - 1) continue;
                /* the order flips block to block and launch to launch, so a single-block
                 * launch runs each way too, and a launch made twice runs each block both ways
                 * (main.cpp's "run twice" checks then see a result that depends on it) */
                emu_run_block((unsigned)threads, (linear + emu_launches) & 1);
                emu_blocks_run++;
                emu_threads_run += threads;
            }
}
