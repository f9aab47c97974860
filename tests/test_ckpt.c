/*
 * tests/test_ckpt.c — checkpoints and model sources.
 *
 *   - resume at the same world size continues bit for bit (fp32 and bf16, every strategy);
 *   - resume at another world size or strategy (4 -> 3, 4 -> 1, 1 -> 4, yafsdp -> zero3-param)
 *     continues the run within the tolerance of W ranks against one (engine_checks.h);
 *   - --keep prunes old checkpoints only after a new one is complete; leftovers of crashed
 *     saves are never loaded and are removed by fs_ckpt_recover;
 *   - lineages: every manifest names its run and what it resumed from; a root of another run
 *     is refused unless resumed from or told --new-lineage; a branch gets its own names;
 *     --keep prunes only the saving lineage; the root opens the most recent save; old
 *     checkpoints without run ids still load; the lock refuses a second writer;
 *   - a save over a checkpoint of the same name, crashed (fork, SIGKILL) at every stage of
 *     its commit, leaves a complete copy, and recovery and resume then work;
 *   - the manifest names the data (shards and token counts) and a different stream is refused;
 *   - corrupted, truncated, wrong-version and wrong-model checkpoints, and hostile manifests,
 *     each give a clear error naming the file and the problem;
 *   - initialisation from safetensors (F32, BF16, F16) and from a Hugging Face directory
 *     with an index of shard files, each rank reading its slices.
 */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "engine_checks.h"
#include "flatshard/ckpt.h"
#include "flatshard/safetensors.h"
#include "flatshard/source.h"
#include "harness.h"

#define MAX_W 4
static char tmpdir[256];

/* One run on W in-process ranks: optionally resumed or initialised, `steps` steps in all,
 * optionally saving after step save_at (or every step with save_every) under save_root. */
typedef struct run_spec {
    const fs_llama_config *cfg;
    fs_train_config tc;
    const int32_t *in, *tg;
    int steps;
    const char *save_root;
    int save_at, save_every, keep;
    int save_end;                    /* also save after the last step (a save over that step's name) */
    fs_ckpt_lineage *lineage;        /* NULL: the trainer's own (unclaimed); else rank 0 saves as it, updated */
    const char *resume_path, *init_path;
    /* outputs */
    double losses[EC_MAX_STEPS + 1]; /* by step number */
    ec_result res;                   /* rank 0's final weights */
    int64_t first_step;
} run_spec;

static fs_status run_rank(fs_comm *comm, void *arg) {
    run_spec *s = arg;
    fs_mem *mem = fs_comm_mem(comm);
    fs_trainer t;
    fs_ckpt ck = {0};
    fs_source *src = NULL;
    fs_status st = FS_OK;
    fs_train_config tc = s->tc;
    if (s->resume_path) {
        FS_TRY(fs_ckpt_open(&ck, s->resume_path));
        tc.seed = ck.seed;
    }
    if (s->init_path) FS_TRY(fs_source_open(&src, s->init_path));
    st = fs_trainer_init(&t, s->cfg, &tc, NULL, comm, mem);
    if (st == FS_OK && s->resume_path) st = fs_trainer_resume(&t, &ck);
    if (st == FS_OK && src) st = fs_trainer_init_from(&t, src);
    const int lead = fs_comm_rank(comm) == 0;
    if (lead) s->first_step = t.step + 1;
    if (lead && s->lineage) t.lineage = *s->lineage;
    while (st == FS_OK && t.step < s->steps) {
        fs_step_stats ss;
        st = fs_trainer_step_on_batch(&t, s->in, s->tg, &ss);
        if (st == FS_OK && lead) s->losses[ss.step] = ss.loss;
        if (st == FS_OK && s->save_root &&
            (ss.step == s->save_at || (s->save_every > 0 && ss.step % s->save_every == 0)))
            st = fs_trainer_save(&t, s->save_root, s->keep);
    }
    if (st == FS_OK && s->save_end) st = fs_trainer_save(&t, s->save_root, s->keep);
    if (lead && s->lineage) *s->lineage = t.lineage;
    ec_result mine;
    memset(&mine, 0, sizeof mine);
    if (st == FS_OK) st = ec_gather(&t, s->cfg, &mine);
    if (lead) ec_result_move(&s->res, &mine);
    else ec_result_free(&mine);
    fs_trainer_free(&t);
    fs_ckpt_close(&ck);
    fs_source_close(src);
    return st;
}

static fs_status run(int W, run_spec *s) { return ec_run_ranks(W, run_rank, s); }

static void root_path(char *buf, size_t n, const char *name) { snprintf(buf, n, "%s/%s", tmpdir, name); }

static void rm_rf(const char *path) {
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", path);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", path);
}

/* ------------------------------------------------------------------ resume */

static void test_resume_is_bit_exact(void) {
    fs_llama_config cfg = ec_model(1);
    int32_t in[2 * 2 * 8], tg[2 * 2 * 8];
    ec_batch(cfg.vocab_size, 4, 8, in, tg);
    for (int s = 0; s < FS_STRATEGY_N; s++)
        for (int p = 0; p < FS_PRECISION_N; p++) {
            char root[512];
            root_path(root, sizeof root, "exact");
            rm_rf(root);
            run_spec full = {.cfg = &cfg, .tc = ec_config((fs_strategy)s, (fs_precision)p, 2, 8),
                             .in = in, .tg = tg, .steps = 6, .save_root = root, .save_at = 3};
            full.tc.steps = 6;
            CHECK_OK(run(2, &full));
            run_spec resumed = full;
            resumed.save_root = NULL;
            resumed.resume_path = root;
            memset(resumed.losses, 0, sizeof resumed.losses);
            CHECK_OK(run(2, &resumed));
            const char *what = fs_strategy_name((fs_strategy)s), *prec = fs_precision_name((fs_precision)p);
            CHECK(resumed.first_step == 4, "%s %s: resumed at step %lld", what, prec, (long long)resumed.first_step);
            for (int i = 4; i <= 6; i++)
                CHECK(resumed.losses[i] == full.losses[i], "%s %s: step %d loss %.17g after resuming, %.17g straight",
                      what, prec, i, resumed.losses[i], full.losses[i]);
            const char *d = resumed.res.weights.data ? ec_first_difference(&resumed.res.weights, &full.res.weights) : "all";
            CHECK(d == NULL, "%s %s: final weights differ in %s", what, prec, d);
            ec_result_free(&full.res);
            ec_result_free(&resumed.res);
        }
}

static void test_resume_at_another_world_size_or_strategy(void) {
    fs_llama_config cfg = ec_model(0);
    int32_t in[12 * 8], tg[12 * 8];
    ec_batch(cfg.vocab_size, 12, 8, in, tg);
    static const struct {
        int from_w, to_w;
        fs_strategy from_s, to_s;
    } cases[] = {
        {4, 3, FS_STRATEGY_YAFSDP, FS_STRATEGY_YAFSDP},
        {4, 1, FS_STRATEGY_YAFSDP, FS_STRATEGY_YAFSDP},
        {1, 4, FS_STRATEGY_YAFSDP, FS_STRATEGY_YAFSDP},
        {3, 4, FS_STRATEGY_YAFSDP, FS_STRATEGY_YAFSDP},
        {2, 3, FS_STRATEGY_YAFSDP, FS_STRATEGY_ZERO3_PARAM},
        {3, 2, FS_STRATEGY_DDP, FS_STRATEGY_ZERO1},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        char root[512], what[96];
        root_path(root, sizeof root, "reshard");
        rm_rf(root);
        snprintf(what, sizeof what, "%s W=%d -> %s W=%d", fs_strategy_name(cases[c].from_s), cases[c].from_w,
                 fs_strategy_name(cases[c].to_s), cases[c].to_w);
        /* the global batch is 12 rows on any W */
        run_spec full = {.cfg = &cfg, .tc = ec_config(cases[c].from_s, FS_PRECISION_FP32, 12 / cases[c].from_w, 8),
                         .in = in, .tg = tg, .steps = 6, .save_root = root, .save_at = 3};
        full.tc.steps = 6;
        CHECK_OK(run(cases[c].from_w, &full));
        run_spec resumed = {.cfg = &cfg, .tc = ec_config(cases[c].to_s, FS_PRECISION_FP32, 12 / cases[c].to_w, 8),
                            .in = in, .tg = tg, .steps = 6, .resume_path = root};
        resumed.tc.steps = 6;
        CHECK_OK(run(cases[c].to_w, &resumed));
        /* the restored state is the saved one bit for bit; the continuation then differs by
         * summation order only: the first resumed step's loss to rounding (1e-6), the later
         * ones and the weights within engine_checks.h's W-vs-one tolerances */
        CHECK(fabs(resumed.losses[4] - full.losses[4]) <= 1e-6 * full.losses[4], "%s: step 4 loss %.9g vs %.9g",
              what, resumed.losses[4], full.losses[4]);
        for (int i = 5; i <= 6; i++)
            CHECK(fabs(resumed.losses[i] - full.losses[i]) <= 1e-4 * full.losses[i], "%s: step %d loss %.9g vs %.9g",
                  what, i, resumed.losses[i], full.losses[i]);
        double d = resumed.res.weights.data ? ec_max_diff(&resumed.res.weights, &full.res.weights) : 1;
        CHECK(d <= 1e-2 / 50 * 3, "%s: final weights differ by %.3g", what, d);
        ec_result_free(&full.res);
        ec_result_free(&resumed.res);
    }
}

/* ------------------------------------------------------------------ files on disk */

static int count_entries(const char *dir, const char *prefix) {
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "ls '%s' | grep -c '^%s'", dir, prefix);
    FILE *p = popen(cmd, "r");
    int n = -1;
    if (p) {
        if (fscanf(p, "%d", &n) != 1) n = -1;
        pclose(p);
    }
    return n;
}

static void test_keep_and_crashed_saves(void) {
    fs_llama_config cfg = ec_model(0);
    int32_t in[2 * 8], tg[2 * 8];
    ec_batch(cfg.vocab_size, 2, 8, in, tg);
    char root[512], stale[600];
    root_path(root, sizeof root, "keep");
    rm_rf(root);
    mkdir(root, 0777);
    /* a crashed save of step 9 left a temporary directory: recovery (at a writer's start,
     * under the lock) removes it */
    snprintf(stale, sizeof stale, "%s/step-00000009.tmp", root);
    mkdir(stale, 0777);
    int repaired = 0;
    CHECK_OK(fs_ckpt_recover(root, &repaired));
    CHECK(repaired == 1, "recovery handled %d entries, expected the one .tmp", repaired);
    /* another lineage's save in progress: a save of ours must leave it alone */
    char theirs[600];
    snprintf(theirs, sizeof theirs, "%s/step-00000005-deadbeef.tmp", root);
    mkdir(theirs, 0777);
    run_spec s = {.cfg = &cfg, .tc = ec_config(FS_STRATEGY_YAFSDP, FS_PRECISION_FP32, 1, 8), .in = in, .tg = tg,
                  .steps = 5, .save_root = root, .save_every = 1, .keep = 2};
    s.tc.steps = 5;
    CHECK_OK(run(2, &s));
    CHECK(count_entries(root, "step-0000000[0-9]$") == 2, "keep 2: %d step directories remain",
          count_entries(root, "step-0000000[0-9]$"));
    struct stat sb;
    CHECK(stat(stale, &sb) != 0, "the crashed save's .tmp directory was removed");
    CHECK(stat(theirs, &sb) == 0, "another lineage's temporary directory was removed by our save");
    fs_ckpt ck;
    CHECK_OK(fs_ckpt_open(&ck, root));
    CHECK(ck.step == 5, "the newest complete checkpoint is step 5, got %lld", (long long)ck.step);
    fs_ckpt_close(&ck);
    /* without its COMPLETE marker, step 5 is incomplete: the root opens step 4 */
    char marker[700];
    snprintf(marker, sizeof marker, "%s/step-00000005/COMPLETE", root);
    CHECK(unlink(marker) == 0, "remove the marker");
    CHECK_OK(fs_ckpt_open(&ck, root));
    CHECK(ck.step == 4, "falls back to step 4, got %lld", (long long)ck.step);
    fs_ckpt_close(&ck);
    ec_result_free(&s.res);
}

/* Saves a 2-rank checkpoint of 2 steps under root; returns its directory in dir. */
static void make_checkpoint(const char *root, char *dir, size_t n) {
    fs_llama_config cfg = ec_model(0);
    int32_t in[2 * 8], tg[2 * 8];
    ec_batch(cfg.vocab_size, 2, 8, in, tg);
    rm_rf(root);
    run_spec s = {.cfg = &cfg, .tc = ec_config(FS_STRATEGY_YAFSDP, FS_PRECISION_FP32, 1, 8), .in = in, .tg = tg,
                  .steps = 2, .save_root = root, .save_at = 2};
    s.tc.steps = 2;
    CHECK_OK(run(2, &s));
    ec_result_free(&s.res);
    snprintf(n ? dir : NULL, n, "%s/step-00000002", root);
}

/* Loads path into a fresh 2-rank trainer of model cfg; returns the status and message. */
static fs_status try_resume(const fs_llama_config *cfg, const char *path) {
    int32_t in[2 * 8] = {0}, tg[2 * 8] = {0};
    run_spec s = {.cfg = cfg, .tc = ec_config(FS_STRATEGY_YAFSDP, FS_PRECISION_FP32, 1, 8), .in = in, .tg = tg,
                  .steps = 2, .resume_path = path};
    s.tc.steps = 2;
    fs_status st = run(2, &s);
    ec_result_free(&s.res);
    return st;
}

static void test_damaged_checkpoints_are_refused(void) {
    char root[512], dir[600], file[700], manifest[700];
    root_path(root, sizeof root, "damage");
    make_checkpoint(root, dir, sizeof dir);
    snprintf(file, sizeof file, "%s/rank-00001-of-00002.bin", dir);
    snprintf(manifest, sizeof manifest, "%s/manifest.json", dir);
    fs_llama_config cfg = ec_model(0);
    CHECK_OK(try_resume(&cfg, root));

    /* one flipped byte in a rank file */
    int fd = open(file, O_RDWR);
    unsigned char b = 0;
    CHECK(fd >= 0 && pread(fd, &b, 1, 100) == 1, "read a byte");
    b ^= 0x40;
    CHECK(pwrite(fd, &b, 1, 100) == 1, "flip it");
    fs_status st = try_resume(&cfg, root);
    CHECK(st == FS_ERR_FORMAT && strstr(fs_error_message(), "checksum mismatch") &&
              strstr(fs_error_message(), "rank-00001-of-00002.bin"),
          "corrupted file: %s", fs_error_message());
    b ^= 0x40;
    CHECK(pwrite(fd, &b, 1, 100) == 1, "restore it");
    close(fd);
    CHECK_OK(try_resume(&cfg, root));

    /* a truncated rank file */
    struct stat sb;
    CHECK(stat(file, &sb) == 0, "stat");
    char saved[800];
    snprintf(saved, sizeof saved, "%s.saved", file);
    char cmd[1600];
    snprintf(cmd, sizeof cmd, "cp '%s' '%s'", file, saved);
    CHECK(system(cmd) == 0, "keep a copy");
    CHECK(truncate(file, sb.st_size / 2) == 0, "truncate");
    st = try_resume(&cfg, root);
    CHECK(st == FS_ERR_FORMAT && strstr(fs_error_message(), "truncated"), "truncated file: %s", fs_error_message());
    CHECK(rename(saved, file) == 0, "restore");

    /* a model of another shape */
    fs_llama_config other = cfg;
    other.intermediate_size = 64;
    st = try_resume(&other, root);
    CHECK(st == FS_ERR_FORMAT && strstr(fs_error_message(), "intermediate_size is 48 there, 64 here"),
          "wrong model: %s", fs_error_message());

    /* an edited manifest no longer matches the checksum in COMPLETE */
    snprintf(cmd, sizeof cmd, "sed -i 's/\"step\": 2/\"step\": 3/' '%s'", manifest);
    CHECK(system(cmd) == 0, "edit the manifest");
    fs_ckpt ck;
    st = fs_ckpt_open(&ck, dir);
    CHECK(st == FS_ERR_FORMAT && strstr(fs_error_message(), "manifest is corrupted"), "edited manifest: %s",
          fs_error_message());
    /* nothing to resume from: a directory of its own, whatever other tests leave in tmpdir */
    char empty[512];
    root_path(empty, sizeof empty, "empty-root");
    rm_rf(empty);
    CHECK(mkdir(empty, 0777) == 0, "mkdir %s", empty);
    st = fs_ckpt_open(&ck, empty);
    CHECK(st == FS_ERR_IO && strstr(fs_error_message(), "no complete checkpoint"), "empty root: %s", fs_error_message());
}

/* Hostile or malformed manifests: each refused with a message naming what is wrong. */
static void test_hostile_manifests(void) {
#define HEAD "{\"format\":\"flatshard-checkpoint\",\"version\":1,\"step\":3,\"seed\":\"7\",\"world_size\":1," \
             "\"strategy\":\"yafsdp\",\"precision\":\"fp32\",\"arrays\":[\"master\",\"adam_m\",\"adam_v\"]," \
             "\"config\":{\"hidden_size\":8,\"intermediate_size\":8,\"num_hidden_layers\":1," \
             "\"num_attention_heads\":2,\"vocab_size\":4},\"tensors\":[{\"name\":\"a\",\"shape\":[4,2]}],"
    static const struct {
        const char *json, *must_mention;
    } cases[] = {
        {HEAD "\"files\":[{\"name\":\"rank-00000-of-00001.bin\",\"bytes\":96,\"crc32\":1,\"numel\":8,\"ranges\":[[0,0,8]]}]}", NULL},
        {"{\"format\":\"other\"}", "format"},
        {"{\"format\":\"flatshard-checkpoint\",\"version\":2}", "version 2 is not supported"},
        {HEAD "\"files\":[{\"name\":\"../../etc/passwd\",\"bytes\":96,\"crc32\":1,\"numel\":8,\"ranges\":[[0,0,8]]}]}", "must be named rank-00000-of-00001.bin"},
        {HEAD "\"files\":[{\"name\":\"rank-00000-of-00001.bin\",\"bytes\":95,\"crc32\":1,\"numel\":8,\"ranges\":[[0,0,8]]}]}", "do not match"},
        {HEAD "\"files\":[{\"name\":\"rank-00000-of-00001.bin\",\"bytes\":96,\"crc32\":1,\"numel\":8,\"ranges\":[[0,0,9]]}]}", "within a tensor"},
        {HEAD "\"files\":[{\"name\":\"rank-00000-of-00001.bin\",\"bytes\":96,\"crc32\":1,\"numel\":8,\"ranges\":[[3,0,8]]}]}", "within a tensor"},
        {HEAD "\"files\":[{\"name\":\"rank-00000-of-00001.bin\",\"bytes\":96,\"crc32\":1,\"numel\":8,\"ranges\":[[0,0,4],[0,2,6]]}]}", "stored twice"},
        {HEAD "\"files\":[{\"name\":\"rank-00000-of-00001.bin\",\"bytes\":72,\"crc32\":1,\"numel\":6,\"ranges\":[[0,0,4],[0,2,4]]}]}", "stored twice"},
        {HEAD "\"files\":[{\"name\":\"rank-00000-of-00001.bin\",\"bytes\":48,\"crc32\":1,\"numel\":4,\"ranges\":[[0,0,4]]}]}", "only 4 of 8"},
        {HEAD "\"files\":[]}", "one file per rank"},
        {HEAD "\"files\":[{\"name\":\"rank-00000-of-00001.bin\",\"bytes\":96,\"crc32\":-1,\"numel\":8,\"ranges\":[[0,0,8]]}]}", "crc32"},
        {HEAD "\"files\":[{\"name\":\"rank-00000-of-00001.bin\",\"bytes\":1e300,\"crc32\":1,\"numel\":8,\"ranges\":[[0,0,8]]}]}", "bytes"},
        {"{\"format\":\"flatshard-checkpoint\",\"version\":1,\"step\":-1}", "step"},
        {"{\"format\":\"flatshard-checkpoint\",\"version\":1,\"step\":1,\"seed\":7}", "seed"},
        {"[1,2", "not valid JSON"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        fs_ckpt ck;
        fs_status st = fs_ckpt_parse_manifest(&ck, cases[i].json, strlen(cases[i].json), "m.json");
        if (!cases[i].must_mention) {
            CHECK(st == FS_OK, "case %zu should parse: %s", i, fs_error_message());
        } else {
            CHECK(st == FS_ERR_FORMAT && strstr(fs_error_message(), cases[i].must_mention) &&
                      strstr(fs_error_message(), "m.json"),
                  "case %zu: '%s' should mention '%s'", i, fs_error_message(), cases[i].must_mention);
        }
        fs_ckpt_close(&ck);
    }
#undef HEAD
}


/* ------------------------------------------------------------------ the data a checkpoint names */

/* A manifest naming its data: the shards' names and token counts, checked against a stream. */
static void test_manifest_names_its_data(void) {
#define MANIFEST_WITH(data)                                                                                 \
    "{\"format\":\"flatshard-checkpoint\",\"version\":1,\"step\":3,\"seed\":\"7\",\"world_size\":1,"        \
    "\"strategy\":\"yafsdp\",\"precision\":\"fp32\"," data ",\"arrays\":[\"master\",\"adam_m\",\"adam_v\"],"  \
    "\"config\":{\"hidden_size\":8,\"intermediate_size\":8,\"num_hidden_layers\":1,"                        \
    "\"num_attention_heads\":2,\"vocab_size\":4},\"tensors\":[{\"name\":\"a\",\"shape\":[4,2]}],"          \
    "\"files\":[{\"name\":\"rank-00000-of-00001.bin\",\"bytes\":96,\"crc32\":1,\"numel\":8,\"ranges\":[[0,0,8]]}]}"
    static const char good[] = MANIFEST_WITH("\"data\":{\"shards\":[{\"name\":\"s1.bin\",\"tokens\":30},"
                                             "{\"name\":\"s2.bin\",\"tokens\":20}]}");
    fs_ckpt ck;
    CHECK_OK(fs_ckpt_parse_manifest(&ck, good, strlen(good), "m.json"));
    CHECK(ck.data_recorded && ck.n_data_shards == 2 && strcmp(ck.data_shards[1].name, "s2.bin") == 0 &&
              ck.data_shards[0].n_tokens == 30,
          "the data parsed: %d shards", ck.n_data_shards);
    snprintf(ck.dir, sizeof ck.dir, "ckpt-dir");
    /* streams to compare: the same shards in another directory, one changed, one fewer, reordered */
    char dir[600], path[700], spec[1500];
    snprintf(dir, sizeof dir, "%s/data-identity", tmpdir);
    mkdir(dir, 0755);
    int32_t toks[30] = {0};
    snprintf(path, sizeof path, "%s/s1.bin", dir);
    CHECK_OK(fs_tokenfile_write(path, toks, 30, 4));
    snprintf(path, sizeof path, "%s/s2.bin", dir);
    CHECK_OK(fs_tokenfile_write(path, toks, 20, 4));
    fs_token_stream data;
    CHECK_OK(fs_token_stream_open(&data, dir));
    CHECK_OK(fs_ckpt_check_data(&ck, &data));
    fs_token_stream_close(&data);
    snprintf(spec, sizeof spec, "%s/s2.bin,%s/s1.bin", dir, dir);
    CHECK_OK(fs_token_stream_open(&data, spec));
    fs_status st = fs_ckpt_check_data(&ck, &data);
    CHECK(st == FS_ERR_USAGE && strstr(fs_error_message(), "shard 1 is") && strstr(fs_error_message(), "s2.bin (20 tokens)") &&
              strstr(fs_error_message(), "ckpt-dir was trained on s1.bin (30 tokens)"),
          "reordered shards: %s", fs_error_message());
    fs_token_stream_close(&data);
    snprintf(spec, sizeof spec, "%s/s1.bin", dir);
    CHECK_OK(fs_token_stream_open(&data, spec));
    st = fs_ckpt_check_data(&ck, &data);
    CHECK(st == FS_ERR_USAGE && strstr(fs_error_message(), "1 shard where the checkpoint ckpt-dir was trained on 2"),
          "a shard missing: %s", fs_error_message());
    fs_token_stream_close(&data);
    snprintf(path, sizeof path, "%s/s2.bin", dir);
    CHECK_OK(fs_tokenfile_write(path, toks, 21, 4)); /* grown by a token */
    CHECK_OK(fs_token_stream_open(&data, dir));
    st = fs_ckpt_check_data(&ck, &data);
    CHECK(st == FS_ERR_USAGE && strstr(fs_error_message(), "shard 2 is") && strstr(fs_error_message(), "(21 tokens)"),
          "a shard changed: %s", fs_error_message());
    fs_ckpt_close(&ck);
    /* a checkpoint that names no data is not checked (data_recorded says so) */
    static const char none[] = MANIFEST_WITH("\"data\":null");
    CHECK_OK(fs_ckpt_parse_manifest(&ck, none, strlen(none), "m.json"));
    CHECK(!ck.data_recorded && fs_ckpt_check_data(&ck, &data) == FS_OK, "no data recorded");
    fs_ckpt_close(&ck);
    fs_token_stream_close(&data);
    /* malformed data records are refused, naming the field */
    static const char *const bad[] = {
        MANIFEST_WITH("\"data\":{\"shards\":[]}"),
        MANIFEST_WITH("\"data\":{\"shards\":[{\"name\":\"\",\"tokens\":3}]}"),
        MANIFEST_WITH("\"data\":{\"shards\":[{\"name\":\"a.bin\",\"tokens\":-3}]}"),
        MANIFEST_WITH("\"data\":[1]"),
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        st = fs_ckpt_parse_manifest(&ck, bad[i], strlen(bad[i]), "m.json");
        CHECK(st == FS_ERR_FORMAT && strstr(fs_error_message(), "m.json") && strstr(fs_error_message(), "data"),
              "bad data record %zu: %s", i, fs_error_message());
        fs_ckpt_close(&ck);
    }
    snprintf(path, sizeof path, "%s/s1.bin", dir);
    unlink(path);
    snprintf(path, sizeof path, "%s/s2.bin", dir);
    unlink(path);
    rmdir(dir);
#undef MANIFEST_WITH
}

/* ------------------------------------------------------------------ lineages, the lock, crashes */

static int complete_in(const char *root, const char *name) {
    char path[1100];
    struct stat sb;
    snprintf(path, sizeof path, "%s/%s/COMPLETE", root, name);
    return stat(path, &sb) == 0;
}

static int exists_in(const char *root, const char *name) {
    char path[1100];
    struct stat sb;
    snprintf(path, sizeof path, "%s/%s", root, name);
    return lstat(path, &sb) == 0;
}

/* Rewrites the checkpoint in dir as versions before run ids wrote it: the manifest without
 * its lineage lines, and COMPLETE with the new manifest's CRC-32. */
static void make_legacy(const char *dir) {
    char path[1100], line[8192];
    snprintf(path, sizeof path, "%s/manifest.json", dir);
    FILE *f = fopen(path, "r");
    CHECK(f != NULL, "open %s", path);
    if (!f) return;
    size_t cap = 1 << 20, len = 0;
    char *out = malloc(cap);
    while (fgets(line, sizeof line, f)) {
        if (!strncmp(line, "  \"run_id\"", 10) || !strncmp(line, "  \"resumed_from\"", 16) ||
            !strncmp(line, "  \"save_seq\"", 12))
            continue;
        size_t k = strlen(line);
        CHECK(len + k < cap, "manifest too large for the test");
        if (len + k >= cap) break;
        memcpy(out + len, line, k);
        len += k;
    }
    fclose(f);
    f = fopen(path, "w");
    fwrite(out, 1, len, f);
    fclose(f);
    snprintf(path, sizeof path, "%s/COMPLETE", dir);
    f = fopen(path, "w");
    fprintf(f, "flatshard-checkpoint complete\nmanifest.json crc32 %08x\n", fs_crc32(0, out, len));
    fclose(f);
    free(out);
}

static void test_lineages_branches_and_keep(void) {
    fs_llama_config cfg = ec_model(0);
    int32_t in[2 * 8], tg[2 * 8];
    ec_batch(cfg.vocab_size, 2, 8, in, tg);
    char root[512], root2[512], one[600], three[600], tag[16];
    root_path(root, sizeof root, "lineage");
    root_path(root2, sizeof root2, "lineage2");
    rm_rf(root);
    rm_rf(root2);
    snprintf(one, sizeof one, "%s/step-00000001", root);
    snprintf(three, sizeof three, "%s/step-00000003", root);

    /* lineage A: steps 1-3, every one kept */
    fs_ckpt_lineage a, b, x;
    CHECK_OK(fs_ckpt_claim(&a, root, NULL, 0)); /* the root does not exist yet: nothing to refuse */
    CHECK(strlen(a.run_id) == FS_CKPT_ID_HEX && a.tag[0] == '\0' && a.seq == 0 && a.parent_step == -1 && !a.continued,
          "a fresh lineage: id '%s' tag '%s' seq %lld", a.run_id, a.tag, (long long)a.seq);
    run_spec sa = {.cfg = &cfg, .tc = ec_config(FS_STRATEGY_YAFSDP, FS_PRECISION_FP32, 1, 8), .in = in, .tg = tg,
                   .steps = 3, .save_root = root, .save_every = 1, .lineage = &a};
    sa.tc.steps = 3;
    CHECK_OK(run(2, &sa));
    CHECK(a.seq == 3 && strcmp(a.last_name, "step-00000003") == 0, "after 3 saves: seq %lld, last %s",
          (long long)a.seq, a.last_name);
    fs_ckpt ck;
    CHECK_OK(fs_ckpt_open(&ck, root));
    CHECK(ck.step == 3 && strcmp(ck.run_id, a.run_id) == 0 && ck.seq == 3 && ck.parent_step == -1,
          "A's manifest: step %lld run '%s' seq %lld parent %lld", (long long)ck.step, ck.run_id,
          (long long)ck.seq, (long long)ck.parent_step);
    fs_ckpt_close(&ck);

    /* a fresh run into A's root is refused, naming A's newest checkpoint and the way out */
    fs_status st = fs_ckpt_claim(&x, root, NULL, 0);
    char a8[16];
    snprintf(a8, sizeof a8, "run %.8s", a.run_id);
    CHECK(st == FS_ERR_USAGE && strstr(fs_error_message(), "holds checkpoints of another run") &&
              strstr(fs_error_message(), "step-00000003") && strstr(fs_error_message(), a8) &&
              strstr(fs_error_message(), "--new-lineage"),
          "a fresh run over A: %s", fs_error_message());

    /* a branch from A's step 1 is its own lineage, with its own names */
    CHECK_OK(fs_ckpt_open(&ck, one));
    CHECK_OK(fs_ckpt_claim(&b, root, &ck, 0));
    fs_ckpt_close(&ck);
    snprintf(tag, sizeof tag, "-%.8s", b.run_id);
    CHECK(!b.continued && strcmp(b.run_id, a.run_id) != 0 && strcmp(b.parent_id, a.run_id) == 0 &&
              b.parent_step == 1 && b.seq == 3 && strcmp(b.tag, tag) == 0,
          "the branch: continued %d parent '%s' step %lld seq %lld tag '%s'", b.continued, b.parent_id,
          (long long)b.parent_step, (long long)b.seq, b.tag);
    run_spec sb = {.cfg = &cfg, .tc = ec_config(FS_STRATEGY_YAFSDP, FS_PRECISION_FP32, 1, 8), .in = in, .tg = tg,
                   .steps = 3, .save_root = root, .save_every = 1, .keep = 1, .resume_path = one, .lineage = &b};
    sb.tc.steps = 3;
    CHECK_OK(run(2, &sb));
    char b2name[64], b3name[64];
    snprintf(b2name, sizeof b2name, "step-00000002%s", b.tag);
    snprintf(b3name, sizeof b3name, "step-00000003%s", b.tag);
    /* nothing of A is lost; --keep 1 pruned only the branch's own step 2 */
    CHECK(complete_in(root, "step-00000001") && complete_in(root, "step-00000002") && complete_in(root, "step-00000003"),
          "A's checkpoints survive the branch");
    CHECK(!exists_in(root, b2name) && complete_in(root, b3name), "the branch keeps only %s", b3name);

    /* the root opens the most recent save (the branch's step 3), not A's same step */
    CHECK_OK(fs_ckpt_open(&ck, root));
    CHECK(strcmp(ck.run_id, b.run_id) == 0 && ck.seq == 5 && ck.parent_step == 1 && strcmp(ck.parent_id, a.run_id) == 0 &&
              strstr(ck.dir, b3name) != NULL,
          "the root opens %s (run '%s', seq %lld)", ck.dir, ck.run_id, (long long)ck.seq);
    /* and resuming it continues the branch */
    CHECK_OK(fs_ckpt_claim(&x, root, &ck, 0));
    CHECK(x.continued && strcmp(x.run_id, b.run_id) == 0 && strcmp(x.tag, b.tag) == 0 && x.seq == 5,
          "resuming the root: continued %d tag '%s' seq %lld", x.continued, x.tag, (long long)x.seq);
    fs_ckpt_close(&ck);

    /* A's tip continues A (its plain names); A's step 2 would be another branch */
    CHECK_OK(fs_ckpt_open(&ck, three));
    CHECK_OK(fs_ckpt_claim(&x, root, &ck, 0));
    CHECK(x.continued && strcmp(x.run_id, a.run_id) == 0 && x.tag[0] == '\0', "A's tip: continued %d tag '%s'",
          x.continued, x.tag);
    /* resumed from A's tip into another root, the run continues A there */
    CHECK_OK(fs_ckpt_claim(&x, root2, &ck, 0));
    CHECK(x.continued && strcmp(x.run_id, a.run_id) == 0 && x.tag[0] == '\0' && x.seq == 0,
          "A's tip into an empty root: continued %d tag '%s'", x.continued, x.tag);
    /* ... and once it has saved steps 4-5 there, A's step 3 is no longer A's tip: a second
     * run from it into that root would save its own step 4 over them and prune the rest, so
     * it is refused, naming the later checkpoint (save numbers count per directory: the
     * continuation's step 5 is save 2 of root2, A's step 3 save 3 of root) */
    run_spec sc = {.cfg = &cfg, .tc = ec_config(FS_STRATEGY_YAFSDP, FS_PRECISION_FP32, 1, 8), .in = in, .tg = tg,
                   .steps = 5, .save_root = root2, .save_every = 1, .resume_path = three, .lineage = &x};
    sc.tc.steps = 5;
    CHECK_OK(run(2, &sc));
    CHECK(x.seq == 2 && complete_in(root2, "step-00000004") && complete_in(root2, "step-00000005"),
          "the continuation saved steps 4-5 into root2 (seq %lld)", (long long)x.seq);
    st = fs_ckpt_claim(&x, root2, &ck, 0);
    CHECK(st == FS_ERR_USAGE && strstr(fs_error_message(), "holds step 5 of the run resumed from") &&
              strstr(fs_error_message(), "step-00000005, saved after it") && strstr(fs_error_message(), "--new-lineage"),
          "A's step 3 again into root2: %s", fs_error_message());
    CHECK_OK(fs_ckpt_claim(&x, root2, &ck, 1));
    CHECK(!x.continued && strcmp(x.run_id, a.run_id) != 0 && x.tag[0] == '-', "with --new-lineage a branch beside it: tag '%s'",
          x.tag);
    /* --new-lineage: told to, even A's tip starts a new lineage */
    CHECK_OK(fs_ckpt_claim(&x, root, &ck, 1));
    CHECK(!x.continued && strcmp(x.run_id, a.run_id) != 0 && x.tag[0] == '-', "--new-lineage from A's tip: tag '%s'", x.tag);
    fs_ckpt_close(&ck);
    char two[600];
    snprintf(two, sizeof two, "%s/step-00000002", root);
    CHECK_OK(fs_ckpt_open(&ck, two));
    CHECK_OK(fs_ckpt_claim(&x, root, &ck, 0));
    CHECK(!x.continued && x.parent_step == 2, "A's step 2 is not its tip: continued %d", x.continued);
    fs_ckpt_close(&ck);
    /* --new-lineage from scratch beside both: accepted, a name of its own */
    CHECK_OK(fs_ckpt_claim(&x, root, NULL, 1));
    snprintf(tag, sizeof tag, "-%.8s", x.run_id);
    CHECK(!x.continued && x.parent_step == -1 && strcmp(x.tag, tag) == 0 && x.seq == 5, "--new-lineage: tag '%s'", x.tag);
    /* the newest save's manifest damaged: the root does not quietly open an older one, it
     * names the damaged one and the next most recent */
    char manifest[700];
    snprintf(manifest, sizeof manifest, "%s/%s/manifest.json", root, b3name);
    FILE *f = fopen(manifest, "w");
    if (f) {
        fputs("{\"format\": \"flatsh", f);
        fclose(f);
    }
    st = fs_ckpt_open(&ck, root);
    CHECK(st == FS_ERR_FORMAT && strstr(fs_error_message(), b3name) &&
              strstr(fs_error_message(), "the next most recent complete checkpoint is") &&
              strstr(fs_error_message(), "/step-00000003 ("),
          "a damaged newest save: %s", fs_error_message());
    ec_result_free(&sa.res);
    ec_result_free(&sb.res);
    ec_result_free(&sc.res);
}

static void test_checkpoints_without_run_ids(void) {
    char root[512], dir[600];
    root_path(root, sizeof root, "legacy");
    make_checkpoint(root, dir, sizeof dir);
    make_legacy(dir);
    fs_llama_config cfg = ec_model(0);
    fs_ckpt ck;
    CHECK_OK(fs_ckpt_open(&ck, root));
    CHECK(ck.step == 2 && ck.run_id[0] == '\0' && ck.seq == 0 && ck.parent_step == -1,
          "an old checkpoint: step %lld run '%s' seq %lld", (long long)ck.step, ck.run_id, (long long)ck.seq);
    CHECK_OK(try_resume(&cfg, root));
    fs_ckpt_lineage x;
    fs_status st = fs_ckpt_claim(&x, root, NULL, 0);
    CHECK(st == FS_ERR_USAGE && strstr(fs_error_message(), "saved before run ids"), "a fresh run over an old one: %s",
          fs_error_message());
    /* resumed, it is a new lineage (an anonymous one cannot be continued) beside the old names */
    CHECK_OK(fs_ckpt_claim(&x, root, &ck, 0));
    CHECK(!x.continued && x.parent_id[0] == '\0' && x.parent_step == 2 && x.tag[0] == '-',
          "resuming an old checkpoint: continued %d parent '%s' %lld tag '%s'", x.continued, x.parent_id,
          (long long)x.parent_step, x.tag);
    fs_ckpt_close(&ck);
    int32_t in[2 * 8], tg[2 * 8];
    ec_batch(cfg.vocab_size, 2, 8, in, tg);
    run_spec s = {.cfg = &cfg, .tc = ec_config(FS_STRATEGY_YAFSDP, FS_PRECISION_FP32, 1, 8), .in = in, .tg = tg,
                  .steps = 4, .save_root = root, .save_every = 1, .keep = 1, .resume_path = root, .lineage = &x};
    s.tc.steps = 4;
    CHECK_OK(run(2, &s));
    ec_result_free(&s.res);
    /* the anonymous checkpoint is nobody's to prune; the new lineage's newest opens */
    CHECK(complete_in(root, "step-00000002"), "the old checkpoint survives --keep 1 of the new lineage");
    CHECK_OK(fs_ckpt_open(&ck, root));
    CHECK(ck.step == 4 && strcmp(ck.run_id, x.run_id) == 0 && strcmp(ck.parent_id, "") == 0 && ck.parent_step == 2,
          "the root opens step %lld of run '%s'", (long long)ck.step, ck.run_id);
    fs_ckpt_close(&ck);
    /* a manifest with a malformed lineage is refused, naming the field */
    static const char *const bad[] = {
        "\"run_id\":\"xyz\",\"save_seq\":1,\"resumed_from\":null", "run_id",
        "\"run_id\":\"0123456789abcdef0123456789abcdef\",\"resumed_from\":null", "save_seq",
        "\"run_id\":\"0123456789abcdef0123456789abcdef\",\"save_seq\":1", "resumed_from",
        "\"run_id\":\"0123456789abcdef0123456789abcdef\",\"save_seq\":1,\"resumed_from\":{\"run_id\":\"\"}", "resumed_from",
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i += 2) {
        char json[2048];
        snprintf(json, sizeof json,
                 "{\"format\":\"flatshard-checkpoint\",\"version\":1,\"step\":3,\"seed\":\"7\",%s,\"world_size\":1,"
                 "\"strategy\":\"yafsdp\",\"precision\":\"fp32\",\"arrays\":[\"master\",\"adam_m\",\"adam_v\"],"
                 "\"config\":{\"hidden_size\":8,\"intermediate_size\":8,\"num_hidden_layers\":1,"
                 "\"num_attention_heads\":2,\"vocab_size\":4},\"tensors\":[{\"name\":\"a\",\"shape\":[4,2]}],"
                 "\"files\":[{\"name\":\"rank-00000-of-00001.bin\",\"bytes\":96,\"crc32\":1,\"numel\":8,\"ranges\":[[0,0,8]]}]}",
                 bad[i]);
        st = fs_ckpt_parse_manifest(&ck, json, strlen(json), "m.json");
        CHECK(st == FS_ERR_FORMAT && strstr(fs_error_message(), bad[i + 1]), "lineage case %zu: %s", i / 2,
              fs_error_message());
        fs_ckpt_close(&ck);
    }
}

static void test_lock(void) {
    char root[512], path[600], want[64];
    root_path(root, sizeof root, "locked");
    rm_rf(root);
    int fd = -1, fd2 = 7, made = -1;
    CHECK_OK(fs_ckpt_lock(root, &fd, &made));
    CHECK(made == 1, "the lock made the missing root: created = %d", made);
    snprintf(want, sizeof want, "pid %ld on host ", (long)getpid());
    fs_status st = fs_ckpt_lock(root, &fd2, NULL);
    CHECK(st == FS_ERR_USAGE && strstr(fs_error_message(), "is in use by another run") && strstr(fs_error_message(), want) &&
              fd2 == -1,
          "a second writer: %s", fs_error_message());
    fs_ckpt_unlock(fd, NULL);
    /* a lock file left by a process that is gone is no lock */
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
        int f = -1;
        _exit(fs_ckpt_lock(root, &f, NULL) == FS_OK ? 0 : 1); /* exits holding it */
    }
    int status = 0;
    CHECK(pid > 0 && waitpid(pid, &status, 0) == pid && WIFEXITED(status) && WEXITSTATUS(status) == 0,
          "the child took the lock after we released ours");
    snprintf(path, sizeof path, "%s/.lock", root);
    FILE *f = fopen(path, "r");
    char body[256] = "";
    if (f) {
        if (!fgets(body, sizeof body, f)) body[0] = '\0';
        fclose(f);
    }
    snprintf(want, sizeof want, "pid %ld on host ", (long)pid);
    CHECK(strncmp(body, want, strlen(want)) == 0, "the lock file names the child: '%s'", body);
    CHECK_OK(fs_ckpt_lock(root, &fd, &made));
    CHECK(made == 0, "the root was there: created = %d", made);
    fs_ckpt_unlock(fd, NULL);
    struct stat sb;
    CHECK(stat(path, &sb) == 0, "unlock without a root to remove leaves the lock file");

    /* a root the lock made goes with the lock when nothing else is in it, and only then */
    rm_rf(root);
    CHECK_OK(fs_ckpt_lock(root, &fd, &made));
    fs_ckpt_unlock(fd, made ? root : NULL);
    CHECK(made == 1 && stat(root, &sb) != 0 && errno == ENOENT, "an empty root the lock made is removed (created = %d)", made);
    char slash[600];
    snprintf(slash, sizeof slash, "%s/", root); /* --save DIR/ names DIR */
    CHECK_OK(fs_ckpt_lock(slash, &fd, &made));
    fs_ckpt_unlock(fd, made ? slash : NULL);
    CHECK(made == 1 && stat(root, &sb) != 0 && errno == ENOENT, "the same given as DIR/ (created = %d)", made);
    CHECK_OK(fs_ckpt_lock(root, &fd, &made));
    char inside[700];
    snprintf(inside, sizeof inside, "%s/step-00000001", root);
    CHECK(mkdir(inside, 0777) == 0, "mkdir %s", inside);
    fs_ckpt_unlock(fd, made ? root : NULL);
    CHECK(stat(inside, &sb) == 0, "a root that holds a checkpoint stays, with what it holds");
    rm_rf(root);
}

/* A save over a checkpoint of the same name (the lineage's step 2 saved again), killed at
 * every stage of its commit: a complete copy is there at once, recovery leaves exactly one
 * (the old before the swap, the new after it) and nothing suffixed, and resume works. */
static void test_crash_at_every_stage_of_a_same_step_save(void) {
    static const struct {
        const char *stage; /* "": no crash */
        int64_t survivor_seq;
        int keep, entries;
    } cases[] = {
        {"", 3, 0, 2},
        {"manifest", 2, 0, 2},
        {"complete", 2, 0, 2},
        {"swapped", 3, 0, 2},
        {"pruning", 3, 1, 1},
        {"fallback-aside", 2, 0, 2},
        {"fallback-swapped", 3, 0, 2},
    };
    fs_llama_config cfg = ec_model(0);
    int32_t in[2 * 8], tg[2 * 8];
    ec_batch(cfg.vocab_size, 2, 8, in, tg);
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        const char *stage = cases[c].stage[0] ? cases[c].stage : "(none)";
        char root[512], two[600], aside[700];
        root_path(root, sizeof root, "stage");
        rm_rf(root);
        snprintf(two, sizeof two, "%s/step-00000002", root);
        snprintf(aside, sizeof aside, "%s.old", two);
        fs_ckpt_lineage lin;
        CHECK_OK(fs_ckpt_claim(&lin, root, NULL, 0));
        run_spec s = {.cfg = &cfg, .tc = ec_config(FS_STRATEGY_YAFSDP, FS_PRECISION_FP32, 1, 8), .in = in, .tg = tg,
                      .steps = 2, .save_root = root, .save_every = 1, .lineage = &lin};
        s.tc.steps = 2;
        CHECK_OK(run(2, &s));
        ec_result_free(&s.res);
        fflush(stdout);
        pid_t pid = fork();
        if (pid == 0) { /* resumes step 2 and saves it again as the same lineage */
            char fault[96];
            snprintf(fault, sizeof fault, "crash-in-save-stage:%s:2", cases[c].stage);
            if (cases[c].stage[0]) setenv("FLATSHARD_FAULT", fault, 1);
            run_spec again = {.cfg = &cfg, .tc = ec_config(FS_STRATEGY_YAFSDP, FS_PRECISION_FP32, 1, 8), .in = in,
                              .tg = tg, .steps = 2, .save_root = root, .save_end = 1, .keep = cases[c].keep,
                              .resume_path = root, .lineage = &lin};
            again.tc.steps = 2;
            _exit(run(2, &again) == FS_OK ? 0 : 1);
        }
        int status = 0;
        CHECK(pid > 0 && waitpid(pid, &status, 0) == pid, "%s: wait", stage);
        if (cases[c].stage[0])
            CHECK(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL, "%s: the save should have been killed (status %d)",
                  stage, status);
        else
            CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0, "the uninterrupted save failed (status %d)", status);
        /* before any recovery, a complete copy exists */
        fs_ckpt ck;
        const char *copy = strcmp(cases[c].stage, "fallback-aside") == 0 ? aside : two;
        fs_status st = fs_ckpt_open(&ck, copy);
        CHECK(st == FS_OK, "%s: no complete copy at %s: %s", stage, copy, fs_error_message());
        for (int r = 0; st == FS_OK && r < ck.world; r++) CHECK_OK(fs_ckpt_verify_file(&ck, r));
        fs_ckpt_close(&ck);
        int repaired = 0;
        CHECK_OK(fs_ckpt_recover(root, &repaired));
        CHECK((repaired > 0) == (cases[c].stage[0] != '\0'), "%s: recovery handled %d entries", stage, repaired);
        CHECK(count_entries(root, "step-.*[.]") == 0, "%s: suffixed leftovers remain after recovery", stage);
        CHECK(count_entries(root, "step-") == cases[c].entries, "%s: %d checkpoints, expected %d", stage,
              count_entries(root, "step-"), cases[c].entries);
        st = fs_ckpt_open(&ck, root);
        CHECK(st == FS_OK && ck.step == 2 && ck.seq == cases[c].survivor_seq, "%s: the root opens step %lld seq %lld, expected seq %lld",
              stage, (long long)ck.step, (long long)ck.seq, (long long)cases[c].survivor_seq);
        for (int r = 0; st == FS_OK && r < ck.world; r++) CHECK_OK(fs_ckpt_verify_file(&ck, r));
        fs_ckpt_close(&ck);
        run_spec on = {.cfg = &cfg, .tc = ec_config(FS_STRATEGY_YAFSDP, FS_PRECISION_FP32, 1, 8), .in = in, .tg = tg,
                       .steps = 3, .resume_path = root};
        on.tc.steps = 3;
        CHECK(run(2, &on) == FS_OK && on.first_step == 3, "%s: resume after recovery: %s", stage, fs_error_message());
        ec_result_free(&on.res);
    }
}

/* ------------------------------------------------------------------ model sources */

/* Writes the weights of w as safetensors in dtype (F32, BF16 or F16), in `files` shard files
 * with an index when files > 1, into dir with a config.json. */
static void write_hf(const fs_weights *w, const char *dir, fs_st_dtype dtype, int files) {
    const fs_layout *l = w->layout;
    mkdir(dir, 0777);
    char path[700], cfg[4096];
    CHECK(fs_llama_config_to_json(&l->cfg, "float32", cfg, sizeof cfg) > 0, "config");
    snprintf(path, sizeof path, "%s/config.json", dir);
    FILE *f = fopen(path, "w");
    fputs(cfg, f);
    fclose(f);
    int per = (l->n_tensors + files - 1) / files;
    FILE *index = NULL;
    if (files > 1) {
        snprintf(path, sizeof path, "%s/model.safetensors.index.json", dir);
        index = fopen(path, "w");
        fputs("{\"metadata\": {}, \"weight_map\": {", index);
    }
    for (int k = 0; k < files; k++) {
        int t0 = k * per, t1 = t0 + per < l->n_tensors ? t0 + per : l->n_tensors;
        fs_st_entry e[256];
        const void *pieces[256];
        size_t bytes[256];
        uint16_t *narrow[256] = {0};
        int n = 0;
        char name[64];
        if (files > 1) snprintf(name, sizeof name, "model-%05d-of-%05d.safetensors", k + 1, files);
        else snprintf(name, sizeof name, "model.safetensors");
        for (int t = t0; t < t1; t++) {
            const fs_tensor_info *ti = &l->tensors[t];
            const float *src = fs_weights_unit(w, ti->unit) + ti->offset;
            if (dtype == FS_ST_F32) {
                pieces[n] = src;
                bytes[n] = (size_t)ti->numel * 4;
            } else {
                narrow[n] = malloc((size_t)ti->numel * 2);
                for (int64_t i = 0; i < ti->numel; i++) {
                    if (dtype == FS_ST_BF16) narrow[n][i] = fs_fp32_to_bf16(src[i]);
                    else { /* F16 of small values: exact for the ones chosen below */
                        union { float f; uint32_t u; } v = {.f = src[i]};
                        uint32_t sign = (v.u >> 16) & 0x8000u, ex = (v.u >> 23) & 0xff, m = (v.u >> 13) & 0x3ff;
                        narrow[n][i] = (uint16_t)(ex == 0 ? sign : sign | ((ex - 112) << 10) | m);
                    }
                }
                pieces[n] = narrow[n];
                bytes[n] = (size_t)ti->numel * 2;
            }
            e[n] = (fs_st_entry){.name = ti->name, .dtype = dtype, .ndim = ti->ndim,
                                 .shape = {ti->shape[0], ti->ndim == 2 ? ti->shape[1] : 0},
                                 .n_pieces = 1, .pieces = &pieces[n], .piece_bytes = &bytes[n]};
            if (index) fprintf(index, "%s\"%s\": \"%s\"", t ? ", " : "", ti->name, name);
            n++;
        }
        snprintf(path, sizeof path, "%s/%s", dir, name);
        CHECK_OK(fs_safetensors_write(path, e, n, NULL));
        for (int i = 0; i < n; i++) free(narrow[i]);
    }
    if (index) {
        fputs("}}", index);
        fclose(index);
    }
}

/* A test value for element k of whole tensor `name`: a multiple of 1/64 in [-1, 1), exactly
 * representable in F16 and BF16, independent of how a layout chunks the tensor. */
static float test_value(const char *name, int64_t k) {
    uint64_t h = 1469598103934665603ULL;
    for (const char *c = name; *c; c++) h = (h ^ (unsigned char)*c) * 1099511628211ULL;
    return (float)((int)fs_rand_below(h, 0, (uint64_t)k, 128) - 64) / 64.0f;
}

/* The first tensor piece of w whose elements are not test_value's. */
static const char *first_wrong(const fs_weights *w) {
    const fs_layout *l = w->layout;
    for (int t = 0; t < l->n_tensors; t++) {
        const fs_tensor_info *ti = &l->tensors[t];
        int64_t origin = ti->ndim == 1 ? 0 : ti->row0 * ti->shape[1];
        const float *x = fs_weights_unit(w, ti->unit) + ti->offset;
        for (int64_t i = 0; i < ti->numel; i++)
            if (x[i] != test_value(ti->name, origin + i)) return ti->name;
    }
    return NULL;
}

static void test_init_from_safetensors_and_hf_directories(void) {
    fs_llama_config cfg = ec_model(0);
    fs_layout l;
    CHECK_OK(fs_layout_init(&l, &cfg, 0));
    fs_mem *mem = NULL;
    CHECK_OK(fs_mem_init(&mem, 0));
    fs_weights w;
    CHECK_OK(fs_weights_init(&w, &l, mem, FS_MEM_OTHER, "source"));
    for (int t = 0; t < l.n_tensors; t++) /* one piece per tensor in this layout */
        for (int64_t i = 0; i < l.tensors[t].numel; i++)
            fs_weights_unit(&w, l.tensors[t].unit)[l.tensors[t].offset + i] = test_value(l.tensors[t].name, i);
    static const struct {
        fs_st_dtype dtype;
        int files;
        const char *dir;
    } cases[] = {{FS_ST_F32, 1, "hf32"}, {FS_ST_BF16, 3, "hfbf16"}, {FS_ST_F16, 2, "hf16"}};
    int32_t in[2 * 8], tg[2 * 8];
    ec_batch(cfg.vocab_size, 2, 8, in, tg);
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        char dir[512];
        root_path(dir, sizeof dir, cases[c].dir);
        write_hf(&w, dir, cases[c].dtype, cases[c].files);
        for (int W = 1; W <= 3; W += 2) {
            run_spec s = {.cfg = &cfg, .tc = ec_config(FS_STRATEGY_YAFSDP, FS_PRECISION_FP32, 1, 8), .in = in,
                          .tg = tg, .steps = 0, .init_path = dir};
            CHECK_OK(run(W, &s));
            /* the trainer's layout splits the vocabulary in chunks of 13 rows: every piece
             * must still hold its own rows of the whole tensor */
            const char *d = s.res.weights.data ? first_wrong(&s.res.weights) : "all";
            CHECK(d == NULL, "%s W=%d: loaded weights differ in %s", fs_st_dtype_name(cases[c].dtype), W, d);
            ec_result_free(&s.res);
        }
    }
    /* a source for another model is refused with the tensor named */
    fs_llama_config other = cfg;
    other.hidden_size = 64;
    other.num_attention_heads = 8;
    run_spec s = {.cfg = &other, .tc = ec_config(FS_STRATEGY_YAFSDP, FS_PRECISION_FP32, 1, 8), .in = in, .tg = tg,
                  .steps = 0};
    char dir[512];
    root_path(dir, sizeof dir, "hf32");
    s.init_path = dir;
    CHECK(run(1, &s) == FS_ERR_FORMAT && strstr(fs_error_message(), "must have shape"), "wrong model: %s",
          fs_error_message());
    ec_result_free(&s.res);
    fs_mem_free(mem);
    fs_layout_free(&l);
}

int main(void) {
    snprintf(tmpdir, sizeof tmpdir, "/tmp/flatshard-test-ckpt-XXXXXX");
    if (!mkdtemp(tmpdir)) {
        perror("mkdtemp");
        return 1;
    }
    RUN(test_resume_is_bit_exact);
    RUN(test_resume_at_another_world_size_or_strategy);
    RUN(test_keep_and_crashed_saves);
    RUN(test_damaged_checkpoints_are_refused);
    RUN(test_hostile_manifests);
    RUN(test_manifest_names_its_data);
    RUN(test_lineages_branches_and_keep);
    RUN(test_checkpoints_without_run_ids);
    RUN(test_lock);
    RUN(test_crash_at_every_stage_of_a_same_step_save);
    RUN(test_init_from_safetensors_and_hf_directories);
    rm_rf(tmpdir);
    return fs_test_summary();
}
