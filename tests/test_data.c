/*
 * tests/test_data.c — the byte-level tokenizer, token files (llm.c layout, byte by byte),
 * hostile and broken files, vocabulary and length checks, the sampler (reproducibility,
 * ranges, the shift by one, slices of a batch equal to the whole batch), sequential windows,
 * tokenizing several text files into one token file, and streams of many shards (order,
 * boundaries, patterns and lists, refusals naming the file, more than 2^31 tokens in all).
 *
 * Every file lives in a mkdtemp directory that is removed at the end. Files over 2 GiB are
 * sparse (ftruncate plus a few pwrites), so they cost no disk space and no time.
 */
#define _FILE_OFFSET_BITS 64
#include "flatshard/data.h"
#include "harness.h"
#include "testdir.h"

#include <dirent.h>
#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <stdint.h>
#include <sys/stat.h>
#include <unistd.h>

/* Reads at most cap bytes of path; returns the file's size (-1 if it cannot be opened). */
static long long read_file(const char *path, uint8_t *buf, size_t cap) {
    FILE *f = fopen(path, "rb");
    if (!f) return -1;
    size_t got = fread(buf, 1, cap, f);
    fseek(f, 0, SEEK_END);
    long long size = ftell(f);
    fclose(f);
    (void)got;
    return size;
}

static int file_exists(const char *path) {
    struct stat st;
    return stat(path, &st) == 0;
}

static void put_le32(uint8_t *p, uint32_t u) {
    for (int i = 0; i < 4; i++) p[i] = (uint8_t)(u >> (8 * i));
}

static uint32_t get_le32(const uint8_t *p) {
    return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) |
           ((uint32_t)p[3] << 24);
}

/* A 1024-byte header as llm.c (vocab 0) or flatshard writes it. */
static void make_header(uint8_t *h, uint32_t magic, uint32_t version, uint32_t n,
                        uint32_t vocab) {
    memset(h, 0, 1024);
    put_le32(h, magic);
    put_le32(h + 4, version);
    put_le32(h + 8, n);
    put_le32(h + 12, vocab);
}

/* Writes a header with the given magic followed by `payload_bytes` bytes of tokens. */
static void write_token_file_magic(const char *path, uint32_t magic, uint32_t version,
                                   uint32_t n, uint32_t vocab, const void *payload,
                                   size_t payload_bytes) {
    static uint8_t buf[1024 + 4096];
    make_header(buf, magic, version, n, vocab);
    if (payload_bytes > 4096) abort();
    if (payload_bytes) memcpy(buf + 1024, payload, payload_bytes);
    write_file(path, buf, 1024 + payload_bytes);
}

static void write_token_file(const char *path, uint32_t version, uint32_t n, uint32_t vocab,
                             const void *payload, size_t payload_bytes) {
    write_token_file_magic(path, FS_TOKENFILE_MAGIC, version, n, vocab, payload, payload_bytes);
}

static int is_closed(const fs_token_data *d) {
    return d->map == NULL && d->tokens == NULL && d->n_tokens == 0 && d->map_bytes == 0;
}

/* Opening path must fail with `want`, a message naming the file and holding `words`, and a
 * closed struct. */
#define CHECK_OPEN_FAILS(path, want, words)                                                 \
    do {                                                                                    \
        const char *p_ = (path);                                                            \
        fs_token_data d_;                                                                   \
        memset(&d_, 0xAB, sizeof d_);                                                       \
        fs_status st_ = fs_token_data_open(&d_, p_);                                        \
        const char *m_ = fs_error_message();                                                \
        CHECK(st_ == (want), "%s: got %s, want %s (%s)", p_, fs_status_name(st_),           \
              fs_status_name(want), m_);                                                    \
        CHECK(strstr(m_, p_) != NULL, "message does not name %s: %s", p_, m_);              \
        CHECK(strstr(m_, words) != NULL, "message lacks \"%s\": %s", words, m_);            \
        CHECK(strchr(m_, '\n') == NULL, "message is not one line: %s", m_);                 \
        CHECK(is_closed(&d_), "%s: struct not left closed after a failed open", p_);        \
        fs_token_data_close(&d_);                                                           \
        fs_token_data_close(&d_);                                                           \
    } while (0)

/* ------------------------------------------------------------------ tokenizer */

static void test_tokenizer_round_trip(void) {
    uint8_t bytes[256], back[256];
    int32_t ids[256];
    for (int i = 0; i < 256; i++) bytes[i] = (uint8_t)(255 - i);
    fs_tokenizer_encode(ids, bytes, 256);
    int ok = 1;
    for (int i = 0; i < 256; i++) ok &= ids[i] == 255 - i;
    CHECK(ok, "encode: id = byte value");
    fs_tokenizer_decode(back, ids, 256);
    CHECK(memcmp(back, bytes, 256) == 0, "decode(encode(x)) == x");
    int32_t odd[4] = {-1, 256, 70000, 65};
    uint8_t out[4];
    fs_tokenizer_decode(out, odd, 4);
    CHECK(memcmp(out, "???A", 4) == 0, "ids outside [0, 256) decode to '?': %.4s", out);
}

/* ------------------------------------------------------------------ text files */

static void test_text_file_is_its_bytes(void) {
    const char *text = "%\nA fortune.\n%\nAnother one, \xc3\xa9t\xc3\xa9.\n";
    const char *p = tpath("fortunes.txt");
    write_file(p, text, strlen(text));
    fs_token_data d;
    CHECK_OK(fs_token_data_open(&d, p));
    CHECK(d.is_text == 1 && d.token_bytes == 1 && d.vocab_size == 256, "text flags");
    CHECK(d.n_tokens == (int64_t)strlen(text), "n_tokens %lld", (long long)d.n_tokens);
    CHECK(strcmp(d.path, p) == 0, "path kept");
    int ok = 1;
    for (int64_t i = 0; i < d.n_tokens; i++) ok &= fs_token_data_get(&d, i) == (uint8_t)text[i];
    CHECK(ok, "tokens are the bytes");
    CHECK_OK(fs_token_data_check_vocab(&d, 256));
    fs_token_data_close(&d);
    CHECK(is_closed(&d), "closed");
    fs_token_data_close(&d); /* idempotent */

    /* shorter than the magic, and 4+ bytes that are not the magic: text */
    const char *short_paths[3] = {tpath("one.txt"), tpath("three.txt"), tpath("nearmagic.txt")};
    uint8_t near[8];
    put_le32(near, FS_TOKENFILE_MAGIC + 1);
    put_le32(near + 4, 1);
    write_file(short_paths[0], "x", 1);
    write_file(short_paths[1], near, 3); /* the first three bytes of the magic */
    write_file(short_paths[2], near, 8);
    int64_t want_n[3] = {1, 3, 8};
    for (int i = 0; i < 3; i++) {
        CHECK_OK(fs_token_data_open(&d, short_paths[i]));
        CHECK(d.is_text && d.n_tokens == want_n[i], "%s: text of %lld bytes", short_paths[i],
              (long long)want_n[i]);
        fs_token_data_close(&d);
    }
}

static void test_empty_file_is_empty_text(void) {
    const char *p = tpath("empty.txt");
    write_file(p, "", 0);
    fs_token_data d;
    CHECK_OK(fs_token_data_open(&d, p));
    CHECK(d.is_text && d.n_tokens == 0 && d.map == NULL, "empty text, no mapping");
    CHECK_OK(fs_token_data_check_vocab(&d, 256));
    fs_status st = fs_token_data_check_length(&d, 8);
    CHECK(st == FS_ERR_FORMAT, "check_length on an empty file: %s", fs_status_name(st));
    CHECK(strstr(fs_error_message(), p) && strstr(fs_error_message(), "holds 0 tokens"),
          "message: %s", fs_error_message());
    fs_token_data_close(&d);
}

/* ------------------------------------------------------------------ token files */

static void test_write_uint16_round_trip(void) {
    enum { N = 5000 };
    static int32_t toks[N];
    for (int i = 0; i < N; i++) toks[i] = (int32_t)(((uint32_t)i * 2654435761u) % 65536u);
    toks[0] = 0;
    toks[N - 1] = 65535; /* the largest id uint16 holds, with vocab 65536 */
    const char *p = tpath("u16.bin");
    CHECK_OK(fs_tokenfile_write(p, toks, N, 65536));
    CHECK(!tmp_file_left(tpath("u16.bin")), "temporary removed by the rename");
    fs_token_data d;
    CHECK_OK(fs_token_data_open(&d, p));
    CHECK(!d.is_text && d.token_bytes == 2 && d.vocab_size == 65536 && d.n_tokens == N,
          "uint16 file: text=%d bytes=%d vocab=%d n=%lld", d.is_text, d.token_bytes,
          d.vocab_size, (long long)d.n_tokens);
    CHECK(d.map_bytes == 1024 + 2 * (size_t)N, "map_bytes %zu", d.map_bytes);
    int ok = 1;
    for (int i = 0; i < N; i++) ok &= fs_token_data_get(&d, i) == toks[i];
    CHECK(ok, "uint16 tokens read back");
    CHECK_OK(fs_token_data_check_vocab(&d, 65536));
    fs_token_data_close(&d);
}

static void test_write_uint32_round_trip(void) {
    enum { N = 3000 };
    static int32_t toks[N];
    const int32_t V = 128256; /* Llama 3 */
    for (int i = 0; i < N; i++) toks[i] = (int32_t)(((uint32_t)i * 2654435761u) % (uint32_t)V);
    toks[1] = V - 1;
    toks[2] = 65536; /* just past what uint16 holds */
    const char *p = tpath("u32.bin");
    CHECK_OK(fs_tokenfile_write(p, toks, N, V));
    fs_token_data d;
    CHECK_OK(fs_token_data_open(&d, p));
    CHECK(!d.is_text && d.token_bytes == 4 && d.vocab_size == V && d.n_tokens == N,
          "uint32 file: bytes=%d vocab=%d n=%lld", d.token_bytes, d.vocab_size,
          (long long)d.n_tokens);
    int ok = 1;
    for (int i = 0; i < N; i++) ok &= fs_token_data_get(&d, i) == toks[i];
    CHECK(ok, "uint32 tokens read back");
    CHECK_OK(fs_token_data_check_vocab(&d, V));
    fs_token_data_close(&d);

    /* zero tokens is a valid file */
    CHECK_OK(fs_tokenfile_write(tpath("none.bin"), NULL, 0, 50257));
    CHECK_OK(fs_token_data_open(&d, tpath("none.bin")));
    CHECK(d.n_tokens == 0 && !d.is_text && d.map_bytes == 1024, "an empty token file");
    fs_token_data_close(&d);
}

static void test_llmc_layout_byte_by_byte(void) {
    uint8_t buf[1100];
    int32_t t16[3] = {1, 258, 65535};
    CHECK_OK(fs_tokenfile_write(tpath("l16.bin"), t16, 3, 65536));
    long long size = read_file(tpath("l16.bin"), buf, sizeof buf);
    CHECK(size == 1024 + 6, "uint16 file size %lld", size);
    CHECK(buf[0] == 0x88 && buf[1] == 0xD8 && buf[2] == 0x34 && buf[3] == 0x01,
          "magic 20240520 = 0x0134D888 little-endian at offset 0");
    CHECK(get_le32(buf + 4) == 1, "version 1 at offset 4");
    CHECK(get_le32(buf + 8) == 3, "count at offset 8");
    CHECK(get_le32(buf + 12) == 65536, "vocab at offset 12: %u", get_le32(buf + 12));
    int zero = 1;
    for (int i = 16; i < 1024; i++) zero &= buf[i] == 0;
    CHECK(zero, "header ints 4..255 are zero");
    const uint8_t want16[6] = {0x01, 0x00, 0x02, 0x01, 0xFF, 0xFF};
    CHECK(memcmp(buf + 1024, want16, 6) == 0, "uint16 tokens little-endian");

    int32_t t32[2] = {0x01020304, 70000};
    CHECK_OK(fs_tokenfile_write(tpath("l32.bin"), t32, 2, 100000000));
    size = read_file(tpath("l32.bin"), buf, sizeof buf);
    CHECK(size == 1024 + 8, "uint32 file size %lld", size);
    CHECK(get_le32(buf) == FS_TOKENFILE_MAGIC && get_le32(buf + 4) == 2 &&
              get_le32(buf + 8) == 2 && get_le32(buf + 12) == 100000000,
          "uint32 header");
    const uint8_t want32[8] = {0x04, 0x03, 0x02, 0x01, 0x70, 0x11, 0x01, 0x00};
    CHECK(memcmp(buf + 1024, want32, 8) == 0, "uint32 tokens little-endian");

    /* a file as llm.c writes it: vocab field 0 ("unknown") */
    uint8_t payload[6] = {0x10, 0x00, 0x50, 0xC4, 0x00, 0x01}; /* 16, 50256, 256 */
    write_token_file(tpath("llmc.bin"), 1, 3, 0, payload, 6);
    fs_token_data d;
    CHECK_OK(fs_token_data_open(&d, tpath("llmc.bin")));
    CHECK(d.vocab_size == 0 && d.n_tokens == 3 && fs_token_data_get(&d, 0) == 16 &&
              fs_token_data_get(&d, 1) == 50256 && fs_token_data_get(&d, 2) == 256,
          "llm.c file read");
    CHECK_OK(fs_token_data_check_vocab(&d, 50257));
    fs_token_data_close(&d);

    /* llm.c's Llama 3 layout: magic 20240801, version 7, uint32 tokens */
    uint8_t p32[8] = {0x00, 0xF5, 0x01, 0x00, 0xFF, 0xF4, 0x01, 0x00}; /* 128256, 128255 */
    write_token_file_magic(tpath("llama3.bin"), FS_TOKENFILE_MAGIC_LLMC_LLAMA3, 7, 2, 0, p32, 8);
    CHECK_OK(fs_token_data_open(&d, tpath("llama3.bin")));
    CHECK(!d.is_text && d.token_bytes == 4 && d.n_tokens == 2 &&
              fs_token_data_get(&d, 0) == 128256 && fs_token_data_get(&d, 1) == 128255,
          "llm.c Llama 3 file read as uint32 tokens");
    CHECK(fs_token_data_check_vocab(&d, 128256) == FS_ERR_FORMAT &&
              strstr(fs_error_message(), "token 128256 at position 0"),
          "Llama 3 file checked: %s", fs_error_message());
    fs_token_data_close(&d);
}

static void test_write_replaces_and_refuses(void) {
    const char *p = tpath("replace.bin");
    int32_t a[4] = {1, 2, 3, 4}, b[2] = {7, 8};
    CHECK_OK(fs_tokenfile_write(p, a, 4, 256));
    CHECK_OK(fs_tokenfile_write(p, b, 2, 256));
    fs_token_data d;
    CHECK_OK(fs_token_data_open(&d, p));
    CHECK(d.n_tokens == 2 && fs_token_data_get(&d, 1) == 8, "replaced");
    fs_token_data_close(&d);

    /* refused before anything is written: the existing file stays, no temporary remains */
    int32_t bad[3] = {1, 300, 2};
    fs_status st = fs_tokenfile_write(p, bad, 3, 256);
    CHECK(st == FS_ERR_USAGE && strstr(fs_error_message(), "token 300 at position 1") &&
              strstr(fs_error_message(), p),
          "token >= vocab: %s: %s", fs_status_name(st), fs_error_message());
    int32_t neg[1] = {-5};
    CHECK(fs_tokenfile_write(p, neg, 1, 256) == FS_ERR_USAGE, "negative token");
    CHECK(fs_tokenfile_write(p, a, -1, 256) == FS_ERR_USAGE, "negative count");
    CHECK(fs_tokenfile_write(p, a, 4, 0) == FS_ERR_USAGE, "vocab 0");
    CHECK(fs_tokenfile_write(p, a, (int64_t)INT32_MAX + 1, 256) == FS_ERR_USAGE,
          "more tokens than the header counts");
    CHECK_OK(fs_token_data_open(&d, p));
    CHECK(d.n_tokens == 2, "existing file untouched by refused writes");
    fs_token_data_close(&d);
    CHECK(!tmp_file_left(tpath("replace.bin")), "no temporary left");

    const char *nodir = tpath("no/such/dir/x.bin");
    st = fs_tokenfile_write(nodir, a, 4, 256);
    CHECK(st == FS_ERR_IO && strstr(fs_error_message(), nodir),
          "unwritable place: %s: %s", fs_status_name(st), fs_error_message());
}

/* ------------------------------------------------------------------ hostile files */

static void test_missing_directory_and_unreadable(void) {
    CHECK_OPEN_FAILS(tpath("does-not-exist.bin"), FS_ERR_IO, "cannot open");
    CHECK_OPEN_FAILS(test_dir, FS_ERR_IO, "is a directory");
    write_file(tpath("plain"), "abc", 3);
    CHECK_OPEN_FAILS(tpath("plain/child"), FS_ERR_IO, "cannot open");
    mkfifo(tpath("fifo"), 0600);
    CHECK_OPEN_FAILS(tpath("fifo"), FS_ERR_IO, "is a FIFO, not a token file");
    /* Permission bits do not stop root, so the unreadable case runs only as another user. */
    const char *p = tpath("secret.txt");
    write_file(p, "secret", 6);
    chmod(p, 0);
    if (geteuid() != 0) {
        CHECK_OPEN_FAILS(p, FS_ERR_IO, "cannot open");
    } else {
        printf("     (running as root: the permission-denied case is not exercised)\n");
    }
    fs_token_data d;
    CHECK(fs_token_data_open(&d, NULL) == FS_ERR_USAGE && is_closed(&d), "NULL path");
    static char long_path[700];
    memset(long_path, 'a', sizeof long_path - 1);
    CHECK(fs_token_data_open(&d, long_path) == FS_ERR_USAGE && is_closed(&d),
          "a path that does not fit fs_token_data.path");
}

static void test_hostile_headers(void) {
    uint8_t h[1024 + 16];
    uint8_t payload[8] = {1, 0, 2, 0, 3, 0, 4, 0};

    /* the magic, then less than a header */
    make_header(h, FS_TOKENFILE_MAGIC, 1, 0, 0);
    write_file(tpath("short4.bin"), h, 4);
    CHECK_OPEN_FAILS(tpath("short4.bin"), FS_ERR_FORMAT, "less than the 1024-byte header");
    write_file(tpath("short1023.bin"), h, 1023);
    CHECK_OPEN_FAILS(tpath("short1023.bin"), FS_ERR_FORMAT, "holds only 1023 bytes");

    write_token_file(tpath("v0.bin"), 0, 4, 0, payload, 8);
    CHECK_OPEN_FAILS(tpath("v0.bin"), FS_ERR_FORMAT, "version 0 is unknown");
    write_token_file(tpath("v3.bin"), 3, 4, 0, payload, 8);
    CHECK_OPEN_FAILS(tpath("v3.bin"), FS_ERR_FORMAT, "version 3 is unknown");
    write_token_file(tpath("vneg.bin"), 0xFFFFFFFFu, 4, 0, payload, 8);
    CHECK_OPEN_FAILS(tpath("vneg.bin"), FS_ERR_FORMAT, "version -1 is unknown");

    write_token_file_magic(tpath("l3v1.bin"), FS_TOKENFILE_MAGIC_LLMC_LLAMA3, 1, 4, 0, payload,
                           8);
    CHECK_OPEN_FAILS(tpath("l3v1.bin"), FS_ERR_FORMAT, "version 1 is unknown");
    write_token_file_magic(tpath("l3short.bin"), FS_TOKENFILE_MAGIC_LLMC_LLAMA3, 7, 0, 0, payload,
                           0);
    CHECK(truncate(tpath("l3short.bin"), 100) == 0, "truncate");
    CHECK_OPEN_FAILS(tpath("l3short.bin"), FS_ERR_FORMAT, "holds only 100 bytes");

    write_token_file(tpath("negcount.bin"), 1, 0x80000000u, 0, payload, 8);
    CHECK_OPEN_FAILS(tpath("negcount.bin"), FS_ERR_FORMAT, "-2147483648 tokens: negative");
    write_token_file(tpath("negvocab.bin"), 1, 4, 0xFFFFFF00u, payload, 8);
    CHECK_OPEN_FAILS(tpath("negvocab.bin"), FS_ERR_FORMAT, "vocabulary size of -256");

    write_token_file(tpath("trunc.bin"), 1, 4, 0, payload, 7);
    CHECK_OPEN_FAILS(tpath("trunc.bin"), FS_ERR_FORMAT,
                     "says 4 uint16 tokens (8 bytes after the 1024-byte header) but the file "
                     "holds 7 bytes after the header (1031 in all): truncated");
    write_token_file(tpath("trunc32.bin"), 2, 4, 0, payload, 8);
    CHECK_OPEN_FAILS(tpath("trunc32.bin"), FS_ERR_FORMAT, "4 uint32 tokens (16 bytes");
    write_token_file(tpath("headeronly.bin"), 2, 1000, 0, payload, 0);
    CHECK_OPEN_FAILS(tpath("headeronly.bin"), FS_ERR_FORMAT, "truncated");
    write_token_file(tpath("trailing.bin"), 1, 3, 0, payload, 8);
    CHECK_OPEN_FAILS(tpath("trailing.bin"), FS_ERR_FORMAT, "trailing bytes");
    /* a huge count in a small file: no out-of-bounds read, just a size mismatch */
    write_token_file(tpath("huge.bin"), 2, 0x7FFFFFFFu, 0, payload, 8);
    CHECK_OPEN_FAILS(tpath("huge.bin"), FS_ERR_FORMAT, "(8589934588 bytes after");
}

static void test_check_vocab(void) {
    fs_token_data d;
    uint8_t p16[8] = {1, 0, 0x10, 0x27, 0x11, 0x27, 0x12, 0x27}; /* 1, 10000, 10001, 10002 */
    write_token_file(tpath("vocab16.bin"), 1, 4, 0, p16, 8);
    CHECK_OK(fs_token_data_open(&d, tpath("vocab16.bin")));
    CHECK_OK(fs_token_data_check_vocab(&d, 10003));
    fs_status st = fs_token_data_check_vocab(&d, 10001);
    const char *m = fs_error_message();
    CHECK(st == FS_ERR_FORMAT && strstr(m, tpath("vocab16.bin")) &&
              strstr(m, "token 10001 at position 2") && strstr(m, "10001"),
          "first offending token: %s: %s", fs_status_name(st), m);
    CHECK(fs_token_data_check_vocab(&d, 0) == FS_ERR_USAGE, "vocab 0 to check against");
    fs_token_data_close(&d);

    /* a uint32 token >= 2^31 must not slip through as a negative int32 */
    uint8_t p32[8] = {5, 0, 0, 0, 0xFF, 0xFF, 0xFF, 0xFF};
    write_token_file(tpath("vocab32.bin"), 2, 2, 0, p32, 8);
    CHECK_OK(fs_token_data_open(&d, tpath("vocab32.bin")));
    st = fs_token_data_check_vocab(&d, 128256);
    CHECK(st == FS_ERR_FORMAT && strstr(fs_error_message(), "token 4294967295 at position 1"),
          "token 0xFFFFFFFF: %s", fs_error_message());
    fs_token_data_close(&d);

    /* the header's vocabulary is larger than the model's */
    write_token_file(tpath("bigvocab.bin"), 1, 4, 50257, p16, 8);
    CHECK_OK(fs_token_data_open(&d, tpath("bigvocab.bin")));
    st = fs_token_data_check_vocab(&d, 32000);
    CHECK(st == FS_ERR_FORMAT && strstr(fs_error_message(), tpath("bigvocab.bin")) &&
              strstr(fs_error_message(), "vocabulary of 50257") &&
              strstr(fs_error_message(), "32000"),
          "header vocab > model vocab: %s", fs_error_message());
    CHECK_OK(fs_token_data_check_vocab(&d, 50257));
    fs_token_data_close(&d);

    /* text checked against a vocabulary smaller than 256 */
    write_file(tpath("abc.txt"), "abcc", 4);
    CHECK_OK(fs_token_data_open(&d, tpath("abc.txt")));
    CHECK_OK(fs_token_data_check_vocab(&d, 100)); /* 'a'..'c' = 97..99 */
    fs_token_data_close(&d);
    write_file(tpath("abce.txt"), "abce", 4);
    CHECK_OK(fs_token_data_open(&d, tpath("abce.txt")));
    CHECK(fs_token_data_check_vocab(&d, 100) == FS_ERR_FORMAT &&
              strstr(fs_error_message(), "token 101 at position 3"),
          "text byte >= vocab: %s", fs_error_message());
    fs_token_data_close(&d);
}

static void test_check_length(void) {
    fs_token_data d;
    write_file(tpath("len.txt"), "0123456789", 10);
    CHECK_OK(fs_token_data_open(&d, tpath("len.txt")));
    CHECK_OK(fs_token_data_check_length(&d, 9));
    fs_status st = fs_token_data_check_length(&d, 10);
    CHECK(st == FS_ERR_FORMAT && strstr(fs_error_message(), tpath("len.txt")) &&
              strstr(fs_error_message(), "holds 10 tokens") &&
              strstr(fs_error_message(), "T + 1 = 11"),
          "10 tokens, T = 10: %s", fs_error_message());
    CHECK(fs_token_data_check_length(&d, 0) == FS_ERR_USAGE, "T = 0");
    CHECK(fs_token_data_check_length(&d, INT64_MAX) == FS_ERR_FORMAT, "T = INT64_MAX");
    fs_token_data_close(&d);
}

static void test_close_is_safe(void) {
    fs_token_data d;
    memset(&d, 0, sizeof d);
    fs_token_data_close(&d);
    fs_token_data_close(&d);
    fs_token_data_close(NULL);
    CHECK(is_closed(&d), "zero struct stays closed");
}

/* ------------------------------------------------------------------ large files */

/* Sparse files over 2 GiB: a text file of 3 GiB and a uint32 token file with the largest
 * count (2^31 - 1 tokens, 8 GiB), each with a few known values past 2 and 4 GiB. */
static void test_files_over_2gib(void) {
    const char *p = tpath("big.txt");
    int fd = open(p, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    CHECK(fd >= 0, "create %s", p);
    if (fd < 0) return;
    const int64_t text_bytes = (int64_t)3 << 30;
    const int64_t mark = ((int64_t)1 << 31) + 5;
    int ok = ftruncate(fd, (off_t)text_bytes) == 0 && pwrite(fd, "Q", 1, (off_t)mark) == 1 &&
             pwrite(fd, "Z", 1, (off_t)(text_bytes - 1)) == 1;
    close(fd);
    CHECK(ok, "sparse text file set up");
    fs_token_data d;
    CHECK_OK(fs_token_data_open(&d, p));
    CHECK(d.is_text && d.n_tokens == text_bytes, "3 GiB text: n_tokens %lld",
          (long long)d.n_tokens);
    if (d.n_tokens == text_bytes) {
        CHECK(fs_token_data_get(&d, mark) == 'Q' && fs_token_data_get(&d, mark - 1) == 0 &&
                  fs_token_data_get(&d, text_bytes - 1) == 'Z',
              "bytes past 2 GiB");
        int32_t in[4], tg[4];
        int64_t last_window = fs_sampler_n_windows(&d, 4) - 1;
        fs_sampler_fill_sequential(&d, last_window, 1, 4, in, tg);
        CHECK(last_window == (text_bytes - 1) / 4 - 1 && tg[3] == 0,
              "last sequential window");
    }
    fs_token_data_close(&d);
    unlink(p);

    const char *q = tpath("big.bin");
    fd = open(q, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    CHECK(fd >= 0, "create %s", q);
    if (fd < 0) return;
    const int64_t n = INT32_MAX;
    uint8_t h[1024], t[4];
    make_header(h, FS_TOKENFILE_MAGIC, 2, (uint32_t)n, 128256);
    const int64_t mid = ((int64_t)5 << 30) / 4; /* a token at byte offset 5 GiB + 1024 */
    ok = pwrite(fd, h, 1024, 0) == 1024 && ftruncate(fd, (off_t)(1024 + 4 * n)) == 0;
    put_le32(t, 128255);
    ok = ok && pwrite(fd, t, 4, (off_t)(1024 + 4 * (n - 1))) == 4;
    put_le32(t, 77777);
    ok = ok && pwrite(fd, t, 4, (off_t)(1024 + 4 * mid)) == 4;
    close(fd);
    CHECK(ok, "sparse token file set up");
    CHECK_OK(fs_token_data_open(&d, q));
    CHECK(d.n_tokens == n && d.token_bytes == 4 && d.map_bytes == (size_t)(1024 + 4 * n),
          "8 GiB token file: n %lld", (long long)d.n_tokens);
    if (d.n_tokens == n) {
        CHECK(fs_token_data_get(&d, n - 1) == 128255 && fs_token_data_get(&d, mid) == 77777,
              "tokens past 4 GiB");
    }
    fs_token_data_close(&d);
    /* one token short of its header: the size arithmetic must not wrap */
    CHECK(truncate(q, (off_t)(1024 + 4 * (n - 1))) == 0, "truncate");
    CHECK_OPEN_FAILS(q, FS_ERR_FORMAT, "8589934588 bytes after the 1024-byte header) but the "
                                       "file holds 8589934584 bytes");
    unlink(q);
}

/* ------------------------------------------------------------------ sampler */

/* A uint32 token file whose token i is i * 3 + 1, so a window shows where it starts. */
static void make_counting_file(const char *path, int64_t n, int32_t vocab) {
    static int32_t toks[100000];
    if (n > 100000) abort();
    for (int64_t i = 0; i < n; i++) toks[i] = (int32_t)(i * 3 + 1);
    if (fs_tokenfile_write(path, toks, n, vocab) != FS_OK) abort();
}

static void test_sampler_windows(void) {
    enum { N = 10000, T = 16, B = 12 };
    make_counting_file(tpath("count.bin"), N, 100000);
    fs_token_data d;
    CHECK_OK(fs_token_data_open(&d, tpath("count.bin")));
    CHECK(d.token_bytes == 4, "uint32 counting file");
    static int32_t in[B * T], tg[B * T], in2[B * T], tg2[B * T];
    int in_range = 1, shifted = 1, contiguous = 1;
    int64_t min_pos = N, max_pos = -1;
    for (int64_t step = 0; step < 200; step++) {
        fs_sampler_fill(&d, 1234, step, 0, B, T, in, tg);
        for (int r = 0; r < B; r++) {
            int64_t pos = (in[r * T] - 1) / 3;
            in_range &= pos >= 0 && pos + T + 1 <= N && (in[r * T] - 1) % 3 == 0;
            if (pos < min_pos) min_pos = pos;
            if (pos > max_pos) max_pos = pos;
            for (int t = 0; t < T; t++) {
                contiguous &= in[r * T + t] == (int32_t)((pos + t) * 3 + 1);
                shifted &= tg[r * T + t] == (int32_t)((pos + t + 1) * 3 + 1);
            }
        }
    }
    CHECK(in_range, "every window lies inside the stream");
    CHECK(contiguous, "inputs are T consecutive tokens");
    CHECK(shifted, "targets are the inputs shifted by one");
    CHECK(min_pos < 200 && max_pos > N - T - 200, "starts cover the stream: [%lld, %lld]",
          (long long)min_pos, (long long)max_pos);

    /* reproducible; rows, steps and seeds differ */
    fs_sampler_fill(&d, 1234, 7, 0, B, T, in, tg);
    fs_sampler_fill(&d, 1234, 7, 0, B, T, in2, tg2);
    CHECK(memcmp(in, in2, sizeof in) == 0 && memcmp(tg, tg2, sizeof tg) == 0,
          "same seed and step: same batch");
    int rows_differ = 1;
    for (int r = 1; r < B; r++) rows_differ &= in[r * T] != in[0];
    CHECK(rows_differ, "rows of one step start at different positions");
    fs_sampler_fill(&d, 1234, 8, 0, B, T, in2, tg2);
    CHECK(memcmp(in, in2, sizeof in) != 0, "another step: another batch");
    fs_sampler_fill(&d, 4321, 7, 0, B, T, in2, tg2);
    CHECK(memcmp(in, in2, sizeof in) != 0, "another seed: another batch");

    /* slices of the global batch equal the rows of the whole batch (ranks take slices) */
    int slices_match = 1;
    for (int r0 = 0; r0 < B; r0++)
        for (int k = 0; r0 + k <= B; k++) {
            fs_sampler_fill(&d, 1234, 7, r0, k, T, in2, tg2);
            slices_match &= memcmp(in2, in + r0 * T, sizeof(int32_t) * (size_t)(k * T)) == 0 &&
                            memcmp(tg2, tg + r0 * T, sizeof(int32_t) * (size_t)(k * T)) == 0;
        }
    CHECK(slices_match, "rows [r0, r0+k) == rows r0.. of the whole batch");
    /* 3 ranks x 4 rows == 12 rows */
    for (int rank = 0; rank < 3; rank++)
        fs_sampler_fill(&d, 1234, 7, rank * 4, 4, T, in2 + rank * 4 * T, tg2 + rank * 4 * T);
    CHECK(memcmp(in, in2, sizeof in) == 0 && memcmp(tg, tg2, sizeof tg) == 0,
          "three ranks' slices assemble the global batch");
    fs_token_data_close(&d);

    /* the smallest stream: T + 1 tokens, the only window starts at 0 */
    make_counting_file(tpath("tiny.bin"), T + 1, 100000);
    CHECK_OK(fs_token_data_open(&d, tpath("tiny.bin")));
    CHECK_OK(fs_token_data_check_length(&d, T));
    int only = 1;
    for (int64_t step = 0; step < 20; step++) {
        fs_sampler_fill(&d, 99, step, 0, B, T, in, tg);
        for (int r = 0; r < B; r++) only &= in[r * T] == 1 && tg[r * T + T - 1] == T * 3 + 1;
    }
    CHECK(only, "with T + 1 tokens every window is the whole stream");
    fs_token_data_close(&d);
}

static void test_sampler_all_widths(void) {
    /* the same stream as bytes (text), uint16 and uint32 gives the same batches */
    enum { N = 3000, T = 8, B = 5 };
    static uint8_t text[N];
    static int32_t toks[N];
    for (int i = 0; i < N; i++) {
        text[i] = (uint8_t)((i * 7 + i / 256) & 255);
        toks[i] = text[i];
    }
    write_file(tpath("w1.txt"), text, N);
    CHECK_OK(fs_tokenfile_write(tpath("w2.bin"), toks, N, 256));
    CHECK_OK(fs_tokenfile_write(tpath("w4.bin"), toks, N, 70000));
    const char *paths[3] = {tpath("w1.txt"), tpath("w2.bin"), tpath("w4.bin")};
    int32_t in[3][B * T], tg[3][B * T];
    int32_t sin[3][B * T], stg[3][B * T];
    for (int w = 0; w < 3; w++) {
        fs_token_data d;
        CHECK_OK(fs_token_data_open(&d, paths[w]));
        CHECK(d.token_bytes == (w == 0 ? 1 : w == 1 ? 2 : 4), "width of %s", paths[w]);
        fs_sampler_fill(&d, 5, 3, 0, B, T, in[w], tg[w]);
        fs_sampler_fill_sequential(&d, 10, B, T, sin[w], stg[w]);
        fs_token_data_close(&d);
    }
    for (int w = 1; w < 3; w++) {
        CHECK(memcmp(in[0], in[w], sizeof in[0]) == 0 && memcmp(tg[0], tg[w], sizeof tg[0]) == 0,
              "random batch, width %d == bytes", w);
        CHECK(memcmp(sin[0], sin[w], sizeof sin[0]) == 0 &&
                  memcmp(stg[0], stg[w], sizeof stg[0]) == 0,
              "sequential batch, width %d == bytes", w);
    }
    int ok = 1;
    for (int r = 0; r < B; r++)
        for (int t = 0; t < T; t++)
            ok &= sin[0][r * T + t] == text[(10 + r) * T + t] &&
                  stg[0][r * T + t] == text[(10 + r) * T + t + 1];
    CHECK(ok, "sequential windows read the text bytes");
}

static void test_sequential_windows(void) {
    enum { T = 10 };
    fs_token_data d;
    int32_t in[4 * T], tg[4 * T];
    /* n = 4T + 1: exactly 4 windows; n = 4T: 3 */
    make_counting_file(tpath("seq41.bin"), 4 * T + 1, 1000);
    CHECK_OK(fs_token_data_open(&d, tpath("seq41.bin")));
    CHECK(fs_sampler_n_windows(&d, T) == 4, "4T+1 tokens: %lld windows",
          (long long)fs_sampler_n_windows(&d, T));
    fs_sampler_fill_sequential(&d, 0, 4, T, in, tg);
    int ok = 1;
    for (int r = 0; r < 4; r++)
        for (int t = 0; t < T; t++)
            ok &= in[r * T + t] == (r * T + t) * 3 + 1 && tg[r * T + t] == (r * T + t + 1) * 3 + 1;
    CHECK(ok, "windows are w*T .. w*T + T, targets one later");
    fs_sampler_fill_sequential(&d, 2, 2, T, in, tg);
    CHECK(in[0] == (2 * T) * 3 + 1 && tg[2 * T - 1] == (4 * T) * 3 + 1, "from window 2");
    fs_token_data_close(&d);

    make_counting_file(tpath("seq40.bin"), 4 * T, 1000);
    CHECK_OK(fs_token_data_open(&d, tpath("seq40.bin")));
    CHECK(fs_sampler_n_windows(&d, T) == 3, "4T tokens: 3 windows");
    CHECK(fs_sampler_n_windows(&d, 4 * T) == 0, "T = n: no window");
    fs_token_data_close(&d);

    write_file(tpath("seq0.txt"), "", 0);
    CHECK_OK(fs_token_data_open(&d, tpath("seq0.txt")));
    CHECK(fs_sampler_n_windows(&d, 1) == 0, "empty stream: no window");
    fs_token_data_close(&d);
}

/* ------------------------------------------------------------------ tokenize_files */

static void test_tokenize_files(void) {
    const char *a = "%\nThe first fortune.\n", *c = "%\nThe third, \xe2\x9c\x93.\n";
    write_file(tpath("a.txt"), a, strlen(a));
    write_file(tpath("b.txt"), "", 0);
    write_file(tpath("c.txt"), c, strlen(c));
    /* larger than the streaming chunk, so several reads and writes are needed */
    enum { BIG = 100000 };
    static uint8_t big[BIG];
    for (int i = 0; i < BIG; i++) big[i] = (uint8_t)(i * 31 + 7);
    big[0] = 'x'; /* not the magic */
    write_file(tpath("big.dat"), big, BIG);
    const char *paths[4] = {tpath("a.txt"), tpath("b.txt"), tpath("c.txt"), tpath("big.dat")};
    const char *out = tpath("corpus.bin");
    int64_t n = -1;
    CHECK_OK(fs_tokenize_files(out, paths, 4, &n));
    int64_t want_n = (int64_t)(strlen(a) + strlen(c)) + BIG;
    CHECK(n == want_n, "token count %lld, want %lld", (long long)n, (long long)want_n);
    CHECK(!tmp_file_left(tpath("corpus.bin")), "no temporary left");
    fs_token_data d;
    CHECK_OK(fs_token_data_open(&d, out));
    CHECK(!d.is_text && d.token_bytes == 2 && d.vocab_size == 256 && d.n_tokens == want_n,
          "byte-level token file: bytes=%d vocab=%d n=%lld", d.token_bytes, d.vocab_size,
          (long long)d.n_tokens);
    if (d.n_tokens == want_n) {
        int ok = 1;
        int64_t i = 0;
        for (size_t k = 0; a[k]; k++) ok &= fs_token_data_get(&d, i++) == (uint8_t)a[k];
        for (size_t k = 0; c[k]; k++) ok &= fs_token_data_get(&d, i++) == (uint8_t)c[k];
        for (int k = 0; k < BIG; k++) ok &= fs_token_data_get(&d, i++) == big[k];
        CHECK(ok, "the files' bytes, concatenated in order");
        /* decode gives the text back */
        static int32_t ids[64];
        uint8_t txt[64];
        for (int k = 0; k < (int)strlen(a); k++) ids[k] = fs_token_data_get(&d, k);
        fs_tokenizer_decode(txt, ids, (int64_t)strlen(a));
        CHECK(memcmp(txt, a, strlen(a)) == 0, "decode returns the text");
    }
    CHECK_OK(fs_token_data_check_vocab(&d, 256));
    fs_token_data_close(&d);
    CHECK_OK(fs_tokenize_files(out, paths, 1, NULL)); /* NULL count is allowed */

    /* errors name the input and leave no output behind */
    const char *out2 = tpath("never.bin");
    const char *missing[2] = {tpath("a.txt"), tpath("nope.txt")};
    fs_status st = fs_tokenize_files(out2, missing, 2, &n);
    CHECK(st == FS_ERR_IO && strstr(fs_error_message(), tpath("nope.txt")) && n == 0,
          "missing input: %s: %s", fs_status_name(st), fs_error_message());
    const char *dir[1] = {test_dir};
    st = fs_tokenize_files(out2, dir, 1, &n);
    CHECK(st == FS_ERR_IO && strstr(fs_error_message(), "is a directory"),
          "directory input: %s", fs_error_message());
    int32_t some[3] = {1, 2, 3};
    CHECK_OK(fs_tokenfile_write(tpath("tok.bin"), some, 3, 256));
    const char *tokfile[2] = {tpath("a.txt"), tpath("tok.bin")};
    st = fs_tokenize_files(out2, tokfile, 2, &n);
    CHECK(st == FS_ERR_FORMAT && strstr(fs_error_message(), tpath("tok.bin")) &&
              strstr(fs_error_message(), "is a token file"),
          "token file as text input: %s", fs_error_message());
    const char *l3[1] = {tpath("l3.bin")};
    write_token_file_magic(l3[0], FS_TOKENFILE_MAGIC_LLMC_LLAMA3, 7, 0, 0, NULL, 0);
    st = fs_tokenize_files(out2, l3, 1, &n);
    CHECK(st == FS_ERR_FORMAT && strstr(fs_error_message(), "is a token file"),
          "llm.c Llama 3 file as text input: %s", fs_error_message());
    CHECK(fs_tokenize_files(out2, paths, 0, &n) == FS_ERR_USAGE, "no inputs");
    CHECK(!file_exists(out2) && !tmp_file_left(tpath("never.bin")), "no output on error");

    /* more bytes than a token file can count (a sparse file of 2^31 bytes) */
    const char *huge = tpath("huge.txt");
    int fd = open(huge, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    CHECK(fd >= 0 && ftruncate(fd, (off_t)1 << 31) == 0, "sparse 2 GiB text");
    if (fd >= 0) close(fd);
    const char *hp[1] = {huge};
    st = fs_tokenize_files(out2, hp, 1, &n);
    CHECK(st == FS_ERR_USAGE && strstr(fs_error_message(), "2147483648 bytes"),
          "2^31 bytes of text: %s: %s", fs_status_name(st), fs_error_message());
    CHECK(!file_exists(out2) && !tmp_file_left(tpath("never.bin")), "no output on error");
    unlink(huge);
}

/* ------------------------------------------------------------------ streams of shards */

/* Removes the files in the test subdirectory `name` and the directory itself. */
static void remove_subdir(const char *name) {
    const char *dir = tpath(name);
    DIR *d = opendir(dir);
    if (!d) return;
    struct dirent *e;
    char path[1024];
    while ((e = readdir(d)) != NULL) {
        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0) continue;
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        struct stat sb;
        if (lstat(path, &sb) == 0 && S_ISDIR(sb.st_mode)) rmdir(path);
        else unlink(path);
    }
    closedir(d);
    rmdir(dir);
}

/* A uint16 token file whose token j is base + j: a window shows its shard and position. */
static void make_shard(const char *path, int64_t n, int32_t base, int32_t vocab) {
    static int32_t toks[20000];
    if (n > 20000) abort();
    for (int64_t j = 0; j < n; j++) toks[j] = base + (int32_t)j;
    if (fs_tokenfile_write(path, toks, n, vocab) != FS_OK) abort();
}

/* Opening spec as a stream must fail with `want` and a one-line message holding `words`. */
#define CHECK_STREAM_FAILS(spec, want, words)                                                \
    do {                                                                                    \
        fs_token_stream s_;                                                                 \
        fs_status st_ = fs_token_stream_open(&s_, (spec));                                  \
        const char *m_ = fs_error_message();                                                \
        CHECK(st_ == (want) && strstr(m_, (words)) != NULL && strchr(m_, '\n') == NULL,     \
              "%s: got %s (%s), want %s naming \"%s\"", (spec), fs_status_name(st_), m_,    \
              fs_status_name(want), (words));                                               \
        CHECK(s_.n_shards == 0 && s_.shards == NULL, "%s: stream not left closed", (spec)); \
        fs_token_stream_close(&s_);                                                         \
    } while (0)

static void test_stream_directory_order_and_boundaries(void) {
    enum { T = 8, B = 16 };
    const int64_t sizes[3] = {1000, 37, 3001}; /* a.bin, b.bin, c.bin */
    CHECK(mkdir(tpath("shards"), 0755) == 0, "mkdir");
    /* created out of order, with a hidden file and a subdirectory that are not shards */
    make_shard(tpath("shards/c.bin"), sizes[2], 20000, 30000);
    make_shard(tpath("shards/a.bin"), sizes[0], 0, 30000);
    make_shard(tpath("shards/b.bin"), sizes[1], 10000, 30000);
    write_file(tpath("shards/.partial"), "junk", 4);
    CHECK(mkdir(tpath("shards/sub"), 0755) == 0, "mkdir sub");
    fs_token_stream s;
    CHECK_OK(fs_token_stream_open(&s, tpath("shards")));
    CHECK(s.n_shards == 3 && s.n_tokens == sizes[0] + sizes[1] + sizes[2] && s.token_bytes == 2 &&
              !s.is_text && s.vocab_size == 30000,
          "3 shards, %lld tokens", (long long)s.n_tokens);
    const char *names[3] = {"a.bin", "b.bin", "c.bin"};
    for (int i = 0; i < s.n_shards && i < 3; i++)
        CHECK(strcmp(strrchr(s.shards[i].path, '/') + 1, names[i]) == 0, "shard %d is %s", i,
              s.shards[i].path);

    /* sequential windows: a's, then b's, then c's, none across a boundary */
    const int64_t per[3] = {(sizes[0] - 1) / T, (sizes[1] - 1) / T, (sizes[2] - 1) / T};
    CHECK(fs_stream_n_windows(&s, T) == per[0] + per[1] + per[2], "windows %lld",
          (long long)fs_stream_n_windows(&s, T));
    static int32_t in[4096 * T], tg[4096 * T];
    const int64_t nw = fs_stream_n_windows(&s, T);
    fs_stream_fill_sequential(&s, 0, nw, T, in, tg);
    int in_order = 1;
    for (int64_t w = 0, shard = 0, k = 0; w < nw; w++, k++) {
        while (k >= per[shard]) k -= per[shard++];
        for (int t = 0; t < T; t++)
            in_order &= in[w * T + t] == (int32_t)(shard * 10000 + k * T + t) &&
                        tg[w * T + t] == (int32_t)(shard * 10000 + k * T + t + 1);
    }
    CHECK(in_order, "sequential windows go through the shards in order");
    /* a slice equals the same rows of the whole */
    static int32_t in2[8 * T], tg2[8 * T];
    fs_stream_fill_sequential(&s, per[0] - 2, 8, T, in2, tg2);
    CHECK(memcmp(in2, in + (per[0] - 2) * T, sizeof in2) == 0 && memcmp(tg2, tg + (per[0] - 2) * T, sizeof tg2) == 0,
          "windows across the first boundary, filled from the middle");

    /* random windows: inside one shard each, every shard drawn, in proportion to its starts */
    int64_t hits[3] = {0, 0, 0};
    int inside = 1, shifted = 1;
    for (int64_t step = 0; step < 400; step++) {
        fs_stream_sampler_fill(&s, 99, step, 0, B, T, in, tg);
        for (int r = 0; r < B; r++) {
            const int32_t first = in[r * T];
            const int shard = first / 10000;
            const int64_t pos = first % 10000;
            if (shard < 0 || shard > 2) {
                inside = 0;
                continue;
            }
            hits[shard]++;
            inside &= pos + T + 1 <= sizes[shard];
            for (int t = 0; t < T; t++)
                shifted &= in[r * T + t] == first + t && tg[r * T + t] == first + t + 1;
        }
    }
    CHECK(inside && shifted, "every random window lies inside one shard, targets shifted by one");
    const double total = (double)(hits[0] + hits[1] + hits[2]);
    const double starts = (double)(sizes[0] - T + sizes[1] - T + sizes[2] - T);
    /* 6400 draws: a share within 0.03 of its expectation is > 5 standard deviations */
    for (int i = 0; i < 3; i++)
        CHECK(hits[i] > 0 && fabs((double)hits[i] / total - (double)(sizes[i] - T) / starts) < 0.03,
              "shard %d drawn %lld of %.0f times", i, (long long)hits[i], total);
    /* rows of a batch filled in two slices equal the whole batch (what ranks rely on) */
    fs_stream_sampler_fill(&s, 5, 17, 0, B, T, in, tg);
    fs_stream_sampler_fill(&s, 5, 17, 5, 3, T, in2, tg2);
    CHECK(memcmp(in2, in + 5 * T, 3 * T * sizeof *in) == 0 && memcmp(tg2, tg + 5 * T, 3 * T * sizeof *tg) == 0,
          "a slice of the batch equals the same rows of the whole");
    CHECK_OK(fs_token_stream_check_length(&s, T));
    CHECK_OK(fs_token_stream_check_unchanged(&s));
    CHECK_OK(fs_token_stream_check_vocab(&s, 30000));
    fs_token_stream_close(&s);
    fs_token_stream_close(&s);

    /* a stream of one file samples exactly as the single-file sampler */
    fs_token_data d;
    CHECK_OK(fs_token_data_open(&d, tpath("shards/c.bin")));
    CHECK_OK(fs_token_stream_open(&s, tpath("shards/c.bin")));
    fs_stream_sampler_fill(&s, 1234, 3, 0, B, T, in, tg);
    fs_sampler_fill(&d, 1234, 3, 0, 8, T, in2, tg2);
    CHECK(s.n_shards == 1 && memcmp(in, in2, 8 * T * sizeof *in) == 0 && memcmp(tg, tg2, 8 * T * sizeof *tg) == 0,
          "one shard: the single-file sampler's windows");
    fs_token_stream_close(&s);
    fs_token_data_close(&d);
    remove_subdir("shards");
}

static void test_stream_patterns_and_lists(void) {
    CHECK(mkdir(tpath("glob"), 0755) == 0, "mkdir");
    make_shard(tpath("glob/train_000002.bin"), 50, 2000, 4000);
    make_shard(tpath("glob/train_000001.bin"), 50, 1000, 4000);
    make_shard(tpath("glob/val_000000.bin"), 50, 0, 4000);
    char spec[1024];
    fs_token_stream s;
    snprintf(spec, sizeof spec, "%s/train_*.bin", tpath("glob"));
    CHECK_OK(fs_token_stream_open(&s, spec));
    CHECK(s.n_shards == 2 && strstr(s.shards[0].path, "train_000001") && strstr(s.shards[1].path, "train_000002"),
          "the pattern's matches, sorted: %d shards", s.n_shards);
    fs_token_stream_close(&s);
    /* a list keeps its order; each part may be a file, a pattern or a directory */
    snprintf(spec, sizeof spec, "%s,%s/train_*1.bin", tpath("glob/val_000000.bin"), tpath("glob"));
    CHECK_OK(fs_token_stream_open(&s, spec));
    CHECK(s.n_shards == 2 && strstr(s.shards[0].path, "val_000000") && strstr(s.shards[1].path, "train_000001") &&
              s.n_tokens == 100,
          "a list in its order: %d shards", s.n_shards);
    fs_token_stream_close(&s);
    /* a file whose name holds a comma is that file, not a list */
    make_shard(tpath("glob/a,b.bin"), 20, 0, 4000);
    CHECK_OK(fs_token_stream_open(&s, tpath("glob/a,b.bin")));
    CHECK(s.n_shards == 1 && s.n_tokens == 20, "a name with a comma: %d shards", s.n_shards);
    fs_token_stream_close(&s);
    unlink(tpath("glob/a,b.bin"));

    /* a comma inside a pattern's brackets is the pattern's, not the list's */
    snprintf(spec, sizeof spec, "%s/train_00000[1,2].bin,%s", tpath("glob"), tpath("glob/val_000000.bin"));
    CHECK_OK(fs_token_stream_open(&s, spec));
    CHECK(s.n_shards == 3 && strstr(s.shards[0].path, "train_000001") && strstr(s.shards[2].path, "val_000000"),
          "[1,2] in a list: %d shards", s.n_shards);
    fs_token_stream_close(&s);
    /* a directory a pattern matches is passed over, as a directory's subdirectories are */
    CHECK(mkdir(tpath("glob/train_000003.bin"), 0755) == 0, "mkdir");
    snprintf(spec, sizeof spec, "%s/train_*", tpath("glob"));
    CHECK_OK(fs_token_stream_open(&s, spec));
    CHECK(s.n_shards == 2, "a matching directory passed over: %d shards", s.n_shards);
    fs_token_stream_close(&s);
    snprintf(spec, sizeof spec, "%s/train_000003*", tpath("glob"));
    CHECK_STREAM_FAILS(spec, FS_ERR_IO, "no file matches the pattern (only directories do)");
    rmdir(tpath("glob/train_000003.bin"));

    snprintf(spec, sizeof spec, "%s/test_*.bin", tpath("glob"));
    CHECK_STREAM_FAILS(spec, FS_ERR_IO, "no file matches");
    CHECK(mkdir(tpath("empty"), 0755) == 0, "mkdir");
    write_file(tpath("empty/.hidden"), "x", 1);
    CHECK_STREAM_FAILS(tpath("empty"), FS_ERR_IO, "holds no data files");
    snprintf(spec, sizeof spec, "%s,", tpath("glob/val_000000.bin"));
    CHECK_STREAM_FAILS(spec, FS_ERR_USAGE, "an empty name");
    snprintf(spec, sizeof spec, "%s,%s", tpath("glob/val_000000.bin"), tpath("glob/missing.bin"));
    CHECK_STREAM_FAILS(spec, FS_ERR_IO, "missing.bin: cannot open");
    /* the same file twice, under two names */
    snprintf(spec, sizeof spec, "%s,%s/./val_000000.bin", tpath("glob/val_000000.bin"), tpath("glob"));
    CHECK_STREAM_FAILS(spec, FS_ERR_USAGE, "each shard may appear once");

    /* which files, written now, a spec would read next time (what an output may not be) */
    char out[1024];
    snprintf(spec, sizeof spec, "%s/train_*.bin", tpath("glob"));
    snprintf(out, sizeof out, "%s/train_000009.bin", tpath("glob"));
    CHECK(fs_token_stream_spec_reads(spec, out), "a new match of the pattern");
    snprintf(out, sizeof out, "%s/./model.bin", tpath("glob"));
    CHECK(!fs_token_stream_spec_reads(spec, out), "a name the pattern does not match");
    snprintf(out, sizeof out, "%s/.train_9.bin", tpath("glob"));
    CHECK(!fs_token_stream_spec_reads(spec, out), "a hidden name (glob matches none)");
    snprintf(spec, sizeof spec, "%s,%s", tpath("glob/val_000000.bin"), tpath("empty"));
    snprintf(out, sizeof out, "%s/../empty/w.safetensors", tpath("glob"));
    CHECK(fs_token_stream_spec_reads(spec, out), "a new file in a directory of the list, by another path");
    snprintf(out, sizeof out, "%s/.w", tpath("empty"));
    CHECK(!fs_token_stream_spec_reads(spec, out), "a hidden name in that directory");
    CHECK(fs_token_stream_spec_reads(spec, tpath("glob/val_000000.bin")), "a file of the list");
    CHECK(!fs_token_stream_spec_reads(spec, tpath("glob/train_000001.bin")), "a file beside one of the list");
    snprintf(out, sizeof out, "%s/sub/w.bin", tpath("empty"));
    CHECK(!fs_token_stream_spec_reads(spec, out), "a subdirectory of a directory of the list");
    remove_subdir("glob");
    remove_subdir("empty");
}

static void test_stream_refusals_name_the_file(void) {
    CHECK(mkdir(tpath("mixed"), 0755) == 0, "mkdir");
    make_shard(tpath("mixed/a.bin"), 40, 0, 300);
    write_file(tpath("mixed/b.txt"), "plain text, not tokens", 22);
    CHECK_STREAM_FAILS(tpath("mixed"), FS_ERR_FORMAT, "b.txt: text (byte level), but");
    unlink(tpath("mixed/b.txt"));
    /* uint32 tokens beside uint16 ones */
    make_counting_file(tpath("mixed/c.bin"), 40, 100000);
    CHECK_STREAM_FAILS(tpath("mixed"), FS_ERR_FORMAT, "c.bin: uint32 tokens, but");
    unlink(tpath("mixed/c.bin"));
    /* two tokenizers' shards */
    make_shard(tpath("mixed/d.bin"), 40, 0, 512);
    CHECK_STREAM_FAILS(tpath("mixed"), FS_ERR_FORMAT, "d.bin: made for a vocabulary of 512, but");
    unlink(tpath("mixed/d.bin"));
    /* a truncated shard: the header says more tokens than the file holds */
    uint8_t payload[40] = {0};
    write_token_file(tpath("mixed/e.bin"), 1, 30, 300, payload, sizeof payload);
    CHECK_STREAM_FAILS(tpath("mixed"), FS_ERR_FORMAT, "e.bin: token file header says 30");
    unlink(tpath("mixed/e.bin"));
    /* an id outside the model's vocabulary: the shard and the position (llm.c's headers
     * state no vocabulary, so only the tokens can tell) */
    remove_subdir("mixed");
    CHECK(mkdir(tpath("mixed"), 0755) == 0, "mkdir");
    uint8_t ids[80] = {0};
    write_token_file(tpath("mixed/g.bin"), 1, 40, 0, ids, sizeof ids);
    ids[2 * 33] = 290 & 0xff;
    ids[2 * 33 + 1] = 290 >> 8;
    write_token_file(tpath("mixed/h.bin"), 1, 40, 0, ids, sizeof ids);
    fs_token_stream s;
    CHECK_OK(fs_token_stream_open(&s, tpath("mixed")));
    fs_status st = fs_token_stream_check_vocab(&s, 256);
    CHECK(st == FS_ERR_FORMAT && strstr(fs_error_message(), "h.bin: token 290 at position 33"),
          "an id >= the vocabulary names the shard and the position: %s", fs_error_message());
    CHECK_OK(fs_token_stream_check_vocab(&s, 300));
    /* no shard long enough for one window: windows do not cross shards */
    st = fs_token_stream_check_length(&s, 40);
    CHECK(st == FS_ERR_FORMAT && strstr(fs_error_message(), "no shard of the 2"), "length: %s", fs_error_message());
    CHECK_OK(fs_token_stream_check_length(&s, 39));
    /* a shard truncated under a running job is caught before a batch reads it */
    CHECK(truncate(tpath("mixed/h.bin"), 100) == 0, "truncate");
    st = fs_token_stream_check_unchanged(&s);
    CHECK(st == FS_ERR_IO && strstr(fs_error_message(), "h.bin") != NULL, "truncated in use: %s", fs_error_message());
    fs_token_stream_close(&s);
    remove_subdir("mixed");
}

/* Two sparse shards of 2^31 - 1 uint16 tokens each: 2^32 - 2 in all, past any int32. A token
 * is planted where the sampler will look in the second shard, so the test shows that the
 * 64-bit arithmetic reaches it. */
static void test_stream_over_2g_tokens(void) {
    enum { T = 16 };
    const int64_t n = INT32_MAX;
    const uint64_t seed = 42;
    const uint64_t starts0 = (uint64_t)(n - T), all = 2 * starts0;
    /* the first row of step 0 whose start falls in the second shard */
    int64_t row = 0;
    while (row < 63 && fs_rand_below(seed, 0, (uint64_t)row, all) < starts0) row++;
    const int64_t pos = (int64_t)(fs_rand_below(seed, 0, (uint64_t)row, all) - starts0);
    CHECK(mkdir(tpath("big"), 0755) == 0, "mkdir");
    const char *files[2] = {tpath("big/part_0.bin"), tpath("big/part_1.bin")};
    int ok = 1;
    for (int f = 0; f < 2; f++) {
        int fd = open(files[f], O_WRONLY | O_CREAT | O_TRUNC, 0644);
        uint8_t h[1024], t[2] = {0x39, 0x30}; /* 12345 */
        make_header(h, FS_TOKENFILE_MAGIC, 1, (uint32_t)n, 50000);
        ok = ok && fd >= 0 && pwrite(fd, h, 1024, 0) == 1024 && ftruncate(fd, (off_t)(1024 + 2 * n)) == 0;
        if (f == 1) {
            ok = ok && pwrite(fd, t, 2, (off_t)(1024 + 2 * pos)) == 2;
            t[0] = 0x31; /* 12337 = the last target of the window */
            ok = ok && pwrite(fd, t, 2, (off_t)(1024 + 2 * (pos + T))) == 2;
            t[0] = 0x07; t[1] = 0x00; /* the last token of the stream */
            ok = ok && pwrite(fd, t, 2, (off_t)(1024 + 2 * (n - 1))) == 2;
        }
        if (fd >= 0) close(fd);
    }
    CHECK(ok, "sparse shards set up");
    fs_token_stream s;
    CHECK_OK(fs_token_stream_open(&s, tpath("big")));
    CHECK(s.n_shards == 2 && s.n_tokens == 2 * n, "2^32 - 2 tokens: %lld", (long long)s.n_tokens);
    if (s.n_shards == 2) {
        static int32_t in[64 * T], tg[64 * T];
        fs_stream_sampler_fill(&s, seed, 0, 0, row + 1, T, in, tg);
        CHECK(in[row * T] == 12345 && tg[row * T + T - 1] == 12337,
              "row %lld starts at %lld of the second shard: got %d .. %d", (long long)row, (long long)pos,
              in[row * T], tg[row * T + T - 1]);
        const int64_t nw = fs_stream_n_windows(&s, T);
        CHECK(nw == 2 * ((n - 1) / T), "windows: %lld", (long long)nw);
        fs_stream_fill_sequential(&s, nw - 1, 1, T, in, tg);
        /* the last window of shard 1 ends at token ((n-1)/T) * T, before the stream's last */
        CHECK(in[0] == 0 && tg[T - 1] == ((n - 1) % T == 0 ? 7 : 0), "the last sequential window");
    }
    fs_token_stream_close(&s);
    remove_subdir("big");
}

/* ------------------------------------------------------------------ main */

int main(void) {
    if (test_dir_create("data") != 0) return 1;
    RUN(test_tokenizer_round_trip);
    RUN(test_text_file_is_its_bytes);
    RUN(test_empty_file_is_empty_text);
    RUN(test_write_uint16_round_trip);
    RUN(test_write_uint32_round_trip);
    RUN(test_llmc_layout_byte_by_byte);
    RUN(test_write_replaces_and_refuses);
    RUN(test_missing_directory_and_unreadable);
    RUN(test_hostile_headers);
    RUN(test_check_vocab);
    RUN(test_check_length);
    RUN(test_close_is_safe);
    RUN(test_files_over_2gib);
    RUN(test_sampler_windows);
    RUN(test_sampler_all_widths);
    RUN(test_sequential_windows);
    RUN(test_tokenize_files);
    RUN(test_stream_directory_order_and_boundaries);
    RUN(test_stream_patterns_and_lists);
    RUN(test_stream_refusals_name_the_file);
    RUN(test_stream_over_2g_tokens);
    test_dir_remove();
    return fs_test_summary();
}
