/*
 * trainer.c — one rank's training step over the sharding engine.
 *
 * Plan, allocate, run: fs_trainer_init computes the shard plan and refuses it if it does not
 * fit --max-mem before allocating anything large; fs_trainer_step only computes (zero3-param
 * excepted, whose engine allocates per use by design).
 *
 * Gradients: each micro-batch's loss is a mean over its tokens; the engine sums the W ranks'
 * and K micro-batches' gradients and scales the sum by 1/(W*K) once, with the clipping.
 */
#include <errno.h>
#include <math.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "flatshard/kernels.h"
#include "flatshard/train.h"

fs_train_config fs_train_config_default(void) {
    return (fs_train_config){
        .batch = 16,
        .seq = 128,
        .grad_accum = 1,
        .steps = 200,
        .warmup_steps = 20,
        .lr = 1e-3,
        .min_lr = 1e-4,
        .adamw = {.beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8, .weight_decay = 0.1},
        .clip = 1.0,
        .seed = 1,
        .threads = 0,
        .vocab_chunk_rows = 0,
        .max_mem_bytes = 0,
        .strategy = FS_STRATEGY_YAFSDP,
        .precision = FS_PRECISION_FP32,
        .overlap = 1,
        .ckpt_layers = 0,
        .on_nan = FS_ON_NAN_STOP,
        .device = FS_DEVICE_CPU,
    };
}

int fs_train_default_threads(int ranks_here) {
    int n = fs_cpu_count() / (ranks_here > 0 ? ranks_here : 1);
    return n < 1 ? 1 : n;
}

static fs_status check_config(const fs_train_config *c) {
    if (c->batch < 1) return fs_errorf(FS_ERR_USAGE, "--batch must be >= 1 (got %lld)", (long long)c->batch);
    if (c->seq < 1) return fs_errorf(FS_ERR_USAGE, "--seq must be >= 1 (got %lld)", (long long)c->seq);
    if (c->grad_accum < 1)
        return fs_errorf(FS_ERR_USAGE, "--grad-accum must be >= 1 (got %lld)", (long long)c->grad_accum);
    if (c->steps < 0) return fs_errorf(FS_ERR_USAGE, "--steps must be >= 0 (got %lld)", (long long)c->steps);
    if (c->warmup_steps < 0)
        return fs_errorf(FS_ERR_USAGE, "--warmup must be >= 0 (got %lld)", (long long)c->warmup_steps);
    if (!(c->lr > 0 && c->lr < 10)) return fs_errorf(FS_ERR_USAGE, "--lr must be in (0, 10) (got %g)", c->lr);
    if (!(c->min_lr >= 0 && c->min_lr <= c->lr))
        return fs_errorf(FS_ERR_USAGE, "--min-lr must be in [0, lr] (got %g with lr %g)", c->min_lr, c->lr);
    if (!(c->adamw.beta1 >= 0 && c->adamw.beta1 < 1) || !(c->adamw.beta2 >= 0 && c->adamw.beta2 < 1))
        return fs_errorf(FS_ERR_USAGE, "AdamW betas must be in [0, 1) (got %g, %g)", c->adamw.beta1,
                         c->adamw.beta2);
    if (!(c->adamw.eps > 0)) return fs_errorf(FS_ERR_USAGE, "--adam-eps must be > 0 (got %g)", c->adamw.eps);
    if (!(c->adamw.weight_decay >= 0))
        return fs_errorf(FS_ERR_USAGE, "--weight-decay must be >= 0 (got %g)", c->adamw.weight_decay);
    if (c->threads < 0 || c->threads > 1024)
        return fs_errorf(FS_ERR_USAGE, "--threads must be between 0 (automatic) and 1024 (got %d)", c->threads);
    if (c->vocab_chunk_rows < 0)
        return fs_errorf(FS_ERR_USAGE, "--vocab-chunk must be >= 0 (got %lld)", (long long)c->vocab_chunk_rows);
    return FS_OK;
}

/* The vocabulary chunk: as asked, or (0) the most rows that keep an embedding or head chunk
 * no larger than a decoder block, so that the ring is sized by the block (DESIGN.md §3). */
static int64_t vocab_chunk(const fs_llama_config *c, int64_t asked) {
    if (asked > 0) return asked;
    const int64_t C = c->hidden_size, HS = C / c->num_attention_heads;
    const int64_t block = C * (c->num_attention_heads + 2 * c->num_key_value_heads) * HS + C * C +
                          3 * C * c->intermediate_size;
    return c->vocab_size * C > block ? block / C : 0;
}

fs_status fs_trainer_plan(fs_plan *plan, fs_layout *layout, const fs_llama_config *model_cfg,
                          const fs_train_config *cfg, int world, int rank) {
    memset(plan, 0, sizeof *plan);
    memset(layout, 0, sizeof *layout); /* freeable after any refusal below */
    FS_TRY(check_config(cfg));
    FS_TRY(fs_llama_config_validate(model_cfg));
    if (cfg->seq > model_cfg->max_position_embeddings)
        return fs_errorf(FS_ERR_USAGE,
                         "--seq %lld exceeds the model's max_position_embeddings (%lld)",
                         (long long)cfg->seq, (long long)model_cfg->max_position_embeddings);
    if (world < 1 || rank < 0 || rank >= world)
        return fs_errorf(FS_ERR_USAGE, "rank %d is outside a world of %d", rank, world);
    const int group = cfg->shard_group > 0 ? cfg->shard_group : world;
    if (cfg->shard_group < 0 || group > world || world % group != 0)
        return fs_errorf(FS_ERR_USAGE,
                         "--shard-group %d must divide the %d rank%s (1 <= G <= W; W/G groups of "
                         "G ranks)",
                         cfg->shard_group, world, world == 1 ? "" : "s");
    const int replicas = world / group;
    FS_TRY(fs_layout_init(layout, model_cfg, vocab_chunk(model_cfg, cfg->vocab_chunk_rows)));
    fs_comm_config cc = fs_comm_config_default();
    /* hybrid sharding: the engine splits the world into a group and a replica communicator,
     * each with staging of its own */
    const size_t split_bytes = replicas > 1 ? fs_comm_rank_bytes(group, cc) + fs_comm_rank_bytes(replicas, cc) : 0;
    fs_plan_config pc = {
        .world = group,
        .rank = rank % group,
        .replicas = replicas,
        .strategy = cfg->strategy,
        .precision = cfg->precision,
        .batch = cfg->batch,
        .seq = cfg->seq,
        .ckpt_layers = cfg->ckpt_layers,
        /* the communicator's staging and the worker's queue are host memory: on a GPU they
         * are not the device allocator's */
        .comm_bytes = cfg->device != FS_DEVICE_CPU ? 0
                      : fs_comm_rank_bytes(world, cc) + split_bytes +
                            fs_comm_worker_bytes(fs_engine_worker_capacity(layout)),
        /* a GPU gathers through the ring even alone (engine.h); a GPU, and the CPU's oneDNN
         * GEMM under bf16, have a GEMM scratch */
        .always_ring = cfg->device != FS_DEVICE_CPU,
        /* a GPU's gradients go to NCCL, which sums in the data type: fp32 (docs/comm.md);
         * --fp32-grad-wire asks for the same on the CPU */
        .fp32_grad_wire = cfg->fp32_grad_wire || cfg->device != FS_DEVICE_CPU,
        .device_bytes = fs_device_scratch_bytes(cfg->device, cfg->precision == FS_PRECISION_BF16,
                                                fs_acts_scratch_bytes(layout, cfg->batch, cfg->seq,
                                                                      cfg->device == FS_DEVICE_CUDA)),
        .bf16_route = cfg->precision == FS_PRECISION_BF16,
    };
    fs_status st = fs_plan_init(plan, layout, pc);
    if (st == FS_OK && cfg->max_mem_bytes > 0 && plan->total_bytes > cfg->max_mem_bytes)
        st = fs_errorf(FS_ERR_USAGE,
                       "the plan needs %.1f MiB per rank (%s, %s, %d rank%s), more than --max-mem "
                       "%zu bytes (%.1f MiB)", /* the bytes too: --max-mem 1K is not "0.0 MiB" */
                       (double)plan->total_bytes / 1048576.0, fs_strategy_name(cfg->strategy),
                       fs_precision_name(cfg->precision), world, world == 1 ? "" : "s",
                       cfg->max_mem_bytes, (double)cfg->max_mem_bytes / 1048576.0);
    if (st != FS_OK) {
        fs_plan_free(plan);
        fs_layout_free(layout);
    }
    return st;
}

fs_status fs_trainer_init(fs_trainer *t, const fs_llama_config *model_cfg,
                          const fs_train_config *cfg, const fs_token_stream *data, fs_comm *comm,
                          fs_mem *mem) {
    memset(t, 0, sizeof *t);
    const int world = fs_comm_world(comm), rank = fs_comm_rank(comm);
    if (data) {
        FS_TRY(fs_token_stream_check_vocab(data, (int32_t)model_cfg->vocab_size));
        FS_TRY(fs_token_stream_check_length(data, cfg->seq));
    }
    FS_TRY(fs_trainer_plan(&t->plan, &t->layout, model_cfg, cfg, world, rank));
    t->cfg = *cfg;
    if (t->cfg.threads == 0) t->cfg.threads = fs_train_default_threads(world);
    t->data = data;
    t->comm = comm;
    t->mem = mem;
    const int on_gpu = cfg->device != FS_DEVICE_CPU;
    fs_status st = fs_pool_init(&t->pool, t->cfg.threads);
    if (st == FS_OK) st = fs_device_open(&t->dev, cfg->device, on_gpu ? cfg->device_ordinal : 0, t->pool);
    /* GPU ranks under MPI talk through NCCL (one rank too, when this build has it: the same
     * path as many); the MPI communicator stays the control one */
    if (st == FS_OK && on_gpu && fs_comm_backend_kind(comm) == FS_COMM_BACKEND_MPI &&
        (world > 1 || fs_comm_nccl_built()))
        st = fs_comm_nccl_init(comm, t->dev, &t->nccl);
    /* several GPU ranks in process share one GPU (or are emulated, in the tests): the
     * in-process device backend, with NCCL's contract */
    else if (st == FS_OK && on_gpu && fs_comm_backend_kind(comm) == FS_COMM_BACKEND_INPROC && world > 1)
        st = fs_comm_device_inproc_init(comm, t->dev, &t->nccl);
    /* a GPU's state and activations are counted by its own allocator, the host's by mem */
    t->dev_mem = mem;
    if (st == FS_OK && on_gpu) {
        t->dev_mem = NULL;
        st = fs_mem_init_device(&t->dev_mem, cfg->max_mem_bytes, t->dev);
        if (st == FS_OK)
            st = fs_mem_alloc(mem, FS_MEM_OTHER, 2 * (size_t)(cfg->batch * cfg->seq) * sizeof(int32_t),
                              "batch staging", (void **)&t->host_batch);
    }
    if (st == FS_OK)
        st = fs_acts_init(&t->acts, &t->layout, cfg->batch, cfg->seq, cfg->ckpt_layers,
                          cfg->precision == FS_PRECISION_BF16, t->dev, t->dev_mem);
    if (st == FS_OK)
        st = fs_acts_prepare_gemms(&t->layout, cfg->batch, cfg->seq, cfg->precision == FS_PRECISION_BF16,
                                   t->dev, t->dev_mem);
    if (st == FS_OK) {
        fs_kernels_init();
        fs_engine_config ec = {.overlap = cfg->overlap, .adamw = cfg->adamw, .clip = cfg->clip,
                               .worker_capacity = 0, .seed = cfg->seed, .on_nan = cfg->on_nan,
                               .device = t->dev, .host_mem = mem, .data_comm = t->nccl};
        st = fs_engine_init(&t->engine, &t->plan, comm, t->dev_mem, t->pool, ec);
    }
    if (st != FS_OK) {
        fs_trainer_free(t);
        return st;
    }
    /* the kernel-time profile: always on the CPU (host clocks, free); on a GPU (CUDA events
     * around each call) only when asked */
    t->model = (fs_model){.layout = &t->layout, .dev = t->dev,
                          .profile = !on_gpu || cfg->profile_gpu ? &t->profile : NULL,
                          .bf16_weights = t->cfg.precision == FS_PRECISION_BF16};
    return FS_OK;
}

void fs_trainer_free(fs_trainer *t) {
    if (!t) return;
    fs_engine_free(t->engine);
    if (t->mem) {
        fs_trace_free(&t->trace_compute, t->mem);
        fs_trace_free(&t->trace_comm, t->mem);
    }
    if (t->dev_mem) fs_acts_free(&t->acts, t->dev_mem);
    fs_comm_free(t->nccl); /* before the device: its calls ran on the device's streams */
    fs_device_release_scratch(t->dev); /* before its allocator goes */
    if (t->dev_mem && t->dev_mem != t->mem) fs_mem_free(t->dev_mem);
    if (t->mem) fs_mem_release(t->mem, t->host_batch);
    fs_device_close(t->dev);
    fs_pool_free(t->pool);
    fs_plan_free(&t->plan);
    fs_layout_free(&t->layout);
    memset(t, 0, sizeof *t);
}

double fs_forward_loss(const fs_model *m, fs_acts *acts, const fs_weights *w) {
    const fs_layout *l = m->layout;
    const float *norm_w = fs_weights_unit(w, l->norm_unit);
    double loss = 0;
    *acts->loss_sum = 0; /* host memory: w is an fs_weights, so this runs on the CPU */
    for (int op = 0; op < l->n_ops; op++)
        fs_model_forward(m, acts, op, fs_weights_unit(w, l->ops[op].unit), norm_w);
    if (fs_acts_take_loss(m->dev, acts, &loss) != FS_OK) return NAN;
    return loss;
}

/* Compute-track events of a timeline: the wait for a unit (when it is long enough to see)
 * and the op itself. */
#define TRACE_MIN_WAIT_S 20e-6
static void trace_op(fs_trainer *t, fs_trace_kind kind, int op, double t0, double t1, double t2) {
    int unit = t->layout.ops[op].unit;
    if (t1 - t0 >= TRACE_MIN_WAIT_S) fs_trace_add(&t->trace_compute, FS_TRACE_WAIT, unit, op, 0, t0, t1);
    fs_trace_add(&t->trace_compute, kind, unit, op, 0, t1, t2);
}

/* Forward and backward of one micro-batch through the engine; its loss is added to the
 * activations' loss_sum. */
static fs_status run_micro_batch(fs_trainer *t) {
    fs_engine *e = t->engine;
    const fs_layout *l = &t->layout;
    const float *norm_w = NULL;
    FS_TRY(fs_engine_norm_weights(e, &norm_w));
    float *norm_dw = fs_engine_norm_grads(e);
    for (int op = 0; op < l->n_ops; op++) {
        const void *w = NULL;
        double t0 = fs_now();
        FS_TRY(fs_engine_acquire_forward(e, op, &w));
        double t1 = fs_now();
        fs_model_forward(&t->model, &t->acts, op, w, norm_w);
        trace_op(t, FS_TRACE_FORWARD, op, t0, t1, fs_now());
        FS_TRY(fs_engine_release_forward(e, op));
    }
    for (int op = l->n_ops - 1; op >= 0; op--) {
        const void *w = NULL;
        float *dw = NULL;
        int accumulate = 0;
        double t0 = fs_now();
        FS_TRY(fs_engine_acquire_backward(e, op, &w, &dw, &accumulate));
        double t1 = fs_now();
        fs_model_backward(&t->model, &t->acts, op, w, dw, accumulate, norm_w, norm_dw);
        trace_op(t, FS_TRACE_BACKWARD, op, t0, t1, fs_now());
        FS_TRY(fs_engine_release_backward(e, op));
    }
    return FS_OK;
}

/* The forward of one micro-batch through the engine, nothing else (fs_trainer_eval). */
static fs_status run_forward_only(fs_trainer *t) {
    fs_engine *e = t->engine;
    const float *norm_w = NULL;
    FS_TRY(fs_engine_norm_weights(e, &norm_w));
    for (int op = 0; op < t->layout.n_ops; op++) {
        const void *w = NULL;
        FS_TRY(fs_engine_acquire_forward(e, op, &w));
        fs_model_forward(&t->model, &t->acts, op, w, norm_w);
        FS_TRY(fs_engine_release_forward(e, op));
    }
    return FS_OK;
}

int64_t fs_trainer_eval_batches(const fs_trainer *t, const fs_token_stream *data, int64_t n_batches) {
    const int64_t per_batch = (int64_t)fs_comm_world(t->comm) * t->cfg.batch;
    const int64_t fit = fs_stream_n_windows(data, t->cfg.seq) / per_batch;
    return fit < n_batches ? fit : n_batches;
}

static fs_status eval_batches(fs_trainer *t, const fs_token_stream *data, int64_t n_batches, double *loss) {
    const fs_train_config *c = &t->cfg;
    const int world = fs_comm_world(t->comm), rank = fs_comm_rank(t->comm);
    FS_ASSERT(n_batches >= 1 && n_batches <= fs_trainer_eval_batches(t, data, n_batches));
    fs_acts *a = &t->acts;
    const int64_t micro = c->batch * c->seq;
    int32_t *in_host = t->host_batch ? t->host_batch : a->inputs;
    int32_t *tg_host = t->host_batch ? t->host_batch + micro : a->targets;
    double mine = 0; /* the sum of this rank's micro-batch means; loss_sum is zero between
                      * steps (fs_acts_take_loss zeroes it) */
    FS_TRY(fs_engine_begin_eval(t->engine));
    for (int64_t k = 0; k < n_batches; k++) {
        FS_TRY(fs_token_stream_check_unchanged(data)); /* never a SIGBUS in the sampler */
        /* the windows of batch k, in the rows a training micro-batch would give each rank */
        fs_stream_fill_sequential(data, (k * world + rank) * c->batch, c->batch, c->seq, in_host, tg_host);
        if (t->host_batch) FS_TRY(fs_acts_upload_batch(t->dev, a, in_host, tg_host));
        FS_TRY(run_forward_only(t));
        double batch_loss = 0;
        FS_TRY(fs_acts_take_loss(t->dev, a, &batch_loss));
        mine += batch_loss;
    }
    double sum = 0;
    FS_TRY(fs_engine_sum_ranks(t->engine, mine, &sum));
    *loss = sum / ((double)world * (double)n_batches);
    return FS_OK;
}

fs_status fs_trainer_eval(fs_trainer *t, const fs_token_stream *data, int64_t n_batches, double *loss) {
    /* the kernel-time profile (--profile) is the training step's: evaluation stays out of it */
    fs_profile *profile = t->model.profile;
    t->model.profile = NULL;
    fs_status st = eval_batches(t, data, n_batches, loss);
    t->model.profile = profile;
    return st;
}

/* die-at and hang-at (fs_trainer_step's comment): this rank stops taking part. */
static fs_status stop_taking_part(fs_trainer *t, int die) {
    if (die && fs_comm_backend_kind(t->comm) == FS_COMM_BACKEND_MPI) raise(SIGKILL);
    /* no collective, no message: in process the peers' timeout fails the group, which ends
     * this loop; under MPI (hang-at) nothing does, and the job must be ended from outside */
    while (!fs_comm_is_failed(t->comm)) {
        struct timespec ts = {0, 10 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    return fs_errorf(FS_ERR_INTERNAL, "rank %d stopped taking part at step %lld (injected fault)",
                     fs_comm_rank(t->comm), (long long)t->step + 1);
}

fs_status fs_trainer_step_on_batch(fs_trainer *t, const int32_t *inputs, const int32_t *targets,
                                   fs_step_stats *out) {
    double t0 = fs_now();
    const fs_train_config *c = &t->cfg;
    fs_acts *a = &t->acts;
    const int world = fs_comm_world(t->comm), rank = fs_comm_rank(t->comm);
    const int64_t micro = c->batch * c->seq;
    /* a timeline records whole steps; the worker is idle between steps */
    const int traced = t->step + 1 >= t->trace_from && t->step + 1 <= t->trace_to;
    t->trace_compute.recording = t->trace_comm.recording = traced;
    t->trace_compute.step = t->trace_comm.step = (int32_t)(t->step + 1);
    const int64_t step = t->step + 1;
    if (fs_fault_at("die-at", step, rank)) return stop_taking_part(t, 1);
    if (fs_fault_at("hang-at", step, rank)) return stop_taking_part(t, 0);
    if (!inputs) {
        /* tests: the (first) data file truncated under the running job at step S */
        const char *first = t->data->shards[0].path;
        if (fs_fault_at("truncate-data-at", step, rank) && truncate(first, 0) != 0)
            return fs_errorf(FS_ERR_IO, "%s: truncate-data-at: %s", first, strerror(errno));
        FS_TRY(fs_token_stream_check_unchanged(t->data)); /* never a SIGBUS in the sampler */
    }
    FS_TRY(fs_engine_begin_step(t->engine, (int)c->grad_accum));
    if (fs_fault_at("desync-at", step, rank)) FS_TRY(fs_engine_inject_desync(t->engine));
    double loss_sum = 0;
    /* the batch is sampled on the host: on a GPU into staging, then uploaded */
    int32_t *in_host = t->host_batch ? t->host_batch : a->inputs;
    int32_t *tg_host = t->host_batch ? t->host_batch + micro : a->targets;
    for (int64_t k = 0; k < c->grad_accum; k++) {
        const int64_t row0 = (k * world + rank) * c->batch; /* this rank's rows of micro k */
        if (inputs) {
            memcpy(in_host, inputs + row0 * c->seq, (size_t)micro * sizeof *inputs);
            memcpy(tg_host, targets + row0 * c->seq, (size_t)micro * sizeof *targets);
        } else {
            fs_stream_sampler_fill(t->data, c->seed, t->step, row0, c->batch, c->seq, in_host, tg_host);
        }
        if (t->host_batch) FS_TRY(fs_acts_upload_batch(t->dev, a, in_host, tg_host));
        fs_engine_begin_micro(t->engine, (int)k);
        FS_TRY(run_micro_batch(t));
        /* a signal in the middle of step S, after compute and before the exchange (tests
         * count the steps a stop takes; signal-twice-at also signals again in the save) */
        if (k == 0 && (fs_fault_at("signal-at", step, rank) || fs_fault_at("signal-twice-at", step, rank)))
            raise(SIGINT);
    }
    /* the micro-batches' losses, read once (on a GPU the host's first wait of the step) */
    FS_TRY(fs_acts_take_loss(t->dev, a, &loss_sum));
    if (fs_fault_at("nan-at", step, rank)) {
        const float nan = NAN;
        FS_TRY(fs_device_upload(t->dev, fs_engine_norm_grads(t->engine), &nan, sizeof nan));
    }
    fs_lr_schedule sched = {.lr = c->lr, .min_lr = c->min_lr, .warmup_steps = c->warmup_steps,
                            .total_steps = c->steps};
    double lr = fs_lr_at(&sched, t->step);
    double t_opt = fs_now();
    fs_engine_step_stats es;
    const int stop_sig = t->stop_flag ? atomic_load(t->stop_flag) : 0;
    if (stop_sig) /* this step's exchange carries it to every rank */
        fs_engine_request_stop(t->engine, stop_sig);
    /* the profile's optimizer span: the end of the step (the last reduce-scatters' waits,
     * the gradient norm, AdamW) */
    fs_profile *profile = t->model.profile;
    if (profile) fs_device_prof_begin(t->dev);
    fs_status st = fs_engine_end_step(t->engine, loss_sum, lr, t->step + 1, &es);
    if (profile) fs_device_prof_end(t->dev, FS_PROF_OPTIM);
    if (st == FS_OK && profile) st = fs_device_prof_collect(t->dev, profile->seconds, profile->calls, FS_PROF_N_KINDS);
    FS_TRY(st);
    t->step++;
    double t1 = fs_now();
    fs_trace_add(&t->trace_compute, FS_TRACE_OPTIMIZER, -1, -1, 0, t_opt, t1);
    fs_trace_add(&t->trace_compute, FS_TRACE_STEP, -1, -1, 0, t0, t1);
    t->trace_compute.recording = t->trace_comm.recording = 0;
    out->step = t->step;
    out->loss = es.loss;
    out->lr = lr;
    out->grad_norm = es.grad_norm;
    out->seconds = t1 - t0;
    out->comm_wait_s = es.comm_wait_s;
    out->tokens = c->grad_accum * world * c->batch * c->seq;
    out->skipped = es.skipped;
    out->stop = es.stop;
    return FS_OK;
}

fs_status fs_trainer_step(fs_trainer *t, fs_step_stats *out) {
    FS_ASSERT(t->data != NULL);
    return fs_trainer_step_on_batch(t, NULL, NULL, out);
}

fs_status fs_trainer_gather_weights(fs_trainer *t, fs_weights *w) {
    return fs_engine_gather_full(t->engine, 0, w);
}

fs_status fs_trainer_init_from(fs_trainer *t, fs_source *src) {
    fs_engine *e = t->engine;
    fs_status st = fs_source_check(src, &t->layout);
    if (st == FS_OK) st = fs_engine_state_to_host(e); /* a GPU loads through its host mirror */
    int n = st == FS_OK ? fs_engine_state_slices(e, 0, NULL, 0) : 0;
    fs_state_slice *sl = st == FS_OK ? calloc((size_t)n + 1, sizeof *sl) : NULL;
    if (st == FS_OK && !sl) st = fs_errorf(FS_ERR_NOMEM, "out of memory");
    if (st == FS_OK) fs_engine_state_slices(e, 0, sl, n);
    for (int i = 0; st == FS_OK && i < n; i++) {
        const fs_tensor_info *ti = &t->layout.tensors[sl[i].tensor];
        int64_t origin = ti->ndim == 1 ? 0 : ti->row0 * ti->shape[1];
        st = fs_source_read(src, ti->name, origin + sl[i].begin, origin + sl[i].end, sl[i].master);
    }
    free(sl);
    FS_TRY(fs_engine_agree(e, st));
    return fs_engine_state_loaded(e);
}

fs_status fs_trainer_resume(fs_trainer *t, const fs_ckpt *ck) {
    FS_TRY(fs_ckpt_load(ck, t->engine));
    t->step = ck->step;
    return FS_OK;
}

fs_status fs_trainer_save(fs_trainer *t, const char *root, int keep) {
    return fs_ckpt_save(t->engine, root, t->step, t->cfg.seed, keep, t->data, &t->lineage);
}

fs_status fs_trainer_trace(fs_trainer *t, int64_t from_step, int64_t to_step) {
    if (from_step < 1 || to_step < from_step)
        return fs_errorf(FS_ERR_USAGE, "trace steps %lld to %lld: need 1 <= from <= to", (long long)from_step,
                         (long long)to_step);
    const fs_layout *l = &t->layout;
    const int64_t steps = to_step - from_step + 1, micro = t->cfg.grad_accum;
    /* per step: a wait and an event per op and pass, the optimizer and the step; on the
     * communication side a few collectives per op and per tensor (zero3-param), the norm
     * group's and the exchange. Generous: a full buffer drops events, it never grows. */
    const int64_t compute_cap = steps * (micro * 4 * l->n_ops + 8) + 16;
    const int64_t comm_cap = steps * (micro * 4 * (l->n_ops + l->n_tensors) + 4 * l->n_units + 16) + 16;
    FS_TRY(fs_trace_init(&t->trace_compute, compute_cap, t->mem));
    FS_TRY(fs_trace_init(&t->trace_comm, comm_cap, t->mem));
    /* a common time zero: every rank leaves this agreement at about the same moment */
    FS_TRY(fs_engine_agree(t->engine, FS_OK));
    t->trace_compute.origin = t->trace_comm.origin = fs_now();
    t->trace_from = from_step;
    t->trace_to = to_step;
    return fs_engine_trace(t->engine, &t->trace_comm);
}

/* What each rank sends rank 0: its counts, then its events (compute track first). */
typedef struct trace_header {
    int64_t n_compute, n_comm, dropped;
} trace_header;

fs_status fs_trainer_trace_write(fs_trainer *t, const char *path, int64_t *dropped) {
    const int world = fs_comm_world(t->comm), rank = fs_comm_rank(t->comm);
    const int64_t cap = t->trace_compute.cap + t->trace_comm.cap;
    const size_t record = sizeof(trace_header) + (size_t)cap * sizeof(fs_trace_event);
    FS_TRY(fs_engine_trace(t->engine, NULL));
    char *mine = calloc(1, record), *all = calloc((size_t)world, record);
    int32_t *ranks = NULL, *tracks = NULL;
    fs_trace_event *events = NULL;
    fs_status st = mine && all ? FS_OK : fs_errorf(FS_ERR_NOMEM, "--trace: out of memory");
    if (st == FS_OK) {
        trace_header h = {.n_compute = t->trace_compute.n, .n_comm = t->trace_comm.n,
                          .dropped = t->trace_compute.dropped + t->trace_comm.dropped};
        memcpy(mine, &h, sizeof h);
        fs_trace_event *ev = (fs_trace_event *)(mine + sizeof h);
        memcpy(ev, t->trace_compute.events, (size_t)h.n_compute * sizeof *ev);
        memcpy(ev + h.n_compute, t->trace_comm.events, (size_t)h.n_comm * sizeof *ev);
        st = fs_engine_all_gather_bytes(t->engine, mine, record, all);
    }
    int64_t total = 0, lost = 0;
    for (int r = 0; st == FS_OK && r < world; r++) {
        const trace_header *h = (const trace_header *)(all + (size_t)r * record);
        total += h->n_compute + h->n_comm;
        lost += h->dropped;
    }
    if (st == FS_OK && rank == 0) {
        events = malloc((size_t)(total + 1) * sizeof *events);
        ranks = malloc((size_t)(total + 1) * sizeof *ranks);
        tracks = malloc((size_t)(total + 1) * sizeof *tracks);
        if (!events || !ranks || !tracks) st = fs_errorf(FS_ERR_NOMEM, "--trace: out of memory");
        int64_t k = 0;
        for (int r = 0; st == FS_OK && r < world; r++) {
            const trace_header *h = (const trace_header *)(all + (size_t)r * record);
            const fs_trace_event *ev = (const fs_trace_event *)(all + (size_t)r * record + sizeof *h);
            for (int64_t i = 0; i < h->n_compute + h->n_comm; i++, k++) {
                events[k] = ev[i];
                ranks[k] = r;
                tracks[k] = i >= h->n_compute;
            }
        }
        if (st == FS_OK) st = fs_trace_write_json(path, events, ranks, tracks, total, world, &t->layout);
    }
    *dropped = lost;
    free(mine);
    free(all);
    free(events);
    free(ranks);
    free(tracks);
    return fs_engine_agree(t->engine, st);
}
