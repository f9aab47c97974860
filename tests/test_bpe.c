/*
 * tests/test_bpe.c — the tokenizer.json BPE (flatshard/bpe.h) and the streaming tokenizer
 * (flatshard/tokenize.h) on hand-made tokenizer.json files whose ids can be worked out by
 * hand: merge order by rank (not by position), leftmost ties, byte fallback, unk fusing,
 * added tokens (leftmost, then longest; which newlines they may hold, where no chunk may be
 * cut), the post-processor template and chunk flags, refusals (one line naming the file and
 * the field), hostile text (invalid UTF-8 with the U+FFFD the Unicode standard's "maximal
 * subpart" rule gives, NUL bytes, empty text, a 3 MB unsplit word), decode(encode(x)) == x,
 * the streaming writer, and documents, threads and chunks.
 *
 * The comparison with the `tokenizers` package itself, on trained tokenizers and real text,
 * is tests/cli/test_tokenizer.sh.
 */
#include "flatshard/bpe.h"
#include "flatshard/data.h"
#include "flatshard/tokenize.h"
#include "harness.h"
#include "testdir.h"

#include <stdint.h>
#include <sys/stat.h>
#include <unistd.h>

/* A byte-level tokenizer: the printable ASCII characters ('!'..'~', ids 0..93), 'Ġ' (the
 * GPT-2 character of the space byte, id 94), five merges, GPT-2's pre-tokenizer, and two
 * added tokens that the tokenizers package numbers 100 and 101 (after the 100 entries). */
static char bytelevel_json[16384];

static void make_bytelevel_json(void) {
    char *p = bytelevel_json;
    size_t left = sizeof bytelevel_json;
    int n = snprintf(p, left, "{\"version\": \"1.0\", \"truncation\": null, \"padding\": null,\n"
                              " \"added_tokens\": [{\"id\": 100, \"content\": \"<|eot|>\", \"special\": true},\n"
                              "                  {\"id\": 101, \"content\": \"<|eo\", \"special\": false}],\n"
                              " \"normalizer\": null,\n"
                              " \"pre_tokenizer\": {\"type\": \"ByteLevel\", \"add_prefix_space\": false, \"use_regex\": true},\n"
                              " \"post_processor\": {\"type\": \"TemplateProcessing\",\n"
                              "   \"single\": [{\"SpecialToken\": {\"id\": \"<|eot|>\", \"type_id\": 0}}, {\"Sequence\": {\"id\": \"A\", \"type_id\": 0}},\n"
                              "              {\"SpecialToken\": {\"id\": \"<|eo\", \"type_id\": 0}}],\n"
                              "   \"special_tokens\": {\"<|eot|>\": {\"id\": \"<|eot|>\", \"ids\": [100], \"tokens\": [\"<|eot|>\"]},\n"
                              "                      \"<|eo\": {\"id\": \"<|eo\", \"ids\": [101], \"tokens\": [\"<|eo\"]}}},\n"
                              " \"decoder\": {\"type\": \"ByteLevel\"},\n"
                              " \"model\": {\"type\": \"BPE\", \"dropout\": null, \"unk_token\": null, \"fuse_unk\": false,\n"
                              "   \"byte_fallback\": false, \"vocab\": {");
    p += n;
    left -= (size_t)n;
    for (int c = '!'; c <= '~'; c++) {
        if (c == '"' || c == '\\') n = snprintf(p, left, "\"\\%c\": %d, ", c, c - '!');
        else n = snprintf(p, left, "\"%c\": %d, ", c, c - '!');
        p += n;
        left -= (size_t)n;
    }
    snprintf(p, left, "\"\xC4\xA0\": 94, \"\xC4\xA0" "a\": 95, \"bc\": 96, \"ab\": 97, \"aa\": 98, \"\xC4\xA0" "abc\": 99},\n"
                      "   \"merges\": [[\"\xC4\xA0\", \"a\"], \"b c\", [\"a\", \"b\"], [\"a\", \"a\"], [\"\xC4\xA0" "a\", \"bc\"]]}}\n");
}

static int32_t ch(char c) { return c - '!'; }

/* A SentencePiece-style tokenizer (Llama 2's layout): <unk> <s> </s>, the 256 byte tokens
 * (ids 3..258) unless without_bytes, then ▁ h i ▁h ▁hi. */
static char sp_json[32768];

static void make_sp_json(int without_bytes, int fuse_unk) {
    char *p = sp_json;
    size_t left = sizeof sp_json;
    int n = snprintf(p, left,
                     "{\"version\": \"1.0\", \"truncation\": null, \"padding\": null,\n"
                     " \"added_tokens\": [{\"id\": 0, \"content\": \"<unk>\", \"special\": true, \"normalized\": false},\n"
                     "   {\"id\": 1, \"content\": \"<s>\", \"special\": true, \"normalized\": false},\n"
                     "   {\"id\": 2, \"content\": \"</s>\", \"special\": true, \"normalized\": false}],\n"
                     " \"normalizer\": {\"type\": \"Sequence\", \"normalizers\": [{\"type\": \"Prepend\", \"prepend\": \"\xE2\x96\x81\"},\n"
                     "   {\"type\": \"Replace\", \"pattern\": {\"String\": \" \"}, \"content\": \"\xE2\x96\x81\"}]},\n"
                     " \"pre_tokenizer\": null,\n"
                     " \"post_processor\": {\"type\": \"TemplateProcessing\",\n"
                     "   \"single\": [{\"SpecialToken\": {\"id\": \"<s>\", \"type_id\": 0}}, {\"Sequence\": {\"id\": \"A\", \"type_id\": 0}}],\n"
                     "   \"special_tokens\": {\"<s>\": {\"id\": \"<s>\", \"ids\": [1], \"tokens\": [\"<s>\"]}}},\n"
                     " \"decoder\": {\"type\": \"Sequence\", \"decoders\": [{\"type\": \"Replace\", \"pattern\": {\"String\": \"\xE2\x96\x81\"}, \"content\": \" \"},\n"
                     "   {\"type\": \"ByteFallback\"}, {\"type\": \"Fuse\"}, {\"type\": \"Strip\", \"content\": \" \", \"start\": 1, \"stop\": 0}]},\n"
                     " \"model\": {\"type\": \"BPE\", \"dropout\": null, \"unk_token\": \"<unk>\", \"fuse_unk\": %s,\n"
                     "   \"byte_fallback\": true, \"vocab\": {\"<unk>\": 0, \"<s>\": 1, \"</s>\": 2, ",
                     fuse_unk ? "true" : "false");
    p += n;
    left -= (size_t)n;
    int next = 3;
    for (int b = 0; b < 256 && !without_bytes; b++) {
        n = snprintf(p, left, "\"<0x%02X>\": %d, ", b, next++);
        p += n;
        left -= (size_t)n;
    }
    snprintf(p, left,
             "\"\xE2\x96\x81\": %d, \"h\": %d, \"i\": %d, \"\xE2\x96\x81h\": %d, \"\xE2\x96\x81hi\": %d},\n"
             "   \"merges\": [[\"\xE2\x96\x81\", \"h\"], [\"\xE2\x96\x81h\", \"i\"]]}}\n",
             next, next + 1, next + 2, next + 3, next + 4);
}

/* Encodes text with a fresh encoder; returns the number of ids (-1 on error, with a CHECK). */
static int64_t encode(const fs_bpe *bpe, const char *text, size_t n, unsigned flags, int32_t *ids, int64_t cap) {
    fs_bpe_encoder *enc = NULL;
    fs_bpe_ids out = {0};
    fs_status st = fs_bpe_encoder_init(&enc, bpe);
    if (st == FS_OK) st = fs_bpe_encode(enc, text, n, flags, &out);
    CHECK(st == FS_OK, "encode failed: %s", fs_error_message());
    int64_t k = st == FS_OK ? out.n : -1;
    for (int64_t i = 0; i < k && i < cap; i++) ids[i] = out.ids[i];
    fs_bpe_ids_free(&out);
    fs_bpe_encoder_free(enc);
    return k;
}

static int same_ids(const int32_t *a, int64_t na, const int32_t *b, int64_t nb) {
    if (na != nb) return 0;
    for (int64_t i = 0; i < na; i++)
        if (a[i] != b[i]) return 0;
    return 1;
}

#define CHECK_IDS(bpe, text, flags, ...)                                                          \
    do {                                                                                          \
        const int32_t want_[] = {__VA_ARGS__};                                                    \
        int32_t got_[64];                                                                         \
        int64_t n_ = encode(bpe, text, sizeof(text) - 1, flags, got_, 64);                        \
        int64_t nw_ = (int64_t)(sizeof want_ / sizeof want_[0]);                                  \
        CHECK(same_ids(got_, n_, want_, nw_), "'%s': %lld ids (first %d), want %lld (first %d)", \
              text, (long long)n_, n_ > 0 ? got_[0] : -1, (long long)nw_, want_[0]);            \
    } while (0)

static fs_bpe *load_text(const char *name, const char *json) {
    write_file(tpath(name), json, strlen(json));
    fs_bpe *bpe = NULL;
    CHECK_OK(fs_bpe_load(&bpe, tpath(name)));
    return bpe;
}

static void test_merges_follow_rank(void) {
    make_bytelevel_json();
    fs_bpe *bpe = load_text("bl.json", bytelevel_json);
    if (!bpe) return;
    CHECK(fs_bpe_vocab_size(bpe) == 102, "vocabulary %d, want 102", fs_bpe_vocab_size(bpe));
    /* "b c" (rank 1) merges before "a b" (rank 2) although "ab" comes first in the text */
    CHECK_IDS(bpe, "abc", 0, ch('a'), 96);
    /* Ġ a -> Ġa (rank 0), b c -> bc (1), then Ġa bc -> Ġabc (4) */
    CHECK_IDS(bpe, " abc", 0, 99);
    /* equal ranks merge leftmost first: aa a, aa aa */
    CHECK_IDS(bpe, "aaa", 0, 98, ch('a'));
    CHECK_IDS(bpe, "aaaa", 0, 98, 98);
    /* GPT-2's regex: "ab" and " ab" are separate pieces, digits and punctuation too */
    CHECK_IDS(bpe, "ab ab", 0, 97, 95, ch('b'));
    CHECK_IDS(bpe, "x12!", 0, ch('x'), ch('1'), ch('2'), ch('!'));
    /* a character outside the vocabulary, without unk or byte fallback, is dropped before
     * the merges (as the tokenizers package does, so its neighbours merge): é is bytes C3 A9,
     * GPT-2 characters Ã and ©, neither known, and "aéb" is the one piece "ab" */
    CHECK_IDS(bpe, "a\xC3\xA9" "b", 0, 97);
    fs_bpe_free(bpe);
}

static void test_added_tokens_and_template(void) {
    make_bytelevel_json();
    fs_bpe *bpe = load_text("bl.json", bytelevel_json);
    if (!bpe) return;
    /* leftmost, then longest: <|eot|> (100) over its prefix <|eo (101) */
    CHECK_IDS(bpe, "x<|eot|>y", 0, ch('x'), 100, ch('y'));
    CHECK_IDS(bpe, "x<|eox", 0, ch('x'), 101, ch('x'));
    CHECK_IDS(bpe, "<|eot|><|eot|>", 0, 100, 100);
    /* the template: 100 before, 101 after; chunk flags leave out the side that continues */
    CHECK_IDS(bpe, "ab", FS_BPE_ADD_SPECIAL, 100, 97, 101);
    CHECK_IDS(bpe, "ab", FS_BPE_ADD_SPECIAL | FS_BPE_CONTINUES, 97, 101);
    CHECK_IDS(bpe, "ab", FS_BPE_ADD_SPECIAL | FS_BPE_CONTINUED, 100, 97);
    CHECK_IDS(bpe, "", FS_BPE_ADD_SPECIAL, 100, 101);
    CHECK(fs_bpe_token_id(bpe, "<|eot|>") == 100 && fs_bpe_token_id(bpe, "bc") == 96 &&
              fs_bpe_token_id(bpe, "nothere") == -1,
          "token ids by text");
    CHECK(fs_bpe_token_text(bpe, 99) && strcmp(fs_bpe_token_text(bpe, 99), "\xC4\xA0" "abc") == 0 &&
              fs_bpe_token_text(bpe, 102) == NULL && fs_bpe_token_text(bpe, -1) == NULL,
          "token text by id");
    CHECK(fs_bpe_eos_id(bpe) == -1, "no eos among these names");
    /* decode: special tokens skipped unless asked for; ByteLevel maps Ġ back to a space */
    const int32_t ids[] = {100, 99, 94, ch('x'), 101, 5000, -3};
    char *text = NULL;
    size_t n = 0;
    CHECK_OK(fs_bpe_decode(bpe, ids, 7, 1, &text, &n));
    CHECK(text && strcmp(text, " abc x<|eo") == 0 && n == strlen(text), "decoded '%s'", text ? text : "");
    free(text);
    CHECK_OK(fs_bpe_decode(bpe, ids, 7, 0, &text, &n));
    CHECK(text && strcmp(text, "<|eot|> abc x<|eo") == 0, "decoded with specials '%s'", text ? text : "");
    free(text);
    fs_bpe_free(bpe);
}

static void test_byte_fallback_and_unk(void) {
    make_sp_json(0, 1);
    fs_bpe *bpe = load_text("sp.json", sp_json);
    if (!bpe) return;
    int32_t sp = 259, h = 260, hh = 262, hi = 263;
    CHECK(fs_bpe_eos_id(bpe) == 2, "eos </s> is 2, got %d", fs_bpe_eos_id(bpe));
    /* "▁" prepended, spaces replaced, merges ▁h then ▁hi */
    CHECK_IDS(bpe, "hi hi", FS_BPE_ADD_SPECIAL, 1, hi, hi);
    CHECK_IDS(bpe, "hi  h", 0, hi, sp, hh);
    /* é is not in the vocabulary: its bytes C3 A9 become <0xC3> <0xA9> */
    CHECK_IDS(bpe, "h\xC3\xA9", 0, hh, 3 + 0xC3, 3 + 0xA9);
    /* NUL is a character like any other: byte fallback <0x00> */
    CHECK_IDS(bpe, "h\0h", 0, hh, 3, h);
    /* a continued chunk gets no "▁" of its own: the document has one, at its start */
    CHECK_IDS(bpe, "hi", FS_BPE_CONTINUES, h, 261);
    /* each segment between added tokens is normalized on its own, as tokenizers does */
    CHECK_IDS(bpe, "hi</s>hi", 0, hi, 2, hi);
    const int32_t ids[] = {1, hh, 3 + 0xC3, 3 + 0xA9, sp, hi, 3 + 0xE2, 2};
    char *text = NULL;
    size_t n = 0;
    /* Strip takes the prepended space; a lone byte <0xE2> is invalid UTF-8: one U+FFFD */
    CHECK_OK(fs_bpe_decode(bpe, ids, 8, 1, &text, &n));
    CHECK(text && strcmp(text, "h\xC3\xA9  hi\xEF\xBF\xBD") == 0, "decoded '%s'", text ? text : "");
    free(text);
    fs_bpe_free(bpe);

    /* without byte tokens, unknown characters are <unk>: fused into one under fuse_unk */
    make_sp_json(1, 1);
    bpe = load_text("sp-unk.json", sp_json);
    if (!bpe) return;
    /* ids: <unk> 0, <s> 1, </s> 2, ▁ 3, h 4, i 5, ▁h 6, ▁hi 7 */
    CHECK_IDS(bpe, "h\xC3\xA9\xE2\x82\xAC" "h", 0, 6, 0, 4);
    fs_bpe_free(bpe);
    make_sp_json(1, 0);
    bpe = load_text("sp-unk2.json", sp_json);
    if (!bpe) return;
    CHECK_IDS(bpe, "h\xC3\xA9\xE2\x82\xAC" "h", 0, 6, 0, 0, 4);
    fs_bpe_free(bpe);
}

/* the replacement of every maximal invalid subpart by one U+FFFD (Unicode 15, section 3.9,
 * "U+FFFD Substitution of Maximal Subparts"); the byte-level tokenizer then decodes it back */
static void test_invalid_utf8(void) {
    make_bytelevel_json();
    fs_bpe *bpe = load_text("bl.json", bytelevel_json);
    if (!bpe) return;
    static const struct {
        const char *in;
        size_t n;
        const char *want;
    } cases[] = {
        {"a\xFF" "b", 3, "a\xEF\xBF\xBD" "b"},
        {"\xE2\x82", 2, "\xEF\xBF\xBD"},                          /* a cut 3-byte sequence: one */
        {"\xF0\x9F\x98 x", 5, "\xEF\xBF\xBD x"},                  /* a cut 4-byte sequence: one */
        {"\xED\xA0\x80", 3, "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD"}, /* a surrogate: three */
        {"\xC0\xAF", 2, "\xEF\xBF\xBD\xEF\xBF\xBD"},              /* overlong: two */
        {"\xF4\x90\x80\x80", 4, "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD"}, /* > U+10FFFF */
        {"\x80\x80", 2, "\xEF\xBF\xBD\xEF\xBF\xBD"},
        {"ok\xC3", 3, "ok\xEF\xBF\xBD"},
    };
    /* every character of the vocabulary-less result is dropped except ASCII, so compare the
     * encodings of input and expected text instead of decoding */
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        int32_t a[64], b[64];
        int64_t na = encode(bpe, cases[i].in, cases[i].n, 0, a, 64);
        int64_t nb = encode(bpe, cases[i].want, strlen(cases[i].want), 0, b, 64);
        CHECK(same_ids(a, na, b, nb), "case %zu: invalid UTF-8 does not encode as its U+FFFD form", i);
    }
    fs_bpe_free(bpe);
    /* with byte fallback the U+FFFD is visible in the ids: EF BF BD */
    make_sp_json(0, 1);
    bpe = load_text("sp.json", sp_json);
    if (!bpe) return;
    CHECK_IDS(bpe, "h\xFF", 0, 262, 3 + 0xEF, 3 + 0xBF, 3 + 0xBD);
    fs_bpe_free(bpe);

    uint8_t cut1[] = {'a', 'b', 0xC3}, cut2[] = {'a', 0xC3, 0xA9}, cut3[] = {0xE2, 0x82};
    uint8_t bad[] = {'a', 0xFF}, cut4[] = {'a', 0xF0, 0x9F, 0x98};
    CHECK(fs_utf8_complete_prefix(cut1, 3) == 2, "a cut 2-byte sequence is held back");
    CHECK(fs_utf8_complete_prefix(cut2, 3) == 3, "a complete sequence is kept");
    CHECK(fs_utf8_complete_prefix(cut3, 2) == 0, "a cut 3-byte sequence is held back");
    CHECK(fs_utf8_complete_prefix(bad, 2) == 2, "an invalid byte is complete");
    CHECK(fs_utf8_complete_prefix(cut4, 4) == 1, "a cut 4-byte sequence is held back");
}

static uint64_t rng_state = 0x9E3779B97F4A7C15ull;
static uint32_t rnd(void) {
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (uint32_t)(rng_state >> 16);
}

/* decode(encode(x)) == x on random valid UTF-8 (NUL, controls, CJK, emoji included) for the
 * byte-level tokenizer (every byte is a character of its vocabulary here: the printable ASCII
 * subset is, so the text is ASCII) and the SentencePiece-style one (byte fallback covers the
 * rest); hostile random bytes and ids never crash and decode to valid UTF-8. */
static void test_round_trip_and_hostile(void) {
    make_sp_json(0, 1);
    fs_bpe *sp = load_text("sp.json", sp_json);
    make_bytelevel_json();
    fs_bpe *bl = load_text("bl.json", bytelevel_json);
    if (!sp || !bl) {
        fs_bpe_free(sp);
        fs_bpe_free(bl);
        return;
    }
    enum { N = 4096 };
    char *text = malloc(4 * N + 1);
    int32_t *ids = malloc((16 * N + 8) * sizeof *ids);
    for (int round = 0; round < 20 && text && ids; round++) {
        size_t n = 0;
        for (int k = 0; k < N / 4; k++) {
            uint32_t pick = rnd() % 6, cp;
            if (pick == 0) cp = rnd() % 0x80;
            else if (pick == 1) cp = ' ';
            else if (pick == 2) cp = 'a' + rnd() % 3;
            else if (pick == 3) cp = 0x4E00 + rnd() % 0x5000;
            else if (pick == 4) cp = 0x1F600 + rnd() % 0x50;
            else cp = 0x300 + rnd() % 0x70; /* combining marks */
            char *o = text + n;
            if (cp < 0x80) {
                o[0] = (char)cp;
                n += 1;
            } else if (cp < 0x800) {
                o[0] = (char)(0xC0 | (cp >> 6));
                o[1] = (char)(0x80 | (cp & 0x3F));
                n += 2;
            } else if (cp < 0x10000) {
                o[0] = (char)(0xE0 | (cp >> 12));
                o[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
                o[2] = (char)(0x80 | (cp & 0x3F));
                n += 3;
            } else {
                o[0] = (char)(0xF0 | (cp >> 18));
                o[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
                o[2] = (char)(0x80 | ((cp >> 6) & 0x3F));
                o[3] = (char)(0x80 | (cp & 0x3F));
                n += 4;
            }
        }
        int64_t k = encode(sp, text, n, FS_BPE_ADD_SPECIAL, ids, 16 * N + 8);
        char *back = NULL;
        size_t nb = 0;
        if (k >= 0) CHECK_OK(fs_bpe_decode(sp, ids, k, 1, &back, &nb));
        CHECK(back && nb == n && memcmp(back, text, n) == 0, "round %d: SentencePiece decode(encode(x)) != x", round);
        free(back);
        /* byte-level: keep the ASCII printable part and spaces (its vocabulary) */
        size_t m = 0;
        for (size_t i = 0; i < n; i++)
            if ((uint8_t)text[i] >= ' ' && (uint8_t)text[i] < 0x7F) text[m++] = text[i];
        k = encode(bl, text, m, 0, ids, 16 * N + 8);
        back = NULL;
        if (k >= 0) CHECK_OK(fs_bpe_decode(bl, ids, k, 1, &back, &nb));
        CHECK(back && nb == m && memcmp(back, text, m) == 0, "round %d: byte-level decode(encode(x)) != x", round);
        free(back);
        /* hostile: random bytes in, random ids out */
        for (size_t i = 0; i < n; i++) text[i] = (char)rnd();
        CHECK(encode(sp, text, n, FS_BPE_ADD_SPECIAL, ids, 16 * N + 8) > 0, "random bytes encode");
        CHECK(encode(bl, text, n, FS_BPE_ADD_SPECIAL, ids, 16 * N + 8) >= 2, "random bytes encode");
        for (int i = 0; i < N; i++) ids[i] = (int32_t)(rnd() % 400) - 50;
        CHECK_OK(fs_bpe_decode(sp, ids, N, round & 1, &back, &nb));
        free(back);
        CHECK_OK(fs_bpe_decode(bl, ids, N, round & 1, &back, &nb));
        free(back);
    }
    /* a 3 MB text without a pre-tokenizer is one word: ▁hi a million times over */
    size_t big = 3 * 1000 * 1000;
    char *huge = malloc(big);
    fs_bpe_encoder *enc = NULL;
    fs_bpe_ids out = {0};
    if (huge) {
        for (size_t i = 0; i < big; i += 3) memcpy(huge + i, "hi ", 3);
        CHECK_OK(fs_bpe_encoder_init(&enc, sp));
        if (enc) CHECK_OK(fs_bpe_encode(enc, huge, big - 1, 0, &out));
        int all = out.n == (int64_t)(big / 3);
        for (int64_t i = 0; all && i < out.n; i++) all = out.ids[i] == 263;
        CHECK(all, "a 3 MB word: %lld ids, want %zu times ▁hi", (long long)out.n, big / 3);
    }
    fs_bpe_ids_free(&out);
    fs_bpe_encoder_free(enc);
    free(huge);
    free(text);
    free(ids);
    fs_bpe_free(sp);
    fs_bpe_free(bl);
}

/* chunk flags: a document cut after a newline gives the ids of the whole document */
static void test_chunks_equal_whole(void) {
    make_bytelevel_json();
    fs_bpe *bl = load_text("bl.json", bytelevel_json);
    make_sp_json(0, 1);
    fs_bpe *sp = load_text("sp.json", sp_json);
    const fs_bpe *both[2] = {bl, sp};
    for (int t = 0; t < 2; t++) {
        if (!both[t]) continue;
        const char doc[] = "ab hi\nhi abc\nx";
        int32_t whole[64], parts[64];
        int64_t nw = encode(both[t], doc, sizeof doc - 1, FS_BPE_ADD_SPECIAL, whole, 64);
        int64_t n1 = encode(both[t], doc, 6, FS_BPE_ADD_SPECIAL | FS_BPE_CONTINUED, parts, 64);
        int64_t n2 = encode(both[t], doc + 6, 7, FS_BPE_ADD_SPECIAL | FS_BPE_CONTINUES | FS_BPE_CONTINUED, parts + n1, 64 - n1);
        int64_t n3 = encode(both[t], doc + 13, 1, FS_BPE_ADD_SPECIAL | FS_BPE_CONTINUES, parts + n1 + n2, 64 - n1 - n2);
        CHECK(n1 >= 0 && n2 >= 0 && n3 >= 0 && same_ids(whole, nw, parts, n1 + n2 + n3),
              "tokenizer %d: three chunks (%lld ids) differ from the whole document (%lld)", t,
              (long long)(n1 + n2 + n3), (long long)nw);
    }
    fs_bpe_free(bl);
    fs_bpe_free(sp);
}

/* Copies src with the first occurrence of from replaced by to into out. */
static void replace_once(char *out, size_t cap, const char *src, const char *from, const char *to) {
    const char *at = strstr(src, from);
    if (!at) {
        fprintf(stderr, "test setup: '%s' not in the JSON\n", from);
        abort();
    }
    snprintf(out, cap, "%.*s%s%s", (int)(at - src), src, to, at + strlen(from));
}

static void test_refusals(void) {
    make_sp_json(0, 1);
    make_bytelevel_json();
    static const struct {
        int bytelevel;
        const char *from, *to, *want;
    } cases[] = {
        {0, "\"type\": \"BPE\"", "\"type\": \"Unigram\"", "model type 'Unigram' is not supported (BPE only)"},
        {0, "\"type\": \"BPE\"", "\"type\": \"WordPiece\"", "model type 'WordPiece' is not supported (BPE only)"},
        {0, "\"type\": \"Prepend\", \"prepend\": \"\xE2\x96\x81\"", "\"type\": \"NFKC\"", "normalizer type 'NFKC' is not supported"},
        {0, "\"truncation\": null", "\"truncation\": {\"max_length\": 8}", "tokenizer.truncation is set"},
        {0, "\"padding\": null", "\"padding\": {\"strategy\": \"BatchLongest\"}", "tokenizer.padding is set"},
        {0, "\"content\": \"<s>\",", "\"content\": \"<s>\", \"lstrip\": true,", "added token '<s>' sets lstrip"},
        {0, "\"dropout\": null", "\"dropout\": 0.1", "model.dropout"},
        {0, "\"fuse_unk\"", "\"continuing_subword_prefix\": \"##\", \"fuse_unk\"", "model.continuing_subword_prefix is set"},
        {0, "[\"\xE2\x96\x81h\", \"i\"]", "[\"\xE2\x96\x81h\", \"q\"]", "merges[1]"},
        {0, "{\"type\": \"Fuse\"}", "{\"type\": \"CTC\"}", "decoder type 'CTC' is not supported"},
        {0, "\"unk_token\": \"<unk>\"", "\"unk_token\": \"<nope>\"", "model.unk_token '<nope>' is not in the vocabulary"},
        {0, "{\"version\"", "[{\"version\"", "not a JSON object"},
        {0, "\"id\": 2, \"content\": \"</s>\"", "\"id\": 7, \"content\": \"</s>\"", "added token '</s>' says id 7"},
        {1, "{\"type\": \"ByteLevel\", \"add_prefix_space\"", "{\"type\": \"Whitespace\", \"add_prefix_space\"", "pre_tokenizer type 'Whitespace' is not supported"},
        {1, "{\"type\": \"ByteLevel\", \"add_prefix_space\": false, \"use_regex\": true}",
         "{\"type\": \"Split\", \"pattern\": {\"Regex\": \"(a\"}, \"behavior\": \"Isolated\", \"invert\": false}",
         "the regex does not compile"},
        {1, "{\"type\": \"ByteLevel\", \"add_prefix_space\": false, \"use_regex\": true}",
         "{\"type\": \"Split\", \"pattern\": {\"String\": \" \"}, \"behavior\": \"Isolated\", \"invert\": true}",
         "Split with invert: true"},
        {1, "{\"type\": \"ByteLevel\", \"add_prefix_space\": false, \"use_regex\": true}",
         "{\"type\": \"Split\", \"pattern\": {\"String\": \" \"}, \"behavior\": \"Contiguous\", \"invert\": false}",
         "behavior 'Contiguous' is not supported"},
        {1, "{\"type\": \"TemplateProcessing\"", "{\"type\": \"RobertaProcessing\"", "post_processor type 'RobertaProcessing'"},
    };
    static char json[40000];
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        replace_once(json, sizeof json, cases[i].bytelevel ? bytelevel_json : sp_json, cases[i].from, cases[i].to);
        const char *path = tpath("refused.json");
        write_file(path, json, strlen(json));
        fs_bpe *bpe = NULL;
        fs_status st = fs_bpe_load(&bpe, path);
        const char *msg = fs_error_message();
        CHECK(st == FS_ERR_FORMAT && !bpe, "case %zu (%s): status %s", i, cases[i].want, fs_status_name(st));
        CHECK(strstr(msg, path) == msg && strstr(msg, cases[i].want) && !strchr(msg, '\n'),
              "case %zu: message '%s' should start with the file and say '%s'", i, msg, cases[i].want);
        fs_bpe_free(bpe);
    }
    fs_bpe *bpe = NULL;
    CHECK(fs_bpe_load(&bpe, tpath("missing.json")) == FS_ERR_IO && !bpe, "a missing file is an I/O error");
    write_file(tpath("empty.json"), "", 0);
    CHECK(fs_bpe_load(&bpe, tpath("empty.json")) == FS_ERR_FORMAT && !bpe, "an empty file is a format error");
}

/* normalized: true: the token is matched by its normalized form in the normalized text, so
 * under Prepend("▁") "<s>" is found as "▁<s>" (as tokenizers does; Llama 2 files vary) */
static void test_normalized_added_tokens(void) {
    make_sp_json(0, 1);
    static char json[40000];
    replace_once(json, sizeof json, sp_json, "\"content\": \"<s>\", \"special\": true, \"normalized\": false",
                 "\"content\": \"<s>\", \"special\": true, \"normalized\": true");
    fs_bpe *bpe = load_text("spn.json", json);
    if (!bpe) return;
    int32_t sp = 259, x = 3 + 'x', y = 3 + 'y';
    CHECK_IDS(bpe, "x <s> y", 0, sp, x, 1, sp, y);
    CHECK_IDS(bpe, "<s>x", 0, 1, x);
    /* not preceded by a space (a "▁"), it is not that token: its bytes fall back */
    CHECK_IDS(bpe, "x<s>", 0, sp, x, 3 + '<', 3 + 's', 3 + '>');
    fs_bpe_free(bpe);
}

#define COVERS(bpe, before, after) \
    fs_bpe_added_may_cover_newline(bpe, before, sizeof(before) - 1, after, sizeof(after) - 1)

/* Whether tokenizing text (one document) in chunks of chunk_bytes gives the ids of encoding it
 * whole, with the template but no eos; want: an id the whole must hold. */
static int chunked_equals_whole(const fs_bpe *bpe, const char *name, const char *text, size_t chunk_bytes,
                                int32_t want) {
    write_file(tpath(name), text, strlen(text));
    fs_tokenize_options o = fs_tokenize_options_default();
    o.add_eos = 0;
    o.chunk_bytes = chunk_bytes;
    const char *inputs[] = {tpath(name)};
    int32_t whole[4096];
    int64_t nw = encode(bpe, text, strlen(text), FS_BPE_ADD_SPECIAL, whole, 4096);
    int ok = nw > 0 && nw <= 4096 && fs_tokenize_files_bpe(bpe, tpath("chunked.bin"), inputs, 1, &o, NULL) == FS_OK;
    fs_token_data d;
    ok = ok && fs_token_data_open(&d, tpath("chunked.bin")) == FS_OK;
    if (!ok) return 0;
    int held = 0;
    ok = d.n_tokens == nw;
    for (int64_t i = 0; ok && i < nw; i++) {
        ok = fs_token_data_get(&d, i) == whole[i];
        held |= whole[i] == want;
    }
    fs_token_data_close(&d);
    return ok && held;
}

/* Added tokens that hold a newline: a cut after that newline would split one, or (after one
 * that ends there) take the segment start from the text after it, so the streaming tokenizer
 * asks fs_bpe_added_may_cover_newline before it cuts there. */
static void test_cuts_keep_added_tokens(void) {
    make_bytelevel_json();
    static char json[40000];
    replace_once(json, sizeof json, bytelevel_json, "\"special\": false}],",
                 "\"special\": false},\n {\"id\": 102, \"content\": \"x\\ny\", \"special\": false, \"normalized\": false}],");
    fs_bpe *plain = load_text("bl.json", bytelevel_json), *bl = load_text("bl-nl.json", json);
    make_sp_json(0, 1);
    /* under Prepend("▁") the normalized "x\ny" is matched as "▁x\ny"; "z\n" ends at a cut */
    replace_once(json, sizeof json, sp_json, "\"special\": true, \"normalized\": false}],",
                 "\"special\": true, \"normalized\": false},\n {\"id\": 264, \"content\": \"x\\ny\", \"special\": false, \"normalized\": true},\n"
                 " {\"id\": 265, \"content\": \"z\\n\", \"special\": false, \"normalized\": false}],");
    fs_bpe *sp = load_text("sp-nl.json", json);
    if (!plain || !bl || !sp) {
        fs_bpe_free(plain);
        fs_bpe_free(bl);
        fs_bpe_free(sp);
        return;
    }
    CHECK(!COVERS(plain, "aax\n", "ybb"), "without an added token with a newline, a newline is clear");
    CHECK(COVERS(bl, "aax\n", "ybb"), "x\\ny lies over the newline of aax|ybb");
    CHECK(!COVERS(bl, "aaq\n", "ybb") && !COVERS(bl, "aax\n", "qbb"), "x\\ny does not lie over aaq|ybb or aax|qbb");
    CHECK(COVERS(bl, "\n", "ybb") && COVERS(bl, "aax\n", ""), "text that runs out may go on matching");
    CHECK(COVERS(plain, "aax", "ybb"), "a before that does not end in a newline gives 1");
    CHECK(COVERS(sp, "a x\n", "ybb"), "the normalized \"\xE2\x96\x81x\\ny\" lies over a x|ybb");
    CHECK(!COVERS(sp, "a q\n", "ybb") && !COVERS(sp, "a x\n", "qbb"), "nor over a q|ybb or a x|qbb");
    CHECK(COVERS(sp, "aaz\n", "bb") && !COVERS(sp, "aaq\n", "bb"), "z\\n ends at the newline of aaz|bb");
    /* the streaming tokenizer: 1 KiB chunks, the first cut due after line 128 */
    static char text[2048];
    const char *ends[][2] = {{"aaaaaax", "ybbbbbb"}, {"aaaaa x", "ybbbbbb"}, {"aaaaaaz", "bbbbbbb"}};
    const fs_bpe *tok[] = {bl, sp, sp};
    const int32_t want[] = {102, 264, 265};
    for (int c = 0; c < 3; c++) {
        size_t n = 0;
        for (int i = 0; i < 127; i++) n += (size_t)snprintf(text + n, sizeof text - n, "aaaaaaa\n");
        n += (size_t)snprintf(text + n, sizeof text - n, "%s\n", ends[c][0]);
        for (int i = 0; i < 10; i++) n += (size_t)snprintf(text + n, sizeof text - n, "%s\n", ends[c][1]);
        CHECK(chunked_equals_whole(tok[c], "cut.txt", text, 1024, want[c]),
              "case %d: 1 KiB chunks of '...%s|%s...' differ from the whole document (or lack id %d)", c,
              ends[c][0], ends[c][1], want[c]);
    }
    fs_bpe_free(plain);
    fs_bpe_free(bl);
    fs_bpe_free(sp);
}

/* src with extra vocabulary entries (", \"x\": 9" form) and one merge of rank 0 before its
 * own, into out. */
static void with_merge_first(char *out, size_t cap, const char *src, const char *vocab, const char *merge) {
    char with[512];
    snprintf(with, sizeof with, "%s},\n   \"merges\": [%s, ", vocab, merge);
    replace_once(out, cap, src, "},\n   \"merges\": [", with);
}

/* Random text for the cut-or-uncut comparison: h, i, runs of spaces, a newline, é and 😀 (byte
 * fallback or unk), and </s> (an added token, so short segments such as "ih" come up). */
static size_t random_sp_text(char *text, size_t cap) {
    static const char *const parts[] = {"h", "i", "hi", "ih", " ", "  ", "   ", "\n", "\xC3\xA9", "\xF0\x9F\x98\x80", "</s>"};
    size_t n = 0;
    while (n + 8 < cap) {
        const char *p = parts[rnd() % 11];
        memcpy(text + n, p, strlen(p));
        n += strlen(p);
    }
    return n;
}

/* The SentencePiece-style json (its first free id next) as it is, where "▁" starts tokens
 * only, must be cut; with q▁ added (a merge q + ▁, which could join across a cut) it must
 * not, but no text here has a q, so that is the same model encoded uncut: the same ids. */
static void check_cut_equals_uncut(const char *what, const char *json, int32_t next) {
    static char uncut_json[40000];
    char vocab[128];
    snprintf(vocab, sizeof vocab, ", \"q\": %d, \"q\xE2\x96\x81\": %d", next, next + 1);
    with_merge_first(uncut_json, sizeof uncut_json, json, vocab, "[\"q\", \"\xE2\x96\x81\"]");
    fs_bpe *cut = load_text("sp-cut.json", json), *uncut = load_text("sp-uncut.json", uncut_json);
    enum { N = 6000 };
    char *text = malloc(N);
    int32_t *a = malloc(4 * N * sizeof *a), *b = malloc(4 * N * sizeof *b);
    if (cut && uncut && text && a && b) {
        CHECK(fs_bpe_split_at_metaspace(cut), "%s: \"▁\" only at token starts, so cut", what);
        CHECK(!fs_bpe_split_at_metaspace(uncut), "%s: with a merge q + ▁, not cut", what);
        for (int round = 0; round < 20; round++) {
            size_t n = random_sp_text(text, N);
            unsigned flags = round & 1 ? FS_BPE_ADD_SPECIAL : FS_BPE_CONTINUES;
            int64_t na = encode(cut, text, n, flags, a, 4 * N), nb = encode(uncut, text, n, flags, b, 4 * N);
            CHECK(na > 0 && same_ids(a, na, b, nb), "%s, round %d: cut %lld ids, uncut %lld", what, round,
                  (long long)na, (long long)nb);
        }
    }
    free(text);
    free(a);
    free(b);
    fs_bpe_free(cut);
    fs_bpe_free(uncut);
}

/* split_at_metaspace (bpe.c, decide_split_at_metaspace): on where no merge joins across a
 * "▁", off where one can, and the ids the same either way, with byte fallback, fused and
 * unfused unk, and ignore_merges */
static void test_split_at_metaspace(void) {
    static char json[40000];
    make_sp_json(0, 1);
    check_cut_equals_uncut("byte fallback", sp_json, 264);
    make_sp_json(1, 1);
    check_cut_equals_uncut("fused unk", sp_json, 8);
    make_sp_json(1, 0);
    check_cut_equals_uncut("unk", sp_json, 8);
    /* ▁▁ (a merge ▁ + ▁ of rank 0, as Llama 2 has runs of ▁): a cut goes before a run only */
    with_merge_first(json, sizeof json, sp_json, ", \"\xE2\x96\x81\xE2\x96\x81\": 8",
                     "[\"\xE2\x96\x81\", \"\xE2\x96\x81\"]");
    check_cut_equals_uncut("unk and a run of \"▁\"", json, 9);
    /* without unk, a character outside the vocabulary is dropped, which can bring two "▁"
     * together across a cut: "é  h" is ▁ é ▁ ▁ h, merged as ▁▁ ▁h, not ▁ | ▁▁ h. Not cut. */
    static char no_unk[40000];
    replace_once(no_unk, sizeof no_unk, json, "\"unk_token\": \"<unk>\"", "\"unk_token\": null");
    fs_bpe *bpe = load_text("sp-drop.json", no_unk);
    if (bpe) {
        CHECK(!fs_bpe_split_at_metaspace(bpe), "characters dropped (no unk, no byte tokens): not cut");
        CHECK_IDS(bpe, "\xC3\xA9  h", 0, 8, 6);
        fs_bpe_free(bpe);
    }
    /* ignore_merges looks up the whole segment: "ih" is ▁ih (264), a token no merge makes,
     * while in "ih ih" it is ▁ i h twice over, cut or not */
    make_sp_json(0, 1);
    static char with_ih[40000];
    replace_once(json, sizeof json, sp_json, "\"byte_fallback\": true", "\"byte_fallback\": true, \"ignore_merges\": true");
    replace_once(with_ih, sizeof with_ih, json, "},\n   \"merges\"", ", \"\xE2\x96\x81ih\": 264},\n   \"merges\"");
    check_cut_equals_uncut("ignore_merges", with_ih, 265);
    bpe = load_text("sp-ih.json", with_ih);
    if (bpe) {
        CHECK_IDS(bpe, "ih", 0, 264);
        CHECK_IDS(bpe, "ih ih", 0, 259, 261, 260, 259, 261, 260);
        CHECK_IDS(bpe, "hi ih", 0, 263, 259, 261, 260);
        fs_bpe_free(bpe);
    }
    /* i▁ (a merge i + ▁ of rank 0, before the others) joins across a cut: not cut, and "hi hi"
     * is ▁h i▁ h i, where cut pieces would give ▁hi ▁hi */
    make_sp_json(0, 1);
    with_merge_first(json, sizeof json, sp_json, ", \"i\xE2\x96\x81\": 264", "[\"i\", \"\xE2\x96\x81\"]");
    bpe = load_text("sp-join.json", json);
    if (bpe) {
        CHECK(!fs_bpe_split_at_metaspace(bpe), "a merge i + ▁: not cut");
        CHECK_IDS(bpe, "hi hi", 0, 262, 264, 260, 261);
        fs_bpe_free(bpe);
    }
    /* a vocabulary without "▁", and byte-level models, are never cut */
    make_sp_json(0, 1);
    replace_once(json, sizeof json, sp_json, "\"\xE2\x96\x81\": 259", "\"\xE2\x96\x82\": 259");
    static char no_metaspace[40000];
    replace_once(no_metaspace, sizeof no_metaspace, json, "[[\"\xE2\x96\x81\", \"h\"], [\"\xE2\x96\x81h\", \"i\"]]", "[]");
    bpe = load_text("sp-nometa.json", no_metaspace);
    CHECK(bpe && !fs_bpe_split_at_metaspace(bpe), "no \"▁\" token: not cut");
    fs_bpe_free(bpe);
    make_bytelevel_json();
    bpe = load_text("bl.json", bytelevel_json);
    CHECK(bpe && !fs_bpe_split_at_metaspace(bpe), "byte level: not cut");
    fs_bpe_free(bpe);
}

static void test_stream_writer(void) {
    fs_tokenfile_stream w;
    const int32_t a[] = {0, 1, 69999}, b[] = {65536};
    CHECK_OK(fs_tokenfile_stream_open(&w, tpath("s.bin"), 70000));
    CHECK_OK(fs_tokenfile_stream_append(&w, a, 3));
    CHECK_OK(fs_tokenfile_stream_append(&w, b, 1));
    const int32_t bad[] = {70000};
    CHECK(fs_tokenfile_stream_append(&w, bad, 1) == FS_ERR_USAGE, "an id outside the vocabulary is refused");
    CHECK_OK(fs_tokenfile_stream_commit(&w));
    fs_token_data d;
    CHECK_OK(fs_token_data_open(&d, tpath("s.bin")));
    CHECK(d.n_tokens == 4 && d.token_bytes == 4 && d.vocab_size == 70000 &&
              fs_token_data_get(&d, 2) == 69999 && fs_token_data_get(&d, 3) == 65536,
          "the streamed file reads back: %lld tokens of %d bytes", (long long)d.n_tokens, d.token_bytes);
    fs_token_data_close(&d);
    CHECK_OK(fs_tokenfile_stream_open(&w, tpath("gone.bin"), 300));
    CHECK_OK(fs_tokenfile_stream_append(&w, a, 2));
    fs_tokenfile_stream_abort(&w);
    struct stat sb;
    CHECK(stat(tpath("gone.bin"), &sb) != 0 && !tmp_file_left(tpath("gone.bin")), "abort leaves nothing");

    /* two writers of one path at once (two 'tokenize -o same.bin'): the second opens while the
     * first is half written; each commit must put in its own file, whole. With one shared
     * "<path>.tmp" the second's O_TRUNC emptied the first's file and both wrote into it: the
     * first commit renamed in a mixture, the second found no file. */
    fs_tokenfile_stream w1, w2;
    const int32_t one[] = {1, 2, 3, 4}, two[] = {7, 8, 9};
    CHECK_OK(fs_tokenfile_stream_open(&w1, tpath("both.bin"), 300));
    CHECK_OK(fs_tokenfile_stream_append(&w1, one, 2));
    CHECK_OK(fs_tokenfile_stream_open(&w2, tpath("both.bin"), 300));
    CHECK_OK(fs_tokenfile_stream_append(&w2, two, 3));
    CHECK_OK(fs_tokenfile_stream_append(&w1, one + 2, 2));
    CHECK_OK(fs_tokenfile_stream_commit(&w1));
    CHECK_OK(fs_token_data_open(&d, tpath("both.bin")));
    CHECK(d.n_tokens == 4 && fs_token_data_get(&d, 0) == 1 && fs_token_data_get(&d, 3) == 4,
          "the first commit put in another file than its own: %lld tokens", (long long)d.n_tokens);
    fs_token_data_close(&d);
    CHECK_OK(fs_tokenfile_stream_commit(&w2));
    CHECK_OK(fs_token_data_open(&d, tpath("both.bin")));
    CHECK(d.n_tokens == 3 && fs_token_data_get(&d, 0) == 7 && fs_token_data_get(&d, 2) == 9,
          "the second commit put in another file than its own: %lld tokens", (long long)d.n_tokens);
    fs_token_data_close(&d);
    CHECK(!tmp_file_left(tpath("both.bin")), "a temporary file is left after both commits");
}

static void test_documents_and_threads(void) {
    make_sp_json(0, 1);
    fs_bpe *sp = load_text("sp.json", sp_json);
    if (!sp) return;
    /* empty documents are skipped; the separator line is dropped; eos after each document */
    const char text[] = "%\n%\nhi\n%\nh\n%";
    write_file(tpath("docs.txt"), text, sizeof text - 1);
    fs_tokenize_options o = fs_tokenize_options_default();
    o.doc_separator = "%";
    const char *inputs[] = {tpath("docs.txt")};
    fs_tokenize_stats s;
    CHECK_OK(fs_tokenize_files_bpe(sp, tpath("docs.bin"), inputs, 1, &o, &s));
    fs_token_data d;
    CHECK_OK(fs_token_data_open(&d, tpath("docs.bin")));
    const int32_t want[] = {1, 263, 3 + '\n', 2, 1, 262, 3 + '\n', 2};
    int ok = d.n_tokens == 8 && s.n_documents == 2 && s.n_tokens == 8;
    for (int i = 0; ok && i < 8; i++) ok = fs_token_data_get(&d, i) == want[i];
    CHECK(ok, "two documents with bos and eos: %lld tokens, %lld documents", (long long)d.n_tokens,
          (long long)s.n_documents);
    fs_token_data_close(&d);
    /* 1 and 3 threads, tiny jobs and chunks: the same bytes */
    char *big = malloc(200000);
    size_t n = 0;
    while (big && n + 40 < 200000) {
        n += (size_t)snprintf(big + n, 200000 - n, "hi h%c\n%s", 'a' + (int)(rnd() % 20), rnd() % 9 ? "" : "%\n");
    }
    if (big) write_file(tpath("big.txt"), big, n);
    free(big);
    inputs[0] = tpath("big.txt");
    o.chunk_bytes = 1024;
    o.n_threads = 1;
    CHECK_OK(fs_tokenize_files_bpe(sp, tpath("t1.bin"), inputs, 1, &o, NULL));
    o.n_threads = 3;
    CHECK_OK(fs_tokenize_files_bpe(sp, tpath("t3.bin"), inputs, 1, &o, NULL));
    FILE *f1 = fopen(tpath("t1.bin"), "rb"), *f3 = fopen(tpath("t3.bin"), "rb");
    int same = f1 && f3;
    while (same) {
        int c1 = fgetc(f1), c3 = fgetc(f3);
        if (c1 != c3) same = 0;
        if (c1 == EOF) break;
    }
    if (f1) fclose(f1);
    if (f3) fclose(f3);
    CHECK(same, "1 and 3 threads wrote different files");
    /* no eos in the tokenizer: refused up front */
    make_bytelevel_json();
    fs_bpe *bl = load_text("bl.json", bytelevel_json);
    if (bl) {
        o = fs_tokenize_options_default();
        CHECK(fs_tokenize_files_bpe(bl, tpath("x.bin"), inputs, 1, &o, NULL) == FS_ERR_USAGE &&
                  strstr(fs_error_message(), "no end-of-text token"),
              "add_eos without an eos token is refused: %s", fs_error_message());
    }
    fs_bpe_free(bl);
    fs_bpe_free(sp);
}

int main(void) {
    if (test_dir_create("bpe") != 0) return 1;
    RUN(test_merges_follow_rank);
    RUN(test_added_tokens_and_template);
    RUN(test_byte_fallback_and_unk);
    RUN(test_invalid_utf8);
    RUN(test_round_trip_and_hostile);
    RUN(test_chunks_equal_whole);
    RUN(test_refusals);
    RUN(test_normalized_added_tokens);
    RUN(test_cuts_keep_added_tokens);
    RUN(test_split_at_metaspace);
    RUN(test_stream_writer);
    RUN(test_documents_and_threads);
    test_dir_remove();
    return fs_test_summary();
}
