/*
 * tests/test_device.c — the device layer's GPU code paths, on the emulated device.
 *
 * The emulated device (device.h: FS_DEVICE_EMULATED) is the CPU's kernel table behind every
 * line a GPU runs in the engine and the trainer: state and activations in a device allocator
 * of their own, batches uploaded, the loss and the weights downloaded, the ring used by one
 * rank (always_ring), gathers and reduce-scatters as stream copies and adds ordered by events
 * (the emulation asserts that every event is recorded before anyone waits on it), and
 * checkpoints written from and read into the host mirror. These run on every machine; the
 * same paths with the CUDA kernels run in tests/cli/test_gpu.sh where a GPU is found.
 *
 *   1. every strategy, fp32 and bf16, tied and untied, with gradient accumulation: the
 *      emulated device trains like the CPU (ec_compare_runs' tolerances; the sums differ only
 *      where the ring's reduce-scatter adds a micro-batch's gradient to the shard instead of
 *      the GEMM accumulating into it);
 *   2. its allocator holds exactly the plan's bytes per category (other excepted, which the
 *      plan estimates), and a step allocates nothing;
 *   3. resume on it is bit-exact, and its checkpoints load on the CPU at world size 2 (and
 *      the other way round) and continue like an uninterrupted run;
 *   4. two emulated GPU ranks train like two CPU ranks, through the engine's NCCL path with
 *      the in-process device backend (fs_comm_device_inproc_init) as the data communicator;
 *   5. hybrid sharding (--shard-group) on four emulated GPU ranks as 2 x 2, through splits of
 *      that backend, against one rank, plain sharding, the CPU, and overlap off;
 *   6. the plan of a --device cuda run (made before a GPU is open) keeps gate and up in bf16
 *      under bf16, as the CUDA table's bf16 MLP route needs;
 *   7. the kernel-time profile on the GPU's path: off unless asked, and then every kernel call
 *      the CPU's profile counts;
 *   8. the GPU's bf16 operand scratch holds every cast the model's linear layers make.
 */
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "engine_checks.h"
#include "flatshard/ckpt.h"
#include "flatshard/device.h"
#include "harness.h"

#define MAX_W 4
#define ROWS 4
#define T 8
static char tmpdir[256];

typedef struct run_spec {
    const fs_llama_config *cfg;
    fs_train_config tc;
    const int32_t *in, *tg;
    int steps;
    const char *save_root; /* save after step save_at */
    int save_at;
    const char *resume_path;
    ec_result res;         /* rank 0's */
    ec_result *others;     /* (MAX_W) when set: rank r's in others[r], r > 0 */
    fs_mem_stats dev_after_step1, dev_at_end;
    fs_plan plan_bytes;    /* the plan's numbers only */
    uint64_t gemm_prims_after_init, gemm_prims_at_end; /* fs_gemm_primitives_created */
    fs_mem_stats at_init;  /* rank 0's host allocator after fs_trainer_init */
    fs_profile profile;    /* rank 0's kernel-time profile at the end */
    const fs_kernel_table *kernels; /* set: the model's kernel table after fs_trainer_init */
} run_spec;

static fs_status run_rank(fs_comm *comm, void *arg) {
    run_spec *s = arg;
    fs_mem *mem = fs_comm_mem(comm);
    const int lead = fs_comm_rank(comm) == 0;
    fs_train_config tc = s->tc;
    fs_ckpt ck = {0};
    if (s->resume_path) {
        FS_TRY(fs_ckpt_open(&ck, s->resume_path));
        tc.seed = ck.seed;
    }
    fs_trainer t;
    fs_status st = fs_trainer_init(&t, s->cfg, &tc, NULL, comm, mem);
    if (st != FS_OK) {
        fs_ckpt_close(&ck);
        return st;
    }
    if (s->kernels) t.dev->kernels = s->kernels;
    if (lead) {
        s->gemm_prims_after_init = fs_gemm_primitives_created();
        s->at_init = fs_mem_get_stats(t.dev_mem);
    }
    if (s->resume_path) st = fs_trainer_resume(&t, &ck);
    ec_result mine;
    memset(&mine, 0, sizeof mine);
    int i = 0;
    while (st == FS_OK && t.step < s->steps) {
        fs_step_stats ss;
        st = fs_trainer_step_on_batch(&t, s->in, s->tg, &ss);
        if (st != FS_OK) break;
        mine.losses[i] = ss.loss;
        mine.norms[i++] = ss.grad_norm;
        if (i == 1 && lead) s->dev_after_step1 = fs_mem_get_stats(t.dev_mem);
        if (s->save_root && ss.step == s->save_at) st = fs_trainer_save(&t, s->save_root, 0);
    }
    mine.steps = i;
    if (lead) {
        s->gemm_prims_at_end = fs_gemm_primitives_created();
        s->dev_at_end = fs_mem_get_stats(t.dev_mem);
        memcpy(s->plan_bytes.bytes, t.plan.bytes, sizeof t.plan.bytes);
        s->plan_bytes.allocs_per_step = t.plan.allocs_per_step;
        s->profile = t.profile;
    }
    if (st == FS_OK) st = ec_gather(&t, s->cfg, &mine);
    if (lead) ec_result_move(&s->res, &mine);
    else if (s->others) ec_result_move(&s->others[fs_comm_rank(comm)], &mine);
    else ec_result_free(&mine);
    fs_trainer_free(&t);
    fs_ckpt_close(&ck);
    return st;
}

static fs_status run(int W, run_spec *s) { return ec_run_ranks(W, run_rank, s); }

static fs_train_config config(fs_strategy s, fs_precision p, fs_device_kind device, int64_t batch) {
    fs_train_config tc = ec_config(s, p, batch, T);
    tc.grad_accum = ROWS / batch; /* the same global batch of ROWS rows on one rank */
    tc.device = device;
    return tc;
}

/* Trains *cpu, and a copy of it on the emulated device, on W ranks and holds the copy to
 * ec_compare_runs' tolerances; counts the comparisons made and those that are bit for bit
 * identical. */
static void check_emulated_like_cpu(int W, run_spec *cpu, const char *what, int *runs, int *bit_identical) {
    run_spec emu = *cpu;
    emu.tc.device = FS_DEVICE_EMULATED;
    fs_status a = run(W, cpu), b = run(W, &emu);
    CHECK(a == FS_OK && b == FS_OK, "%s: the runs failed: %s", what, fs_error_message());
    if (a == FS_OK && b == FS_OK) {
        CHECK_OK(ec_compare_runs(&emu.res, &cpu->res, cpu->tc.lr, what));
        (*runs)++;
        *bit_identical += ec_first_difference(&emu.res.weights, &cpu->res.weights) == NULL;
    }
    ec_result_free(&cpu->res);
    ec_result_free(&emu.res);
}

/* ------------------------------------------------------------------ tests */

static void test_emulated_device_trains_like_the_cpu(void) {
    int32_t in[ROWS * T], tg[ROWS * T];
    int bit_identical = 0, runs = 0;
    for (int tied = 0; tied <= 1; tied++) {
        fs_llama_config cfg = ec_model(tied);
        ec_batch(cfg.vocab_size, ROWS, T, in, tg);
        for (int s = 0; s < FS_STRATEGY_N; s++)
            for (int p = 0; p < FS_PRECISION_N; p++) {
                run_spec cpu = {.cfg = &cfg, .tc = config((fs_strategy)s, (fs_precision)p, FS_DEVICE_CPU, 2),
                                .in = in, .tg = tg, .steps = 4};
                char what[160];
                snprintf(what, sizeof what, "%s %s %s", fs_strategy_name((fs_strategy)s),
                         fs_precision_name((fs_precision)p), tied ? "tied" : "untied");
                check_emulated_like_cpu(1, &cpu, what, &runs, &bit_identical);
            }
    }
    fs_test_note("%d of %d configurations bit-identical to the CPU", bit_identical, runs);
}

static void test_emulated_memory_is_the_plan(void) {
    fs_llama_config cfg = ec_model(0);
    int32_t in[ROWS * T], tg[ROWS * T];
    ec_batch(cfg.vocab_size, ROWS, T, in, tg);
    for (int s = 0; s < FS_STRATEGY_N; s++) {
        run_spec emu = {.cfg = &cfg, .tc = config((fs_strategy)s, FS_PRECISION_BF16, FS_DEVICE_EMULATED, 2),
                        .in = in, .tg = tg, .steps = 3};
        CHECK_OK(run(1, &emu));
        const char *name = fs_strategy_name((fs_strategy)s);
        for (int k = 0; k < FS_MEM_N_CATEGORIES; k++) {
            if (k == FS_MEM_OTHER) continue; /* the plan estimates the small tables */
            /* zero3-param allocates per use: its plan is an upper bound of the peak */
            if (s == FS_STRATEGY_ZERO3_PARAM && (k == FS_MEM_WEIGHT_BUF || k == FS_MEM_GRAD_BUF))
                CHECK(emu.dev_at_end.peak[k] <= emu.plan_bytes.bytes[k], "%s: %s peak %zu above the plan's %zu",
                      name, fs_mem_category_name((fs_mem_category)k), emu.dev_at_end.peak[k], emu.plan_bytes.bytes[k]);
            else
                CHECK(emu.dev_at_end.peak[k] == emu.plan_bytes.bytes[k], "%s: %s peak %zu, the plan says %zu",
                      name, fs_mem_category_name((fs_mem_category)k), emu.dev_at_end.peak[k], emu.plan_bytes.bytes[k]);
        }
        CHECK(emu.plan_bytes.bytes[FS_MEM_WEIGHT_BUF] > 0, "%s: one rank on a GPU gathers through buffers", name);
        if (s != FS_STRATEGY_ZERO3_PARAM)
            CHECK(emu.dev_at_end.n_allocs == emu.dev_after_step1.n_allocs,
                  "%s: steps 2-3 allocated %llu blocks on the device", name,
                  (unsigned long long)(emu.dev_at_end.n_allocs - emu.dev_after_step1.n_allocs));
        ec_result_free(&emu.res);
    }
}

/* The GPU's bf16 operand scratch (fs_acts_scratch_bytes with gpu = 1) holds every cast the
 * model's linear layers make: the CPU's kernels run behind a table whose linear entries first
 * count what src/device/cuda.c's bf16_operands would take for the same call (one operand:
 * its elements; two: x rounded up to 128 elements, then y; a forward casts inp, a backward
 * dout then inp, the bf16 route's entries the one fp32 operand they have), over whole steps
 * of bf16 training: with the head's chunk or C the widest cast (q/k/v the widest output, whose
 * dqkv the route no longer casts), with checkpointed blocks, tied and untied. The largest must
 * fit, and fill the rule (a looser rule wastes GPU memory: room for the dqkv would show). On
 * the bf16 route every activation operand is bf16 already: the fp32 entries, which cast
 * their inputs under bf16, are never called with bf16 weights; nor the fp32 attention
 * entries, whose fp32 q/k/v and output the model would have to widen (the route's entries
 * take them in bf16, which the GPU's tensor-core attention reads as they are), nor the fp32
 * RoPE entries, whose output the model would have to round (rope_forward_bf16_out writes
 * the rounded q/k/v, attention_rope_backward_bf16 the rotated, rounded dq/dk/dv). */
static int64_t operand_need;  /* the largest, in elements */
static int fp32_entry_casts;  /* calls of linear_forward or linear_backward with bf16 = 1 */
static int fp32_attention_calls; /* calls of attention_forward or attention_backward */
static int fp32_rope_calls;      /* calls of rope_forward or rope_backward */
static void need_operands(int64_t nx, int64_t ny) {
    const int64_t n = ny ? (nx + 127) / 128 * 128 + ny : nx;
    if (n > operand_need) operand_need = n;
}
static void audit_linear_forward(fs_device *d, float *out, const float *residual, const float *inp,
                                 const void *w, int bf16, int64_t N, int64_t IC, int64_t OC) {
    if (bf16) need_operands(N * IC, 0), fp32_entry_casts++;
    fs_cpu_kernel_table.linear_forward(d, out, residual, inp, w, bf16, N, IC, OC);
}
static void audit_linear_backward(fs_device *d, float *dinp, float *dw, const float *dout, const float *inp,
                                  const void *w, int bf16, int64_t N, int64_t IC, int64_t OC, int acc_dinp,
                                  int acc_dw) {
    if (bf16) need_operands(N * OC, dw ? N * IC : 0), fp32_entry_casts++;
    fs_cpu_kernel_table.linear_backward(d, dinp, dw, dout, inp, w, bf16, N, IC, OC, acc_dinp, acc_dw);
}
static void audit_linear_backward_bf16_inp(fs_device *d, float *dinp, float *dw, const float *dout,
                                           const uint16_t *inp, const void *w, int64_t N, int64_t IC, int64_t OC,
                                           int acc_dinp, int acc_dw) {
    need_operands(N * OC, 0);
    fs_cpu_kernel_table.linear_backward_bf16_inp(d, dinp, dw, dout, inp, w, N, IC, OC, acc_dinp, acc_dw);
}

static void audit_attention_forward(fs_device *d, float *out, float *lse, const float *q, const float *k,
                                    const float *v, int64_t ld, int64_t B, int64_t T_, int64_t NH, int64_t NKV,
                                    int64_t HS, int bf16) {
    fp32_attention_calls++;
    fs_cpu_kernel_table.attention_forward(d, out, lse, q, k, v, ld, B, T_, NH, NKV, HS, bf16);
}
static void audit_attention_backward(fs_device *d, float *dq, float *dk, float *dv, int64_t ldd, const float *dout,
                                     const float *q, const float *k, const float *v, int64_t ld, const float *out,
                                     const float *lse, int64_t B, int64_t T_, int64_t NH, int64_t NKV, int64_t HS,
                                     int bf16) {
    fp32_attention_calls++;
    fs_cpu_kernel_table.attention_backward(d, dq, dk, dv, ldd, dout, q, k, v, ld, out, lse, B, T_, NH, NKV, HS,
                                           bf16);
}

static void audit_rope_forward(fs_device *d, float *x, int64_t ld, const float *cs, const float *sn, int64_t B,
                               int64_t T_, int64_t heads, int64_t HS) {
    fp32_rope_calls++;
    fs_cpu_kernel_table.rope_forward(d, x, ld, cs, sn, B, T_, heads, HS);
}
static void audit_rope_backward(fs_device *d, float *x, int64_t ld, const float *cs, const float *sn, int64_t B,
                                int64_t T_, int64_t heads, int64_t HS) {
    fp32_rope_calls++;
    fs_cpu_kernel_table.rope_backward(d, x, ld, cs, sn, B, T_, heads, HS);
}

static void test_gpu_operand_scratch_holds_every_cast(void) {
    fs_kernel_table audit = fs_cpu_kernel_table;
    audit.rope_forward = audit_rope_forward;
    audit.rope_backward = audit_rope_backward;
    audit.attention_forward = audit_attention_forward;
    audit.attention_backward = audit_attention_backward;
    audit.linear_forward = audit_linear_forward;
    audit.linear_backward = audit_linear_backward;
    audit.linear_backward_bf16_inp = audit_linear_backward_bf16_inp;
    for (int c = 0; c < 4; c++) {
        /* 0, 1: q/k/v the widest output (QKV 64 > C 32 > chunks of 13), C the widest cast;
         * 2: the head's one chunk of 200 rows; 3: checkpointed blocks */
        fs_llama_config cfg = ec_model(c == 1);
        if (c == 2) cfg.vocab_size = 200;
        int32_t in[ROWS * T], tg[ROWS * T];
        ec_batch(cfg.vocab_size, ROWS, T, in, tg);
        run_spec spec = {.cfg = &cfg, .tc = config(FS_STRATEGY_YAFSDP, FS_PRECISION_BF16, FS_DEVICE_CPU, 2),
                         .in = in, .tg = tg, .steps = 2, .kernels = &audit};
        if (c == 2) spec.tc.vocab_chunk_rows = 0;
        if (c == 3) spec.tc.ckpt_layers = 2;
        operand_need = 0;
        fp32_entry_casts = 0;
        fp32_attention_calls = 0;
        fp32_rope_calls = 0;
        CHECK_OK(run(1, &spec));
        CHECK(fp32_rope_calls == 0, "case %d: %d calls of the fp32 RoPE entries under bf16 (the route's "
              "rope_forward_bf16_out and attention_rope_backward_bf16 rotate and round q/k/v and dq/dk/dv)", c,
              fp32_rope_calls);
        CHECK(fp32_attention_calls == 0, "case %d: %d calls of the fp32 attention entries under bf16 (their q/k/v "
              "and output are the bf16 route's kept arrays widened)", c, fp32_attention_calls);
        CHECK(fp32_entry_casts == 0, "case %d: %d calls of the fp32 linear entries under bf16 (each casts an "
              "activation the bf16 route keeps in bf16)", c, fp32_entry_casts);
        fs_layout l;
        CHECK_OK(fs_layout_init(&l, &cfg, spec.tc.vocab_chunk_rows));
        const size_t rule = fs_acts_scratch_bytes(&l, 2, T, 1), need = (size_t)operand_need * sizeof(uint16_t);
        CHECK(need > 0 && need == rule,
              "case %d: the casts need %zu bytes, the GPU's rule reserves %zu", c, need, rule);
        fs_layout_free(&l);
        ec_result_free(&spec.res);
    }
}

/* The kernel-time profile on a GPU's code path (device.h: the spans the model and the trainer
 * mark, collected at each step's end; the emulated device times them on the host, a GPU with
 * CUDA events): off unless asked (profile_gpu), and when asked it counts every kernel call
 * the CPU's profile counts, kind by kind (more zero fills), with finite non-negative times. */
static void test_emulated_kernel_profile(void) {
    fs_llama_config cfg = ec_model(0);
    int32_t in[ROWS * T], tg[ROWS * T];
    ec_batch(cfg.vocab_size, ROWS, T, in, tg);
    for (int p = 0; p < FS_PRECISION_N; p++) {
        run_spec cpu = {.cfg = &cfg, .tc = config(FS_STRATEGY_YAFSDP, (fs_precision)p, FS_DEVICE_CPU, 2),
                        .in = in, .tg = tg, .steps = 3};
        run_spec quiet = cpu, timed = cpu;
        quiet.tc.device = timed.tc.device = FS_DEVICE_EMULATED;
        timed.tc.profile_gpu = 1;
        CHECK_OK(run(1, &cpu));
        CHECK_OK(run(1, &quiet));
        CHECK_OK(run(1, &timed));
        const char *prec = fs_precision_name((fs_precision)p);
        double total = 0;
        for (int k = 0; k < FS_PROF_N_KINDS; k++) {
            const char *kind = fs_prof_kind_name((fs_prof_kind)k);
            CHECK(quiet.profile.calls[k] == 0 && quiet.profile.seconds[k] == 0,
                  "%s %s: profiled without profile_gpu (%lld calls)", prec, kind, (long long)quiet.profile.calls[k]);
            /* other: the GPU path also zeroes the embedding chunks' gradients before every
             * micro-batch (the ring's reduce-scatter accumulates them, not the kernel) */
            const int64_t got = timed.profile.calls[k], want = cpu.profile.calls[k];
            CHECK(k == FS_PROF_OTHER ? got >= want : got == want, "%s %s: %lld calls profiled, the CPU's %lld", prec,
                  kind, (long long)got, (long long)want);
            CHECK(isfinite(timed.profile.seconds[k]) && timed.profile.seconds[k] >= 0, "%s %s: %g s", prec, kind,
                  timed.profile.seconds[k]);
            total += timed.profile.seconds[k];
        }
        CHECK(timed.profile.calls[FS_PROF_OPTIM] == 3 && timed.profile.calls[FS_PROF_GEMM] > 0 && total > 0,
              "%s: one optimizer span per step (%lld), GEMM spans (%lld), time (%g s)", prec,
              (long long)timed.profile.calls[FS_PROF_OPTIM], (long long)timed.profile.calls[FS_PROF_GEMM], total);
        ec_result_free(&cpu.res);
        ec_result_free(&quiet.res);
        ec_result_free(&timed.res);
    }
}

/* On the CPU under bf16 with the oneDNN GEMM path: the trainer reserves the GEMM's staging
 * from its allocator (the plan's "other" bytes count it) and creates every oneDNN primitive
 * before the first step; the steps create none. */
static void test_cpu_bf16_gemms_prepared_before_the_steps(void) {
    if (fs_gemm_path_in_use() != FS_GEMM_PATH_ONEDNN)
        SKIP(FS_SKIP_NOT_APPLICABLE, "the bf16 GEMM runs on the %s path here, which has no primitives",
             fs_gemm_path_name(fs_gemm_path_in_use()));
    fs_llama_config cfg = ec_model(1);
    int32_t in[ROWS * T], tg[ROWS * T];
    ec_batch(cfg.vocab_size, ROWS, T, in, tg);
    run_spec cpu = {.cfg = &cfg, .tc = config(FS_STRATEGY_YAFSDP, FS_PRECISION_BF16, FS_DEVICE_CPU, 2),
                    .in = in, .tg = tg, .steps = 3};
    CHECK_OK(run(1, &cpu));
    CHECK(cpu.gemm_prims_at_end == cpu.gemm_prims_after_init, "3 steps created %llu oneDNN primitives",
          (unsigned long long)(cpu.gemm_prims_at_end - cpu.gemm_prims_after_init));
    fs_layout l;
    CHECK_OK(fs_layout_init(&l, &cfg, 0));
    const size_t stage = fs_device_scratch_bytes(FS_DEVICE_CPU, 1, fs_acts_scratch_bytes(&l, 2, T, 0));
    CHECK(stage > 0, "no staging on the oneDNN path");
    CHECK(cpu.plan_bytes.bytes[FS_MEM_OTHER] >= stage && cpu.at_init.bytes[FS_MEM_OTHER] >= stage,
          "the staging (%zu bytes) is not in the plan's other bytes (%zu) or the allocator's (%zu)", stage,
          cpu.plan_bytes.bytes[FS_MEM_OTHER], cpu.at_init.bytes[FS_MEM_OTHER]);
    fs_layout_free(&l);
    ec_result_free(&cpu.res);
}

static void test_emulated_checkpoints(void) {
    fs_llama_config cfg = ec_model(0);
    int32_t in[ROWS * T], tg[ROWS * T];
    ec_batch(cfg.vocab_size, ROWS, T, in, tg);
    for (int p = 0; p < FS_PRECISION_N; p++) {
        char root[300], back[300];
        snprintf(root, sizeof root, "%s/emu-%d", tmpdir, p);
        snprintf(back, sizeof back, "%s/cpu-%d", tmpdir, p);
        const fs_precision prec = (fs_precision)p;
        /* 6 steps straight, and 3 + 3 resumed, on the emulated device: the same bits */
        run_spec straight = {.cfg = &cfg, .tc = config(FS_STRATEGY_YAFSDP, prec, FS_DEVICE_EMULATED, 2),
                             .in = in, .tg = tg, .steps = 6};
        run_spec first = straight, second = straight;
        first.steps = 3;
        first.save_root = root;
        first.save_at = 3;
        second.resume_path = root;
        CHECK_OK(run(1, &straight));
        CHECK_OK(run(1, &first));
        CHECK_OK(run(1, &second));
        const char *d = ec_first_difference(&second.res.weights, &straight.res.weights);
        CHECK(d == NULL, "%s: resume on the emulated device differs in %s", fs_precision_name(prec), d);
        /* its checkpoint, resumed on the CPU with 2 ranks (1 row each, 2 micro-batches), and
         * that run's checkpoint resumed on the emulated device: like the straight run */
        run_spec cpu2 = {.cfg = &cfg, .tc = config(FS_STRATEGY_YAFSDP, prec, FS_DEVICE_CPU, 1),
                         .in = in, .tg = tg, .steps = 5, .resume_path = root, .save_root = back, .save_at = 5};
        cpu2.tc.grad_accum = 2;
        run_spec emu_again = straight;
        emu_again.resume_path = back;
        CHECK_OK(run(2, &cpu2));
        CHECK_OK(run(1, &emu_again));
        /* the final weights within ec_compare_runs' bounds for 6 steps (its header says why):
         * the 2-rank steps sum the gradients in another order (observed: 1.2e-7 largest and
         * 2.7e-9 rms in fp32). Under bf16 the MLP keeps its operands in bf16 (gu, h, dgu:
         * llama.c's bf16 route), so a difference at the fp32 rounding level — another
         * summation order, or on the oneDNN path a row's product that depends on how many rows
         * the GEMM has (8 here, 16 in the straight run) — becomes a 2^-8 relative one where it
         * crosses a bf16 rounding: observed 2.1e-4 largest and 1.3e-5 rms on the oneDNN path,
         * 2.5e-4 and 2.6e-5 (lr/2300 per step) on the flatshard path (the Xeon with AMX,
         * FLATSHARD_GEMM=flatshard or a build without oneDNN), so
         * lr/1000 per step under bf16 on either path, which a wrong update of even 1% of the
         * elements (lr/10 rms per step) exceeds 100-fold. */
        const double lr = straight.tc.lr, max_d = ec_max_diff(&emu_again.res.weights, &straight.res.weights);
        const double rms_d = ec_rms_diff(&emu_again.res.weights, &straight.res.weights);
        const double max_tol = lr / 50 * 6, rms_tol = lr / (prec == FS_PRECISION_BF16 ? 1000 : 10000) * 6;
        CHECK(max_d <= max_tol && rms_d <= rms_tol,
              "%s emulated -> cpu x2 -> emulated: weights differ by up to %.3g (tolerance %.3g), "
              "%.3g rms (%.3g)", fs_precision_name(prec), max_d, max_tol, rms_d, rms_tol);
        CHECK(emu_again.res.steps == 1, "the last run took step 6 alone (%d steps)", emu_again.res.steps);
        ec_result_free(&straight.res);
        ec_result_free(&first.res);
        ec_result_free(&second.res);
        ec_result_free(&cpu2.res);
        ec_result_free(&emu_again.res);
    }
}

/* Two emulated GPU ranks: the engine's NCCL path (a stream-ordered data communicator beside
 * the control one: fs_comm_device_inproc_init) against two CPU ranks, every strategy, with
 * gradient accumulation (the accumulating reduce-scatter: in place into the rank's chunk,
 * then an add). fp32: at W = 2 a sum of two terms is the same whatever the order, so the
 * tolerances of ec_compare_runs hold with room (bit for bit where the plan is the same). */
static void test_two_emulated_gpu_ranks_train_like_two_cpu_ranks(void) {
    fs_llama_config cfg = ec_model(0);
    int32_t in[ROWS * T], tg[ROWS * T];
    ec_batch(cfg.vocab_size, ROWS, T, in, tg);
    int bit_identical = 0, runs = 0;
    for (int s = 0; s < FS_STRATEGY_N; s++) {
        run_spec cpu = {.cfg = &cfg, .tc = config((fs_strategy)s, FS_PRECISION_FP32, FS_DEVICE_CPU, 1),
                        .in = in, .tg = tg, .steps = 3};
        cpu.tc.grad_accum = 2;
        check_emulated_like_cpu(2, &cpu, fs_strategy_name((fs_strategy)s), &runs, &bit_identical);
    }
    /* bf16: the GPU's gradients travel as fp32 (NCCL would sum a bf16 wire in bf16), so the
     * engine must not hand the emulated NCCL a bf16 -> fp32 reduce-scatter, which it refuses
     * as NCCL's contract says; the run then differs from the CPU's bf16 wire by that wire's
     * rounding only (one bf16 rounding, 2^-8 relative, of each rank's gradient): the losses of
     * three steps agree within 1e-3 relative */
    for (int s = 0; s < FS_STRATEGY_N; s++) {
        if (s != FS_STRATEGY_YAFSDP && s != FS_STRATEGY_ZERO2) continue; /* the bf16 wire's */
        run_spec cpu = {.cfg = &cfg, .tc = config((fs_strategy)s, FS_PRECISION_BF16, FS_DEVICE_CPU, 1),
                        .in = in, .tg = tg, .steps = 3};
        cpu.tc.grad_accum = 2;
        run_spec emu = cpu;
        emu.tc.device = FS_DEVICE_EMULATED;
        fs_status a = run(2, &cpu), b = run(2, &emu);
        CHECK(a == FS_OK && b == FS_OK, "%s bf16: the runs failed: %s", fs_strategy_name((fs_strategy)s),
              fs_error_message());
        for (int i = 0; a == FS_OK && b == FS_OK && i < 3; i++)
            CHECK(fabs(emu.res.losses[i] - cpu.res.losses[i]) <= 1e-3 * fabs(cpu.res.losses[i]),
                  "%s bf16: step %d loss %.9g, the CPU's %.9g", fs_strategy_name((fs_strategy)s), i + 1,
                  emu.res.losses[i], cpu.res.losses[i]);
        ec_result_free(&cpu.res);
        ec_result_free(&emu.res);
    }
    fs_test_note("fp32: %d of %d strategies bit-identical to the CPU", bit_identical, runs);
}

/* Hybrid sharding on GPUs (--shard-group, issue 15) on 4 emulated GPU ranks as 2 groups of 2:
 * the engine splits the in-process device backend into the group's and the replicas'
 * communicators, and all-reduces each unit's gradient shard over the replicas on the reduce
 * stream after the unit's last reduce-scatter. yafsdp, zero1 and zero2 in fp32 with tied
 * embeddings and 2 micro-batches (the accumulating reduce-scatter, and a unit used twice),
 * on the same global batch of 8 rows as:
 *   - one emulated rank, and plain sharding over the 4 emulated ranks: within
 *     ec_compare_runs' reduction-order tolerances (the group's and the replicas' sums regroup
 *     the 4 ranks' terms; nothing else differs);
 *   - CPU hybrid sharding 2 x 2: bit for bit (and within those tolerances, for a clearer
 *     message): every sum in either communicator has two terms, the same in any order, an
 *     accumulating reduce-scatter adds the same sum into the shard on both, and the
 *     emulated device's kernels are the CPU's;
 *   - itself with overlap off: bit for bit (scheduling never changes arithmetic).
 * Every rank ends with the same bits, the device allocator holds exactly the plan's bytes
 * (the split communicators take none of the device's memory: their rendezvous are host
 * memory), and no step after the first allocates. A rank that stops taking part fails
 * every rank of both groups (no hang). bf16 (yafsdp, zero2): the losses of 3
 * steps agree with CPU hybrid sharding's within 1e-3 relative, as for two ranks above (the
 * GPU's gradient wire is fp32, the CPU's bf16). */
static void test_hybrid_sharding_on_four_emulated_gpu_ranks(void) {
    enum { HROWS = 8, W = 4, G = 2, K = 2 };
    const int steps = 3;
    static const fs_strategy strategies[] = {FS_STRATEGY_YAFSDP, FS_STRATEGY_ZERO1, FS_STRATEGY_ZERO2};
    static const fs_mem_category exact[] = {FS_MEM_MASTER, FS_MEM_GRADS, FS_MEM_OPTIM, FS_MEM_COMPUTE_SHARD,
                                            FS_MEM_WEIGHT_BUF, FS_MEM_GRAD_BUF, FS_MEM_COMM};
    fs_llama_config cfg = ec_model(1);
    int32_t in[HROWS * T], tg[HROWS * T];
    ec_batch(cfg.vocab_size, HROWS, T, in, tg);
    run_spec one = {.cfg = &cfg, .tc = ec_config(FS_STRATEGY_YAFSDP, FS_PRECISION_FP32, HROWS / K, T),
                    .in = in, .tg = tg, .steps = steps};
    one.tc.grad_accum = K;
    one.tc.device = FS_DEVICE_EMULATED;
    CHECK_OK(run(1, &one));
    for (size_t k = 0; k < sizeof strategies / sizeof strategies[0]; k++) {
        const char *name = fs_strategy_name(strategies[k]);
        ec_result others[MAX_W];
        memset(others, 0, sizeof others);
        run_spec emu = {.cfg = &cfg, .tc = ec_config(strategies[k], FS_PRECISION_FP32, HROWS / W / K, T),
                        .in = in, .tg = tg, .steps = steps, .others = others};
        emu.tc.grad_accum = K;
        emu.tc.device = FS_DEVICE_EMULATED;
        emu.tc.shard_group = G;
        run_spec plain = emu, cpu = emu, serial = emu;
        plain.tc.shard_group = 0;
        plain.others = NULL;
        cpu.tc.device = FS_DEVICE_CPU;
        cpu.others = NULL;
        serial.tc.overlap = 0;
        serial.others = NULL;
        fs_status a = run(W, &emu);
        CHECK(a == FS_OK, "%s %d x %d: %s", name, W / G, G, fs_error_message());
        if (a != FS_OK) continue;
        char what[96];
        snprintf(what, sizeof what, "%s hybrid 2 x 2 on emulated GPUs against one rank", name);
        CHECK_OK(ec_compare_runs(&emu.res, &one.res, emu.tc.lr, what));
        if (run(W, &plain) == FS_OK) {
            snprintf(what, sizeof what, "%s hybrid 2 x 2 against plain sharding, 4 emulated GPUs", name);
            CHECK_OK(ec_compare_runs(&emu.res, &plain.res, emu.tc.lr, what));
        } else {
            CHECK(0, "%s plain sharding on 4 emulated GPUs: %s", name, fs_error_message());
        }
        if (run(W, &cpu) == FS_OK) {
            snprintf(what, sizeof what, "%s hybrid 2 x 2, emulated GPUs against the CPU", name);
            CHECK_OK(ec_compare_runs(&emu.res, &cpu.res, emu.tc.lr, what));
            const char *d = ec_first_difference(&emu.res.weights, &cpu.res.weights);
            CHECK(d == NULL, "%s hybrid 2 x 2: the emulated GPUs' weights differ from the CPU's in %s", name, d);
        } else {
            CHECK(0, "%s CPU hybrid 2 x 2: %s", name, fs_error_message());
        }
        if (run(W, &serial) == FS_OK) {
            const char *d = ec_first_difference(&serial.res.weights, &emu.res.weights);
            CHECK(d == NULL, "%s hybrid on emulated GPUs: overlap off differs from on in %s", name, d);
            for (int i = 0; i < steps; i++)
                CHECK(serial.res.losses[i] == emu.res.losses[i] && serial.res.norms[i] == emu.res.norms[i],
                      "%s: overlap off, step %d: loss %.9g norm %.9g, overlap on %.9g %.9g", name, i + 1,
                      serial.res.losses[i], serial.res.norms[i], emu.res.losses[i], emu.res.norms[i]);
        } else {
            CHECK(0, "%s hybrid with overlap off: %s", name, fs_error_message());
        }
        for (int r = 1; r < W; r++) {
            const char *d = ec_first_difference(&others[r].weights, &emu.res.weights);
            CHECK(d == NULL, "%s hybrid on emulated GPUs: rank %d's weights differ from rank 0's in %s", name, r, d);
            CHECK(others[r].losses[steps - 1] == emu.res.losses[steps - 1] &&
                      others[r].norms[steps - 1] == emu.res.norms[steps - 1],
                  "%s: rank %d reports another loss or norm", name, r);
        }
        for (size_t c = 0; c < sizeof exact / sizeof exact[0]; c++)
            CHECK(emu.dev_at_end.peak[exact[c]] == emu.plan_bytes.bytes[exact[c]],
                  "%s hybrid: device %s peak %zu bytes, plan %zu", name, fs_mem_category_name(exact[c]),
                  emu.dev_at_end.peak[exact[c]], emu.plan_bytes.bytes[exact[c]]);
        CHECK(emu.dev_at_end.n_allocs == emu.dev_after_step1.n_allocs, "%s hybrid: steps 2-%d allocated on the device",
              name, steps);
        for (int r = 0; r < MAX_W; r++) ec_result_free(&others[r]);
        ec_result_free(&emu.res);
        ec_result_free(&plain.res);
        ec_result_free(&cpu.res);
        ec_result_free(&serial.res);
    }
    ec_result_free(&one.res);
    /* a rank of the second group stops taking part at step 2 (die-at: no collective, no
     * message): its group peer gives up after the 1 s timeout inside the group's split, and
     * the run ends on every rank with an error, none hangs (that a failure crosses the splits
     * without any timeout is test_nccl's test_device_inproc_split) */
    {
        run_spec dead = {.cfg = &cfg, .tc = ec_config(FS_STRATEGY_YAFSDP, FS_PRECISION_FP32, HROWS / W / K, T),
                         .in = in, .tg = tg, .steps = steps};
        dead.tc.grad_accum = K;
        dead.tc.device = FS_DEVICE_EMULATED;
        dead.tc.shard_group = G;
        setenv("FLATSHARD_FAULT", "die-at:2:3", 1);
        setenv("FLATSHARD_COMM_TIMEOUT", "1", 1);
        fs_status st = run(W, &dead);
        unsetenv("FLATSHARD_FAULT");
        unsetenv("FLATSHARD_COMM_TIMEOUT");
        /* named by its global rank, not its rank in the group ("rank 1") */
        CHECK(st != FS_OK && strstr(fs_error_message(), "no progress from rank 3 (rank 1 of split group 1)"),
              "rank 3 dead at step 2 of a 2 x 2 hybrid run: status %s: %s", fs_status_name(st), fs_error_message());
        if (st != FS_OK) fs_test_note("rank 3 dead at step 2: %s", fs_error_message());
        ec_result_free(&dead.res);
    }
    for (size_t k = 0; k < sizeof strategies / sizeof strategies[0]; k++) {
        if (strategies[k] == FS_STRATEGY_ZERO1) continue; /* the bf16 wire's */
        run_spec emu = {.cfg = &cfg, .tc = ec_config(strategies[k], FS_PRECISION_BF16, HROWS / W / K, T),
                        .in = in, .tg = tg, .steps = steps};
        emu.tc.grad_accum = K;
        emu.tc.shard_group = G;
        run_spec cpu = emu;
        emu.tc.device = FS_DEVICE_EMULATED;
        const char *name = fs_strategy_name(strategies[k]);
        fs_status a = run(W, &cpu), b = run(W, &emu);
        CHECK(a == FS_OK && b == FS_OK, "%s bf16 hybrid: the runs failed: %s", name, fs_error_message());
        for (int i = 0; a == FS_OK && b == FS_OK && i < steps; i++)
            CHECK(fabs(emu.res.losses[i] - cpu.res.losses[i]) <= 1e-3 * fabs(cpu.res.losses[i]),
                  "%s bf16 hybrid: step %d loss %.9g, the CPU's %.9g", name, i + 1, emu.res.losses[i],
                  cpu.res.losses[i]);
        ec_result_free(&cpu.res);
        ec_result_free(&emu.res);
    }
}

static void test_device_names(void) {
    fs_device_kind k;
    CHECK(fs_device_parse("cpu", &k) == FS_OK && k == FS_DEVICE_CPU, "cpu");
    CHECK(fs_device_parse("cuda", &k) == FS_OK && k == FS_DEVICE_CUDA, "cuda");
    CHECK(fs_device_parse("emulated", &k) == FS_ERR_USAGE, "the emulated device is not a command-line name");
    CHECK(fs_device_parse("gpu", &k) == FS_ERR_USAGE && strstr(fs_error_message(), "cpu or cuda"),
          "an unknown name lists the choices: %s", fs_error_message());
    const char *why = NULL;
    int n = fs_device_cuda_count(&why);
    CHECK(n > 0 || (why && *why), "no GPU comes with a reason");
    if (n == 0) {
        fs_device *d = NULL;
        fs_status st = fs_device_open(&d, FS_DEVICE_CUDA, 0, NULL);
        CHECK(st == FS_ERR_USAGE && d == NULL && strstr(fs_error_message(), "--device cuda"),
              "opening a missing GPU: %s %s", fs_status_name(st), fs_error_message());
    }
    fs_test_note("%s", n > 0 ? "a GPU is here" : why);
}

/* The model calls every entry of a device's table (none is optional): the CPU's has them all,
 * and fs_kernel_table_complete, which fs_device_open applies to the CUDA library's table,
 * finds one missing entry wherever it is. */
static void test_kernel_table_complete(void) {
    CHECK(fs_kernel_table_complete(&fs_cpu_kernel_table), "the CPU's kernel table has every entry");
    typedef void (*entry)(void);
    const size_t n = sizeof(fs_kernel_table) / sizeof(entry);
    int found = 0;
    for (size_t i = 0; i < n; i++) {
        fs_kernel_table k = fs_cpu_kernel_table;
        memset((char *)&k + i * sizeof(entry), 0, sizeof(entry));
        found += !fs_kernel_table_complete(&k);
    }
    CHECK(found == (int)n, "an empty entry is found at each of the %zu places (%d)", n, found);
}

/* The plan of a GPU run keeps the bf16 route's activations (gate and up, q/k/v, the
 * attention output, the final norm's output) in bf16 under bf16, as the CPU's does: the CUDA table has the route's
 * kernels (since fs_cuda_api_v4), and the plan (made before any GPU is open, so it runs here) must
 * size the activations the model will use, or the model's assertion stops the first step on
 * the GPU. fp32 keeps them in fp32 on both; the difference is exactly those arrays at 2
 * bytes instead of 4 per block. */
static void test_gpu_plan_keeps_gu_in_bf16(void) {
    fs_llama_config mc;
    CHECK_OK(fs_llama_config_preset("tiny", &mc));
    size_t act[2][2] = {{0}}; /* [device: cpu, cuda][precision: fp32, bf16] */
    for (int gpu = 0; gpu <= 1; gpu++)
        for (int bf16 = 0; bf16 <= 1; bf16++) {
            fs_train_config c = fs_train_config_default();
            c.batch = 2;
            c.seq = 64;
            c.precision = bf16 ? FS_PRECISION_BF16 : FS_PRECISION_FP32;
            c.device = gpu ? FS_DEVICE_CUDA : FS_DEVICE_CPU;
            fs_plan plan;
            fs_layout layout;
            fs_status st = fs_trainer_plan(&plan, &layout, &mc, &c, 1, 0);
            CHECK(st == FS_OK, "plan %d %d: %s", gpu, bf16, fs_error_message());
            if (st != FS_OK) continue;
            CHECK(plan.cfg.bf16_route == bf16, "%s %s: bf16_route %d", gpu ? "cuda" : "cpu",
                  bf16 ? "bf16" : "fp32", plan.cfg.bf16_route);
            act[gpu][bf16] = plan.bytes[FS_MEM_ACTIVATIONS];
            fs_plan_free(&plan);
            fs_layout_free(&layout);
        }
    /* N = 2 x 64 tokens; gu (N x 2FF), q/k/v (N x QKV) and the attention output (N x C)
     * per block and the final norm's output (N x C), 2 bytes fewer each (tiny's sizes make
     * every array a whole number of lines) */
    const size_t C = (size_t)mc.hidden_size, HS = C / (size_t)mc.num_attention_heads;
    const size_t QKV = ((size_t)mc.num_attention_heads + 2 * (size_t)mc.num_key_value_heads) * HS;
    const size_t gu_half =
        ((size_t)mc.num_hidden_layers * (2 * 64) * (2 * (size_t)mc.intermediate_size + QKV + C) + (2 * 64) * C) * 2;
    for (int bf16 = 0; bf16 <= 1; bf16++)
        CHECK(act[1][bf16] == act[0][bf16], "%s: the GPU plans %zu bytes of activations, the CPU %zu",
              bf16 ? "bf16" : "fp32", act[1][bf16], act[0][bf16]);
    CHECK(act[1][0] - act[1][1] == gu_half, "cuda: fp32 minus bf16 activations %zu, the route's halves %zu",
          act[1][0] - act[1][1], gu_half);
}

int main(void) {
    snprintf(tmpdir, sizeof tmpdir, "/tmp/flatshard-test-device-XXXXXX");
    if (!mkdtemp(tmpdir)) {
        perror("mkdtemp");
        return 1;
    }
    RUN(test_device_names);
    RUN(test_kernel_table_complete);
    RUN(test_gpu_plan_keeps_gu_in_bf16);
    RUN(test_gpu_operand_scratch_holds_every_cast);
    RUN(test_emulated_device_trains_like_the_cpu);
    RUN(test_emulated_memory_is_the_plan);
    RUN(test_emulated_kernel_profile);
    RUN(test_emulated_checkpoints);
    RUN(test_cpu_bf16_gemms_prepared_before_the_steps);
    RUN(test_two_emulated_gpu_ranks_train_like_two_cpu_ranks);
    RUN(test_hybrid_sharding_on_four_emulated_gpu_ranks);
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpdir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", tmpdir);
    return fs_test_summary();
}
