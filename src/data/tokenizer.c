/*
 * tokenizer.c — the byte-level tokenizer: token id = byte value, vocabulary 256.
 *
 * There are no special tokens, no merges and no normalisation: a text is its bytes (UTF-8 or
 * anything else), and documents are separated by whatever the text itself uses. Encoding is
 * therefore total and decoding is the identity on ids in [0, 256).
 *
 * What it deliberately does not do: BPE or any learned vocabulary, Unicode handling, or
 * allocation (callers pass both buffers).
 */
#include "flatshard/data.h"

void fs_tokenizer_encode(int32_t *ids, const uint8_t *bytes, int64_t n) {
    for (int64_t i = 0; i < n; i++) ids[i] = bytes[i];
}

void fs_tokenizer_decode(uint8_t *bytes, const int32_t *ids, int64_t n) {
    for (int64_t i = 0; i < n; i++)
        bytes[i] = (ids[i] >= 0 && ids[i] < FS_BYTE_VOCAB_SIZE) ? (uint8_t)ids[i] : (uint8_t)'?';
}
