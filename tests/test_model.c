/*
 * tests/test_model.c — the whole Llama model against PyTorch, and the trainer's invariants.
 *
 * Against PyTorch (tools/torch_reference.py, run with Debian's /usr/bin/python3): the same
 * weights (written by flatshard as safetensors) and the same tokens give the same logits,
 * loss and gradient of every parameter, and the same losses and final weights over five
 * AdamW steps with weight decay and global-norm clipping. Cases: untied with GQA and an
 * awkward shape (C = 48, 3 heads / 1 kv head, odd T, vocabulary 61), tied embeddings split
 * into uneven vocabulary chunks, and one attention head.
 *
 * In C alone: the activations backward makes again (ln1, ln2, h, xmid) give the gradients a
 * backward reading kept copies gives, bit for bit (fp32 and bf16, with and without a
 * checkpointed block); vocabulary chunking changes nothing; k micro-batches of b equal one batch of
 * k*b; a training step allocates nothing; the loss falls when training on a repetitive text.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "flatshard/model.h"
#include "flatshard/safetensors.h"
#include "flatshard/source.h"
#include "flatshard/train.h"
#include "harness.h"

static char tmpdir[256];

static const char *python(void) {
    const char *p = getenv("FLATSHARD_PYTHON");
    return p && *p ? p : "/usr/bin/python3";
}

typedef struct model_case {
    const char *name;
    fs_llama_config cfg;
    int64_t B, T, vocab_chunk;
} model_case;

static fs_llama_config make_cfg(int64_t C, int64_t FF, int64_t L, int64_t NH, int64_t NKV,
                                int64_t V, int tied) {
    return (fs_llama_config){.hidden_size = C, .intermediate_size = FF, .num_hidden_layers = L,
                             .num_attention_heads = NH, .num_key_value_heads = NKV,
                             .vocab_size = V, .max_position_embeddings = 64, .rms_norm_eps = 1e-5,
                             .rope_theta = 10000.0, .initializer_range = 0.02,
                             .tie_word_embeddings = tied};
}

/* AdamW settings shared by both sides: lr is large enough that five steps move the weights
 * well beyond rounding noise, and weight decay strong enough that applying it wrongly (to
 * norms, or not to matrices) moves the final weights well beyond the tolerance below. */
#define TEST_LR 1e-2
#define TEST_WD 1.0
#define TEST_CLIP 0.5
#define TEST_STEPS 5

static fs_train_config train_cfg(const model_case *mc, double clip) {
    fs_train_config tc = fs_train_config_default();
    tc.batch = mc->B;
    tc.seq = mc->T;
    tc.steps = TEST_STEPS;
    tc.warmup_steps = 0;
    tc.lr = tc.min_lr = TEST_LR; /* constant learning rate, as torch.optim.AdamW alone has */
    tc.adamw.weight_decay = TEST_WD;
    tc.clip = clip;
    tc.seed = 1234;
    tc.threads = 2;
    tc.vocab_chunk_rows = mc->vocab_chunk;
    return tc;
}

static void make_batch(const model_case *mc, int32_t *inputs, int32_t *targets) {
    int64_t N = mc->B * mc->T;
    for (int64_t i = 0; i < N; i++) {
        inputs[i] = (int32_t)fs_rand_below(99, 1, (uint64_t)i, (uint64_t)mc->cfg.vocab_size);
        targets[i] = (int32_t)fs_rand_below(99, 2, (uint64_t)i, (uint64_t)mc->cfg.vocab_size);
    }
}

/* One rank alone: its allocator, an in-process communicator of one, the trainer, and full
 * copies of the weights and gradients pulled from the engine on request (allocated from a
 * separate allocator, so that the rank's allocation count only shows the trainer's). */
typedef struct solo {
    fs_mem *mem, *views_mem;
    fs_comm *comm;
    fs_trainer t;
    fs_weights params, grads;
} solo;

static fs_status solo_init(solo *s, const fs_llama_config *cfg, const fs_train_config *tc,
                           const fs_token_stream *data) {
    memset(s, 0, sizeof *s);
    FS_TRY(fs_mem_init(&s->mem, 0));
    FS_TRY(fs_mem_init(&s->views_mem, 0));
    FS_TRY(fs_comm_inproc_init(1, fs_comm_config_default(), &s->mem, &s->comm));
    FS_TRY(fs_trainer_init(&s->t, cfg, tc, data, s->comm, s->mem));
    FS_TRY(fs_weights_init(&s->params, &s->t.layout, s->views_mem, FS_MEM_OTHER, "params view"));
    return fs_weights_init(&s->grads, &s->t.layout, s->views_mem, FS_MEM_OTHER, "grads view");
}

/* Fills s->params (and s->grads: the last step's gradient, as AdamW saw it) from the engine. */
static void solo_pull(solo *s) {
    CHECK_OK(fs_trainer_gather_weights(&s->t, &s->params));
    CHECK_OK(fs_engine_gather_full(s->t.engine, 1, &s->grads));
}

static void solo_step(solo *s, const int32_t *in, const int32_t *tg, fs_step_stats *st) {
    CHECK_OK(fs_trainer_step_on_batch(&s->t, in, tg, st));
}

static void solo_free(solo *s) {
    fs_trainer_free(&s->t);
    fs_comm_free(s->comm);
    fs_mem_free(s->mem);
    fs_mem_free(s->views_mem); /* releases the views */
    memset(s, 0, sizeof *s);
}

/* Reads reference tensor `name` (F32) into a new array of doubles; NULL (and a failed
 * check) when it is missing or has another size. */
static double *read_ref(const fs_safetensors *ref, const char *name, int64_t numel) {
    const fs_st_tensor *t = fs_safetensors_find(ref, name);
    CHECK(t != NULL, "reference has no tensor '%s'", name);
    if (!t) return NULL;
    CHECK(t->dtype == FS_ST_F32 && t->numel == numel, "reference '%s' has %lld elements, want %lld",
          name, (long long)t->numel, (long long)numel);
    if (t->dtype != FS_ST_F32 || t->numel != numel) return NULL;
    float *f = malloc((size_t)numel * sizeof *f);
    double *d = malloc((size_t)numel * sizeof *d);
    CHECK_OK(fs_safetensors_read(ref, t, 0, f, (size_t)numel * sizeof *f));
    for (int64_t i = 0; i < numel; i++) d[i] = f[i];
    free(f);
    return d;
}

/* Largest |x| of a reference array: per-tensor tolerances scale with it. */
static double max_abs(const double *x, int64_t n) {
    double m = 0;
    for (int64_t i = 0; i < n; i++) m = fabs(x[i]) > m ? fabs(x[i]) : m;
    return m;
}

/* max |got - want| */
static double max_diff(const float *got, const double *want, int64_t n) {
    double m = 0;
    for (int64_t i = 0; i < n; i++) m = fabs((double)got[i] - want[i]) > m ? fabs((double)got[i] - want[i]) : m;
    return m;
}

/* Compares every tensor piece of `w` with reference tensors named prefix + HF name, with
 * |err| <= rel * max|ref tensor| + abs_floor, and prints the worst observed error (absolute
 * and relative to the tensor's scale) so the margin under each tolerance stays visible. */
static void compare_weights(const fs_weights *w, const fs_safetensors *ref, const char *prefix,
                            double rel, double abs_floor) {
    const fs_layout *l = w->layout;
    double worst_abs = 0, worst_rel = 0;
    for (int ti = 0; ti < l->n_tensors; ti++) {
        const fs_tensor_info *p = &l->tensors[ti];
        char name[160];
        snprintf(name, sizeof name, "%s%s", prefix, p->name);
        int64_t whole = p->ndim == 1 ? p->numel : p->full_rows * p->shape[1];
        double *want = read_ref(ref, name, whole);
        if (!want) continue;
        const double *piece = want + p->row0 * p->shape[1];
        double scale = max_abs(want, whole);
        const float *got = fs_weights_unit(w, p->unit) + p->offset;
        CHECK_CLOSE(name, got, piece, p->numel, rel * scale + abs_floor, 0.0);
        double d = max_diff(got, piece, p->numel);
        if (d > worst_abs) worst_abs = d;
        if (scale > 0 && d / scale > worst_rel) worst_rel = d / scale;
        free(want);
    }
    printf("     %-7s worst |err| %.3g absolute, %.3g of the tensor's largest value (tolerance %.3g "
           "relative + %.3g)\n", prefix, worst_abs, worst_rel, rel, abs_floor);
}

static void against_torch(const model_case *mc) {
    const int64_t N = mc->B * mc->T, V = mc->cfg.vocab_size;
    int32_t *inputs = malloc((size_t)N * sizeof *inputs), *targets = malloc((size_t)N * sizeof *targets);
    make_batch(mc, inputs, targets);
    char wpath[512], bpath[512], rpath[512], cmd[2048];
    snprintf(wpath, sizeof wpath, "%s/%s.weights.safetensors", tmpdir, mc->name);
    snprintf(bpath, sizeof bpath, "%s/%s.batch.safetensors", tmpdir, mc->name);
    snprintf(rpath, sizeof rpath, "%s/%s.ref.safetensors", tmpdir, mc->name);

    /* Phase A: logits, loss and raw gradients of the initial weights. */
    fs_train_config tc = train_cfg(mc, 0.0);
    solo so;
    CHECK_OK(solo_init(&so, &mc->cfg, &tc, NULL));
    solo_pull(&so);
    CHECK_OK(fs_weights_save_safetensors(&so.params, wpath));
    const void *pin[] = {inputs}, *ptg[] = {targets};
    size_t tok_bytes[] = {(size_t)N * sizeof(int32_t)};
    fs_st_entry batch[2] = {
        {.name = "inputs", .dtype = FS_ST_I32, .ndim = 2, .shape = {mc->B, mc->T}, .n_pieces = 1,
         .pieces = pin, .piece_bytes = tok_bytes},
        {.name = "targets", .dtype = FS_ST_I32, .ndim = 2, .shape = {mc->B, mc->T}, .n_pieces = 1,
         .pieces = ptg, .piece_bytes = tok_bytes},
    };
    CHECK_OK(fs_safetensors_write(bpath, batch, 2, NULL));
    snprintf(cmd, sizeof cmd,
             "%s tools/torch_reference.py --weights %s --batch %s --out %s --steps %d --lr %.17g "
             "--beta1 %.17g --beta2 %.17g --eps %.17g --weight-decay %.17g --clip %.17g",
             python(), wpath, bpath, rpath, TEST_STEPS, TEST_LR, tc.adamw.beta1, tc.adamw.beta2,
             tc.adamw.eps, TEST_WD, TEST_CLIP);
    int rc = system(cmd);
    CHECK(rc == 0, "the PyTorch reference failed (exit %d): %s", rc, cmd);
    fs_safetensors ref;
    fs_status st = rc == 0 ? fs_safetensors_open(&ref, rpath) : FS_ERR_IO;
    CHECK(st == FS_OK, "cannot read the reference output %s", rpath);
    if (st != FS_OK) {
        solo_free(&so);
        free(inputs);
        free(targets);
        return;
    }

    memcpy(so.t.acts.inputs, inputs, (size_t)N * sizeof *inputs);
    memcpy(so.t.acts.targets, targets, (size_t)N * sizeof *targets);
    double loss = fs_forward_loss(&so.t.model, &so.t.acts, &so.params);
    double *ref_loss = read_ref(&ref, "loss", 1);
    /* The loss is a mean of N log-sum-exps over V logits: fp32 rounding in both programs
     * leaves ~1e-7 relative; 2e-6 bounds it with margin and is far below any modelling
     * error (a wrong mask or rotation changes the loss by 1e-3 or more). */
    if (ref_loss) {
        CHECK(fabs(loss - ref_loss[0]) <= 2e-6 * fabs(ref_loss[0]), "loss %.9g vs torch %.9g", loss,
              ref_loss[0]);
        printf("     %s: loss %.7f, torch %.7f, relative |err| %.3g (tolerance 2e-6)\n", mc->name,
               loss, ref_loss[0], fabs(loss - ref_loss[0]) / fabs(ref_loss[0]));
    }
    free(ref_loss);
    if (mc->vocab_chunk == 0) { /* the logits buffer holds every logit only without chunking */
        double *want = read_ref(&ref, "logits", N * V);
        /* Logits: fp32 GEMMs summed in different orders (OpenBLAS blocking vs PyTorch's),
         * through L blocks of rsqrt/exp/softmax; observed differences are ~1e-7 absolute on
         * logits of magnitude ~0.1. 2e-6 absolute keeps a 10x margin. */
        if (want) {
            CHECK_CLOSE("logits", so.t.acts.logits, want, N * V, 2e-6, 1e-5);
            printf("     logits  worst |err| %.3g (tolerance 2e-6 + 1e-5 relative)\n",
                   max_diff(so.t.acts.logits, want, N * V));
        }
        free(want);
    }

    fs_step_stats s;
    solo_step(&so, inputs, targets, &s);
    solo_pull(&so);
    /* Gradients: relative to each tensor's largest gradient. Backpropagation through the
     * softmax and the RMSNorms amplifies fp32 rounding to ~5e-7 of the tensor's scale
     * (observed); 1e-5 keeps a 20x margin, while a missing term, a transposed matrix or a
     * wrong scale gives errors of order 1 on that scale. */
    compare_weights(&so.grads, &ref, "grad.", 1e-5, 1e-9);
    solo_free(&so);

    /* Phase B: five AdamW steps with clipping, from the same initial weights. */
    tc = train_cfg(mc, TEST_CLIP);
    CHECK_OK(solo_init(&so, &mc->cfg, &tc, NULL));
    double *ref_losses = read_ref(&ref, "losses", TEST_STEPS);
    double worst_step = 0;
    for (int i = 0; i < TEST_STEPS; i++) {
        solo_step(&so, inputs, targets, &s);
        if (ref_losses && fabs(s.loss - ref_losses[i]) / fabs(ref_losses[i]) > worst_step)
            worst_step = fabs(s.loss - ref_losses[i]) / fabs(ref_losses[i]);
        /* Each step's loss: as the loss above, plus the divergence that earlier updates
         * carry; Adam's normalised update keeps that at the 1e-6 level. */
        if (ref_losses)
            CHECK(fabs(s.loss - ref_losses[i]) <= 1e-5 * fabs(ref_losses[i]),
                  "step %d loss %.9g vs torch %.9g", i + 1, s.loss, ref_losses[i]);
    }
    if (ref_losses)
        printf("     losses  of %d AdamW steps %.5f -> %.5f, worst relative |err| %.3g (tolerance "
               "1e-5)\n", TEST_STEPS, ref_losses[0], ref_losses[TEST_STEPS - 1], worst_step);
    free(ref_losses);
    /* Final weights: each AdamW step moves a weight by about lr. Rounding differences in m
     * and sqrt(v) change an update by ~1e-6 relative, except where a gradient is itself at
     * the rounding level and m/sqrt(v) can differ by a good fraction of lr; the worst
     * observed is ~2e-5 (0.2% of lr = 1e-2). lr/50 = 2e-4 keeps a 10x margin and is still
     * far below a missed step (lr) or wrong weight decay (lr * wd * |w| per step = 1e-2 * |w|,
     * 5e-2 * |w| over five steps: ~3e-3 for the largest matrix weights (~0.06), 5e-2 for norm
     * weights (1)). */
    solo_pull(&so);
    compare_weights(&so.params, &ref, "final.", 0.0, TEST_LR / 50);
    solo_free(&so);
    fs_safetensors_close(&ref);
    free(inputs);
    free(targets);
}

static void test_untied_gqa_awkward_shape_vs_torch(void) {
    model_case mc = {"untied", make_cfg(48, 80, 2, 3, 1, 61, 0), 2, 7, 0};
    against_torch(&mc);
}

static void test_tied_vocab_chunks_vs_torch(void) {
    model_case mc = {"tied_chunks", make_cfg(32, 64, 2, 4, 2, 61, 1), 2, 9, 13};
    against_torch(&mc);
}

static void test_one_head_vs_torch(void) {
    model_case mc = {"one_head", make_cfg(24, 40, 3, 1, 1, 37, 0), 3, 5, 0};
    against_torch(&mc);
}

/* ------------------------------------------------------------------ Hugging Face interop */

/* Logits and loss of the model in `source` on the batch, computed by flatshard (one process,
 * full weights, the vocabulary in one chunk). */
static void flatshard_logits(const char *source, const model_case *mc, const int32_t *in, const int32_t *tg,
                             float *logits, double *loss) {
    fs_source *src = NULL;
    CHECK_OK(fs_source_open(&src, source));
    if (!src) return;
    fs_layout l;
    fs_mem *mem = NULL;
    fs_weights w;
    fs_acts a;
    CHECK_OK(fs_layout_init(&l, fs_source_config(src), 0));
    CHECK_OK(fs_mem_init(&mem, 0));
    CHECK_OK(fs_weights_init(&w, &l, mem, FS_MEM_OTHER, "weights"));
    CHECK_OK(fs_weights_load(&w, src));
    CHECK_OK(fs_acts_init(&a, &l, mc->B, mc->T, 0, 0, NULL, mem));
    fs_device *dev = NULL;
    CHECK_OK(fs_device_open(&dev, FS_DEVICE_CPU, 0, NULL));
    const int64_t N = mc->B * mc->T;
    memcpy(a.inputs, in, (size_t)N * sizeof *in);
    memcpy(a.targets, tg, (size_t)N * sizeof *tg);
    fs_model m = {.layout = &l, .dev = dev, .profile = NULL};
    *loss = fs_forward_loss(&m, &a, &w);
    memcpy(logits, a.logits, (size_t)(N * mc->cfg.vocab_size) * sizeof *logits);
    fs_device_close(dev);
    fs_source_close(src);
    fs_mem_free(mem);
    fs_layout_free(&l);
}

static void write_batch(const char *path, const model_case *mc, const int32_t *in, const int32_t *tg) {
    const void *pin[] = {in}, *ptg[] = {tg};
    size_t tok_bytes[] = {(size_t)(mc->B * mc->T) * sizeof(int32_t)};
    fs_st_entry batch[2] = {
        {.name = "inputs", .dtype = FS_ST_I32, .ndim = 2, .shape = {mc->B, mc->T}, .n_pieces = 1,
         .pieces = pin, .piece_bytes = tok_bytes},
        {.name = "targets", .dtype = FS_ST_I32, .ndim = 2, .shape = {mc->B, mc->T}, .n_pieces = 1,
         .pieces = ptg, .piece_bytes = tok_bytes},
    };
    CHECK_OK(fs_safetensors_write(path, batch, 2, NULL));
}

/* Compares flatshard's logits and loss with the reference's output file. The two programs
 * read the same stored weights (widened from BF16 exactly where they are BF16) and compute
 * in fp32: the forward-pass tolerances of against_torch apply. */
static void compare_with_reference(const char *ref_path, const float *logits, double loss, int64_t n,
                                   const char *what) {
    fs_safetensors ref;
    fs_status st = fs_safetensors_open(&ref, ref_path);
    CHECK(st == FS_OK, "%s: cannot read %s", what, ref_path);
    if (st != FS_OK) return;
    double *want = read_ref(&ref, "logits", n), *ref_loss = read_ref(&ref, "loss", 1);
    if (want) {
        CHECK_CLOSE(what, logits, want, n, 2e-6, 1e-5);
        printf("     %s: logits worst |err| %.3g, loss %.7f vs torch %.7f\n", what, max_diff(logits, want, n), loss,
               ref_loss ? ref_loss[0] : 0.0);
    }
    if (ref_loss) CHECK(fabs(loss - ref_loss[0]) <= 2e-6 * ref_loss[0], "%s: loss %.9g vs torch %.9g", what, loss, ref_loss[0]);
    free(want);
    free(ref_loss);
    fs_safetensors_close(&ref);
}

/* flatshard -> Hugging Face: a checkpoint of a trained model, exported as F32 and as BF16,
 * gives the reference the logits flatshard computes from the same file. */
static void test_exported_model_runs_in_the_reference(void) {
    model_case mc = {"export", make_cfg(48, 80, 2, 3, 1, 61, 0), 2, 7, 0};
    const int64_t N = mc.B * mc.T, V = mc.cfg.vocab_size;
    int32_t in[14], tg[14];
    make_batch(&mc, in, tg);
    fs_train_config tc = train_cfg(&mc, TEST_CLIP);
    solo so;
    CHECK_OK(solo_init(&so, &mc.cfg, &tc, NULL));
    fs_step_stats s;
    for (int i = 0; i < 3; i++) solo_step(&so, in, tg, &s); /* a trained model, not the initial one */
    char ckpt[512], batch[512];
    snprintf(ckpt, sizeof ckpt, "%s/export-ckpt", tmpdir);
    snprintf(batch, sizeof batch, "%s/export-batch.safetensors", tmpdir);
    CHECK_OK(fs_trainer_save(&so.t, ckpt, 1));
    solo_free(&so);
    write_batch(batch, &mc, in, tg);
    static const fs_st_dtype dtypes[] = {FS_ST_F32, FS_ST_BF16};
    float *logits = malloc((size_t)(N * V) * sizeof *logits);
    for (int d = 0; d < 2; d++) {
        char dir[512], out[600], cmd[4096];
        snprintf(dir, sizeof dir, "%s/export-%s", tmpdir, fs_st_dtype_name(dtypes[d]));
        snprintf(out, sizeof out, "%s.ref.safetensors", dir);
        mkdir(dir, 0777);
        fs_source *src = NULL;
        uint64_t bytes = 0;
        int stale = 0;
        CHECK_OK(fs_source_open(&src, ckpt));
        if (src) CHECK_OK(fs_source_export_hf(src, dir, dtypes[d], &bytes, &stale));
        fs_source_close(src);
        snprintf(cmd, sizeof cmd, "%s tools/torch_reference.py --mode eval --model %s --batch %s --out %s", python(),
                 dir, batch, out);
        int rc = system(cmd);
        CHECK(rc == 0, "the reference failed on %s: %s", dir, cmd);
        double loss = 0;
        flatshard_logits(dir, &mc, in, tg, logits, &loss);
        if (rc == 0) compare_with_reference(out, logits, loss, N * V, fs_st_dtype_name(dtypes[d]));
    }
    free(logits);
}

/* Hugging Face -> flatshard: a model the reference created (its own random weights, two BF16
 * shard files and an index) gives flatshard the reference's loss and logits. */
static void test_reference_model_loads_in_flatshard(void) {
    model_case mc = {"created", make_cfg(32, 64, 2, 4, 2, 61, 1), 2, 9, 0};
    const int64_t N = mc.B * mc.T, V = mc.cfg.vocab_size;
    int32_t in[18], tg[18];
    make_batch(&mc, in, tg);
    char dir[512], out[512], batch[512], config[512], cmd[4096], text[4096];
    snprintf(dir, sizeof dir, "%s/torch-model", tmpdir);
    snprintf(out, sizeof out, "%s/torch-model.ref.safetensors", tmpdir);
    snprintf(batch, sizeof batch, "%s/torch-batch.safetensors", tmpdir);
    snprintf(config, sizeof config, "%s/torch-config.json", tmpdir);
    write_batch(batch, &mc, in, tg);
    CHECK(fs_llama_config_to_json(&mc.cfg, "float32", text, sizeof text) > 0, "config");
    FILE *f = fopen(config, "w");
    fputs(text, f);
    fclose(f);
    snprintf(cmd, sizeof cmd, "%s tools/torch_reference.py --mode create --config %s --seed 11 --model %s --batch %s --out %s",
             python(), config, dir, batch, out);
    int rc = system(cmd);
    CHECK(rc == 0, "the reference failed: %s", cmd);
    if (rc != 0) return;
    float *logits = malloc((size_t)(N * V) * sizeof *logits);
    double loss = 0;
    flatshard_logits(dir, &mc, in, tg, logits, &loss);
    compare_with_reference(out, logits, loss, N * V, "torch-created BF16 model");
    free(logits);
}

/* ------------------------------------------------------------------ C-only invariants */

/* ------------------------------------------------------------------ recomputed activations */

/* Block l's forward and backward as llama.c ran them while it kept ln1, ln2, h and xmid:
 * every activation in an array of its own, read back in backward. llama.c now makes those
 * four again in backward; with the same kernels on the same inputs the gradients must be the very
 * same bits (fp32 and bf16 policies). Under bf16 llama.c also takes the CPU's bf16 dgu route
 * (fs_swiglu_backward_bf16 into the gate/up backward GEMMs), which this reference does not:
 * the same bits again. It also keeps gu in bf16 (fs_matmul_forward_bf16_inp_out): this reference
 * rounds its fp32 gu the same way (fs_cast) and runs the fp32 SwiGLU on the widened values;
 * and q/k/v and the attention output, which this reference rounds and widens in place (its
 * o_proj GEMMs read the widened output, llama.c the bf16 one: the same bits); and ln1, ln2,
 * which llama.c writes in bf16 (fs_rmsnorm_forward_bf16) where this reference keeps them in
 * fp32 for GEMMs that round them: the same bits; and dq/dk/dv, which llama.c takes rotated
 * back and rounded from the device's attention_rope_backward_bf16, where this reference
 * zeroes, sums, rotates them in fp32 for a GEMM that rounds them: the same bits (an element
 * below FLT_MIN apart, which the AVX512-BF16 packing takes as zero and the cast rounds: none
 * on these inputs, or the comparison would say so). */
typedef struct kept_block {
    float *ln1, *rstd1, *qkv, *att, *lse, *xmid, *ln2, *rstd2, *gu, *h;
    uint16_t *gu16; /* (N, 2FF): the bf16 route keeps gu in bf16 */
    uint16_t *act16; /* (N, max(QKV, C)): q/k/v, then the attention output, rounded */
    float *dres, *dln, *dqkv, *datt, *dgu, *dh;
    float *xnext; /* the block's output, on the fp32-h route */
} kept_block;

static void kept_block_backward(const fs_model *m, const fs_acts *a, int l, const void *w,
                                const float *norm_w, const float *dres_in, kept_block *k,
                                float *dw, float *dnorm /* (2C): ln1's, ln2's */) {
    fs_device *dev = m->dev;
    const fs_kernel_table *K = fs_device_kernels(dev);
    const fs_llama_config *c = &m->layout->cfg;
    const int64_t B = a->B, T = a->T, N = a->N, C = c->hidden_size, FF = c->intermediate_size;
    const int64_t NH = c->num_attention_heads, NKV = c->num_key_value_heads, HS = C / NH;
    const int64_t QKV = (NH + 2 * NKV) * HS;
    const float eps = (float)c->rms_norm_eps;
    const int bf16 = m->bf16_weights;
    const size_t es = bf16 ? sizeof(uint16_t) : sizeof(float);
    const char *wq = w, *wo = wq + (size_t)(QKV * C) * es, *wgu = wo + (size_t)(C * C) * es;
    const char *wd = wgu + (size_t)(2 * FF * C) * es;
    float *gq = dw, *go = gq + QKV * C, *ggu = go + C * C, *gd = ggu + 2 * FF * C;
    const float *ln1_w = norm_w + 2 * l * C, *ln2_w = ln1_w + C;
    const float *x = a->x + l * N * C;
    float *q = k->qkv, *kk = q + NH * HS, *v = kk + NKV * HS;
    float *dq = k->dqkv, *dk = dq + NH * HS, *dv = dk + NKV * HS;
    K->rmsnorm_forward(dev, k->ln1, k->rstd1, x, ln1_w, N, C, eps);
    K->linear_forward(dev, k->qkv, NULL, k->ln1, wq, bf16, N, C, QKV);
    K->rope_forward(dev, q, QKV, a->rope_cos, a->rope_sin, B, T, NH, HS);
    K->rope_forward(dev, kk, QKV, a->rope_cos, a->rope_sin, B, T, NKV, HS);
    if (a->bf16_route) { /* q, k, v rounded to bf16, as the bf16 route keeps them */
        K->cast_fp32_to_bf16(dev, k->act16, k->qkv, N * QKV);
        K->cast_bf16_to_fp32(dev, k->qkv, k->act16, N * QKV);
    }
    K->attention_forward(dev, k->att, k->lse, q, kk, v, QKV, B, T, NH, NKV, HS, bf16);
    if (a->bf16_route) { /* and the attention's output */
        K->cast_fp32_to_bf16(dev, k->act16, k->att, N * C);
        K->cast_bf16_to_fp32(dev, k->att, k->act16, N * C);
    }
    K->linear_forward(dev, k->xmid, x, k->att, wo, bf16, N, C, C);
    K->rmsnorm_forward(dev, k->ln2, k->rstd2, k->xmid, ln2_w, N, C, eps);
    K->linear_forward(dev, k->gu, NULL, k->ln2, wgu, bf16, N, C, 2 * FF);
    if (a->bf16_route) { /* gu rounded to bf16, as the bf16 route keeps it, then read widened */
        K->cast_fp32_to_bf16(dev, k->gu16, k->gu, N * 2 * FF);
        K->cast_bf16_to_fp32(dev, k->gu, k->gu16, N * 2 * FF);
    }
    K->swiglu_forward(dev, k->h, k->gu, N, FF);
    K->linear_forward(dev, k->xnext, k->xmid, k->h, wd, bf16, N, FF, C);
    memcpy(k->dres, dres_in, (size_t)(N * C) * sizeof(float));
    memset(dnorm, 0, (size_t)(2 * C) * sizeof(float));
    K->linear_backward(dev, k->dh, gd, k->dres, k->h, wd, bf16, N, FF, C, 0, 0);
    K->zero(dev, k->dgu, (size_t)(N * 2 * FF) * sizeof(float));
    K->swiglu_backward(dev, k->dgu, k->dh, k->gu, N, FF);
    K->linear_backward(dev, k->dln, ggu, k->dgu, k->ln2, wgu, bf16, N, C, 2 * FF, 0, 0);
    K->rmsnorm_backward(dev, k->dres, dnorm + C, k->dln, k->xmid, ln2_w, k->rstd2, N, C);
    K->linear_backward(dev, k->datt, go, k->dres, k->att, wo, bf16, N, C, C, 0, 0);
    K->zero(dev, k->dqkv, (size_t)(N * QKV) * sizeof(float));
    K->attention_backward(dev, dq, dk, dv, QKV, k->datt, q, kk, v, QKV, k->att, k->lse, B, T,
                          NH, NKV, HS, bf16);
    K->rope_backward(dev, dq, QKV, a->rope_cos, a->rope_sin, B, T, NH, HS);
    K->rope_backward(dev, dk, QKV, a->rope_cos, a->rope_sin, B, T, NKV, HS);
    K->linear_backward(dev, k->dln, gq, k->dqkv, k->ln1, wq, bf16, N, C, QKV, 0, 0);
    K->rmsnorm_backward(dev, k->dres, dnorm, k->dln, x, ln1_w, k->rstd1, N, C);
}

/* The head as llama.c ran it while it kept the final norm's output in fp32 (the bf16 route
 * now keeps it in bf16 for GEMMs that round it anyway): the final RMSNorm, each vocabulary
 * chunk's logits and cross-entropy state, the loss, then in backward each chunk's logits
 * again (last chunk first), its dlogits, the chunk's weight gradient and dlnf, and the final
 * norm's backward into a zeroed dres. Returns the loss; dw_head is the head's units in order,
 * each l->units[u].numel. */
static double kept_head(const fs_model *m, const fs_acts *a, const void *const *unit_w, const float *norm_w,
                        float *dw_head, float *dnorm_f /* (C) */, float *dres /* (N, C) */) {
    fs_device *dev = m->dev;
    const fs_kernel_table *K = fs_device_kernels(dev);
    const fs_layout *l = m->layout;
    const int64_t N = a->N, C = l->cfg.hidden_size, L = l->cfg.num_hidden_layers;
    const float *x = a->x + L * N * C, *final_w = norm_w + 2 * L * C;
    float *lnf = calloc((size_t)(N * C), sizeof(float)), *rstd = calloc((size_t)N, sizeof(float));
    float *rm = calloc((size_t)N, sizeof(float)), *rs = calloc((size_t)N, sizeof(float));
    float *tl = calloc((size_t)N, sizeof(float)), *dlnf = calloc((size_t)(N * C), sizeof(float));
    float *logits = calloc((size_t)(N * l->cfg.vocab_size), sizeof(float));
    double loss = 0.0;
    K->rmsnorm_forward(dev, lnf, rstd, x, final_w, N, C, (float)l->cfg.rms_norm_eps);
    for (int op = 0; op < l->n_ops; op++) {
        const fs_op *o = &l->ops[op];
        if (o->kind != FS_UNIT_HEAD) continue;
        const fs_unit_info *u = &l->units[o->unit];
        K->linear_forward(dev, logits, NULL, lnf, unit_w[o->unit], m->bf16_weights, N, C, u->rows);
        K->xent_chunk_forward(dev, rm, rs, tl, logits, a->targets, N, u->rows, u->row0, o->first_of_kind);
        if (o->last_of_kind) K->xent_finish(dev, rm, rm, rs, tl, N, &loss);
    }
    for (int op = l->n_ops - 1; op >= 0; op--) {
        const fs_op *o = &l->ops[op];
        if (o->kind != FS_UNIT_HEAD) continue;
        const fs_unit_info *u = &l->units[o->unit];
        K->linear_forward(dev, logits, NULL, lnf, unit_w[o->unit], m->bf16_weights, N, C, u->rows);
        K->xent_chunk_backward(dev, logits, logits, rm, a->targets, N, u->rows, u->row0, 1.0f / (float)N);
        float *dwu = dw_head;
        for (int v = 0; v < op; v++) /* the unit's place among the head's units, in op order */
            if (l->ops[v].kind == FS_UNIT_HEAD) dwu += l->units[l->ops[v].unit].numel;
        K->linear_backward(dev, dlnf, dwu, logits, lnf, unit_w[o->unit], m->bf16_weights, N, C, u->rows,
                           !o->last_of_kind, 0);
    }
    memset(dres, 0, (size_t)(N * C) * sizeof(float));
    K->rmsnorm_backward(dev, dres, dnorm_f, dlnf, x, final_w, rstd, N, C);
    free(lnf), free(rstd), free(rm), free(rs), free(tl), free(dlnf), free(logits);
    return loss;
}

static void test_recomputed_activations_give_the_kept_gradients(void) {
    /* GQA, FF not a multiple of 16, odd T; 3 blocks so that a checkpointed one shares its
     * slot; the vocabulary in chunks of 16 (four head units) */
    model_case mc = {"recompute", make_cfg(48, 72, 3, 3, 1, 61, 0), 2, 7, 0};
    const fs_llama_config *c = &mc.cfg;
    const int64_t N = mc.B * mc.T, C = c->hidden_size, FF = c->intermediate_size;
    const int64_t HS = C / c->num_attention_heads;
    const int64_t QKV = (c->num_attention_heads + 2 * c->num_key_value_heads) * HS;
    int32_t in[14], tg[14];
    make_batch(&mc, in, tg);
    for (int bf16 = 0; bf16 <= 1; bf16++)
        for (int64_t ckpt = 0; ckpt <= 1; ckpt++) {
            fs_layout l;
            fs_mem *mem = NULL;
            fs_device *dev = NULL;
            fs_weights w, g;
            fs_acts a;
            CHECK_OK(fs_layout_init(&l, c, 16));
            CHECK_OK(fs_mem_init(&mem, 0));
            CHECK_OK(fs_device_open(&dev, FS_DEVICE_CPU, 0, NULL));
            CHECK_OK(fs_weights_init(&w, &l, mem, FS_MEM_OTHER, "weights"));
            CHECK_OK(fs_weights_init(&g, &l, mem, FS_MEM_OTHER, "grads"));
            uint16_t *w16 = calloc((size_t)w.numel, sizeof *w16);
            for (int u = 0; u < l.n_units; u++) {
                float *p = fs_weights_unit(&w, u);
                fs_layout_init_weights(&l, u, 0, l.units[u].numel, p, 5);
                if (u == l.norm_unit) /* norms of 1 would hide a swapped norm weight */
                    for (int64_t i = 0; i < l.units[u].numel; i++) p[i] = 1.0f + 0.01f * (float)(i % 13);
                for (int64_t i = 0; i < l.units[u].numel; i++)
                    w16[w.unit_offset[u] + i] = fs_fp32_to_bf16(p[i]);
            }
            CHECK_OK(fs_acts_init(&a, &l, mc.B, mc.T, ckpt, bf16, dev, mem));
            CHECK_OK(fs_acts_prepare_gemms(&l, mc.B, mc.T, bf16, dev, mem));
            memcpy(a.inputs, in, sizeof in);
            memcpy(a.targets, tg, sizeof tg);
            fs_model m = {.layout = &l, .dev = dev, .profile = NULL, .bf16_weights = bf16};
            const float *norm_w = fs_weights_unit(&w, l.norm_unit);
            float *norm_dw = fs_weights_unit(&g, l.norm_unit);
            kept_block k;
            float **bufs[] = {&k.ln1, &k.rstd1, &k.qkv, &k.att, &k.lse, &k.xmid, &k.ln2, &k.rstd2,
                              &k.gu, &k.h, &k.dres, &k.dln, &k.dqkv, &k.datt, &k.dgu, &k.dh, &k.xnext};
            const int64_t sizes[] = {N * C, N, N * QKV, N * C, N * c->num_attention_heads, N * C,
                                     N * C, N, N * 2 * FF, N * FF, N * C, N * C, N * QKV, N * C,
                                     N * 2 * FF, N * FF, N * C};
            for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++)
                *bufs[i] = calloc((size_t)sizes[i], sizeof(float));
            k.gu16 = calloc((size_t)(N * 2 * FF), sizeof(uint16_t));
            k.act16 = calloc((size_t)(N * (QKV > C ? QKV : C)), sizeof(uint16_t));
            CHECK(a.bf16_route == bf16, "bf16 %d: the activations keep gu, q/k/v and att in bf16 exactly under bf16 on the CPU", bf16);
            float *dres_in = calloc((size_t)(N * C), sizeof(float));
            float *kdw = calloc((size_t)l.max_unit_numel, sizeof(float));
            float *kdnorm = calloc((size_t)(2 * C), sizeof(float));
            #define UNIT_W(u) (bf16 ? (const void *)(w16 + w.unit_offset[u]) : (const void *)fs_weights_unit(&w, u))
            for (int op = 0; op < l.n_ops; op++)
                fs_model_forward(&m, &a, op, UNIT_W(l.ops[op].unit), norm_w);
            /* the head as it ran with its norm's output in fp32: the loss and, after the head's
             * backward, its gradients, bit for bit */
            const void **unit_w = calloc((size_t)l.n_units, sizeof *unit_w);
            int64_t head_numel = 0;
            for (int u = 0; u < l.n_units; u++) unit_w[u] = UNIT_W(u);
            for (int op = 0; op < l.n_ops; op++)
                if (l.ops[op].kind == FS_UNIT_HEAD) head_numel += l.units[l.ops[op].unit].numel;
            float *hdw = calloc((size_t)head_numel, sizeof(float)), *hdnorm = calloc((size_t)C, sizeof(float));
            float *hdres = calloc((size_t)(N * C), sizeof(float));
            const double kept_loss = kept_head(&m, &a, unit_w, norm_w, hdw, hdnorm, hdres);
            CHECK(memcmp(&kept_loss, a.loss_sum, sizeof kept_loss) == 0,
                  "bf16 %d, %lld checkpointed: the loss %.17g, with the final norm's output in fp32 %.17g", bf16,
                  (long long)ckpt, *a.loss_sum, kept_loss);
            int heads = 0;
            int blocks_equal = 0;
            for (int op = l.n_ops - 1; op >= 0; op--) {
                const int u = l.ops[op].unit;
                const int is_block = l.ops[op].kind == FS_UNIT_BLOCK, bl = l.units[u].index;
                if (is_block) memcpy(dres_in, a.dres, (size_t)(N * C) * sizeof(float));
                fs_model_backward(&m, &a, op, UNIT_W(u), fs_weights_unit(&g, u), 0, norm_w, norm_dw);
                if (l.ops[op].kind == FS_UNIT_HEAD && l.ops[op].first_of_kind) { /* the head's backward done */
                    int same = memcmp(hdnorm, norm_dw + 2 * c->num_hidden_layers * C, (size_t)C * sizeof(float)) == 0 &&
                               memcmp(hdres, a.dres, (size_t)(N * C) * sizeof(float)) == 0;
                    const float *hw = hdw;
                    for (int v = 0; v < l.n_ops; v++)
                        if (l.ops[v].kind == FS_UNIT_HEAD) {
                            const int hu = l.ops[v].unit;
                            heads++;
                            same &= memcmp(hw, fs_weights_unit(&g, hu), (size_t)l.units[hu].numel * sizeof(float)) == 0;
                            hw += l.units[hu].numel;
                        }
                    CHECK(same, "bf16 %d, %lld checkpointed: the head's weight, final norm and residual gradients "
                          "equal those with the final norm's output in fp32, bit for bit", bf16, (long long)ckpt);
                }
                if (!is_block) continue;
                kept_block_backward(&m, &a, bl, UNIT_W(u), norm_w, dres_in, &k, kdw, kdnorm);
                /* the forward's output too (under bf16 llama.c made h in bf16) */
                CHECK(memcmp(k.xnext, a.x + (bl + 1) * N * C, (size_t)(N * C) * sizeof(float)) == 0,
                      "bf16 %d, %lld checkpointed: block %d's output equals the fp32-h route's bit for bit", bf16,
                      (long long)ckpt, bl);
                int same = memcmp(kdw, fs_weights_unit(&g, u),
                                  (size_t)l.units[u].numel * sizeof(float)) == 0 &&
                           memcmp(kdnorm, norm_dw + 2 * bl * C, (size_t)(2 * C) * sizeof(float)) == 0 &&
                           memcmp(k.dres, a.dres, (size_t)(N * C) * sizeof(float)) == 0;
                CHECK(same, "bf16 %d, %lld checkpointed: block %d's weight, norm and input gradients "
                      "equal the kept-activation backward's bit for bit", bf16, (long long)ckpt, bl);
                blocks_equal += same;
            }
            #undef UNIT_W
            CHECK(blocks_equal == c->num_hidden_layers && heads == 4, "every block (%d) and head chunk (%d) compared",
                  blocks_equal, heads);
            free(unit_w), free(hdw), free(hdnorm), free(hdres);
            for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) free(*bufs[i]);
            free(k.gu16);
            free(k.act16);
            free(dres_in);
            free(kdw);
            free(kdnorm);
            free(w16);
            fs_acts_free(&a, mem);
            fs_device_close(dev);
            fs_mem_free(mem);
            fs_layout_free(&l);
        }
}

static void test_vocab_chunking_changes_nothing(void) {
    model_case whole = {"whole", make_cfg(32, 64, 2, 4, 2, 61, 0), 2, 9, 0};
    model_case chunked = whole;
    chunked.vocab_chunk = 13;
    const int64_t N = whole.B * whole.T;
    int32_t in[18], tg[18];
    make_batch(&whole, in, tg);
    solo sa, sb;
    fs_train_config ta = train_cfg(&whole, 0.0), tb = train_cfg(&chunked, 0.0);
    CHECK_OK(solo_init(&sa, &whole.cfg, &ta, NULL));
    CHECK_OK(solo_init(&sb, &chunked.cfg, &tb, NULL));
    fs_trainer *a = &sa.t, *b = &sb.t;
    solo_pull(&sa);
    solo_pull(&sb);
    CHECK(b->layout.n_units == a->layout.n_units + 8, "61 rows in chunks of 13: 5 embed + 5 head units");
    /* initial weights are a function of the whole tensor's element index: equal bitwise */
    for (int ti = 0; ti < b->layout.n_tensors; ti++) {
        const fs_tensor_info *p = &b->layout.tensors[ti];
        int tj = fs_layout_find_tensor(&a->layout, p->name, 0);
        const fs_tensor_info *q = &a->layout.tensors[tj];
        const float *x = fs_weights_unit(&sb.params, p->unit) + p->offset;
        const float *y = fs_weights_unit(&sa.params, q->unit) + q->offset + p->row0 * p->shape[1];
        CHECK(memcmp(x, y, (size_t)p->numel * sizeof *x) == 0, "%s rows from %lld differ", p->name,
              (long long)p->row0);
    }
    memcpy(a->acts.inputs, in, sizeof in);
    memcpy(a->acts.targets, tg, sizeof tg);
    memcpy(b->acts.inputs, in, sizeof in);
    memcpy(b->acts.targets, tg, sizeof tg);
    double la = fs_forward_loss(&a->model, &a->acts, &sa.params);
    double lb = fs_forward_loss(&b->model, &b->acts, &sb.params);
    /* the online log-sum-exp over chunks rounds differently from one pass: ~1e-7 relative */
    CHECK(fabs(la - lb) <= 1e-6 * la, "loss whole %.9g vs chunked %.9g", la, lb);
    fs_step_stats s;
    solo_step(&sa, in, tg, &s);
    solo_step(&sb, in, tg, &s);
    solo_pull(&sa);
    solo_pull(&sb);
    /* gradients (clipping is off, so they are the raw ones) agree to fp32 rounding, relative
     * to each tensor's largest gradient */
    for (int ti = 0; ti < b->layout.n_tensors; ti++) {
        const fs_tensor_info *p = &b->layout.tensors[ti];
        int tj = fs_layout_find_tensor(&a->layout, p->name, 0);
        const fs_tensor_info *q = &a->layout.tensors[tj];
        int64_t q_numel = q->numel;
        double *want = malloc((size_t)q_numel * sizeof *want);
        const float *y = fs_weights_unit(&sa.grads, q->unit) + q->offset;
        for (int64_t i = 0; i < q_numel; i++) want[i] = y[i];
        CHECK_CLOSE(p->name, fs_weights_unit(&sb.grads, p->unit) + p->offset,
                    want + p->row0 * p->shape[1], p->numel, 1e-5 * max_abs(want, q_numel), 0.0);
        free(want);
    }
    (void)N;
    solo_free(&sa);
    solo_free(&sb);
}

static void test_grad_accumulation_equals_big_batch(void) {
    model_case big = {"big", make_cfg(32, 64, 2, 4, 2, 61, 1), 4, 9, 0};
    model_case micro = big;
    micro.B = 2;
    const int64_t N = big.B * big.T;
    int32_t *in = malloc((size_t)N * sizeof *in), *tg = malloc((size_t)N * sizeof *tg);
    make_batch(&big, in, tg);
    fs_train_config tbig = train_cfg(&big, 0.0), tmic = train_cfg(&micro, 0.0);
    tmic.grad_accum = 2;
    solo a, b;
    CHECK_OK(solo_init(&a, &big.cfg, &tbig, NULL));
    CHECK_OK(solo_init(&b, &micro.cfg, &tmic, NULL));
    fs_step_stats sa, sb;
    solo_step(&a, in, tg, &sa);
    solo_step(&b, in, tg, &sb);
    solo_pull(&a);
    solo_pull(&b);
    /* the mean of two half-batch means is the full mean up to fp32 rounding */
    CHECK(fabs(sa.loss - sb.loss) <= 1e-6 * sa.loss, "loss %.9g vs %.9g", sa.loss, sb.loss);
    CHECK(fabs(sa.grad_norm - sb.grad_norm) <= 1e-5 * sa.grad_norm, "grad norm %.9g vs %.9g",
          sa.grad_norm, sb.grad_norm);
    double *want = malloc((size_t)a.grads.numel * sizeof *want);
    for (int64_t i = 0; i < a.grads.numel; i++) want[i] = a.grads.data[i];
    double scale = max_abs(want, a.grads.numel);
    CHECK_CLOSE("gradients", b.grads.data, want, a.grads.numel, 1e-5 * scale, 0.0);
    free(want);
    solo_free(&a);
    solo_free(&b);
    free(in);
    free(tg);
}

/* The trainer takes each step's learning rate from the schedule at the right step: warmup
 * 2 of 6 steps, lr 1e-2 down to 1e-3, values worked out by hand from the formula in
 * optim.h (p = (step - 2) / 4: 0, 1/4, 1/2, 3/4). An off-by-one in the step the trainer
 * passes, or a schedule left at a constant, changes at least one of them by 10% or more. */
static void test_trainer_follows_the_lr_schedule(void) {
    model_case mc = {"lr", make_cfg(24, 40, 1, 1, 1, 37, 0), 1, 5, 0};
    fs_train_config tc = train_cfg(&mc, 0.0);
    tc.steps = 6;
    tc.warmup_steps = 2;
    tc.lr = 1e-2;
    tc.min_lr = 1e-3;
    const double lr = 1e-2, mn = 1e-3;
    const double want[6] = {lr / 2, lr, lr, mn + (lr - mn) * (2 + sqrt(2.0)) / 4, (lr + mn) / 2,
                            mn + (lr - mn) * (2 - sqrt(2.0)) / 4};
    const int64_t N = mc.B * mc.T;
    int32_t in[5], tg[5];
    make_batch(&mc, in, tg);
    solo so;
    CHECK_OK(solo_init(&so, &mc.cfg, &tc, NULL));
    for (int i = 0; i < 6 && N == 5; i++) {
        fs_step_stats st;
        solo_step(&so, in, tg, &st);
        CHECK(fabs(st.lr - want[i]) <= 1e-12 * want[i], "step %d: lr %.17g, want %.17g", i + 1, st.lr,
              want[i]);
    }
    solo_free(&so);
}

static void test_step_allocates_nothing_and_loss_falls(void) {
    /* a repetitive text: the model must learn it quickly */
    char path[512];
    snprintf(path, sizeof path, "%s/repeat.txt", tmpdir);
    FILE *f = fopen(path, "w");
    for (int i = 0; i < 400; i++) fputs("the quick brown fox jumps over the lazy dog. ", f);
    fclose(f);
    fs_token_stream data;
    CHECK_OK(fs_token_stream_open(&data, path));
    fs_llama_config cfg = make_cfg(64, 128, 2, 4, 2, 256, 0);
    fs_train_config tc = fs_train_config_default();
    tc.batch = 8;
    tc.seq = 32;
    tc.steps = 60;
    tc.warmup_steps = 5;
    tc.lr = 3e-3;
    tc.threads = 2;
    solo so;
    CHECK_OK(solo_init(&so, &cfg, &tc, &data));
    fs_step_stats s;
    CHECK_OK(fs_trainer_step(&so.t, &s));
    double first = s.loss;
    fs_mem_stats m1 = fs_mem_get_stats(so.mem);
    for (int i = 1; i < tc.steps; i++) CHECK_OK(fs_trainer_step(&so.t, &s));
    fs_mem_stats m2 = fs_mem_get_stats(so.mem);
    CHECK(m2.n_allocs == m1.n_allocs && m2.total_bytes == m1.total_bytes,
          "steps 2..%lld allocated: %llu -> %llu allocations", (long long)tc.steps,
          (unsigned long long)m1.n_allocs, (unsigned long long)m2.n_allocs);
    /* ln(256) = 5.55 at the start; a 27-character cycle is learnable to well below 1.5 */
    CHECK(first > 5.0 && s.loss < 1.5, "loss %.3f -> %.3f", first, s.loss);
    solo_free(&so);
    fs_token_stream_close(&data);
    unlink(path);
}

static void test_trainer_rejects_bad_configs(void) {
    fs_llama_config cfg = make_cfg(32, 64, 2, 4, 2, 61, 0);
    fs_train_config tc = fs_train_config_default();
    tc.seq = 65; /* > max_position_embeddings = 64 */
    solo t;
    CHECK(solo_init(&t, &cfg, &tc, NULL) == FS_ERR_USAGE &&
              strstr(fs_error_message(), "max_position_embeddings"),
          "seq too long: %s", fs_error_message());
    solo_free(&t);
    tc = fs_train_config_default();
    tc.lr = -1;
    CHECK(solo_init(&t, &cfg, &tc, NULL) == FS_ERR_USAGE && strstr(fs_error_message(), "--lr"),
          "negative lr: %s", fs_error_message());
    solo_free(&t);
    tc = fs_train_config_default();
    tc.seq = 8;
    tc.max_mem_bytes = 1 << 16; /* far too small */
    CHECK(solo_init(&t, &cfg, &tc, NULL) == FS_ERR_USAGE &&
              strstr(fs_error_message(), "--max-mem"),
          "memory limit: %s", fs_error_message());
    solo_free(&t);
    /* a data file whose tokens do not fit the vocabulary */
    char path[512];
    snprintf(path, sizeof path, "%s/bytes.txt", tmpdir);
    FILE *f = fopen(path, "w");
    fputs("bytes above 60 are outside a vocabulary of 61", f);
    fclose(f);
    fs_token_stream data;
    CHECK_OK(fs_token_stream_open(&data, path));
    tc = fs_train_config_default();
    tc.seq = 8;
    CHECK(solo_init(&t, &cfg, &tc, &data) != FS_OK && strstr(fs_error_message(), path),
          "vocab: %s", fs_error_message());
    solo_free(&t);
    fs_token_stream_close(&data);
    unlink(path);
}

int main(void) {
    snprintf(tmpdir, sizeof tmpdir, "/tmp/flatshard-test-model-XXXXXX");
    if (!mkdtemp(tmpdir)) {
        perror("mkdtemp");
        return 1;
    }
    RUN(test_untied_gqa_awkward_shape_vs_torch);
    RUN(test_tied_vocab_chunks_vs_torch);
    RUN(test_one_head_vs_torch);
    RUN(test_exported_model_runs_in_the_reference);
    RUN(test_reference_model_loads_in_flatshard);
    RUN(test_recomputed_activations_give_the_kept_gradients);
    RUN(test_vocab_chunking_changes_nothing);
    RUN(test_grad_accumulation_equals_big_batch);
    RUN(test_trainer_follows_the_lr_schedule);
    RUN(test_step_allocates_nothing_and_loss_falls);
    RUN(test_trainer_rejects_bad_configs);
    char cmd[512];
    snprintf(cmd, sizeof cmd, "rm -rf %s", tmpdir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", tmpdir);
    return fs_test_summary();
}
