/*
 * tests/test_export.c — the final save written by every rank at its offsets, and export.
 *
 *   - the header fs_st_header_build computes is exactly what the streaming writer writes
 *     (length prefix, JSON, padding, offsets), so files written in parts can be identical;
 *   - the one-file-many-writers protocol: writes past the data area are refused, a writer
 *     that cannot see the file says the filesystem must be shared, a file of the wrong size
 *     is never renamed into place, discard removes the temporary file;
 *   - fs_weights_save_sharded on W = 1..5 in-process ranks, every strategy, tied and untied,
 *     with vocabulary chunks, writes the same bytes as gathering the model and writing it
 *     with fs_weights_save_safetensors, and takes exactly the plan's staging bytes;
 *   - a failed write on one rank fails every rank, leaves no temporary file and leaves the
 *     previous file untouched;
 *   - export removes a stale model.safetensors.index.json and the shard files it names, and
 *     nothing else (names outside the directory, model.safetensors, non-safetensors files).
 */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "engine_checks.h"
#include "flatshard/safetensors.h"
#include "flatshard/source.h"
#include "harness.h"

#define MAX_W 5
static char tmpdir[256];

static void path_in(char *buf, size_t n, const char *name) { snprintf(buf, n, "%s/%s", tmpdir, name); }

static int exists(const char *path) {
    struct stat sb;
    return stat(path, &sb) == 0;
}

/* Whether a temporary file of a save to path is left: "<path>.<id>.tmp" (fs_st_parallel). */
static int tmp_left(const char *path) {
    char dir[512];
    snprintf(dir, sizeof dir, "%s", path);
    char *slash = strrchr(dir, '/');
    const char *base = slash ? slash + 1 : path;
    if (slash) *slash = '\0';
    DIR *d = opendir(slash ? dir : ".");
    if (!d) return 0;
    int left = 0;
    for (struct dirent *de; (de = readdir(d)) && !left;) {
        size_t n = strlen(de->d_name), b = strlen(base);
        left = n > b + 5 && strncmp(de->d_name, base, b) == 0 && de->d_name[b] == '.' &&
               strcmp(de->d_name + n - 4, ".tmp") == 0;
    }
    closedir(d);
    return left;
}

/* The whole file into a malloc'ed buffer (*n bytes), or NULL. */
static char *slurp(const char *path, size_t *n) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long len = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *buf = len >= 0 ? malloc((size_t)len + 1) : NULL;
    *n = buf ? fread(buf, 1, (size_t)len, f) : 0;
    fclose(f);
    return buf;
}

static int same_file(const char *a, const char *b) {
    size_t na = 0, nb = 0;
    char *pa = slurp(a, &na), *pb = slurp(b, &nb);
    int same = pa && pb && na == nb && memcmp(pa, pb, na) == 0;
    free(pa);
    free(pb);
    return same;
}

static void write_text(const char *path, const char *text) {
    FILE *f = fopen(path, "w");
    if (f) {
        fputs(text, f);
        fclose(f);
    }
}

/* ------------------------------------------------------------------ the header */

static void test_header_is_what_the_writer_writes(void) {
    float a[6] = {1, 2, 3, 4, 5, 6}, b[3] = {7, 8, 9};
    const void *pa[] = {a}, *pb[] = {b};
    size_t ba[] = {sizeof a}, bb[] = {sizeof b};
    fs_st_entry e[2] = {
        {.name = "x.weight", .dtype = FS_ST_F32, .ndim = 2, .shape = {2, 3}, .n_pieces = 1, .pieces = pa, .piece_bytes = ba},
        {.name = "y \"quoted\"", .dtype = FS_ST_F32, .ndim = 1, .shape = {3}, .n_pieces = 1, .pieces = pb, .piece_bytes = bb},
    };
    const char *meta[] = {"format", "pt", "k", "line\nbreak", NULL};
    char path[512];
    path_in(path, sizeof path, "header.safetensors");
    CHECK_OK(fs_safetensors_write(path, e, 2, meta));
    fs_st_header h;
    CHECK_OK(fs_st_header_build(&h, e, 2, meta));
    size_t n = 0;
    char *file = slurp(path, &n);
    CHECK(file && n == h.size + h.data_bytes, "file %zu bytes, header %zu + data %llu", n, h.size,
          (unsigned long long)h.data_bytes);
    CHECK(file && n >= h.size && memcmp(file, h.bytes, h.size) == 0, "the header bytes differ from the file's");
    CHECK(h.size % 8 == 0, "the data area starts at %zu, not 8-aligned", h.size);
    uint64_t len = 0;
    for (int i = 0; i < 8; i++) len |= (uint64_t)(uint8_t)h.bytes[i] << (8 * i);
    CHECK(len == h.size - 8, "length prefix %llu for %zu header bytes", (unsigned long long)len, h.size);
    CHECK(h.data_bytes == sizeof a + sizeof b, "data bytes %llu", (unsigned long long)h.data_bytes);
    fs_safetensors st = {0};
    CHECK_OK(fs_safetensors_open(&st, path));
    for (int i = 0; i < 2 && st.n_tensors == 2; i++)
        CHECK(st.tensors[i].begin == h.begin[i], "entry %d begins at %llu, the file says %llu", i,
              (unsigned long long)h.begin[i], (unsigned long long)st.tensors[i].begin);
    CHECK(st.data_start == h.size, "data start %llu, header size %zu", (unsigned long long)st.data_start, h.size);
    fs_safetensors_close(&st);
    fs_st_header_free(&h);
    fs_st_header_free(&h); /* idempotent */
    free(file);
}

/* ------------------------------------------------------------------ many writers */

static void test_parallel_protocol(void) {
    float a[4] = {1, 2, 3, 4}, b[2] = {5, 6};
    const void *pa[] = {a}, *pb[] = {b};
    size_t ba[] = {sizeof a}, bb[] = {sizeof b};
    fs_st_entry e[2] = {
        {.name = "a", .dtype = FS_ST_F32, .ndim = 1, .shape = {4}, .n_pieces = 1, .pieces = pa, .piece_bytes = ba},
        {.name = "b", .dtype = FS_ST_F32, .ndim = 1, .shape = {2}, .n_pieces = 1, .pieces = pb, .piece_bytes = bb},
    };
    char ref[512], path[512], tmp[600];
    path_in(ref, sizeof ref, "ref.safetensors");
    path_in(path, sizeof path, "parts.safetensors");
    CHECK_OK(fs_safetensors_write(ref, e, 2, NULL));
    fs_st_header h;
    CHECK_OK(fs_st_header_build(&h, e, 2, NULL));

    /* a writer that cannot see the file is told the filesystem must be shared */
    fs_st_parallel *p = NULL;
    CHECK(fs_st_parallel_open(&p, path, 1, &h) == FS_ERR_IO && strstr(fs_error_message(), "share") && !p,
          "open without create: %s", fs_error_message());

    /* two writers, in reverse order, one element at a time for the second */
    uint64_t id = 0;
    int owner = -1;
    CHECK_OK(fs_st_parallel_create(path, &h, &id, &owner));
    CHECK(id != 0 && fs_st_parallel_tmp_name(tmp, sizeof tmp, path, id), "the id %llx names a file",
          (unsigned long long)id);
    struct stat sb;
    CHECK(stat(tmp, &sb) == 0 && (uint64_t)sb.st_size == h.size + h.data_bytes, "created at %lld bytes",
          (long long)sb.st_size);
    fs_st_parallel *w1 = NULL, *w2 = NULL;
    CHECK_OK(fs_st_parallel_open(&w1, path, id, &h));
    CHECK_OK(fs_st_parallel_open(&w2, path, id, &h));
    if (w1 && w2) {
        CHECK_OK(fs_st_parallel_write(w2, h.begin[1], b, sizeof b));
        for (int i = 3; i >= 0; i--) CHECK_OK(fs_st_parallel_write(w1, h.begin[0] + 4 * (uint64_t)i, &a[i], 4));
        /* one byte past the data area, and an offset past it: refused */
        CHECK(fs_st_parallel_write(w1, h.data_bytes - 4, a, 5) == FS_ERR_INTERNAL, "a write past the end was accepted");
        CHECK(fs_st_parallel_write(w1, h.data_bytes + 1, a, 0) == FS_ERR_INTERNAL, "an offset past the end was accepted");
        CHECK(strstr(fs_error_message(), "past the data area") != NULL, "message: %s", fs_error_message());
    }
    CHECK_OK(fs_st_parallel_close(w1));
    CHECK_OK(fs_st_parallel_close(w2));
    CHECK_OK(fs_st_parallel_close(NULL));
    CHECK(stat(tmp, &sb) == 0 && (uint64_t)sb.st_size == h.size + h.data_bytes,
          "the refused writes changed the size to %lld", (long long)sb.st_size);
    CHECK_OK(fs_st_parallel_commit(path, id, &h, owner));
    CHECK(same_file(path, ref), "the file written in parts differs from the streamed one");
    CHECK(!exists(tmp), "the temporary file is left after the commit");

    /* a temporary file of the wrong size is not renamed over the good file, and goes */
    CHECK_OK(fs_st_parallel_create(path, &h, &id, &owner));
    fs_st_parallel_tmp_name(tmp, sizeof tmp, path, id);
    CHECK(truncate(tmp, (off_t)(h.size + 4)) == 0, "truncate");
    CHECK(fs_st_parallel_commit(path, id, &h, owner) == FS_ERR_IO && strstr(fs_error_message(), "expected"),
          "a short file was committed: %s", fs_error_message());
    CHECK(!exists(tmp), "a refused commit leaves the temporary file");
    CHECK(same_file(path, ref), "a refused commit changed the file in place");

    /* discard */
    CHECK_OK(fs_st_parallel_create(path, &h, &id, &owner));
    fs_st_parallel_tmp_name(tmp, sizeof tmp, path, id);
    fs_st_parallel_discard(path, id, owner);
    CHECK(!exists(tmp), "discard leaves the temporary file");
    CHECK(same_file(path, ref), "discard changed the file in place");

    /* two saves to the same path at once (two runs with the same --out): the second's create
     * must not truncate or share the first's file. Save 1 writes a, b; save 2 is created in
     * the middle of it and writes other values; each commit puts one save's file in whole.
     * With one shared temporary name save 2's create emptied save 1's file, save 1's commit
     * put save 2's bytes in, and save 2's commit found no file. */
    float a2[4] = {-1, -2, -3, -4}, b2[2] = {-5, -6};
    const void *pa2[] = {a2}, *pb2[] = {b2};
    fs_st_entry e2[2] = {e[0], e[1]};
    e2[0].pieces = pa2;
    e2[1].pieces = pb2;
    char ref2[512], tmp1[600], tmp2[600];
    path_in(ref2, sizeof ref2, "ref2.safetensors");
    CHECK_OK(fs_safetensors_write(ref2, e2, 2, NULL));
    uint64_t id1 = 0, id2 = 0;
    int owner1 = -1, owner2 = -1;
    fs_st_parallel *s1 = NULL, *s2 = NULL;
    CHECK_OK(fs_st_parallel_create(path, &h, &id1, &owner1));
    CHECK_OK(fs_st_parallel_open(&s1, path, id1, &h));
    if (s1) CHECK_OK(fs_st_parallel_write(s1, h.begin[0], a, sizeof a));
    /* save 2's create sweeps abandoned temporaries of path: save 1's, locked, is not one */
    CHECK_OK(fs_st_parallel_create(path, &h, &id2, &owner2));
    CHECK(id1 != id2, "two saves got the same temporary file (id %llx)", (unsigned long long)id1);
    CHECK_OK(fs_st_parallel_open(&s2, path, id2, &h));
    if (s2) {
        CHECK_OK(fs_st_parallel_write(s2, h.begin[0], a2, sizeof a2));
        CHECK_OK(fs_st_parallel_write(s2, h.begin[1], b2, sizeof b2));
    }
    if (s1) CHECK_OK(fs_st_parallel_write(s1, h.begin[1], b, sizeof b));
    CHECK_OK(fs_st_parallel_close(s1));
    CHECK_OK(fs_st_parallel_close(s2));
    CHECK_OK(fs_st_parallel_commit(path, id1, &h, owner1));
    CHECK(same_file(path, ref), "the first save's commit put in another file than its own");
    CHECK_OK(fs_st_parallel_commit(path, id2, &h, owner2));
    CHECK(same_file(path, ref2), "the second save's commit put in another file than its own");
    fs_st_parallel_tmp_name(tmp1, sizeof tmp1, path, id1);
    fs_st_parallel_tmp_name(tmp2, sizeof tmp2, path, id2);
    CHECK(!exists(tmp1) && !exists(tmp2), "a temporary file is left after both commits");
    fs_st_header_free(&h);
}

/* ------------------------------------------------------------------ the sharded save */

typedef struct save_spec {
    const fs_llama_config *cfg;
    fs_train_config tc;
    const int32_t *in, *tg;
    const char *ref, *path;
    fs_status status[MAX_W];
    size_t staging_peak[MAX_W], staging_plan[MAX_W];
} save_spec;

static fs_status save_rank(fs_comm *comm, void *arg) {
    save_spec *s = arg;
    const int rank = fs_comm_rank(comm);
    fs_trainer t;
    FS_TRY(fs_trainer_init(&t, s->cfg, &s->tc, NULL, comm, fs_comm_mem(comm)));
    fs_step_stats ss;
    fs_status st = fs_trainer_step_on_batch(&t, s->in, s->tg, &ss); /* weights no longer the init's */
    fs_mem *wmem = NULL;
    fs_weights w = {0};
    if (st == FS_OK && s->ref) {
        st = fs_mem_init(&wmem, 0);
        if (st == FS_OK) st = fs_weights_init(&w, &t.layout, wmem, FS_MEM_OTHER, "gathered");
        if (st == FS_OK) st = fs_trainer_gather_weights(&t, &w);
        if (st == FS_OK && rank == 0) st = fs_weights_save_safetensors(&w, s->ref);
        st = fs_engine_agree(t.engine, st);
    }
    fs_mem *smem = NULL;
    if (st == FS_OK) st = fs_mem_init(&smem, 0);
    if (st == FS_OK) {
        st = fs_weights_save_sharded(t.engine, smem, s->path);
        s->staging_peak[rank] = fs_mem_get_stats(smem).total_peak;
        s->staging_plan[rank] = t.plan.save_bytes;
    }
    s->status[rank] = st;
    fs_mem_free(smem);
    fs_weights_free(&w, wmem);
    fs_mem_free(wmem);
    fs_trainer_free(&t);
    return st;
}

static fs_status run_save(int W, save_spec *s) { return ec_run_ranks(W, save_rank, s); }

static void test_sharded_save_equals_the_gathered_one(void) {
    int32_t in[MAX_W * 8], tg[MAX_W * 8];
    const fs_strategy strategies[] = {FS_STRATEGY_YAFSDP, FS_STRATEGY_DDP, FS_STRATEGY_ZERO1, FS_STRATEGY_ZERO2,
                                      FS_STRATEGY_ZERO3_PARAM};
    char ref[512], path[512];
    path_in(ref, sizeof ref, "gathered.safetensors");
    path_in(path, sizeof path, "sharded.safetensors");
    int cases = 0;
    for (int tied = 0; tied < 2; tied++) {
        fs_llama_config cfg = ec_model(tied);
        ec_batch(cfg.vocab_size, MAX_W, 8, in, tg);
        for (int W = 1; W <= MAX_W; W++)
            for (size_t si = 0; si < sizeof strategies / sizeof *strategies; si++)
                for (int p = 0; p < FS_PRECISION_N; p++) {
                    /* fewer bf16 cases: the file holds the fp32 master either way */
                    if (p == FS_PRECISION_BF16 && W != 3) continue;
                    unlink(ref);
                    unlink(path);
                    save_spec s = {.cfg = &cfg, .tc = ec_config(strategies[si], (fs_precision)p, 1, 8),
                                   .in = in, .tg = tg, .ref = ref, .path = path};
                    fs_status st = run_save(W, &s);
                    CHECK(st == FS_OK, "W=%d %s %s tied=%d: %s", W, fs_strategy_name(strategies[si]),
                          fs_precision_name((fs_precision)p), tied, fs_error_message());
                    CHECK(st != FS_OK || same_file(ref, path), "W=%d %s %s tied=%d: the files differ", W,
                          fs_strategy_name(strategies[si]), fs_precision_name((fs_precision)p), tied);
                    for (int r = 0; r < W; r++) {
                        CHECK(s.staging_peak[r] == s.staging_plan[r],
                              "W=%d %s rank %d: staging peak %zu bytes, the plan says %zu", W,
                              fs_strategy_name(strategies[si]), r, s.staging_peak[r], s.staging_plan[r]);
                        /* ddp: rank 0 writes everything, the others nothing */
                        if (strategies[si] == FS_STRATEGY_DDP && r > 0)
                            CHECK(s.staging_plan[r] == 0, "ddp rank %d plans %zu staging bytes", r, s.staging_plan[r]);
                        else
                            CHECK(s.staging_plan[r] > 0 && s.staging_plan[r] <= FS_SAVE_STAGING_BYTES,
                                  "W=%d %s rank %d plans %zu staging bytes", W, fs_strategy_name(strategies[si]), r,
                                  s.staging_plan[r]);
                    }
                    cases++;
                }
    }
    CHECK(!tmp_left(path), "a temporary file is left");
    fs_test_note("%d cases", cases);
}

static void test_a_failed_write_fails_every_rank(void) {
    fs_llama_config cfg = ec_model(0);
    int32_t in[MAX_W * 8], tg[MAX_W * 8];
    ec_batch(cfg.vocab_size, MAX_W, 8, in, tg);
    char path[512], keep[512];
    path_in(path, sizeof path, "faulty.safetensors");
    path_in(keep, sizeof keep, "faulty.keep");
    save_spec s = {.cfg = &cfg, .tc = ec_config(FS_STRATEGY_YAFSDP, FS_PRECISION_FP32, 1, 8), .in = in, .tg = tg,
                   .path = path};
    CHECK_OK(run_save(3, &s));
    CHECK(rename(path, keep) == 0 && link(keep, path) == 0, "copy");
    /* a different run's weights would replace it: a new seed */
    s.tc.seed = 8;
    for (int bad = 0; bad < 3; bad++) {
        char fault[64];
        snprintf(fault, sizeof fault, "write-fail-in-final-save:%d", bad);
        setenv("FLATSHARD_FAULT", fault, 1);
        fs_status st = run_save(3, &s);
        unsetenv("FLATSHARD_FAULT");
        CHECK(st == FS_ERR_IO, "fault on rank %d: %s: %s", bad, fs_status_name(st), fs_error_message());
        /* every rank fails (the others with the failing rank's error, or, when that rank has
         * already returned and so ended the in-process group, with the group's failure) */
        for (int r = 0; r < 3; r++)
            CHECK(s.status[r] != FS_OK, "fault on rank %d: rank %d returned ok", bad, r);
        CHECK(strstr(fs_error_message(), "injected fault") != NULL, "message: %s", fs_error_message());
        CHECK(!tmp_left(path), "fault on rank %d: the temporary file is left", bad);
        CHECK(same_file(path, keep), "fault on rank %d: the previous file changed", bad);
    }
    CHECK_OK(run_save(3, &s));
    CHECK(!same_file(path, keep), "without the fault the new weights replace the old");
}

/* ------------------------------------------------------------------ export and a stale index */

static void test_export_removes_a_stale_index(void) {
    char model[512], dir[512], file[700], outside[512];
    path_in(model, sizeof model, "sharded.safetensors"); /* the sharded save test's output */
    path_in(dir, sizeof dir, "hf");
    path_in(outside, sizeof outside, "outside.safetensors");
    mkdir(dir, 0777);
    const char *kept[] = {"notes.txt", "model-x.bin"};
    for (int round = 0; round < 3; round++) {
        snprintf(file, sizeof file, "%s/model.safetensors.index.json", dir);
        int want_removed = 0;
        if (round == 0) { /* shards it names, names it must not touch */
            write_text(file, "{\"metadata\": {}, \"weight_map\": {\"a\": \"model-00001-of-00002.safetensors\", "
                             "\"b\": \"model-00002-of-00002.safetensors\", \"c\": \"model-00001-of-00002.safetensors\", "
                             "\"d\": \"../outside.safetensors\", \"e\": \"model.safetensors\", \"f\": \"notes.txt\", "
                             "\"g\": \"model-x.bin\", \"h\": \"model-00003-of-00002.safetensors\"}}");
            want_removed = 3; /* the index and the two shards that exist */
        } else if (round == 1) { /* not JSON: the index still goes */
            write_text(file, "{ not json");
            want_removed = 1;
        }
        char shard[2][700];
        for (int i = 0; i < 2; i++) {
            snprintf(shard[i], sizeof shard[i], "%s/model-0000%d-of-00002.safetensors", dir, i + 1);
            write_text(shard[i], "old shard");
        }
        write_text(outside, "not in the directory");
        for (int i = 0; i < 2; i++) {
            snprintf(file, sizeof file, "%s/%s", dir, kept[i]);
            write_text(file, "keep me");
        }
        fs_source *src = NULL;
        uint64_t bytes = 0;
        int removed = -1;
        CHECK_OK(fs_source_open(&src, model));
        if (src) CHECK_OK(fs_source_export_hf(src, dir, FS_ST_F32, &bytes, &removed));
        fs_source_close(src);
        CHECK(removed == want_removed, "round %d: %d files removed, expected %d", round, removed, want_removed);
        snprintf(file, sizeof file, "%s/model.safetensors.index.json", dir);
        CHECK(!exists(file), "round %d: the index is still there", round);
        for (int i = 0; i < 2; i++)
            CHECK(exists(shard[i]) == (round != 0), "round %d: shard %d %s", round, i + 1,
                  round == 0 ? "is still there" : "was removed without an index naming it");
        CHECK(exists(outside), "round %d: a file outside the directory was removed", round);
        for (int i = 0; i < 2; i++) {
            snprintf(file, sizeof file, "%s/%s", dir, kept[i]);
            CHECK(exists(file), "round %d: %s was removed", round, kept[i]);
        }
        snprintf(file, sizeof file, "%s/model.safetensors", dir);
        CHECK(same_file(file, model), "round %d: the exported model.safetensors differs from its source", round);
        /* the directory now reads as the new model */
        fs_source *back = NULL;
        CHECK_OK(fs_source_open(&back, dir));
        CHECK(back && strstr(fs_source_describe(back), "(1 safetensors file)") != NULL, "round %d: reads as %s", round,
              back ? fs_source_describe(back) : "nothing");
        fs_source_close(back);
    }
}

int main(void) {
    snprintf(tmpdir, sizeof tmpdir, "/tmp/flatshard-test-export-XXXXXX");
    if (!mkdtemp(tmpdir)) {
        perror("mkdtemp");
        return 1;
    }
    RUN(test_header_is_what_the_writer_writes);
    RUN(test_parallel_protocol);
    RUN(test_sharded_save_equals_the_gathered_one);
    RUN(test_a_failed_write_fails_every_rank);
    RUN(test_export_removes_a_stale_index);
    char cmd[400];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpdir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", tmpdir);
    return fs_test_summary();
}
