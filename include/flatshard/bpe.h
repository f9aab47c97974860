/*
 * flatshard/bpe.h — byte-pair-encoding tokenizers read from a Hugging Face tokenizer.json.
 *
 * The ids are the ones the `tokenizers` package gives (Tokenizer.encode / decode) for the two
 * kinds of BPE that Llama models ship:
 *   - byte-level BPE (GPT-2, Llama 3): pre_tokenizer ByteLevel (with its own regex) or
 *     Sequence[Split(regex), ByteLevel]; bytes map to printable characters (GPT-2's table);
 *     decoder ByteLevel;
 *   - SentencePiece-style BPE (Llama 2's LlamaTokenizerFast): normalizer
 *     Sequence[Prepend("▁"), Replace(" ", "▁")] or pre_tokenizer Metaspace; model BPE with
 *     byte_fallback (a character outside the vocabulary becomes its <0xNN> byte tokens) and
 *     fuse_unk; decoder Sequence[Replace, ByteFallback, Fuse, Strip].
 * added_tokens are cut out of the text first (leftmost, then longest), each becoming its id;
 * the post_processor TemplateProcessing's "single" template (bos before the text, as Llama
 * has it) is applied when FS_BPE_ADD_SPECIAL is given. docs/formats.md lists every supported
 * field; anything else is refused at load with one line naming the file and the field.
 *
 * Text. Input is UTF-8; invalid bytes are replaced by U+FFFD (one per maximal invalid
 * subsequence, as Python's bytes.decode(errors="replace") and Rust's from_utf8_lossy do), so
 * any byte string encodes. NUL is an ordinary character. Split regexes run on PCRE2 with
 * PCRE2_UTF | PCRE2_UCP (Unicode properties, lookahead); HF runs them on Oniguruma, and the
 * two agree on the Llama and GPT-2 patterns (tests/cli/test_tokenizer.sh checks it on
 * CJK, emoji, combining marks, RTL text and Unicode spaces).
 *
 * Threads. An fs_bpe is read-only once loaded and may be shared by any number of threads;
 * each thread encodes with its own fs_bpe_encoder (regex match state, a cache of pre-token ->
 * ids, scratch). The cache changes speed, never ids.
 *
 * What it does not do: Unigram or WordPiece models, BPE dropout, subword prefixes/suffixes,
 * Unicode normalization forms (NFC, NFKC), truncation and padding, pair templates, offsets.
 */
#ifndef FLATSHARD_BPE_H
#define FLATSHARD_BPE_H

#include <stddef.h>
#include <stdint.h>

#include "flatshard/core.h"

typedef struct fs_bpe fs_bpe;
typedef struct fs_bpe_encoder fs_bpe_encoder;

/* Loads a tokenizer.json. Errors: FS_ERR_IO (missing, unreadable), FS_ERR_FORMAT (not JSON, a
 * missing or malformed field, an unsupported model/normalizer/pre-tokenizer/decoder/post-
 * processor type or option, a merge whose parts or result are not in the vocabulary, a regex
 * PCRE2 cannot compile), each one line naming the file and the field. */
fs_status fs_bpe_load(fs_bpe **out, const char *path);
void fs_bpe_free(fs_bpe *bpe); /* NULL is a no-op */

/* 1 + the largest id of the vocabulary and the added tokens: the model's V must equal it. */
int32_t fs_bpe_vocab_size(const fs_bpe *bpe);
/* The id of a token's exact text (vocabulary or added token), or -1. */
int32_t fs_bpe_token_id(const fs_bpe *bpe, const char *token);
/* The text of id (NUL-terminated, as in tokenizer.json), or NULL for an id with none. */
const char *fs_bpe_token_text(const fs_bpe *bpe, int32_t id);
/* The end-of-text token: the first added special token among "<|end_of_text|>", "</s>",
 * "<|endoftext|>", "<|eot_id|>" (in that order), or -1. */
int32_t fs_bpe_eos_id(const fs_bpe *bpe);

/* Whether encoding cuts each piece before every run of "▁" (U+2581) and encodes the parts on
 * their own (and through the piece cache): decided at load, true only where no merge can join
 * across such a cut, so that it changes speed, never ids (src/data/bpe.c,
 * decide_split_at_metaspace, gives the argument). True of a vocabulary SentencePiece trained
 * with split_by_whitespace (Llama 2's), whose tokens have "▁" only in a run at their start;
 * false for byte-level models. For tests and benchmarks. */
int fs_bpe_split_at_metaspace(const fs_bpe *bpe);

/* A growable id array; zero-initialise it, and release it with fs_bpe_ids_free. */
typedef struct fs_bpe_ids {
    int32_t *ids;
    int64_t n, cap;
} fs_bpe_ids;
void fs_bpe_ids_free(fs_bpe_ids *ids);
fs_status fs_bpe_ids_push(fs_bpe_ids *ids, int32_t id); /* FS_ERR_NOMEM */

fs_status fs_bpe_encoder_init(fs_bpe_encoder **out, const fs_bpe *bpe);
void fs_bpe_encoder_free(fs_bpe_encoder *enc); /* NULL is a no-op */

/* Encoding flags. A long document may be encoded as several chunks cut at pre-token
 * boundaries outside added tokens (the CLI cuts after a newline between two non-space
 * characters, where fs_bpe_added_may_cover_newline says no added token lies): the chunks
 * after the first say FS_BPE_CONTINUES (no "▁" prepended, no bos), those before the last
 * FS_BPE_CONTINUED (no template tokens after the text). */
#define FS_BPE_ADD_SPECIAL 1u /* the post-processor's template tokens (bos), as encode() does */
#define FS_BPE_CONTINUES 2u   /* the text continues the previous chunk of a document */
#define FS_BPE_CONTINUED 4u   /* the next chunk continues this text */

/* Whether an added token may hold the newline that ends before[0, n_before) in a text that
 * goes on with after[0, n_after): then a cut after that newline would split the token, or
 * (if the token ends there) give the text after it no segment start of its own, and the
 * chunks would not have the ids of the whole text. 0: no added token matches there. It errs
 * towards 1: bytes it would need past either end count as matching, and so do bytes it cannot
 * compare with the token's as given (outside ASCII, where U+FFFD may replace them; for a
 * normalized token, bytes a normalizer step matches or writes). A before that does not end in
 * a newline gives 1. Only added tokens with a newline are looked at (the list is made at
 * load), so for most tokenizers this is a return. */
int fs_bpe_added_may_cover_newline(const fs_bpe *bpe, const char *before, size_t n_before,
                                   const char *after, size_t n_after);

/* Appends the ids of text[0, n_bytes) to out. Errors: FS_ERR_NOMEM, FS_ERR_INTERNAL (a regex
 * match failed, e.g. PCRE2's match limit on a pathological pattern), with a message. */
fs_status fs_bpe_encode(fs_bpe_encoder *enc, const char *text, size_t n_bytes, unsigned flags,
                        fs_bpe_ids *out);

/* decode(): the text of ids as the tokenizer's decoder makes it (valid UTF-8), in a malloc'd
 * NUL-terminated buffer (*text, *n_bytes without the NUL). Ids without a token are skipped,
 * as are special added tokens when skip_special is non-zero (the `tokenizers` default). */
fs_status fs_bpe_decode(const fs_bpe *bpe, const int32_t *ids, int64_t n, int skip_special,
                        char **text, size_t *n_bytes);

/* The bytes that end a whole number of UTF-8 characters of buf[0, n): the position after the
 * last complete sequence (invalid bytes count as complete), for cutting a stream into chunks
 * without splitting a character. */
size_t fs_utf8_complete_prefix(const uint8_t *buf, size_t n);

#endif /* FLATSHARD_BPE_H */
