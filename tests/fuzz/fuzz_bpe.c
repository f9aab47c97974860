/*
 * tests/fuzz/fuzz_bpe.c — libFuzzer target: the tokenizer.json BPE on hostile input. The
 * first byte picks what the rest is: text for a byte-level tokenizer with Llama 3's split
 * regex (0), text for a SentencePiece-style one with byte fallback (1), or a whole
 * tokenizer.json (2), which, when accepted, encodes and decodes a fixed text. Every id must
 * be inside the vocabulary and every decoded text must be valid UTF-8 (checked by encoding
 * it again: the encoder replaces nothing in valid text, so the byte count is kept).
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "flatshard/bpe.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size); /* libFuzzer's entry point */

static const char BYTELEVEL[] =
    "{\"added_tokens\": [{\"id\": 6, \"content\": \"<|end_of_text|>\", \"special\": true}],"
    " \"pre_tokenizer\": {\"type\": \"Sequence\", \"pretokenizers\": [{\"type\": \"Split\", \"pattern\": {\"Regex\":"
    " \"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\\\r\\\\n\\\\p{L}\\\\p{N}]?\\\\p{L}+|\\\\p{N}{1,3}| ?[^\\\\s\\\\p{L}\\\\p{N}]+[\\\\r\\\\n]*|\\\\s*[\\\\r\\\\n]+|\\\\s+(?!\\\\S)|\\\\s+\"},"
    " \"behavior\": \"Isolated\", \"invert\": false}, {\"type\": \"ByteLevel\", \"add_prefix_space\": false, \"use_regex\": false}]},"
    " \"decoder\": {\"type\": \"ByteLevel\"},"
    " \"model\": {\"type\": \"BPE\", \"ignore_merges\": true, \"vocab\": {\"a\": 0, \"b\": 1, \"\xC4\xA0\": 2, \"ab\": 3, \"\xC4\xA0" "ab\": 4, \"\xC4\x8A\": 5},"
    " \"merges\": [\"a b\", \"\xC4\xA0 ab\"]}}";

static const char SENTENCEPIECE[] =
    "{\"added_tokens\": [{\"id\": 0, \"content\": \"<unk>\", \"special\": true}, {\"id\": 1, \"content\": \"<s>\", \"special\": true}],"
    " \"normalizer\": {\"type\": \"Sequence\", \"normalizers\": [{\"type\": \"Prepend\", \"prepend\": \"\xE2\x96\x81\"},"
    " {\"type\": \"Replace\", \"pattern\": {\"String\": \" \"}, \"content\": \"\xE2\x96\x81\"}]},"
    " \"post_processor\": {\"type\": \"TemplateProcessing\", \"single\": [{\"SpecialToken\": {\"id\": \"<s>\"}}, {\"Sequence\": {\"id\": \"A\"}}],"
    " \"special_tokens\": {\"<s>\": {\"id\": \"<s>\", \"ids\": [1]}}},"
    " \"decoder\": {\"type\": \"Sequence\", \"decoders\": [{\"type\": \"Replace\", \"pattern\": {\"String\": \"\xE2\x96\x81\"}, \"content\": \" \"},"
    " {\"type\": \"ByteFallback\"}, {\"type\": \"Fuse\"}, {\"type\": \"Strip\", \"content\": \" \", \"start\": 1, \"stop\": 0}]},"
    " \"model\": {\"type\": \"BPE\", \"unk_token\": \"<unk>\", \"fuse_unk\": true, \"byte_fallback\": true,"
    " \"vocab\": {\"<unk>\": 0, \"<s>\": 1, \"<0x41>\": 2, \"<0xC3>\": 3, \"\xE2\x96\x81\": 4, \"h\": 5, \"\xE2\x96\x81h\": 6},"
    " \"merges\": [[\"\xE2\x96\x81\", \"h\"]]}}";

static fs_bpe *load_json(const char *json, size_t n) {
    char path[] = "/tmp/fuzz-bpe-XXXXXX";
    int fd = mkstemp(path);
    if (fd < 0) return NULL;
    FILE *f = fdopen(fd, "wb");
    if (!f) {
        close(fd);
        unlink(path);
        return NULL;
    }
    fwrite(json, 1, n, f);
    fclose(f);
    fs_bpe *bpe = NULL;
    if (fs_bpe_load(&bpe, path) != FS_OK) bpe = NULL;
    unlink(path);
    return bpe;
}

static void exercise(const fs_bpe *bpe, const uint8_t *text, size_t n) {
    fs_bpe_encoder *enc = NULL;
    fs_bpe_ids ids = {0};
    if (fs_bpe_encoder_init(&enc, bpe) != FS_OK) abort();
    if (fs_bpe_encode(enc, (const char *)text, n, FS_BPE_ADD_SPECIAL, &ids) != FS_OK) abort();
    for (int64_t i = 0; i < ids.n; i++)
        if (ids.ids[i] < 0 || ids.ids[i] >= fs_bpe_vocab_size(bpe)) abort();
    char *out = NULL;
    size_t n_out = 0;
    if (fs_bpe_decode(bpe, ids.ids, ids.n, (int)(n & 1), &out, &n_out) != FS_OK) abort();
    if (strlen(out) > n_out) abort(); /* NUL-terminated at n_out */
    free(out);
    fs_bpe_ids_free(&ids);
    fs_bpe_encoder_free(enc);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static fs_bpe *fixed[2];
    if (!fixed[0]) fixed[0] = load_json(BYTELEVEL, sizeof BYTELEVEL - 1);
    if (!fixed[1]) fixed[1] = load_json(SENTENCEPIECE, sizeof SENTENCEPIECE - 1);
    if (!fixed[0] || !fixed[1]) abort(); /* the fixed tokenizers must load */
    if (size == 0) return 0;
    uint8_t mode = data[0] % 3;
    if (mode < 2) {
        exercise(fixed[mode], data + 1, size - 1);
    } else {
        fs_bpe *bpe = load_json((const char *)data + 1, size - 1);
        if (bpe) {
            static const uint8_t text[] = "hi there\n\xC3\xA9t\xC3\xA9 <s> 12345 \xF0\x9F\x98\x80 \xFF end";
            exercise(bpe, text, sizeof text - 1);
            fs_bpe_free(bpe);
        }
    }
    return 0;
}
