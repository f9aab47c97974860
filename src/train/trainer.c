/*
 * trainer.c — the single-process training step.
 *
 * Plan, allocate, run: fs_trainer_init computes every size from the configurations and
 * allocates once; fs_trainer_step only computes. The micro-batches of step s are rows
 * [k*B, (k+1)*B) of the global batch the sampler defines for (seed, s), so a run with
 * grad_accum = K and batch B sees the same tokens as one with grad_accum = 1 and batch K*B.
 *
 * Gradients: a unit's first backward use in a step writes its gradient slots (GEMM beta = 0),
 * every later use (a tied embedding's second use, later micro-batches) accumulates. Each
 * micro-batch's loss is a mean over its tokens, so the sum over K micro-batches is scaled by
 * 1/K once, before clipping.
 */
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
        .threads = 0, /* 0: one per online CPU */
        .vocab_chunk_rows = 0,
        .max_mem_bytes = 0,
    };
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
        return fs_errorf(FS_ERR_USAGE, "--threads must be between 0 (all CPUs) and 1024 (got %d)", c->threads);
    return FS_OK;
}

fs_status fs_trainer_init(fs_trainer *t, const fs_llama_config *model_cfg,
                          const fs_train_config *cfg, const fs_token_data *data) {
    memset(t, 0, sizeof *t);
    FS_TRY(check_config(cfg));
    FS_TRY(fs_llama_config_validate(model_cfg));
    if (cfg->seq > model_cfg->max_position_embeddings)
        return fs_errorf(FS_ERR_USAGE,
                         "--seq %lld exceeds the model's max_position_embeddings (%lld)",
                         (long long)cfg->seq, (long long)model_cfg->max_position_embeddings);
    if (data) {
        FS_TRY(fs_token_data_check_vocab(data, (int32_t)model_cfg->vocab_size));
        FS_TRY(fs_token_data_check_length(data, cfg->seq));
    }

    t->cfg = *cfg;
    if (t->cfg.threads == 0) t->cfg.threads = fs_cpu_count();
    t->data = data;
    fs_status st = fs_layout_init(&t->layout, model_cfg, cfg->vocab_chunk_rows);
    if (st == FS_OK) st = fs_mem_init(&t->mem, cfg->max_mem_bytes);
    if (st == FS_OK) st = fs_pool_init(&t->pool, t->cfg.threads);
    if (st == FS_OK) st = fs_weights_init(&t->params, &t->layout, t->mem, FS_MEM_MASTER, "master weights");
    if (st == FS_OK) st = fs_weights_init(&t->grads, &t->layout, t->mem, FS_MEM_GRADS, "gradients");
    if (st == FS_OK) st = fs_weights_init(&t->adam_m, &t->layout, t->mem, FS_MEM_OPTIM, "AdamW m");
    if (st == FS_OK) st = fs_weights_init(&t->adam_v, &t->layout, t->mem, FS_MEM_OPTIM, "AdamW v");
    if (st == FS_OK) st = fs_acts_init(&t->acts, &t->layout, cfg->batch, cfg->seq, t->mem);
    if (st != FS_OK) {
        fs_trainer_free(t);
        return st;
    }
    fs_kernels_init();
    fs_weights_init_random(&t->params, cfg->seed);
    t->model = (fs_model){.layout = &t->layout, .pool = t->pool, .profile = &t->profile};
    return FS_OK;
}

void fs_trainer_free(fs_trainer *t) {
    if (!t) return;
    if (t->mem) {
        fs_acts_free(&t->acts, t->mem);
        fs_weights_free(&t->adam_v, t->mem);
        fs_weights_free(&t->adam_m, t->mem);
        fs_weights_free(&t->grads, t->mem);
        fs_weights_free(&t->params, t->mem);
    }
    fs_pool_free(t->pool);
    fs_mem_free(t->mem);
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

void fs_trainer_step(fs_trainer *t, fs_step_stats *out) {
    FS_ASSERT(t->data != NULL);
    fs_trainer_step_on_batch(t, NULL, NULL, out);
}

void fs_trainer_step_on_batch(fs_trainer *t, const int32_t *inputs, const int32_t *targets,
                              fs_step_stats *out) {
    double t0 = fs_now();
    const fs_layout *l = &t->layout;
    const fs_train_config *c = &t->cfg;
    fs_acts *a = &t->acts;
    /* unit_written[u]: u's gradient slots already hold this step's first contribution */
    enum { MAX_UNITS_ON_STACK = 4096 };
    unsigned char unit_written[MAX_UNITS_ON_STACK];
    FS_ASSERT(l->n_units <= MAX_UNITS_ON_STACK);
    memset(unit_written, 0, (size_t)l->n_units);

    float *norm_dw = fs_weights_unit(&t->grads, l->norm_unit);
    memset(norm_dw, 0, (size_t)l->units[l->norm_unit].numel * sizeof(float));
    unit_written[l->norm_unit] = 1;
    const float *norm_w = fs_weights_unit(&t->params, l->norm_unit);

    double loss_sum = 0;
    for (int64_t k = 0; k < c->grad_accum; k++) {
        const int64_t micro = c->batch * c->seq;
        if (inputs) {
            memcpy(a->inputs, inputs + k * micro, (size_t)micro * sizeof *inputs);
            memcpy(a->targets, targets + k * micro, (size_t)micro * sizeof *targets);
        } else {
            fs_sampler_fill(t->data, c->seed, t->step, k * c->batch, c->batch, c->seq, a->inputs,
                            a->targets);
        }
        loss_sum += fs_forward_loss(&t->model, a, &t->params);
        for (int op = l->n_ops - 1; op >= 0; op--) {
            int u = l->ops[op].unit;
            fs_model_backward(&t->model, a, op, fs_weights_unit(&t->params, u),
                              fs_weights_unit(&t->grads, u), unit_written[u], norm_w, norm_dw);
            unit_written[u] = 1;
        }
    }

    double t_opt = fs_now();
    if (c->grad_accum > 1) fs_scale(t->pool, t->grads.data, t->grads.numel, 1.0f / (float)c->grad_accum);
    double norm = fs_weights_global_norm(t->pool, &t->grads);
    double factor = fs_clip_factor(norm, c->clip);
    if (factor < 1.0) fs_scale(t->pool, t->grads.data, t->grads.numel, (float)factor);
    fs_lr_schedule sched = {.lr = c->lr, .min_lr = c->min_lr, .warmup_steps = c->warmup_steps,
                            .total_steps = c->steps};
    double lr = fs_lr_at(&sched, t->step);
    t->step++;
    fs_adamw_step_weights(t->pool, &t->params, &t->adam_m, &t->adam_v, &t->grads, lr, t->step,
                          &c->adamw);
    double t1 = fs_now();
    t->profile.seconds[FS_PROF_OPTIM] += t1 - t_opt;
    t->profile.calls[FS_PROF_OPTIM]++;

    out->step = t->step;
    out->loss = loss_sum / (double)c->grad_accum;
    out->lr = lr;
    out->grad_norm = norm;
    out->seconds = t1 - t0;
    out->tokens = c->grad_accum * c->batch * c->seq;
}
