/*
 * bpe.c — Hugging Face tokenizer.json BPE: loading, encoding and decoding (flatshard/bpe.h).
 *
 * The pipeline is the one `tokenizers` runs, step for step, because the ids must be its ids:
 *   text -> U+FFFD for invalid UTF-8 -> cut out added tokens (leftmost, then longest)
 *        -> per remaining segment: normalizer (Prepend, Replace) -> pre-tokenizer (Split,
 *           ByteLevel, Metaspace) into pieces -> BPE per piece -> ids
 *        -> post-processor template (bos) around the whole.
 * The BPE of a piece is the lowest-rank-pair loop on a binary heap of (rank, position), which
 * breaks ties by the leftmost position exactly as `tokenizers`' Word::merge_all does, and
 * stale heap entries are recognised the same way (the pair at that position no longer merges
 * into that id). A piece of n symbols costs O(n log n), so an unsplit SentencePiece document
 * of megabytes is fine.
 *
 * Speed: pieces of byte-level models never touch the vocabulary hash during the merge (each
 * byte has its symbol id precomputed), pairs are one open-addressing probe on (left << 32 |
 * right), and each encoder keeps a cache of piece bytes -> ids (reset when full: the cache
 * changes speed, never ids). A SentencePiece-style piece (without a pre-tokenizer, a whole
 * document) is cut before each run of "▁" when the merges cannot join across such a cut
 * (decide_split_at_metaspace), so that it too is short pieces the cache answers.
 *
 * What it deliberately does not do: anything bpe.h lists as unsupported; it refuses those at
 * load rather than giving ids that differ from the reference.
 */
#define PCRE2_CODE_UNIT_WIDTH 8
#include "flatshard/bpe.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <pcre2.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* GPT-2's pre-tokenizer regex, which the ByteLevel pre-tokenizer uses when use_regex is true
 * (a fact about `tokenizers`' byte_level.rs). */
static const char GPT2_PATTERN[] =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

/* U+2581, SentencePiece's space, in UTF-8 */
static const char METASPACE[] = "\xE2\x96\x81";
enum { METASPACE_BYTES = 3 };

/* ------------------------------------------------------------------ small helpers */

static uint64_t hash_bytes(const void *p, size_t n) {
    /* FNV-1a over 8-byte words, then a final mix: fast on short pieces, good enough spread */
    const uint8_t *b = p;
    uint64_t h = 0xcbf29ce484222325ull ^ (uint64_t)n;
    while (n >= 8) {
        uint64_t w;
        memcpy(&w, b, 8);
        h = (h ^ w) * 0x100000001b3ull;
        h ^= h >> 29;
        b += 8;
        n -= 8;
    }
    while (n--) h = (h ^ *b++) * 0x100000001b3ull;
    h ^= h >> 33;
    h *= 0xff51afd7ed558ccdull;
    h ^= h >> 33;
    return h;
}

/* A growable byte buffer. */
typedef struct bytes {
    char *p;
    size_t n, cap;
} bytes;

static fs_status bytes_reserve(bytes *b, size_t extra) {
    if (b->n + extra <= b->cap) return FS_OK;
    size_t cap = b->cap ? b->cap : 256;
    while (cap < b->n + extra) cap *= 2;
    char *p = realloc(b->p, cap);
    if (!p) return fs_errorf(FS_ERR_NOMEM, "tokenizer: out of memory (%zu bytes)", cap);
    b->p = p;
    b->cap = cap;
    return FS_OK;
}

static fs_status bytes_put(bytes *b, const void *p, size_t n) {
    FS_TRY(bytes_reserve(b, n));
    if (n) memcpy(b->p + b->n, p, n);
    b->n += n;
    return FS_OK;
}

fs_status fs_bpe_ids_push(fs_bpe_ids *v, int32_t id) {
    if (v->n == v->cap) {
        int64_t cap = v->cap ? 2 * v->cap : 1024;
        int32_t *p = realloc(v->ids, (size_t)cap * sizeof *p);
        if (!p) return fs_errorf(FS_ERR_NOMEM, "tokenizer: out of memory (%lld ids)", (long long)cap);
        v->ids = p;
        v->cap = cap;
    }
    v->ids[v->n++] = id;
    return FS_OK;
}

void fs_bpe_ids_free(fs_bpe_ids *ids) {
    if (!ids) return;
    free(ids->ids);
    ids->ids = NULL;
    ids->n = ids->cap = 0;
}

static int utf8_encode(uint32_t cp, char *out) {
    if (cp < 0x80) {
        out[0] = (char)cp;
        return 1;
    }
    if (cp < 0x800) {
        out[0] = (char)(0xC0 | (cp >> 6));
        out[1] = (char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        out[0] = (char)(0xE0 | (cp >> 12));
        out[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
        out[2] = (char)(0x80 | (cp & 0x3F));
        return 3;
    }
    out[0] = (char)(0xF0 | (cp >> 18));
    out[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
    out[2] = (char)(0x80 | ((cp >> 6) & 0x3F));
    out[3] = (char)(0x80 | (cp & 0x3F));
    return 4;
}

/* The UTF-8 sequence at p[0, n): returns its length if valid (*cp set), or 0 with *bad the
 * length of the maximal invalid subpart (>= 1), the unit that becomes one U+FFFD. */
static size_t utf8_next(const uint8_t *p, size_t n, uint32_t *cp, size_t *bad) {
    uint8_t b0 = p[0];
    if (b0 < 0x80) {
        *cp = b0;
        return 1;
    }
    size_t need;
    uint8_t lo = 0x80, hi = 0xBF;
    uint32_t c;
    if (b0 >= 0xC2 && b0 <= 0xDF) {
        need = 1;
        c = b0 & 0x1F;
    } else if (b0 >= 0xE0 && b0 <= 0xEF) {
        need = 2;
        c = b0 & 0x0F;
        if (b0 == 0xE0) lo = 0xA0;
        if (b0 == 0xED) hi = 0x9F;
    } else if (b0 >= 0xF0 && b0 <= 0xF4) {
        need = 3;
        c = b0 & 0x07;
        if (b0 == 0xF0) lo = 0x90;
        if (b0 == 0xF4) hi = 0x8F;
    } else {
        *bad = 1;
        return 0;
    }
    for (size_t i = 1; i <= need; i++) {
        uint8_t lo_i = i == 1 ? lo : 0x80, hi_i = i == 1 ? hi : 0xBF;
        if (i >= n || p[i] < lo_i || p[i] > hi_i) {
            *bad = i;
            return 0;
        }
        c = (c << 6) | (p[i] & 0x3F);
    }
    *cp = c;
    return need + 1;
}

size_t fs_utf8_complete_prefix(const uint8_t *buf, size_t n) {
    /* a sequence cut by the end of buf is the only thing to hold back: at most 3 bytes */
    size_t i = n;
    for (size_t back = 1; back <= 3 && back <= n; back++) {
        uint8_t b = buf[n - back];
        if ((b & 0xC0) == 0x80) continue; /* continuation byte: keep looking for the lead */
        size_t want = b >= 0xF0 ? 4 : b >= 0xE0 ? 3 : b >= 0xC0 ? 2 : 1;
        if (want > back && b >= 0xC2 && b <= 0xF4) { /* a lead byte that may still complete */
            uint32_t cp;
            size_t bad = 0;
            /* held back only if what is there is a valid beginning (could still complete) */
            if (utf8_next(buf + n - back, back, &cp, &bad) == 0 && bad == back) i = n - back;
        }
        break;
    }
    return i;
}

/* Appends text[0, n) to out with every maximal invalid subpart replaced by U+FFFD. */
static fs_status utf8_lossy(bytes *out, const uint8_t *text, size_t n) {
    FS_TRY(bytes_reserve(out, n + n / 2 + 4));
    size_t i = 0;
    while (i < n) {
        uint32_t cp;
        size_t bad = 0, k = utf8_next(text + i, n - i, &cp, &bad);
        if (k) {
            FS_TRY(bytes_put(out, text + i, k));
            i += k;
        } else {
            FS_TRY(bytes_put(out, "\xEF\xBF\xBD", 3));
            i += bad;
        }
    }
    return FS_OK;
}

static int utf8_valid(const uint8_t *text, size_t n) {
    size_t i = 0;
    while (i < n) {
        if (text[i] < 0x80) {
            i++;
            continue;
        }
        uint32_t cp;
        size_t bad, k = utf8_next(text + i, n - i, &cp, &bad);
        if (!k) return 0;
        i += k;
    }
    return 1;
}

/* ------------------------------------------------------------------ the tokenizer */

typedef enum { NORM_PREPEND, NORM_REPLACE } norm_kind;
typedef struct norm_step {
    norm_kind kind;
    char *a, *b; /* Prepend: a = text; Replace: a = pattern, b = content */
} norm_step;

typedef enum { PT_SPLIT, PT_BYTELEVEL, PT_METASPACE } pt_kind;
typedef enum { SPLIT_ISOLATED, SPLIT_REMOVED, SPLIT_MERGED_PREV, SPLIT_MERGED_NEXT } split_kind;
typedef enum { PREPEND_ALWAYS, PREPEND_FIRST, PREPEND_NEVER } prepend_kind;
typedef struct pt_step {
    pt_kind kind;
    pcre2_code *re;       /* Split, ByteLevel with use_regex */
    split_kind behavior;  /* Split (ByteLevel's regex is Isolated) */
    int add_prefix_space; /* ByteLevel */
    char replacement[8];  /* Metaspace: the character, UTF-8 */
    prepend_kind prepend; /* Metaspace */
    int split;            /* Metaspace */
} pt_step;

typedef enum { DEC_BYTELEVEL, DEC_REPLACE, DEC_BYTEFALLBACK, DEC_FUSE, DEC_STRIP, DEC_METASPACE } dec_kind;
typedef struct dec_step {
    dec_kind kind;
    char *a, *b;         /* Replace: pattern, content; Metaspace: a = replacement */
    uint32_t content;    /* Strip: the code point */
    int start, stop;     /* Strip */
    int prepend;         /* Metaspace: prepend_scheme != never */
} dec_step;

typedef struct added_token {
    int32_t id;
    int special;
    int normalized; /* matched in the normalized text of a segment, not in the raw text */
    const char *text; /* into the token pool */
    size_t len;
    char *match;      /* what is matched: text, or for a normalized token its normalized form */
    size_t match_len;
} added_token;

enum { MAX_STEPS = 16 };

struct fs_bpe {
    char path[512];
    int32_t vocab_size;
    /* id -> text (NUL-terminated in pool); ids without text have tok_len -1 */
    char *pool;
    size_t pool_bytes;
    size_t *tok_off;
    int32_t *tok_len;
    uint8_t *is_special; /* per id: a special added token */
    /* model vocabulary: text -> id, open addressing over ids (-1 empty) */
    int32_t *vocab_slot;
    uint64_t vocab_mask;
    /* merges: (left << 32 | right) -> rank, new id */
    struct pair_slot {
        uint64_t key;
        int32_t rank, new_id;
    } *pairs;
    uint64_t pair_mask;
    /* the model */
    int32_t unk_id; /* -1: no unk_token */
    int fuse_unk, byte_fallback, ignore_merges;
    /* pieces are cut before each run of "▁" and the parts encoded (and cached) on their own:
     * decided at load by decide_split_at_metaspace, which gives the argument */
    int split_at_metaspace;
    int32_t byte_fallback_id[256]; /* <0xNN> ids, -1 if absent */
    int32_t ascii_id[128];         /* the vocabulary id of each ASCII character, -1 if absent */
    /* byte level: byte -> GPT-2 character (UTF-8) and its vocabulary id */
    int byte_level;
    char byte_char[256][3];
    uint8_t byte_char_len[256];
    int32_t byte_sym[256];
    /* added tokens, sorted by (first byte, length descending) */
    added_token *added;
    int n_added;
    int added_first[257]; /* added[added_first[b] .. added_first[b+1]) start with byte b */
    int has_normalized_added;
    /* fs_bpe_added_may_cover_newline: the added tokens whose match holds a newline (indices
     * into added; usually none), the bytes a normalizer step matches or writes (a normalized
     * token is compared with raw text only where neither side has one), and whether every
     * newline may be in an added token (the normalizer rewrites or writes newlines, and
     * some added token is normalized) */
    int *nl_added;
    int n_nl_added;
    uint8_t norm_touches[256];
    int nl_any_added;
    /* pipeline */
    norm_step norm[MAX_STEPS];
    int n_norm;
    pt_step pt[MAX_STEPS];
    int n_pt;
    dec_step dec[MAX_STEPS];
    int n_dec, has_decoder;
    int32_t *tmpl_before, *tmpl_after; /* post-processor ids around the text */
    int n_before, n_after;
    int32_t eos_id;
};

static const char *tok_text(const fs_bpe *t, int32_t id) { return t->pool + t->tok_off[id]; }

static int32_t vocab_find(const fs_bpe *t, const char *s, size_t n) {
    if (!t->vocab_slot) return -1;
    for (uint64_t h = hash_bytes(s, n) & t->vocab_mask;; h = (h + 1) & t->vocab_mask) {
        int32_t id = t->vocab_slot[h];
        if (id < 0) return -1;
        if ((size_t)t->tok_len[id] == n && memcmp(tok_text(t, id), s, n) == 0) return id;
    }
}

/* The pair table's slot of a key: one multiply, since pair_find is a quarter of the time of
 * a SentencePiece-style encode. */
static uint64_t pair_hash(uint64_t key) {
    uint64_t x = key * 0x9E3779B97F4A7C15ull;
    return x ^ (x >> 29);
}

static const struct pair_slot *pair_find(const fs_bpe *t, int32_t a, int32_t b) {
    uint64_t key = ((uint64_t)(uint32_t)a << 32) | (uint32_t)b;
    for (uint64_t h = pair_hash(key) & t->pair_mask;; h = (h + 1) & t->pair_mask) {
        const struct pair_slot *s = &t->pairs[h];
        if (s->key == UINT64_MAX) return NULL;
        if (s->key == key) return s;
    }
}

int32_t fs_bpe_vocab_size(const fs_bpe *bpe) { return bpe->vocab_size; }
int32_t fs_bpe_eos_id(const fs_bpe *bpe) { return bpe->eos_id; }
int fs_bpe_split_at_metaspace(const fs_bpe *bpe) { return bpe->split_at_metaspace; }

const char *fs_bpe_token_text(const fs_bpe *bpe, int32_t id) {
    if (id < 0 || id >= bpe->vocab_size || bpe->tok_len[id] < 0) return NULL;
    return tok_text(bpe, id);
}

int32_t fs_bpe_token_id(const fs_bpe *bpe, const char *token) {
    size_t n = strlen(token);
    for (int i = 0; i < bpe->n_added; i++)
        if (bpe->added[i].len == n && memcmp(bpe->added[i].text, token, n) == 0)
            return bpe->added[i].id;
    return vocab_find(bpe, token, n);
}

void fs_bpe_free(fs_bpe *t) {
    if (!t) return;
    for (int i = 0; i < t->n_norm; i++) {
        free(t->norm[i].a);
        free(t->norm[i].b);
    }
    for (int i = 0; i < t->n_pt; i++) pcre2_code_free(t->pt[i].re);
    for (int i = 0; i < t->n_dec; i++) {
        free(t->dec[i].a);
        free(t->dec[i].b);
    }
    free(t->pool);
    free(t->tok_off);
    free(t->tok_len);
    free(t->is_special);
    free(t->vocab_slot);
    free(t->pairs);
    for (int i = 0; t->added && i < t->n_added; i++) free(t->added[i].match);
    free(t->added);
    free(t->nl_added);
    free(t->tmpl_before);
    free(t->tmpl_after);
    free(t);
}

/* ------------------------------------------------------------------ loading */

static fs_status unsupported(const fs_bpe *t, const char *what) {
    return fs_errorf(FS_ERR_FORMAT, "%s: %s is not supported", t->path, what);
}

static const cJSON *field(const cJSON *o, const char *name) {
    return cJSON_GetObjectItemCaseSensitive(o, name);
}

/* A field that must be null or absent for the ids to be the reference's. */
static fs_status require_null(const fs_bpe *t, const cJSON *o, const char *name,
                              const char *where) {
    const cJSON *v = field(o, name);
    if (!v || cJSON_IsNull(v)) return FS_OK;
    if (cJSON_IsString(v) && v->valuestring[0] == '\0') return FS_OK;
    if (cJSON_IsFalse(v)) return FS_OK;
    return fs_errorf(FS_ERR_FORMAT, "%s: %s.%s is set; flatshard supports only null there",
                     t->path, where, name);
}

static fs_status get_string(const fs_bpe *t, const cJSON *o, const char *name, const char *where,
                            const char **out) {
    const cJSON *v = field(o, name);
    if (!cJSON_IsString(v))
        return fs_errorf(FS_ERR_FORMAT, "%s: %s.%s is missing or not a string", t->path, where,
                         name);
    *out = v->valuestring;
    return FS_OK;
}

static int get_bool(const cJSON *o, const char *name, int dflt) {
    const cJSON *v = field(o, name);
    if (cJSON_IsBool(v)) return cJSON_IsTrue(v);
    return dflt;
}

static char *dup_str(const char *s) {
    size_t n = strlen(s) + 1;
    char *p = malloc(n);
    if (p) memcpy(p, s, n);
    return p;
}

/* A Split/Replace "pattern": {"String": s} or {"Regex": r}; *is_regex tells which. */
static fs_status get_pattern(const fs_bpe *t, const cJSON *o, const char *where, const char **s,
                             int *is_regex) {
    const cJSON *p = field(o, "pattern");
    const cJSON *str = p ? field(p, "String") : NULL, *re = p ? field(p, "Regex") : NULL;
    if (cJSON_IsString(str)) {
        *s = str->valuestring;
        *is_regex = 0;
        return FS_OK;
    }
    if (cJSON_IsString(re)) {
        *s = re->valuestring;
        *is_regex = 1;
        return FS_OK;
    }
    return fs_errorf(FS_ERR_FORMAT, "%s: %s.pattern is neither {\"String\": ...} nor {\"Regex\": ...}",
                     t->path, where);
}

static fs_status compile_regex(const fs_bpe *t, const char *pattern, int literal, const char *where,
                               pcre2_code **out) {
    int err = 0;
    PCRE2_SIZE at = 0;
    uint32_t opts = PCRE2_UTF | (literal ? PCRE2_LITERAL : PCRE2_UCP); /* LITERAL refuses UCP */
    pcre2_code *re = pcre2_compile((PCRE2_SPTR)pattern, PCRE2_ZERO_TERMINATED, opts, &err, &at, NULL);
    if (!re) {
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(err, msg, sizeof msg);
        return fs_errorf(FS_ERR_FORMAT, "%s: %s: the regex does not compile at offset %zu: %s",
                         t->path, where, (size_t)at, (const char *)msg);
    }
    /* JIT makes the pre-tokenizer several times faster; without it PCRE2 still matches */
    (void)pcre2_jit_compile(re, PCRE2_JIT_COMPLETE);
    *out = re;
    return FS_OK;
}

static fs_status load_normalizer(fs_bpe *t, const cJSON *n, int depth) {
    if (!n || cJSON_IsNull(n)) return FS_OK;
    const char *type = NULL;
    FS_TRY(get_string(t, n, "type", "normalizer", &type));
    if (strcmp(type, "Sequence") == 0 && depth == 0) {
        const cJSON *list = field(n, "normalizers");
        if (!cJSON_IsArray(list))
            return fs_errorf(FS_ERR_FORMAT, "%s: normalizer.normalizers is not a list", t->path);
        for (const cJSON *e = list->child; e; e = e->next) FS_TRY(load_normalizer(t, e, 1));
        return FS_OK;
    }
    if (t->n_norm == MAX_STEPS) return unsupported(t, "a normalizer of more than 16 steps");
    norm_step *s = &t->norm[t->n_norm];
    if (strcmp(type, "Prepend") == 0) {
        const char *p = NULL;
        FS_TRY(get_string(t, n, "prepend", "normalizer Prepend", &p));
        s->kind = NORM_PREPEND;
        s->a = dup_str(p);
        if (!s->a) return fs_errorf(FS_ERR_NOMEM, "%s: out of memory", t->path);
    } else if (strcmp(type, "Replace") == 0) {
        const char *p = NULL, *c = NULL;
        int is_regex = 0;
        FS_TRY(get_pattern(t, n, "normalizer Replace", &p, &is_regex));
        if (is_regex) return unsupported(t, "normalizer Replace with a Regex pattern");
        if (!p[0]) return unsupported(t, "normalizer Replace with an empty pattern");
        FS_TRY(get_string(t, n, "content", "normalizer Replace", &c));
        s->kind = NORM_REPLACE;
        s->a = dup_str(p);
        s->b = dup_str(c);
        if (!s->a || !s->b) return fs_errorf(FS_ERR_NOMEM, "%s: out of memory", t->path);
    } else {
        return fs_errorf(FS_ERR_FORMAT,
                         "%s: normalizer type '%s' is not supported (Sequence, Prepend, Replace)",
                         t->path, type);
    }
    t->n_norm++;
    return FS_OK;
}

static fs_status load_prepend_scheme(fs_bpe *t, const cJSON *o, prepend_kind *out) {
    const cJSON *ps = field(o, "prepend_scheme");
    if (cJSON_IsString(ps)) {
        if (strcmp(ps->valuestring, "always") == 0) *out = PREPEND_ALWAYS;
        else if (strcmp(ps->valuestring, "first") == 0) *out = PREPEND_FIRST;
        else if (strcmp(ps->valuestring, "never") == 0) *out = PREPEND_NEVER;
        else
            return fs_errorf(FS_ERR_FORMAT, "%s: Metaspace prepend_scheme '%s' is not always, first or never",
                             t->path, ps->valuestring);
    } else {
        /* files before prepend_scheme existed: add_prefix_space (default true) */
        *out = get_bool(o, "add_prefix_space", 1) ? PREPEND_ALWAYS : PREPEND_NEVER;
    }
    return FS_OK;
}

static fs_status load_replacement(fs_bpe *t, const cJSON *o, const char *where, char out[8]) {
    const char *r = NULL;
    FS_TRY(get_string(t, o, "replacement", where, &r));
    uint32_t cp;
    size_t bad, n = strlen(r);
    if (n == 0 || n > 4 || utf8_next((const uint8_t *)r, n, &cp, &bad) != n)
        return fs_errorf(FS_ERR_FORMAT, "%s: %s.replacement is not one character", t->path, where);
    memcpy(out, r, n + 1);
    return FS_OK;
}

static fs_status load_pre_tokenizer(fs_bpe *t, const cJSON *p, int depth) {
    if (!p || cJSON_IsNull(p)) return FS_OK;
    const char *type = NULL;
    FS_TRY(get_string(t, p, "type", "pre_tokenizer", &type));
    if (strcmp(type, "Sequence") == 0 && depth == 0) {
        const cJSON *list = field(p, "pretokenizers");
        if (!cJSON_IsArray(list))
            return fs_errorf(FS_ERR_FORMAT, "%s: pre_tokenizer.pretokenizers is not a list", t->path);
        for (const cJSON *e = list->child; e; e = e->next) FS_TRY(load_pre_tokenizer(t, e, 1));
        return FS_OK;
    }
    if (t->n_pt == MAX_STEPS) return unsupported(t, "a pre_tokenizer of more than 16 steps");
    pt_step *s = &t->pt[t->n_pt];
    memset(s, 0, sizeof *s);
    if (strcmp(type, "Split") == 0) {
        const char *pat = NULL, *beh = NULL;
        int is_regex = 0;
        FS_TRY(get_pattern(t, p, "pre_tokenizer Split", &pat, &is_regex));
        if (get_bool(p, "invert", 0)) return unsupported(t, "pre_tokenizer Split with invert: true");
        FS_TRY(get_string(t, p, "behavior", "pre_tokenizer Split", &beh));
        if (strcmp(beh, "Isolated") == 0) s->behavior = SPLIT_ISOLATED;
        else if (strcmp(beh, "Removed") == 0) s->behavior = SPLIT_REMOVED;
        else if (strcmp(beh, "MergedWithPrevious") == 0) s->behavior = SPLIT_MERGED_PREV;
        else if (strcmp(beh, "MergedWithNext") == 0) s->behavior = SPLIT_MERGED_NEXT;
        else
            return fs_errorf(FS_ERR_FORMAT,
                             "%s: pre_tokenizer Split behavior '%s' is not supported (Isolated, "
                             "Removed, MergedWithPrevious, MergedWithNext)",
                             t->path, beh);
        s->kind = PT_SPLIT;
        t->n_pt++; /* counted before compiling, so fs_bpe_free frees a compiled regex */
        return compile_regex(t, pat, !is_regex, "pre_tokenizer Split", &s->re);
    }
    if (strcmp(type, "ByteLevel") == 0) {
        s->kind = PT_BYTELEVEL;
        s->add_prefix_space = get_bool(p, "add_prefix_space", 1);
        t->byte_level = 1;
        t->n_pt++;
        if (get_bool(p, "use_regex", 1))
            return compile_regex(t, GPT2_PATTERN, 0, "pre_tokenizer ByteLevel", &s->re);
        return FS_OK;
    }
    if (strcmp(type, "Metaspace") == 0) {
        s->kind = PT_METASPACE;
        FS_TRY(load_replacement(t, p, "pre_tokenizer Metaspace", s->replacement));
        FS_TRY(load_prepend_scheme(t, p, &s->prepend));
        s->split = get_bool(p, "split", 1);
        t->n_pt++;
        /* split on the replacement character, which joins the piece after it */
        if (s->split) return compile_regex(t, s->replacement, 1, "pre_tokenizer Metaspace", &s->re);
        return FS_OK;
    }
    return fs_errorf(FS_ERR_FORMAT,
                     "%s: pre_tokenizer type '%s' is not supported (Sequence, Split, ByteLevel, "
                     "Metaspace)",
                     t->path, type);
}

static fs_status load_decoder(fs_bpe *t, const cJSON *d, int depth) {
    if (!d || cJSON_IsNull(d)) return FS_OK;
    t->has_decoder = 1;
    const char *type = NULL;
    FS_TRY(get_string(t, d, "type", "decoder", &type));
    if (strcmp(type, "Sequence") == 0 && depth == 0) {
        const cJSON *list = field(d, "decoders");
        if (!cJSON_IsArray(list))
            return fs_errorf(FS_ERR_FORMAT, "%s: decoder.decoders is not a list", t->path);
        for (const cJSON *e = list->child; e; e = e->next) FS_TRY(load_decoder(t, e, 1));
        return FS_OK;
    }
    if (t->n_dec == MAX_STEPS) return unsupported(t, "a decoder of more than 16 steps");
    dec_step *s = &t->dec[t->n_dec];
    memset(s, 0, sizeof *s);
    if (strcmp(type, "ByteLevel") == 0) {
        s->kind = DEC_BYTELEVEL;
    } else if (strcmp(type, "ByteFallback") == 0) {
        s->kind = DEC_BYTEFALLBACK;
    } else if (strcmp(type, "Fuse") == 0) {
        s->kind = DEC_FUSE;
    } else if (strcmp(type, "Replace") == 0) {
        const char *p = NULL, *c = NULL;
        int is_regex = 0;
        FS_TRY(get_pattern(t, d, "decoder Replace", &p, &is_regex));
        if (is_regex) return unsupported(t, "decoder Replace with a Regex pattern");
        if (!p[0]) return unsupported(t, "decoder Replace with an empty pattern");
        FS_TRY(get_string(t, d, "content", "decoder Replace", &c));
        s->kind = DEC_REPLACE;
        s->a = dup_str(p);
        s->b = dup_str(c);
        if (!s->a || !s->b) return fs_errorf(FS_ERR_NOMEM, "%s: out of memory", t->path);
    } else if (strcmp(type, "Strip") == 0) {
        const char *c = NULL;
        FS_TRY(get_string(t, d, "content", "decoder Strip", &c));
        size_t bad, n = strlen(c);
        if (n == 0 || utf8_next((const uint8_t *)c, n, &s->content, &bad) != n)
            return fs_errorf(FS_ERR_FORMAT, "%s: decoder Strip content is not one character", t->path);
        const cJSON *a = field(d, "start"), *b = field(d, "stop");
        if (!cJSON_IsNumber(a) || !cJSON_IsNumber(b) || a->valuedouble < 0 || b->valuedouble < 0)
            return fs_errorf(FS_ERR_FORMAT, "%s: decoder Strip start/stop are not counts", t->path);
        s->kind = DEC_STRIP;
        s->start = a->valueint;
        s->stop = b->valueint;
    } else if (strcmp(type, "Metaspace") == 0) {
        char rep[8];
        prepend_kind pk;
        FS_TRY(load_replacement(t, d, "decoder Metaspace", rep));
        FS_TRY(load_prepend_scheme(t, d, &pk));
        s->kind = DEC_METASPACE;
        s->a = dup_str(rep);
        if (!s->a) return fs_errorf(FS_ERR_NOMEM, "%s: out of memory", t->path);
        s->prepend = pk != PREPEND_NEVER;
    } else {
        return fs_errorf(FS_ERR_FORMAT,
                         "%s: decoder type '%s' is not supported (Sequence, ByteLevel, "
                         "ByteFallback, Fuse, Replace, Strip, Metaspace)",
                         t->path, type);
    }
    t->n_dec++;
    return FS_OK;
}

static fs_status append_ids(int32_t **list, int *n, const int32_t *ids, int k) {
    int32_t *p = realloc(*list, (size_t)(*n + k + 1) * sizeof *p);
    if (!p) return fs_errorf(FS_ERR_NOMEM, "tokenizer: out of memory");
    memcpy(p + *n, ids, (size_t)k * sizeof *p);
    *list = p;
    *n += k;
    return FS_OK;
}

static fs_status load_post_processor(fs_bpe *t, const cJSON *p, int depth) {
    if (!p || cJSON_IsNull(p)) return FS_OK;
    const char *type = NULL;
    FS_TRY(get_string(t, p, "type", "post_processor", &type));
    if (strcmp(type, "Sequence") == 0 && depth == 0) {
        const cJSON *list = field(p, "processors");
        if (!cJSON_IsArray(list))
            return fs_errorf(FS_ERR_FORMAT, "%s: post_processor.processors is not a list", t->path);
        for (const cJSON *e = list->child; e; e = e->next) FS_TRY(load_post_processor(t, e, 1));
        return FS_OK;
    }
    if (strcmp(type, "ByteLevel") == 0) return FS_OK; /* it moves offsets only, never ids */
    if (strcmp(type, "TemplateProcessing") != 0)
        return fs_errorf(FS_ERR_FORMAT,
                         "%s: post_processor type '%s' is not supported (TemplateProcessing, "
                         "ByteLevel, Sequence)",
                         t->path, type);
    if (t->n_before || t->n_after) return unsupported(t, "more than one TemplateProcessing");
    const cJSON *single = field(p, "single"), *specials = field(p, "special_tokens");
    if (!cJSON_IsArray(single) || !cJSON_IsObject(specials))
        return fs_errorf(FS_ERR_FORMAT,
                         "%s: post_processor TemplateProcessing needs 'single' (a list) and "
                         "'special_tokens' (an object)",
                         t->path);
    int seen_sequence = 0;
    for (const cJSON *e = single->child; e; e = e->next) {
        const cJSON *sp = field(e, "SpecialToken"), *sq = field(e, "Sequence");
        if (sq) {
            const cJSON *id = field(sq, "id");
            if (seen_sequence || !cJSON_IsString(id) || strcmp(id->valuestring, "A") != 0)
                return unsupported(t, "a TemplateProcessing single template other than one $A "
                                      "with special tokens around it");
            seen_sequence = 1;
            continue;
        }
        const cJSON *name = sp ? field(sp, "id") : NULL;
        if (!cJSON_IsString(name))
            return fs_errorf(FS_ERR_FORMAT, "%s: post_processor template item is neither "
                             "SpecialToken nor Sequence", t->path);
        const cJSON *def = field(specials, name->valuestring);
        const cJSON *ids = def ? field(def, "ids") : NULL;
        if (!cJSON_IsArray(ids))
            return fs_errorf(FS_ERR_FORMAT, "%s: post_processor special_tokens has no ids for '%s'",
                             t->path, name->valuestring);
        for (const cJSON *i = ids->child; i; i = i->next) {
            if (!cJSON_IsNumber(i) || i->valuedouble < 0 || i->valuedouble >= 2147483647.0)
                return fs_errorf(FS_ERR_FORMAT, "%s: post_processor special token '%s' has a bad id",
                                 t->path, name->valuestring);
            int32_t v = (int32_t)i->valuedouble;
            FS_TRY(seen_sequence ? append_ids(&t->tmpl_after, &t->n_after, &v, 1)
                                 : append_ids(&t->tmpl_before, &t->n_before, &v, 1));
        }
    }
    if (!seen_sequence)
        return fs_errorf(FS_ERR_FORMAT, "%s: post_processor single template has no $A", t->path);
    return FS_OK;
}

/* Runs the normalizer over a in place (scratch: a buffer to swap with). prepend_ok: the text
 * starts a segment of its own (a chunk that continues a document does not, so it gets no
 * Prepend). */
static fs_status normalize(const fs_bpe *t, bytes *a, bytes *scratch, int prepend_ok) {
    for (int i = 0; i < t->n_norm; i++) {
        const norm_step *ns = &t->norm[i];
        if (ns->kind == NORM_PREPEND) {
            /* the prepended text goes before a non-empty segment only */
            if (a->n == 0 || !prepend_ok) continue;
            size_t k = strlen(ns->a);
            FS_TRY(bytes_reserve(a, k));
            memmove(a->p + k, a->p, a->n);
            memcpy(a->p, ns->a, k);
            a->n += k;
        } else {
            size_t pl = strlen(ns->a), cl = strlen(ns->b);
            scratch->n = 0;
            /* copy the spans between matches whole: this runs over every byte of text */
            size_t k = 0;
            while (k < a->n) {
                const char *hit = memchr(a->p + k, ns->a[0], a->n - k);
                size_t at = hit ? (size_t)(hit - a->p) : a->n;
                if (at + pl > a->n) at = a->n;
                FS_TRY(bytes_put(scratch, a->p + k, at - k));
                k = at;
                if (k == a->n) break;
                if (memcmp(a->p + k, ns->a, pl) == 0) {
                    FS_TRY(bytes_put(scratch, ns->b, cl));
                    k += pl;
                } else {
                    FS_TRY(bytes_put(scratch, a->p + k, 1));
                    k++;
                }
            }
            bytes tmp = *a;
            *a = *scratch;
            *scratch = tmp;
        }
    }
    return FS_OK;
}

static int cmp_added(const void *pa, const void *pb) {
    const added_token *a = pa, *b = pb;
    uint8_t fa = (uint8_t)a->match[0], fb = (uint8_t)b->match[0];
    if (fa != fb) return fa < fb ? -1 : 1;
    if (a->match_len != b->match_len) return a->match_len > b->match_len ? -1 : 1;
    return a->id < b->id ? -1 : a->id > b->id;
}

static int ends_with_metaspace(const fs_bpe *t, int32_t id) {
    int32_t n = t->tok_len[id];
    return n >= METASPACE_BYTES && memcmp(tok_text(t, id) + n - METASPACE_BYTES, METASPACE, METASPACE_BYTES) == 0;
}

/* Whether a piece may be cut before each run of "▁" (a "▁" after another character) and the
 * parts encoded on their own, with the ids of the uncut piece. Without a pre-tokenizer
 * (Llama 2's layout) a whole document is one piece, which costs O(n log n) in the merge heap
 * and never hits the piece cache; cut, it is "▁word" pieces that the cache answers.
 *
 * The argument, for a piece cut at position i (character i is "▁", character i-1 is not):
 *  1. The symbols of the piece are those of its two parts, one after the other. build_symbols
 *     handles each character on its own except for a pending unk, and "▁" is required to be
 *     in the vocabulary, so it is a symbol of its own (text "▁") that flushes any pending unk
 *     first: no fused unk spans i, nothing is carried across it. No character may be dropped
 *     either (else "▁▁" + dropped + "▁x" would bring two "▁" symbols together across i), so
 *     an unk token or byte fallback with all 256 byte tokens is required.
 *  2. A symbol's text is the concatenation of its first symbols' texts, because a merge
 *     (a, b) gives the token whose text is text(a) text(b) (load_model_and_tokens checks it).
 *     So a symbol that starts at i has a text starting with "▁"; one that ends at i has a
 *     text ending with that of the last symbol before i: character i-1's own (not "▁"), a
 *     "<0xNN>" byte token, or the unk token, whose text is required not to end with "▁".
 *  3. So a merge across i would be a merge (a, b) with b starting with "▁" and a not ending
 *     with it. If the merges hold none, no merge joins the parts, each part's pairs are
 *     untouched by the other's merges, and merging by (rank, leftmost) gives the same ids
 *     part by part as whole (merges in one part never change the order of the other's).
 * A vocabulary that SentencePiece trained with split_by_whitespace (Llama 2's) has "▁" only
 * at the start of a token or in a run of "▁" at its start, so it passes; one trained on whole
 * lines ("e▁") does not, and is encoded uncut. ignore_merges looks up the whole piece, which
 * encode_split_at_metaspace does before cutting it. Byte-level models see GPT-2 characters,
 * not "▁", and are never cut. */
static void decide_split_at_metaspace(fs_bpe *t) {
    t->split_at_metaspace = 0;
    if (t->byte_level || vocab_find(t, METASPACE, METASPACE_BYTES) < 0) return;
    if (t->unk_id >= 0 && ends_with_metaspace(t, t->unk_id)) return;
    int all_bytes = t->byte_fallback;
    for (int b = 0; b < 256; b++) all_bytes &= t->byte_fallback_id[b] >= 0;
    if (t->unk_id < 0 && !all_bytes) return;
    for (uint64_t h = 0; h <= t->pair_mask; h++) {
        uint64_t key = t->pairs[h].key;
        if (key == UINT64_MAX) continue;
        int32_t a = (int32_t)(key >> 32), b = (int32_t)(key & 0xFFFFFFFFu);
        int b_starts = t->tok_len[b] >= METASPACE_BYTES &&
                       memcmp(tok_text(t, b), METASPACE, METASPACE_BYTES) == 0;
        if (b_starts && !ends_with_metaspace(t, a)) return;
    }
    t->split_at_metaspace = 1;
}

/* Fills what fs_bpe_added_may_cover_newline reads, once the added tokens are sorted (the
 * normalizer is loaded before them). */
static fs_status find_newline_added(fs_bpe *t) {
    for (int i = 0; i < t->n_norm; i++) {
        const norm_step *ns = &t->norm[i];
        for (const char *c = ns->a; c && *c; c++) t->norm_touches[(uint8_t)*c] = 1;
        for (const char *c = ns->kind == NORM_REPLACE ? ns->b : NULL; c && *c; c++)
            t->norm_touches[(uint8_t)*c] = 1;
    }
    t->nl_any_added = t->norm_touches['\n'] && t->has_normalized_added;
    for (int i = 0; i < t->n_added; i++) {
        const added_token *a = &t->added[i];
        if (!memchr(a->match, '\n', a->match_len)) continue;
        if (!t->nl_added) {
            t->nl_added = malloc((size_t)t->n_added * sizeof *t->nl_added);
            if (!t->nl_added) return fs_errorf(FS_ERR_NOMEM, "%s: out of memory", t->path);
        }
        t->nl_added[t->n_nl_added++] = i;
    }
    return FS_OK;
}

/* Reads the id of a vocabulary or added-token entry. */
static fs_status get_id(const fs_bpe *t, const cJSON *v, const char *where, const char *name,
                        int32_t *out) {
    if (!cJSON_IsNumber(v) || v->valuedouble < 0 || v->valuedouble >= 16777216.0 ||
        v->valuedouble != (double)(int64_t)v->valuedouble)
        return fs_errorf(FS_ERR_FORMAT, "%s: %s '%s' has id %s, not an integer in [0, 2^24)",
                         t->path, where, name, cJSON_IsNumber(v) ? "out of range" : "missing");
    *out = (int32_t)v->valuedouble;
    return FS_OK;
}

static fs_status load_model_and_tokens(fs_bpe *t, const cJSON *root) {
    const cJSON *model = field(root, "model");
    if (!cJSON_IsObject(model))
        return fs_errorf(FS_ERR_FORMAT, "%s: no 'model' object (is this a tokenizer.json?)", t->path);
    const cJSON *type = field(model, "type");
    if (cJSON_IsString(type) && strcmp(type->valuestring, "BPE") != 0)
        return fs_errorf(FS_ERR_FORMAT, "%s: model type '%s' is not supported (BPE only)", t->path,
                         type->valuestring);
    const cJSON *vocab = field(model, "vocab"), *merges = field(model, "merges");
    if (!cJSON_IsObject(vocab) || !cJSON_IsArray(merges))
        return fs_errorf(FS_ERR_FORMAT, "%s: model needs 'vocab' (an object) and 'merges' (a list)",
                         t->path);
    const cJSON *dropout = field(model, "dropout");
    if (cJSON_IsNumber(dropout) && dropout->valuedouble != 0.0)
        return unsupported(t, "model.dropout (BPE dropout; ids would be random)");
    FS_TRY(require_null(t, model, "continuing_subword_prefix", "model"));
    FS_TRY(require_null(t, model, "end_of_word_suffix", "model"));
    t->fuse_unk = get_bool(model, "fuse_unk", 0);
    t->byte_fallback = get_bool(model, "byte_fallback", 0);
    t->ignore_merges = get_bool(model, "ignore_merges", 0);
    const cJSON *added = field(root, "added_tokens");
    if (added && !cJSON_IsNull(added) && !cJSON_IsArray(added))
        return fs_errorf(FS_ERR_FORMAT, "%s: added_tokens is not a list", t->path);

    /* sizes first: the largest id and the text bytes */
    int32_t max_id = -1;
    size_t text_bytes = 0;
    int n_vocab = 0, n_added = 0;
    for (const cJSON *e = vocab->child; e; e = e->next, n_vocab++) {
        int32_t id = 0;
        FS_TRY(get_id(t, e, "vocab entry", e->string, &id));
        if (id > max_id) max_id = id;
        text_bytes += strlen(e->string) + 1;
    }
    for (const cJSON *e = added ? added->child : NULL; e; e = e->next, n_added++) {
        const cJSON *c = field(e, "content");
        if (!cJSON_IsString(c) || !c->valuestring[0])
            return fs_errorf(FS_ERR_FORMAT, "%s: added_tokens[%d] has no content", t->path, n_added);
        int32_t id = 0;
        FS_TRY(get_id(t, field(e, "id"), "added token", c->valuestring, &id));
        if (id > max_id) max_id = id;
        text_bytes += strlen(c->valuestring) + 1;
    }
    if (max_id < 0) return fs_errorf(FS_ERR_FORMAT, "%s: the vocabulary is empty", t->path);
    t->vocab_size = max_id + 1;
    size_t V = (size_t)t->vocab_size;
    t->pool = malloc(text_bytes);
    t->tok_off = calloc(V, sizeof *t->tok_off);
    t->tok_len = malloc(V * sizeof *t->tok_len);
    t->is_special = calloc(V, 1);
    uint64_t vcap = 16;
    while (vcap < 2 * (uint64_t)n_vocab + 2) vcap *= 2;
    t->vocab_slot = malloc(vcap * sizeof *t->vocab_slot);
    t->vocab_mask = vcap - 1;
    t->added = calloc((size_t)n_added + 1, sizeof *t->added);
    if (!t->pool || !t->tok_off || !t->tok_len || !t->is_special || !t->vocab_slot || !t->added)
        return fs_errorf(FS_ERR_NOMEM, "%s: out of memory for a vocabulary of %zu", t->path, V);
    for (size_t i = 0; i < V; i++) t->tok_len[i] = -1;
    for (uint64_t i = 0; i < vcap; i++) t->vocab_slot[i] = -1;

    for (const cJSON *e = vocab->child; e; e = e->next) {
        int32_t id = (int32_t)e->valuedouble;
        size_t n = strlen(e->string);
        if (t->tok_len[id] >= 0)
            return fs_errorf(FS_ERR_FORMAT, "%s: vocab id %d is given to '%s' and '%s'", t->path,
                             id, tok_text(t, id), e->string);
        memcpy(t->pool + t->pool_bytes, e->string, n + 1);
        t->tok_off[id] = t->pool_bytes;
        t->tok_len[id] = (int32_t)n;
        t->pool_bytes += n + 1;
        uint64_t h = hash_bytes(e->string, n) & t->vocab_mask;
        while (t->vocab_slot[h] >= 0) {
            if ((size_t)t->tok_len[t->vocab_slot[h]] == n &&
                memcmp(tok_text(t, t->vocab_slot[h]), e->string, n) == 0)
                return fs_errorf(FS_ERR_FORMAT, "%s: vocab token '%s' appears twice", t->path, e->string);
            h = (h + 1) & t->vocab_mask;
        }
        t->vocab_slot[h] = id;
    }
    int32_t max_added = -1;
    for (const cJSON *e = added ? added->child : NULL; e; e = e->next) {
        const char *c = field(e, "content")->valuestring;
        int32_t id = (int32_t)field(e, "id")->valuedouble;
        size_t n = strlen(c);
        /* `tokenizers` does not read these ids: an added token takes its vocabulary id, or
         * the next id after the vocabulary and the added tokens before it. A file whose ids
         * say otherwise would give other ids there than here, so it is refused. */
        int32_t given = vocab_find(t, c, n);
        if (given < 0) given = max_added >= n_vocab ? max_added + 1 : n_vocab;
        if (given != id)
            return fs_errorf(FS_ERR_FORMAT,
                             "%s: added token '%s' says id %d, but the tokenizers package gives it "
                             "%d (an added token outside the vocabulary takes the next free id in order)",
                             t->path, c, id, given);
        if (id > max_added) max_added = id;
        if (get_bool(e, "lstrip", 0) || get_bool(e, "rstrip", 0) || get_bool(e, "single_word", 0))
            return fs_errorf(FS_ERR_FORMAT,
                             "%s: added token '%s' sets lstrip, rstrip or single_word, which "
                             "flatshard does not support",
                             t->path, c);
        if (t->tok_len[id] >= 0 && ((size_t)t->tok_len[id] != n || memcmp(tok_text(t, id), c, n) != 0))
            return fs_errorf(FS_ERR_FORMAT, "%s: added token '%s' has id %d, which the vocabulary gives '%s'",
                             t->path, c, id, tok_text(t, id));
        if (t->tok_len[id] < 0) {
            memcpy(t->pool + t->pool_bytes, c, n + 1);
            t->tok_off[id] = t->pool_bytes;
            t->tok_len[id] = (int32_t)n;
            t->pool_bytes += n + 1;
        }
        added_token *a = &t->added[t->n_added++];
        a->id = id;
        a->special = get_bool(e, "special", 0);
        /* tokenizers' default for an added token is normalized: !special */
        a->normalized = get_bool(e, "normalized", !a->special);
        if (a->normalized) t->has_normalized_added = 1;
        /* tokenizers matches a normalized token by its normalized form ("<s>" is "▁<s>"
         * under Llama 2's Prepend) */
        bytes m = {0}, scratch = {0};
        fs_status nst = bytes_put(&m, c, n);
        if (nst == FS_OK && a->normalized) nst = normalize(t, &m, &scratch, 1);
        if (nst == FS_OK) nst = bytes_put(&m, "", 1);
        free(scratch.p);
        if (nst != FS_OK) {
            free(m.p);
            return nst;
        }
        a->match = m.p;
        a->match_len = m.n - 1;
        if (a->match_len == 0)
            return fs_errorf(FS_ERR_FORMAT, "%s: added token '%s' normalizes to nothing", t->path, c);
        a->text = tok_text(t, id);
        a->len = n;
        if (a->special) t->is_special[id] = 1;
    }
    qsort(t->added, (size_t)t->n_added, sizeof *t->added, cmp_added);
    for (int b = 0, i = 0; b <= 256; b++) {
        while (i < t->n_added && (uint8_t)t->added[i].match[0] < b) i++;
        t->added_first[b] = i;
    }
    FS_TRY(find_newline_added(t));

    const cJSON *unk = field(model, "unk_token");
    t->unk_id = -1;
    if (cJSON_IsString(unk)) {
        t->unk_id = vocab_find(t, unk->valuestring, strlen(unk->valuestring));
        if (t->unk_id < 0)
            return fs_errorf(FS_ERR_FORMAT, "%s: model.unk_token '%s' is not in the vocabulary",
                             t->path, unk->valuestring);
    }
    for (int c = 0; c < 128; c++) {
        char one = (char)c;
        t->ascii_id[c] = vocab_find(t, &one, 1);
    }
    for (int b = 0; b < 256; b++) {
        char name[8];
        snprintf(name, sizeof name, "<0x%02X>", b);
        t->byte_fallback_id[b] = vocab_find(t, name, 6);
    }

    /* merges: rank = position in the list */
    int n_merges = cJSON_GetArraySize(merges);
    uint64_t pcap = 16;
    while (pcap < 2 * (uint64_t)n_merges + 2) pcap *= 2;
    t->pairs = malloc(pcap * sizeof *t->pairs);
    if (!t->pairs) return fs_errorf(FS_ERR_NOMEM, "%s: out of memory for %d merges", t->path, n_merges);
    t->pair_mask = pcap - 1;
    for (uint64_t i = 0; i < pcap; i++) t->pairs[i].key = UINT64_MAX;
    bytes joined = {0};
    int rank = 0;
    fs_status st = FS_OK;
    for (const cJSON *e = merges->child; e && st == FS_OK; e = e->next, rank++) {
        const char *a = NULL, *b = NULL;
        size_t na = 0, nb = 0;
        if (cJSON_IsString(e)) { /* the older "left right" form */
            const char *sp = strchr(e->valuestring, ' ');
            if (sp && sp != e->valuestring && sp[1]) {
                a = e->valuestring;
                na = (size_t)(sp - a);
                b = sp + 1;
                nb = strlen(b);
            }
        } else if (cJSON_GetArraySize(e) == 2 && cJSON_IsString(e->child) &&
                   cJSON_IsString(e->child->next)) {
            a = e->child->valuestring;
            na = strlen(a);
            b = e->child->next->valuestring;
            nb = strlen(b);
        }
        if (!a) {
            st = fs_errorf(FS_ERR_FORMAT, "%s: merges[%d] is neither \"left right\" nor [left, right]",
                           t->path, rank);
            break;
        }
        int32_t ia = vocab_find(t, a, na), ib = vocab_find(t, b, nb);
        joined.n = 0;
        st = bytes_put(&joined, a, na);
        if (st == FS_OK) st = bytes_put(&joined, b, nb);
        if (st != FS_OK) break;
        int32_t ij = vocab_find(t, joined.p, joined.n);
        if (ia < 0 || ib < 0 || ij < 0) {
            st = fs_errorf(FS_ERR_FORMAT, "%s: merges[%d] ('%.*s' + '%.*s') has a part or a result "
                           "outside the vocabulary", t->path, rank, (int)na, a, (int)nb, b);
            break;
        }
        uint64_t key = ((uint64_t)(uint32_t)ia << 32) | (uint32_t)ib;
        uint64_t h = pair_hash(key) & t->pair_mask;
        while (t->pairs[h].key != UINT64_MAX && t->pairs[h].key != key) h = (h + 1) & t->pair_mask;
        if (t->pairs[h].key == UINT64_MAX) { /* a repeated pair keeps its first (lowest) rank */
            t->pairs[h].key = key;
            t->pairs[h].rank = rank;
            t->pairs[h].new_id = ij;
        }
    }
    free(joined.p);
    FS_TRY(st);

    if (t->byte_level) {
        /* GPT-2's table: printable Latin-1 bytes stand for themselves, the others (control
         * characters, space, 0x7F-0xA0, 0xAD) for 256, 257, ... in byte order */
        uint32_t next = 256;
        for (int b = 0; b < 256; b++) {
            int printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
            uint32_t cp = printable ? (uint32_t)b : next++;
            t->byte_char_len[b] = (uint8_t)utf8_encode(cp, t->byte_char[b]);
            t->byte_sym[b] = vocab_find(t, t->byte_char[b], t->byte_char_len[b]);
        }
    }
    decide_split_at_metaspace(t);
    static const char *const eos_names[] = {"<|end_of_text|>", "</s>", "<|endoftext|>", "<|eot_id|>"};
    t->eos_id = -1;
    for (int k = 0; k < 4 && t->eos_id < 0; k++)
        for (int i = 0; i < t->n_added; i++)
            if (t->added[i].special && strcmp(t->added[i].text, eos_names[k]) == 0) t->eos_id = t->added[i].id;
    return FS_OK;
}

fs_status fs_bpe_load(fs_bpe **out, const char *path) {
    *out = NULL;
    fs_bpe *t = calloc(1, sizeof *t);
    if (!t) return fs_errorf(FS_ERR_NOMEM, "%s: out of memory", path);
    if (strlen(path) >= sizeof t->path) {
        free(t);
        return fs_errorf(FS_ERR_USAGE, "%s: tokenizer path too long", path);
    }
    strcpy(t->path, path);
    /* a directory failed as "read failed"; a device such as /dev/zero would be read until
     * memory ran out. A pipe (<(cat tokenizer.json)) is read as a file is; a named FIFO is
     * refused by name (fs_file_open: its writer may never come). */
    FILE *f = NULL;
    fs_status st = fs_file_fopen(path, "a tokenizer.json", FS_FILE_PIPE_OK, FS_ERR_USAGE, &f);
    if (st != FS_OK) {
        free(t);
        return st;
    }
    bytes text = {0};
    char buf[65536];
    size_t k;
    while (st == FS_OK && (k = fread(buf, 1, sizeof buf, f)) > 0) st = bytes_put(&text, buf, k);
    if (st == FS_OK && ferror(f)) st = fs_errorf(FS_ERR_IO, "%s: read failed: %s", path, strerror(errno));
    fclose(f);
    cJSON *root = NULL;
    if (st == FS_OK) {
        root = cJSON_ParseWithLength(text.p ? text.p : "", text.n);
        if (!cJSON_IsObject(root)) st = fs_errorf(FS_ERR_FORMAT, "%s: not a JSON object", path);
    }
    free(text.p);
    if (st == FS_OK) st = require_null(t, root, "truncation", "tokenizer");
    if (st == FS_OK) st = require_null(t, root, "padding", "tokenizer");
    if (st == FS_OK) st = load_normalizer(t, field(root, "normalizer"), 0);
    if (st == FS_OK) st = load_pre_tokenizer(t, field(root, "pre_tokenizer"), 0);
    if (st == FS_OK) st = load_model_and_tokens(t, root);
    if (st == FS_OK) st = load_decoder(t, field(root, "decoder"), 0);
    if (st == FS_OK) st = load_post_processor(t, field(root, "post_processor"), 0);
    for (int i = 0; st == FS_OK && i < t->n_before; i++)
        if (t->tmpl_before[i] >= t->vocab_size) st = fs_errorf(FS_ERR_FORMAT, "%s: post_processor id %d is outside the vocabulary", path, t->tmpl_before[i]);
    for (int i = 0; st == FS_OK && i < t->n_after; i++)
        if (t->tmpl_after[i] >= t->vocab_size) st = fs_errorf(FS_ERR_FORMAT, "%s: post_processor id %d is outside the vocabulary", path, t->tmpl_after[i]);
    cJSON_Delete(root);
    if (st != FS_OK) {
        fs_bpe_free(t);
        return st;
    }
    *out = t;
    return FS_OK;
}

/* ------------------------------------------------------------------ the encoder */

typedef struct piece {
    size_t off, len;
} piece;

typedef struct symbol {
    int32_t id, prev, next, alive;
} symbol;

typedef struct heap_item {
    int32_t rank, pos, new_id;
    int32_t left, right; /* the pair's ids when pushed, to skip the lookup of a fresh entry */
} heap_item;

enum { CACHE_SLOTS = 1 << 15, CACHE_MAX_PIECE = 128, CACHE_KEY_BYTES = 1 << 21, CACHE_IDS = 1 << 19 };

typedef struct cache_slot {
    uint64_t hash;
    uint32_t key_off, key_len, ids_off, n_ids; /* key_len 0: empty */
} cache_slot;

struct fs_bpe_encoder {
    const fs_bpe *bpe;
    pcre2_match_data *match;
    pcre2_match_context *mctx;
    pcre2_jit_stack *jit_stack;
    bytes clean, seg, normed, arena[2];
    piece *pieces[2];
    size_t n_pieces[2], cap_pieces[2];
    symbol *sym;
    size_t cap_sym;
    heap_item *heap;
    size_t cap_heap;
    bytes mapped; /* a byte-level piece in GPT-2 characters, for ignore_merges */
    cache_slot *cache;
    char *cache_keys;
    int32_t *cache_ids;
    size_t cache_used, cache_key_used, cache_ids_used;
};

void fs_bpe_encoder_free(fs_bpe_encoder *e) {
    if (!e) return;
    pcre2_match_data_free(e->match);
    pcre2_match_context_free(e->mctx);
    pcre2_jit_stack_free(e->jit_stack);
    free(e->clean.p);
    free(e->seg.p);
    free(e->normed.p);
    free(e->arena[0].p);
    free(e->arena[1].p);
    free(e->pieces[0]);
    free(e->pieces[1]);
    free(e->sym);
    free(e->heap);
    free(e->mapped.p);
    free(e->cache);
    free(e->cache_keys);
    free(e->cache_ids);
    free(e);
}

fs_status fs_bpe_encoder_init(fs_bpe_encoder **out, const fs_bpe *bpe) {
    *out = NULL;
    fs_bpe_encoder *e = calloc(1, sizeof *e);
    if (!e) return fs_errorf(FS_ERR_NOMEM, "tokenizer: out of memory for an encoder");
    e->bpe = bpe;
    e->match = pcre2_match_data_create(4, NULL);
    e->mctx = pcre2_match_context_create(NULL);
    /* a larger JIT stack than the 32 KiB default, for long runs of one character class */
    e->jit_stack = pcre2_jit_stack_create(32 * 1024, 8 * 1024 * 1024, NULL);
    e->cache = calloc(CACHE_SLOTS, sizeof *e->cache);
    e->cache_keys = malloc(CACHE_KEY_BYTES);
    e->cache_ids = malloc(CACHE_IDS * sizeof *e->cache_ids);
    if (!e->match || !e->mctx || !e->jit_stack || !e->cache || !e->cache_keys || !e->cache_ids) {
        fs_bpe_encoder_free(e);
        return fs_errorf(FS_ERR_NOMEM, "tokenizer: out of memory for an encoder");
    }
    pcre2_jit_stack_assign(e->mctx, NULL, e->jit_stack);
    *out = e;
    return FS_OK;
}

static fs_status pieces_push(fs_bpe_encoder *e, int which, size_t off, size_t len) {
    if (len == 0) return FS_OK; /* `tokenizers` drops empty splits */
    if (e->n_pieces[which] == e->cap_pieces[which]) {
        size_t cap = e->cap_pieces[which] ? 2 * e->cap_pieces[which] : 256;
        piece *p = realloc(e->pieces[which], cap * sizeof *p);
        if (!p) return fs_errorf(FS_ERR_NOMEM, "tokenizer: out of memory");
        e->pieces[which] = p;
        e->cap_pieces[which] = cap;
    }
    e->pieces[which][e->n_pieces[which]++] = (piece){off, len};
    return FS_OK;
}

/* The regex matches of s[0, n) as (start, end) pairs, appended to *m (a growable array). */
typedef struct span {
    size_t s, e;
    int is_match;
} span;

static fs_status regex_spans(fs_bpe_encoder *e, pcre2_code *re, const char *s, size_t n,
                             span **spans, size_t *n_spans, size_t *cap) {
    size_t at = 0, gap = 0;
    *n_spans = 0;
    while (at <= n) {
        int rc = pcre2_match(re, (PCRE2_SPTR)s, n, at, PCRE2_NO_UTF_CHECK, e->match, e->mctx);
        if (rc == PCRE2_ERROR_NOMATCH) break;
        if (rc < 0) {
            PCRE2_UCHAR msg[256];
            pcre2_get_error_message(rc, msg, sizeof msg);
            return fs_errorf(FS_ERR_INTERNAL, "%s: pre-tokenizer regex failed: %s", e->bpe->path,
                             (const char *)msg);
        }
        PCRE2_SIZE *ov = pcre2_get_ovector_pointer(e->match);
        size_t ms = ov[0], me = ov[1];
        if (*n_spans + 2 > *cap) {
            size_t c = *cap ? 2 * *cap : 64;
            span *p = realloc(*spans, c * sizeof *p);
            if (!p) return fs_errorf(FS_ERR_NOMEM, "tokenizer: out of memory");
            *spans = p;
            *cap = c;
        }
        if (me == ms) { /* an empty match splits nothing; step over one character */
            if (ms >= n) break;
            at = ms + 1;
            while (at < n && ((uint8_t)s[at] & 0xC0) == 0x80) at++;
            continue;
        }
        if (ms > gap) (*spans)[(*n_spans)++] = (span){gap, ms, 0};
        (*spans)[(*n_spans)++] = (span){ms, me, 1};
        gap = at = me;
    }
    if (gap < n) {
        if (*n_spans + 1 > *cap) {
            size_t c = *cap ? 2 * *cap : 64;
            span *p = realloc(*spans, c * sizeof *p);
            if (!p) return fs_errorf(FS_ERR_NOMEM, "tokenizer: out of memory");
            *spans = p;
            *cap = c;
        }
        (*spans)[(*n_spans)++] = (span){gap, n, 0};
    }
    return FS_OK;
}

/* Splits every current piece (arena[cur], pieces[cur]) with re and behavior into pieces[1-cur]
 * over the same arena, then swaps. */
static fs_status split_pieces(fs_bpe_encoder *e, int *cur, pcre2_code *re, split_kind behavior) {
    int from = *cur, to = 1 - *cur;
    e->n_pieces[to] = 0;
    span *sp = NULL;
    size_t n_sp = 0, cap = 0;
    fs_status st = FS_OK;
    const char *base = e->arena[from].p;
    for (size_t i = 0; st == FS_OK && i < e->n_pieces[from]; i++) {
        piece pc = e->pieces[from][i];
        st = regex_spans(e, re, base + pc.off, pc.len, &sp, &n_sp, &cap);
        if (st != FS_OK) break;
        if (behavior == SPLIT_ISOLATED || behavior == SPLIT_REMOVED) {
            for (size_t k = 0; st == FS_OK && k < n_sp; k++)
                if (behavior == SPLIT_ISOLATED || !sp[k].is_match)
                    st = pieces_push(e, to, pc.off + sp[k].s, sp[k].e - sp[k].s);
        } else if (behavior == SPLIT_MERGED_PREV) {
            /* a match joins the piece before it when that piece is not itself a match */
            size_t start = 0;
            int have = 0, prev_match = 0;
            for (size_t k = 0; k < n_sp; k++) {
                if (sp[k].is_match && !prev_match && have) {
                    /* extend the pending piece */
                } else {
                    if (have) st = pieces_push(e, to, pc.off + start, sp[k].s - start);
                    start = sp[k].s;
                    have = 1;
                }
                prev_match = sp[k].is_match;
            }
            if (have && st == FS_OK) st = pieces_push(e, to, pc.off + start, pc.len - start);
        } else { /* SPLIT_MERGED_NEXT: a match joins the piece after it when that is no match */
            size_t end = pc.len, k = n_sp;
            int have = 0, next_match = 0;
            /* walk right to left, collecting pieces, then emit in order */
            size_t first = e->n_pieces[to];
            while (k-- > 0 && st == FS_OK) {
                if (sp[k].is_match && !next_match && have) {
                    /* the pending piece starts earlier */
                } else {
                    if (have) st = pieces_push(e, to, pc.off + sp[k].e, end - sp[k].e);
                    end = sp[k].e;
                    have = 1;
                }
                next_match = sp[k].is_match;
            }
            if (have && st == FS_OK) st = pieces_push(e, to, pc.off, end);
            piece *p = e->pieces[to];
            for (size_t a = first, b = e->n_pieces[to]; st == FS_OK && a + 1 < b; a++, b--) {
                piece tmp = p[a];
                p[a] = p[b - 1];
                p[b - 1] = tmp;
            }
        }
    }
    free(sp);
    if (st == FS_OK) {
        /* both piece lists now refer to arena[from]; make arena[to] that arena */
        bytes tmp = e->arena[to];
        e->arena[to] = e->arena[from];
        e->arena[from] = tmp;
        *cur = to;
    }
    return st;
}

/* Rewrites every piece into the other arena: ByteLevel's prefix space, Metaspace's
 * replacement and prefix. no_prefix_first: piece 0 continues a chunk's document, so it is
 * not the start of anything and gets no prefix. */
static fs_status rewrite_pieces(fs_bpe_encoder *e, int *cur, const pt_step *s, int first_at_zero,
                                int no_prefix_first) {
    int from = *cur, to = 1 - *cur;
    e->n_pieces[to] = 0;
    e->arena[to].n = 0;
    const char *base = e->arena[from].p;
    for (size_t i = 0; i < e->n_pieces[from]; i++) {
        piece pc = e->pieces[from][i];
        size_t off = e->arena[to].n;
        const char *p = base + pc.off;
        if (s->kind == PT_BYTELEVEL) { /* add_prefix_space */
            if (p[0] != ' ' && !(i == 0 && no_prefix_first)) FS_TRY(bytes_put(&e->arena[to], " ", 1));
            FS_TRY(bytes_put(&e->arena[to], p, pc.len));
        } else { /* Metaspace: spaces become the replacement, which is prepended */
            size_t rl = strlen(s->replacement);
            bytes *a = &e->arena[to];
            for (size_t k = 0; k < pc.len; k++) {
                if (p[k] == ' ') FS_TRY(bytes_put(a, s->replacement, rl));
                else FS_TRY(bytes_put(a, p + k, 1));
            }
            int starts = a->n - off >= rl && memcmp(a->p + off, s->replacement, rl) == 0;
            int prepend = !starts && !(i == 0 && no_prefix_first) && (s->prepend == PREPEND_ALWAYS ||
                                      (s->prepend == PREPEND_FIRST && i == 0 && first_at_zero));
            if (prepend) {
                FS_TRY(bytes_reserve(a, rl));
                memmove(a->p + off + rl, a->p + off, a->n - off);
                memcpy(a->p + off, s->replacement, rl);
                a->n += rl;
            }
        }
        FS_TRY(pieces_push(e, to, off, e->arena[to].n - off));
    }
    *cur = to;
    return FS_OK;
}

static void heap_push(heap_item *h, size_t *n, heap_item x) {
    size_t i = (*n)++;
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (h[p].rank < x.rank || (h[p].rank == x.rank && h[p].pos <= x.pos)) break;
        h[i] = h[p];
        i = p;
    }
    h[i] = x;
}

static heap_item heap_pop(heap_item *h, size_t *n) {
    heap_item top = h[0], x = h[--(*n)];
    size_t i = 0;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= *n) break;
        if (c + 1 < *n && (h[c + 1].rank < h[c].rank || (h[c + 1].rank == h[c].rank && h[c + 1].pos < h[c].pos)))
            c++;
        if (x.rank < h[c].rank || (x.rank == h[c].rank && x.pos <= h[c].pos)) break;
        h[i] = h[c];
        i = c;
    }
    h[i] = x;
    return top;
}

static fs_status sym_reserve(fs_bpe_encoder *e, size_t n) {
    if (n <= e->cap_sym) return FS_OK;
    size_t cap = e->cap_sym ? e->cap_sym : 256;
    while (cap < n) cap *= 2;
    symbol *s = realloc(e->sym, cap * sizeof *s);
    heap_item *h = s ? realloc(e->heap, 2 * cap * sizeof *h) : NULL;
    if (s) e->sym = s;
    if (h) e->heap = h;
    if (!s || !h) return fs_errorf(FS_ERR_NOMEM, "tokenizer: out of memory for a piece of %zu symbols", n);
    e->cap_sym = cap;
    e->cap_heap = 2 * cap;
    return FS_OK;
}

/* The symbols of one piece, as `tokenizers`' BPE::merge_word builds them: each character in
 * the vocabulary is one symbol; one outside it becomes its <0xNN> tokens under byte_fallback
 * (when all exist), else unk (consecutive unks fused under fuse_unk), else nothing. */
static fs_status build_symbols(fs_bpe_encoder *e, const char *p, size_t n, size_t *n_sym) {
    const fs_bpe *t = e->bpe;
    FS_TRY(sym_reserve(e, 4 * n + 1));
    size_t k = 0;
    int32_t pending_unk = -1;
    size_t i = 0;
    while (i < n) {
        const char *ch = NULL;
        size_t ch_len;
        int32_t id;
        if (t->byte_level) {
            uint8_t b = (uint8_t)p[i];
            ch = t->byte_char[b];
            ch_len = t->byte_char_len[b];
            id = t->byte_sym[b];
            i += 1;
        } else {
            uint32_t cp;
            size_t bad, len = utf8_next((const uint8_t *)p + i, n - i, &cp, &bad);
            if (!len) len = bad; /* cannot happen: the text was made valid */
            ch = p + i;
            ch_len = len;
            id = len == 1 ? t->ascii_id[(uint8_t)*ch] : vocab_find(t, ch, ch_len);
            i += len;
        }
        if (id >= 0) {
            if (pending_unk >= 0) e->sym[k++].id = pending_unk;
            pending_unk = -1;
            e->sym[k++].id = id;
            continue;
        }
        if (t->byte_fallback) {
            int all = 1;
            for (size_t j = 0; j < ch_len; j++) all &= t->byte_fallback_id[(uint8_t)ch[j]] >= 0;
            if (all) {
                /* as `tokenizers` does, a pending unk is not flushed before byte tokens */
                for (size_t j = 0; j < ch_len; j++) e->sym[k++].id = t->byte_fallback_id[(uint8_t)ch[j]];
                continue;
            }
        }
        if (t->unk_id >= 0) {
            if (pending_unk >= 0 && !t->fuse_unk) e->sym[k++].id = pending_unk;
            pending_unk = t->unk_id;
        }
    }
    if (pending_unk >= 0) e->sym[k++].id = pending_unk;
    for (size_t j = 0; j < k; j++) {
        e->sym[j].prev = (int32_t)j - 1;
        e->sym[j].next = j + 1 < k ? (int32_t)j + 1 : -1;
        e->sym[j].alive = 1;
    }
    *n_sym = k;
    return FS_OK;
}

/* Merges the symbols by rank (Word::merge_all) and appends the resulting ids to out. */
static fs_status merge_symbols(fs_bpe_encoder *e, size_t n_sym, fs_bpe_ids *out) {
    const fs_bpe *t = e->bpe;
    symbol *s = e->sym;
    heap_item *h = e->heap;
    size_t nh = 0;
    for (size_t j = 0; j + 1 < n_sym; j++) {
        const struct pair_slot *m = pair_find(t, s[j].id, s[j + 1].id);
        if (m) heap_push(h, &nh, (heap_item){m->rank, (int32_t)j, m->new_id, s[j].id, s[j + 1].id});
    }
    while (nh > 0) {
        heap_item top = heap_pop(h, &nh);
        symbol *cur = &s[top.pos];
        if (!cur->alive || cur->next < 0) continue;
        symbol *right = &s[cur->next];
        /* stale unless the pair there still merges into top.new_id (tokenizers' own test);
         * the same two ids as when pushed certainly do */
        if (cur->id != top.left || right->id != top.right) {
            const struct pair_slot *m = pair_find(t, cur->id, right->id);
            if (!m || m->new_id != top.new_id) continue;
        }
        cur->id = top.new_id;
        right->alive = 0;
        cur->next = right->next;
        if (right->next >= 0) s[right->next].prev = top.pos;
        /* each merge pops one entry and pushes at most two: the heap never exceeds 2n */
        FS_ASSERT(nh + 2 <= e->cap_heap);
        if (cur->prev >= 0) {
            const struct pair_slot *mp = pair_find(t, s[cur->prev].id, cur->id);
            if (mp) heap_push(h, &nh, (heap_item){mp->rank, cur->prev, mp->new_id, s[cur->prev].id, cur->id});
        }
        if (cur->next >= 0) {
            const struct pair_slot *mn = pair_find(t, cur->id, s[cur->next].id);
            if (mn) heap_push(h, &nh, (heap_item){mn->rank, top.pos, mn->new_id, cur->id, s[cur->next].id});
        }
    }
    for (int32_t j = n_sym ? 0 : -1; j >= 0; j = s[j].next) FS_TRY(fs_bpe_ids_push(out, s[j].id));
    return FS_OK;
}

static void cache_reset(fs_bpe_encoder *e) {
    memset(e->cache, 0, CACHE_SLOTS * sizeof *e->cache);
    e->cache_used = e->cache_key_used = e->cache_ids_used = 0;
}

/* The BPE of one piece, through the cache. whole_token_first: under ignore_merges, a piece
 * that is a whole token is that token (0 for the parts of a cut piece: the whole was looked up
 * before the cut; an encoder caches one kind only, as a tokenizer cuts always or never). */
static fs_status encode_piece(fs_bpe_encoder *e, const char *p, size_t n, int whole_token_first,
                              fs_bpe_ids *out) {
    const fs_bpe *t = e->bpe;
    uint64_t hash = 0, slot = 0;
    int cacheable = n <= CACHE_MAX_PIECE;
    if (cacheable) {
        hash = hash_bytes(p, n);
        for (slot = hash & (CACHE_SLOTS - 1);; slot = (slot + 1) & (CACHE_SLOTS - 1)) {
            cache_slot *c = &e->cache[slot];
            if (c->key_len == 0) break;
            if (c->hash == hash && c->key_len == n && memcmp(e->cache_keys + c->key_off, p, n) == 0) {
                for (uint32_t k = 0; k < c->n_ids; k++) FS_TRY(fs_bpe_ids_push(out, e->cache_ids[c->ids_off + k]));
                return FS_OK;
            }
        }
    }
    int64_t first = out->n;
    int done = 0;
    if (t->ignore_merges && whole_token_first) {
        const char *q = p;
        size_t qn = n;
        if (t->byte_level) {
            e->mapped.n = 0;
            for (size_t k = 0; k < n; k++)
                FS_TRY(bytes_put(&e->mapped, t->byte_char[(uint8_t)p[k]], t->byte_char_len[(uint8_t)p[k]]));
            q = e->mapped.p;
            qn = e->mapped.n;
        }
        int32_t id = vocab_find(t, q, qn);
        if (id >= 0) {
            FS_TRY(fs_bpe_ids_push(out, id));
            done = 1;
        }
    }
    if (!done) {
        size_t n_sym;
        FS_TRY(build_symbols(e, p, n, &n_sym));
        FS_TRY(merge_symbols(e, n_sym, out));
    }
    if (cacheable) {
        size_t k = (size_t)(out->n - first);
        if (e->cache_used + 1 > CACHE_SLOTS * 3 / 4 || e->cache_key_used + n > CACHE_KEY_BYTES ||
            e->cache_ids_used + k > CACHE_IDS) {
            cache_reset(e);
            for (slot = hash & (CACHE_SLOTS - 1); e->cache[slot].key_len; slot = (slot + 1) & (CACHE_SLOTS - 1)) {
            }
        }
        cache_slot *c = &e->cache[slot];
        c->hash = hash;
        c->key_off = (uint32_t)e->cache_key_used;
        c->key_len = (uint32_t)n;
        c->ids_off = (uint32_t)e->cache_ids_used;
        c->n_ids = (uint32_t)k;
        memcpy(e->cache_keys + e->cache_key_used, p, n);
        if (k) memcpy(e->cache_ids + e->cache_ids_used, out->ids + first, k * sizeof *out->ids);
        e->cache_key_used += n;
        e->cache_ids_used += k;
        e->cache_used++;
    }
    return FS_OK;
}

/* A piece cut before each run of "▁", the parts encoded on their own: the ids of the whole
 * piece when split_at_metaspace holds (decide_split_at_metaspace says why). */
static fs_status encode_split_at_metaspace(fs_bpe_encoder *e, const char *p, size_t n, fs_bpe_ids *out) {
    const fs_bpe *t = e->bpe;
    if (t->ignore_merges) {
        int32_t id = vocab_find(t, p, n);
        if (id >= 0) return fs_bpe_ids_push(out, id);
    }
    size_t start = 0;
    /* a "▁" at i >= 1 whose 3 bytes fit; the text is valid UTF-8, so 0xE2 is a lead byte */
    for (size_t i = 1; i + METASPACE_BYTES <= n;) {
        const char *hit = memchr(p + i, METASPACE[0], n - i - (METASPACE_BYTES - 1));
        if (!hit) break;
        size_t at = (size_t)(hit - p);
        if (memcmp(hit, METASPACE, METASPACE_BYTES) != 0) {
            i = at + 1;
            continue;
        }
        int after_metaspace = at >= METASPACE_BYTES && memcmp(hit - METASPACE_BYTES, METASPACE, METASPACE_BYTES) == 0;
        if (!after_metaspace) {
            FS_TRY(encode_piece(e, p + start, at - start, 0, out));
            start = at;
        }
        i = at + METASPACE_BYTES;
    }
    return encode_piece(e, p + start, n - start, 0, out);
}

/* The added token of the given kind (normalized or not) at s[i], the longest; or NULL. */
static const added_token *added_at(const fs_bpe *t, const char *s, size_t n, size_t i, int normalized) {
    uint8_t b = (uint8_t)s[i];
    for (int k = t->added_first[b]; k < t->added_first[b + 1]; k++) {
        const added_token *a = &t->added[k];
        if (a->normalized == normalized && a->match_len <= n - i && memcmp(s + i, a->match, a->match_len) == 0)
            return a;
    }
    return NULL;
}

/* Whether the text byte r, facing the byte m of a's match, may differ from what the matcher
 * sees there, so that r != m rules nothing out: U+FFFD replaces bytes >= 0x80 only, and a
 * normalizer step copies a byte it neither matches nor writes as it is, next to its copied
 * neighbours; a byte it does touch (in the text or the token: the "▁" of Prepend stands where
 * the text may have a raw added token's last byte) may stand anywhere. */
static int unknown_byte(const fs_bpe *t, const added_token *a, uint8_t r, uint8_t m) {
    return r >= 0x80 || (a->normalized && (t->norm_touches[r] || t->norm_touches[m]));
}

/* Whether a's match may lie over the newline that ends before (fs_bpe_added_may_cover_newline):
 * each newline of the match is put on it and the bytes beside it compared outward. */
static int added_may_cover(const fs_bpe *t, const added_token *a, const char *before, size_t n_before,
                           const char *after, size_t n_after) {
    const uint8_t *m = (const uint8_t *)a->match;
    for (size_t k = 0; k < a->match_len; k++) {
        if (m[k] != '\n') continue;
        int fits = 1;
        /* before[n_before - 1] is the newline, so before[n_before - 1 - j] faces m[k - j];
         * where the text runs out, the token may go on matching */
        for (size_t j = 1; j <= k && j < n_before && fits; j++) {
            uint8_t r = (uint8_t)before[n_before - 1 - j];
            if (unknown_byte(t, a, r, m[k - j])) break;
            fits = r == m[k - j];
        }
        for (size_t j = 0; k + 1 + j < a->match_len && j < n_after && fits; j++) {
            uint8_t r = (uint8_t)after[j];
            if (unknown_byte(t, a, r, m[k + 1 + j])) break;
            fits = r == m[k + 1 + j];
        }
        if (fits) return 1;
    }
    return 0;
}

int fs_bpe_added_may_cover_newline(const fs_bpe *bpe, const char *before, size_t n_before,
                                   const char *after, size_t n_after) {
    if (n_before == 0 || before[n_before - 1] != '\n') return 1;
    if (bpe->nl_any_added) return 1;
    for (int i = 0; i < bpe->n_nl_added; i++)
        if (added_may_cover(bpe, &bpe->added[bpe->nl_added[i]], before, n_before, after, n_after)) return 1;
    return 0;
}

static fs_status pretokenize_and_encode(fs_bpe_encoder *e, int at_zero, int no_prefix, fs_bpe_ids *out);

/* Normalizes, pre-tokenizes and encodes one segment (text between added tokens). at_zero: the
 * segment starts the text of a document (Metaspace's "first"). */
static fs_status encode_segment(fs_bpe_encoder *e, const char *s, size_t n, int at_zero,
                                int prepend_ok, fs_bpe_ids *out) {
    const fs_bpe *t = e->bpe;
    if (n == 0) return FS_OK;
    bytes *a = &e->arena[0];
    a->n = 0;
    FS_TRY(bytes_put(a, s, n));
    FS_TRY(normalize(t, a, &e->seg, prepend_ok));
    if (!t->has_normalized_added) return pretokenize_and_encode(e, at_zero, !prepend_ok, out);
    /* added tokens with normalized: true are cut out of the normalized text; the parts
     * between them are pre-tokenized on their own, like any other split */
    e->normed.n = 0;
    FS_TRY(bytes_put(&e->normed, a->p, a->n));
    const char *q = e->normed.p;
    size_t m = e->normed.n, part = 0;
    for (size_t i = 0; i <= m; i++) {
        const added_token *hit = i < m ? added_at(t, q, m, i, 1) : NULL;
        if (!hit && i < m) continue;
        if (i > part) {
            e->arena[0].n = 0;
            FS_TRY(bytes_put(&e->arena[0], q + part, i - part));
            FS_TRY(pretokenize_and_encode(e, at_zero && part == 0, !prepend_ok && part == 0, out));
        }
        if (!hit) break;
        FS_TRY(fs_bpe_ids_push(out, hit->id));
        i += hit->match_len - 1;
        part = i + 1;
    }
    return FS_OK;
}

/* Pre-tokenizes arena[0] (one split) into pieces and appends their BPE ids. at_zero: the
 * split starts its document (Metaspace "first"); no_prefix: it continues a chunk's document,
 * so it gets no prefix of its own. */
static fs_status pretokenize_and_encode(fs_bpe_encoder *e, int at_zero, int no_prefix, fs_bpe_ids *out) {
    const fs_bpe *t = e->bpe;
    int cur = 0;
    e->n_pieces[0] = 0;
    FS_TRY(pieces_push(e, 0, 0, e->arena[0].n));
    for (int i = 0; i < t->n_pt; i++) {
        const pt_step *ps = &t->pt[i];
        if (ps->kind == PT_SPLIT) {
            FS_TRY(split_pieces(e, &cur, ps->re, ps->behavior));
        } else if (ps->kind == PT_BYTELEVEL) {
            /* the prefix goes on every piece so far; as the first step, the pieces are the
             * segments, and a chunk that continues a document has no segment start */
            if (ps->add_prefix_space) FS_TRY(rewrite_pieces(e, &cur, ps, at_zero, i == 0 && no_prefix));
            if (ps->re) FS_TRY(split_pieces(e, &cur, ps->re, SPLIT_ISOLATED));
        } else {
            FS_TRY(rewrite_pieces(e, &cur, ps, at_zero, i == 0 && no_prefix));
            if (ps->re) FS_TRY(split_pieces(e, &cur, ps->re, SPLIT_MERGED_NEXT));
        }
    }
    const char *base = e->arena[cur].p;
    for (size_t i = 0; i < e->n_pieces[cur]; i++) {
        const char *p = base + e->pieces[cur][i].off;
        size_t n = e->pieces[cur][i].len;
        FS_TRY(t->split_at_metaspace ? encode_split_at_metaspace(e, p, n, out) : encode_piece(e, p, n, 1, out));
    }
    return FS_OK;
}

fs_status fs_bpe_encode(fs_bpe_encoder *e, const char *text, size_t n, unsigned flags,
                        fs_bpe_ids *out) {
    const fs_bpe *t = e->bpe;
    const char *s = text;
    if (!utf8_valid((const uint8_t *)text, n)) {
        e->clean.n = 0;
        FS_TRY(utf8_lossy(&e->clean, (const uint8_t *)text, n));
        s = e->clean.p;
        n = e->clean.n;
    }
    int special = (flags & FS_BPE_ADD_SPECIAL) != 0;
    if (special && !(flags & FS_BPE_CONTINUES))
        for (int i = 0; i < t->n_before; i++) FS_TRY(fs_bpe_ids_push(out, t->tmpl_before[i]));
    /* cut out added tokens: the leftmost match, the longest there */
    size_t seg = 0, i = 0;
    int first_seg = 1;
    while (i < n) {
        const added_token *hit = added_at(t, s, n, i, 0);
        if (!hit) {
            i++;
            continue;
        }
        int at_zero = seg == 0 && !(flags & FS_BPE_CONTINUES);
        int prepend_ok = !(first_seg && (flags & FS_BPE_CONTINUES));
        FS_TRY(encode_segment(e, s + seg, i - seg, at_zero, prepend_ok, out));
        if (i > seg) first_seg = 0;
        FS_TRY(fs_bpe_ids_push(out, hit->id));
        first_seg = 0;
        i += hit->match_len;
        seg = i;
    }
    int at_zero = seg == 0 && !(flags & FS_BPE_CONTINUES);
    int prepend_ok = !(first_seg && (flags & FS_BPE_CONTINUES));
    FS_TRY(encode_segment(e, s + seg, n - seg, at_zero, prepend_ok, out));
    if (special && !(flags & FS_BPE_CONTINUED))
        for (int k = 0; k < t->n_after; k++) FS_TRY(fs_bpe_ids_push(out, t->tmpl_after[k]));
    return FS_OK;
}

/* ------------------------------------------------------------------ decoding */

typedef struct strlist {
    bytes *s;
    size_t n, cap;
} strlist;

static void strlist_free(strlist *l) {
    for (size_t i = 0; i < l->n; i++) free(l->s[i].p);
    free(l->s);
    l->s = NULL;
    l->n = l->cap = 0;
}

static fs_status strlist_push(strlist *l, const char *p, size_t n) {
    if (l->n == l->cap) {
        size_t cap = l->cap ? 2 * l->cap : 64;
        bytes *s = realloc(l->s, cap * sizeof *s);
        if (!s) return fs_errorf(FS_ERR_NOMEM, "tokenizer: out of memory while decoding");
        l->s = s;
        l->cap = cap;
    }
    bytes b = {0};
    FS_TRY(bytes_put(&b, p, n));
    FS_TRY(bytes_put(&b, "", 1)); /* keep a NUL after the text; n excludes it */
    b.n--;
    l->s[l->n++] = b;
    return FS_OK;
}

/* GPT-2 character -> byte, or -1. */
static int byte_of_char(const fs_bpe *t, uint32_t cp) {
    if (cp < 256) {
        int printable = (cp >= '!' && cp <= '~') || (cp >= 0xA1 && cp <= 0xAC) || (cp >= 0xAE);
        return printable ? (int)cp : -1;
    }
    uint32_t k = 256;
    for (int b = 0; b < 256; b++) {
        int printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
        if (!printable && k++ == cp) return b;
    }
    (void)t;
    return -1;
}

static fs_status replace_all(bytes *dst, const bytes *src, const char *pat, const char *with) {
    size_t pl = strlen(pat), wl = strlen(with);
    dst->n = 0;
    for (size_t k = 0; k < src->n;) {
        if (k + pl <= src->n && memcmp(src->p + k, pat, pl) == 0) {
            FS_TRY(bytes_put(dst, with, wl));
            k += pl;
        } else {
            FS_TRY(bytes_put(dst, src->p + k, 1));
            k++;
        }
    }
    return FS_OK;
}

static int hexval(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

static fs_status decode_step(const fs_bpe *t, const dec_step *d, strlist *in, strlist *outl) {
    outl->n = 0;
    bytes acc = {0}, tmp = {0};
    fs_status st = FS_OK;
    if (d->kind == DEC_BYTELEVEL || d->kind == DEC_FUSE) {
        for (size_t i = 0; st == FS_OK && i < in->n; i++) {
            const bytes *tk = &in->s[i];
            if (d->kind == DEC_FUSE) {
                st = bytes_put(&acc, tk->p, tk->n);
                continue;
            }
            /* every character back to its byte; a token with any other character is its text */
            size_t mark = acc.n;
            int ok = 1;
            for (size_t k = 0; ok && st == FS_OK && k < tk->n;) {
                uint32_t cp;
                size_t bad, len = utf8_next((const uint8_t *)tk->p + k, tk->n - k, &cp, &bad);
                int b = len ? byte_of_char(t, cp) : -1;
                if (b < 0) {
                    ok = 0;
                    break;
                }
                uint8_t ub = (uint8_t)b;
                st = bytes_put(&acc, &ub, 1);
                k += len;
            }
            if (!ok && st == FS_OK) {
                acc.n = mark;
                st = bytes_put(&acc, tk->p, tk->n);
            }
        }
        if (st == FS_OK && d->kind == DEC_BYTELEVEL) st = utf8_lossy(&tmp, (const uint8_t *)(acc.p ? acc.p : ""), acc.n);
        if (st == FS_OK) st = d->kind == DEC_BYTELEVEL ? strlist_push(outl, tmp.p ? tmp.p : "", tmp.n)
                                                       : strlist_push(outl, acc.p ? acc.p : "", acc.n);
    } else if (d->kind == DEC_BYTEFALLBACK) {
        size_t n_bytes = 0;
        for (size_t i = 0; st == FS_OK && i <= in->n; i++) {
            const bytes *tk = i < in->n ? &in->s[i] : NULL;
            int v = -1;
            if (tk && tk->n == 6 && memcmp(tk->p, "<0x", 3) == 0 && tk->p[5] == '>') {
                int h1 = hexval(tk->p[3]), h2 = hexval(tk->p[4]);
                if (h1 >= 0 && h2 >= 0) v = h1 * 16 + h2;
            }
            if (v >= 0) {
                uint8_t ub = (uint8_t)v;
                st = bytes_put(&acc, &ub, 1);
                n_bytes++;
                continue;
            }
            if (n_bytes) {
                if (utf8_valid((const uint8_t *)acc.p, acc.n)) {
                    st = strlist_push(outl, acc.p, acc.n);
                } else {
                    for (size_t k = 0; st == FS_OK && k < n_bytes; k++) st = strlist_push(outl, "\xEF\xBF\xBD", 3);
                }
                acc.n = 0;
                n_bytes = 0;
            }
            if (tk && st == FS_OK) st = strlist_push(outl, tk->p, tk->n);
        }
    } else {
        for (size_t i = 0; st == FS_OK && i < in->n; i++) {
            const bytes *tk = &in->s[i];
            if (d->kind == DEC_REPLACE) {
                st = replace_all(&tmp, tk, d->a, d->b);
                if (st == FS_OK) st = strlist_push(outl, tmp.p ? tmp.p : "", tmp.n);
            } else if (d->kind == DEC_METASPACE) {
                st = replace_all(&tmp, tk, d->a, i == 0 && d->prepend ? "" : " ");
                if (st == FS_OK) st = strlist_push(outl, tmp.p ? tmp.p : "", tmp.n);
            } else { /* DEC_STRIP: up to start leading and stop trailing content characters */
                size_t b = 0, e = tk->n;
                char c[4];
                size_t cl = (size_t)utf8_encode(d->content, c);
                for (int k = 0; k < d->start && b + cl <= e && memcmp(tk->p + b, c, cl) == 0; k++) b += cl;
                for (int k = 0; k < d->stop && e >= b + cl && memcmp(tk->p + e - cl, c, cl) == 0; k++) e -= cl;
                st = strlist_push(outl, tk->p + b, e - b);
            }
        }
    }
    free(acc.p);
    free(tmp.p);
    return st;
}

fs_status fs_bpe_decode(const fs_bpe *t, const int32_t *ids, int64_t n, int skip_special,
                        char **text, size_t *n_bytes) {
    *text = NULL;
    *n_bytes = 0;
    strlist a = {0}, b = {0};
    fs_status st = FS_OK;
    for (int64_t i = 0; st == FS_OK && i < n; i++) {
        int32_t id = ids[i];
        if (id < 0 || id >= t->vocab_size || t->tok_len[id] < 0) continue;
        if (skip_special && t->is_special[id]) continue;
        st = strlist_push(&a, tok_text(t, id), (size_t)t->tok_len[id]);
    }
    for (int i = 0; st == FS_OK && i < t->n_dec; i++) {
        st = decode_step(t, &t->dec[i], &a, &b);
        strlist tmp = a;
        a = b;
        b = tmp;
        for (size_t k = 0; k < b.n; k++) free(b.s[k].p);
        b.n = 0;
    }
    bytes outb = {0};
    for (size_t i = 0; st == FS_OK && i < a.n; i++) {
        /* without a decoder `tokenizers` joins the tokens with spaces */
        if (i > 0 && !t->has_decoder) st = bytes_put(&outb, " ", 1);
        if (st == FS_OK) st = bytes_put(&outb, a.s[i].p, a.s[i].n);
    }
    if (st == FS_OK) st = bytes_put(&outb, "", 1);
    strlist_free(&a);
    strlist_free(&b);
    if (st != FS_OK) {
        free(outb.p);
        return st;
    }
    *text = outb.p;
    *n_bytes = outb.n - 1;
    return FS_OK;
}
