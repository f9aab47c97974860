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
#include <stdlib.h>
#include <string.h>

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
    FS_TRY(check_config(cfg));
    FS_TRY(fs_llama_config_validate(model_cfg));
    if (cfg->seq > model_cfg->max_position_embeddings)
        return fs_errorf(FS_ERR_USAGE,
                         "--seq %lld exceeds the model's max_position_embeddings (%lld)",
                         (long long)cfg->seq, (long long)model_cfg->max_position_embeddings);
    FS_TRY(fs_layout_init(layout, model_cfg, vocab_chunk(model_cfg, cfg->vocab_chunk_rows)));
    fs_comm_config cc = fs_comm_config_default();
    fs_plan_config pc = {
        .world = world,
        .rank = rank,
        .strategy = cfg->strategy,
        .precision = cfg->precision,
        .batch = cfg->batch,
        .seq = cfg->seq,
        .ckpt_layers = cfg->ckpt_layers,
        .comm_bytes = fs_comm_rank_bytes(world, cc) +
                      fs_comm_worker_bytes(fs_engine_worker_capacity(layout)),
    };
    fs_status st = fs_plan_init(plan, layout, pc);
    if (st == FS_OK && cfg->max_mem_bytes > 0 && plan->total_bytes > cfg->max_mem_bytes)
        st = fs_errorf(FS_ERR_USAGE,
                       "the plan needs %.1f MiB per rank (%s, %s, %d ranks), more than --max-mem "
                       "%.1f MiB",
                       (double)plan->total_bytes / 1048576.0, fs_strategy_name(cfg->strategy),
                       fs_precision_name(cfg->precision), world,
                       (double)cfg->max_mem_bytes / 1048576.0);
    if (st != FS_OK) {
        fs_plan_free(plan);
        fs_layout_free(layout);
    }
    return st;
}

fs_status fs_trainer_init(fs_trainer *t, const fs_llama_config *model_cfg,
                          const fs_train_config *cfg, const fs_token_data *data, fs_comm *comm,
                          fs_mem *mem) {
    memset(t, 0, sizeof *t);
    const int world = fs_comm_world(comm), rank = fs_comm_rank(comm);
    if (data) {
        FS_TRY(fs_token_data_check_vocab(data, (int32_t)model_cfg->vocab_size));
        FS_TRY(fs_token_data_check_length(data, cfg->seq));
    }
    FS_TRY(fs_trainer_plan(&t->plan, &t->layout, model_cfg, cfg, world, rank));
    t->cfg = *cfg;
    if (t->cfg.threads == 0) t->cfg.threads = fs_train_default_threads(world);
    t->data = data;
    t->comm = comm;
    t->mem = mem;
    fs_status st = fs_pool_init(&t->pool, t->cfg.threads);
    if (st == FS_OK) st = fs_acts_init(&t->acts, &t->layout, cfg->batch, cfg->seq, cfg->ckpt_layers, mem);
    if (st == FS_OK) {
        fs_kernels_init();
        fs_engine_config ec = {.overlap = cfg->overlap, .adamw = cfg->adamw, .clip = cfg->clip,
                               .worker_capacity = 0, .seed = cfg->seed};
        st = fs_engine_init(&t->engine, &t->plan, comm, mem, t->pool, ec);
    }
    if (st != FS_OK) {
        fs_trainer_free(t);
        return st;
    }
    t->model = (fs_model){.layout = &t->layout, .pool = t->pool, .profile = &t->profile};
    return FS_OK;
}

void fs_trainer_free(fs_trainer *t) {
    if (!t) return;
    fs_engine_free(t->engine);
    if (t->mem) fs_acts_free(&t->acts, t->mem);
    fs_pool_free(t->pool);
    fs_plan_free(&t->plan);
    fs_layout_free(&t->layout);
    memset(t, 0, sizeof *t);
}

double fs_forward_loss(const fs_model *m, fs_acts *acts, const fs_weights *w) {
    const fs_layout *l = m->layout;
    const float *norm_w = fs_weights_unit(w, l->norm_unit);
    for (int op = 0; op < l->n_ops; op++)
        fs_model_forward(m, acts, op, fs_weights_unit(w, l->ops[op].unit), norm_w);
    return acts->loss;
}

/* Forward and backward of one micro-batch through the engine; adds its loss to *loss_sum. */
static fs_status run_micro_batch(fs_trainer *t, double *loss_sum) {
    fs_engine *e = t->engine;
    const fs_layout *l = &t->layout;
    const float *norm_w = NULL;
    FS_TRY(fs_engine_norm_weights(e, &norm_w));
    float *norm_dw = fs_engine_norm_grads(e);
    for (int op = 0; op < l->n_ops; op++) {
        const float *w = NULL;
        FS_TRY(fs_engine_acquire_forward(e, op, &w));
        fs_model_forward(&t->model, &t->acts, op, w, norm_w);
        FS_TRY(fs_engine_release_forward(e, op));
    }
    *loss_sum += t->acts.loss;
    for (int op = l->n_ops - 1; op >= 0; op--) {
        const float *w = NULL;
        float *dw = NULL;
        int accumulate = 0;
        FS_TRY(fs_engine_acquire_backward(e, op, &w, &dw, &accumulate));
        fs_model_backward(&t->model, &t->acts, op, w, dw, accumulate, norm_w, norm_dw);
        FS_TRY(fs_engine_release_backward(e, op));
    }
    return FS_OK;
}

fs_status fs_trainer_step_on_batch(fs_trainer *t, const int32_t *inputs, const int32_t *targets,
                                   fs_step_stats *out) {
    double t0 = fs_now();
    const fs_train_config *c = &t->cfg;
    fs_acts *a = &t->acts;
    const int world = fs_comm_world(t->comm), rank = fs_comm_rank(t->comm);
    const int64_t micro = c->batch * c->seq;
    FS_TRY(fs_engine_begin_step(t->engine, (int)c->grad_accum));
    double loss_sum = 0;
    for (int64_t k = 0; k < c->grad_accum; k++) {
        const int64_t row0 = (k * world + rank) * c->batch; /* this rank's rows of micro k */
        if (inputs) {
            memcpy(a->inputs, inputs + row0 * c->seq, (size_t)micro * sizeof *inputs);
            memcpy(a->targets, targets + row0 * c->seq, (size_t)micro * sizeof *targets);
        } else {
            fs_sampler_fill(t->data, c->seed, t->step, row0, c->batch, c->seq, a->inputs,
                            a->targets);
        }
        fs_engine_begin_micro(t->engine, (int)k);
        FS_TRY(run_micro_batch(t, &loss_sum));
    }
    fs_lr_schedule sched = {.lr = c->lr, .min_lr = c->min_lr, .warmup_steps = c->warmup_steps,
                            .total_steps = c->steps};
    double lr = fs_lr_at(&sched, t->step);
    double t_opt = fs_now();
    fs_engine_step_stats es;
    FS_TRY(fs_engine_end_step(t->engine, loss_sum, lr, t->step + 1, &es));
    t->step++;
    double t1 = fs_now();
    t->profile.seconds[FS_PROF_OPTIM] += t1 - t_opt;
    t->profile.calls[FS_PROF_OPTIM]++;
    out->step = t->step;
    out->loss = es.loss;
    out->lr = lr;
    out->grad_norm = es.grad_norm;
    out->seconds = t1 - t0;
    out->comm_wait_s = es.comm_wait_s;
    out->tokens = c->grad_accum * world * c->batch * c->seq;
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
    return fs_ckpt_save(t->engine, root, t->step, t->cfg.seed, keep);
}
