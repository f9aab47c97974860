#!/usr/bin/env python3
"""tools/bpe_ref.py — the Hugging Face `tokenizers` package as the reference for flatshard's BPE.

  bpe_ref.py train OUTDIR CORPUS...
      trains five small tokenizers on the corpus files and writes them as tokenizer.json files:
        OUTDIR/bytelevel.json      byte-level BPE with Llama 3's split regex
                                   (pre_tokenizer Sequence[Split(regex), ByteLevel]), bos/eos
                                   <|begin_of_text|> / <|end_of_text|>, a TemplateProcessing
                                   post-processor that adds bos, ignore_merges as Llama 3 has it
        OUTDIR/gpt2.json           byte-level BPE as GPT-2 has it (ByteLevel pre-tokenizer with
                                   its own regex, no post-processor), eos <|endoftext|>
        OUTDIR/sentencepiece.json  SentencePiece-style BPE with byte fallback as transformers
                                   writes Llama 2's (normalizer Prepend + Replace, <unk> <s> </s>,
                                   fuse_unk, bos added by TemplateProcessing)
        OUTDIR/metaspace.json      the same model with the older Metaspace pre-tokenizer and
                                   decoder (prepend_scheme "first", split) in place of the normalizer
        OUTDIR/sentencepiece-words.json  Llama 2's layout again (no pre-tokenizer), with a model
                                   trained on words (a Metaspace pre-tokenizer that splits before
                                   each U+2581 while training), so U+2581 is only at token starts,
                                   as in a vocabulary SentencePiece trains with split_by_whitespace:
                                   flatshard encodes it in pieces cut before each U+2581 (bpe.c)
  bpe_ref.py samples OUTDIR
      writes unicode.txt (CJK, emoji, combining marks, RTL, Unicode spaces, CRLF, special tokens
      inline) and hostile texts (invalid UTF-8, NUL bytes, empty, 100 k spaces, a 630 kB line)
  bpe_ref.py encode TOKENIZER OUT.txt FILE... [--doc-separator LINE] [--no-special] [--eos]
      the ids flatshard tokenize writes for the same arguments, one per line: each FILE is a
      document (or each part between --doc-separator lines), encoded with encode() (bos added
      by the post-processor unless --no-special), followed by eos when --eos is given.
      Files are read as UTF-8 with invalid bytes replaced by U+FFFD, as flatshard does.
  bpe_ref.py ids TOKENIZER TEXTFILE OUT.txt [--no-special]
      encode() of the whole file's text; the ids, one per line
  bpe_ref.py decode TOKENIZER IDS.txt OUT.txt
      decode() of the ids (special tokens skipped), written as UTF-8
  bpe_ref.py dump TOKENS.bin OUT.txt
      the ids of a flatshard token file, one per line
  bpe_ref.py bench TOKENIZER TEXTFILE [--doc-separator LINE]
      encode_batch over the file's documents (as flatshard cuts them, bos added), 3 runs:
      the median's MB/s (of the file's bytes), and a hash of the ids with eos after each
      document (RAYON_NUM_THREADS caps its threads)
  bpe_ref.py hash TOKENS.bin
      the same hash of a flatshard token file's ids
"""
import array
import hashlib
import json
import os
import sys
import time


def train(outdir, corpus):
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers
    from tokenizers import processors, trainers

    # Llama 3's split pattern (a fact about its tokenizer.json)
    llama3 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|"
              r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")

    tok = Tokenizer(models.BPE(ignore_merges=True))
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(llama3), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    special = ["<|begin_of_text|>", "<|end_of_text|>"]
    tok.train(corpus, trainers.BpeTrainer(vocab_size=1000, special_tokens=special,
                                          initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                          show_progress=False))
    bos = tok.token_to_id(special[0])
    tok.post_processor = processors.Sequence([
        processors.ByteLevel(trim_offsets=False),
        processors.TemplateProcessing(single=f"{special[0]} $A",
                                      pair=f"{special[0]} $A {special[0]} $B:1",
                                      special_tokens=[(special[0], bos)])])
    tok.save(f"{outdir}/bytelevel.json")

    gpt2 = Tokenizer(models.BPE())
    gpt2.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    gpt2.decoder = decoders.ByteLevel()
    gpt2.train(corpus, trainers.BpeTrainer(vocab_size=800, special_tokens=["<|endoftext|>"],
                                           initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                           show_progress=False))
    gpt2.save(f"{outdir}/gpt2.json")

    sp = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True, fuse_unk=True))
    sp.normalizer = normalizers.Sequence([normalizers.Prepend("\u2581"),
                                          normalizers.Replace(" ", "\u2581")])
    sp.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(),
                                    decoders.Fuse(), decoders.Strip(" ", 1, 0)])
    # the 256 byte tokens first, as Llama 2's vocabulary has them, so byte fallback has them all;
    # the alphabet is capped so that rare characters (CJK, emoji) really fall back to bytes
    byte_tokens = [f"<0x{b:02X}>" for b in range(256)]
    sp.train(corpus, trainers.BpeTrainer(vocab_size=1000, special_tokens=["<unk>", "<s>", "</s>"]
                                         + byte_tokens, limit_alphabet=60, show_progress=False))
    sp.post_processor = processors.TemplateProcessing(
        single="<s> $A", pair="<s> $A <s> $B:1", special_tokens=[("<s>", sp.token_to_id("<s>"))])
    # the byte tokens are ordinary vocabulary entries in Llama 2, not added (special) tokens:
    # the trainer only takes them as special tokens, so they leave added_tokens afterwards
    spec = json.loads(sp.to_str())
    spec["added_tokens"] = [t for t in spec["added_tokens"] if t["content"] not in byte_tokens]
    with open(f"{outdir}/sentencepiece.json", "w", encoding="utf-8") as f:
        json.dump(spec, f, ensure_ascii=False)
    # trained without a pre-tokenizer, the model above learns tokens with "\u2581" after another
    # character ("e\u2581", "s\u2581"); trained on words it cannot, and only its model goes into
    # the same layout
    words = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True, fuse_unk=True))
    words.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="always",
                                                   split=True)
    words.train(corpus, trainers.BpeTrainer(vocab_size=1000, special_tokens=["<unk>", "<s>", "</s>"]
                                            + byte_tokens, limit_alphabet=60, show_progress=False))
    words_spec = dict(spec, model=json.loads(words.to_str())["model"])
    with open(f"{outdir}/sentencepiece-words.json", "w", encoding="utf-8") as f:
        json.dump(words_spec, f, ensure_ascii=False)
    # the older form of the same tokenizer: no normalizer, a Metaspace pre-tokenizer and decoder
    spec["normalizer"] = None
    spec["pre_tokenizer"] = {"type": "Metaspace", "replacement": "\u2581",
                             "prepend_scheme": "first", "split": True}
    spec["decoder"] = {"type": "Metaspace", "replacement": "\u2581", "prepend_scheme": "first",
                       "split": True}
    with open(f"{outdir}/metaspace.json", "w", encoding="utf-8") as f:
        json.dump(spec, f, ensure_ascii=False)


def read_text(path):
    with open(path, "rb") as f:
        return f.read().decode("utf-8", errors="replace")


def eos_of(tok):
    for t in ("<|end_of_text|>", "</s>", "<|endoftext|>"):
        i = tok.token_to_id(t)
        if i is not None:
            return i
    raise SystemExit("no eos token")


def documents(text, separator):
    """The documents of one file, as flatshard cuts them: the whole text, or the parts between
    lines equal to separator (lines end at "\n" only); empty documents are dropped."""
    if separator is None:
        return [text] if text else []
    parts = text.split("\n")
    lines = [p + "\n" for p in parts[:-1]] + ([parts[-1]] if parts[-1] else [])
    docs, cur = [], []
    for line in lines:
        if line in (separator, separator + "\n"):
            docs.append("".join(cur))
            cur = []
        else:
            cur.append(line)
    docs.append("".join(cur))
    return [d for d in docs if d]


def read_tokens(path):
    """The ids of a flatshard token file (1024-byte header, then uint16 or uint32)."""
    import struct
    data = open(path, "rb").read()
    magic, version, n = struct.unpack("<iii", data[:12])
    width = 2 if version == 1 else 4
    return list(struct.unpack(f"<{n}{'H' if width == 2 else 'I'}", data[1024:1024 + n * width]))


def samples(outdir):
    """Unicode and hostile texts for the comparison (tests/cli/test_tokenizer.sh)."""
    uni = ("日本語のテキスト、中文文本，한국어 텍스트。\n"
           "Emoji: 😀👍🏽 👨\u200d👩\u200d👧\u200d👦 🇫🇷 ❤️\u200d🔥\n"
           "Combining: e\u0301 a\u0308 n\u0303 Z\u0351\u0352\u0353 a\u20dd\n"
           "RTL: שלום עולם — مرحبا بالعالم\u200f (mixed) abc\n"
           "Spaces:\tTab\t\tand  double   triple\u00a0nbsp\u3000ideo\u2028ls\u0085nel\u200bzw\n"
           "CRLF line\r\nnext\r\n\r\n"
           "Numbers 1234567 3.14159 1,000,000 ٣٤٥ ४२\n"
           "Contractions: I'M don't they'RE we'll it's O'Neil 'S\n"
           "Thai: สวัสดีครับ Devanagari: नमस्ते दुनिया\n"
           "   leading spaces and trailing   \n\n\n   \n\t\n"
           "<s> inline <|begin_of_text|> specials </s><|end_of_text|><|endoftext|>x</s>\n")
    files = {
        "unicode.txt": uni.encode("utf-8"),
        # invalid UTF-8: stray continuation bytes, cut sequences, a surrogate, overlong, > U+10FFFF
        "invalid.txt": (b"ok \xff\xfe bad \xc3 cut \xe2\x82 more \xf0\x9f\x98 \xed\xa0\x80 surrogate "
                        b"\xc0\xaf over \xf4\x90\x80\x80 end\x80\x80"),
        "nul.txt": b"a\x00b\x00\x00 c \x00\n\x00",
        "empty.txt": b"",
        "whitespace.txt": b" \n\t\r\n",
        "spaces.txt": b" " * 100000 + b"x" + b"\n" * 5000 + b"\t \r\n" * 1000,
        "longline.txt": b"word 123 " * 70000 + b"\n",
        "cuttail.txt": "trailing cut é".encode("utf-8")[:-1],
    }
    for name, data in files.items():
        with open(os.path.join(outdir, name), "wb") as f:
            f.write(data)


def main():
    from tokenizers import Tokenizer
    args = sys.argv[1:]
    if not args:
        raise SystemExit(__doc__)
    cmd = args.pop(0)
    if cmd == "train":
        train(args[0], args[1:])
    elif cmd == "samples":
        samples(args[0])
    elif cmd == "encode":
        separator, special, eos = None, True, False
        rest = []
        while args:
            a = args.pop(0)
            if a == "--doc-separator":
                separator = args.pop(0)
            elif a == "--no-special":
                special = False
            elif a == "--eos":
                eos = True
            else:
                rest.append(a)
        tok = Tokenizer.from_file(rest[0])
        ids = []
        for path in rest[2:]:
            for doc in documents(read_text(path), separator):
                ids += tok.encode(doc, add_special_tokens=special).ids
                if eos:
                    ids.append(eos_of(tok))
        with open(rest[1], "w") as f:
            f.write("".join(f"{i}\n" for i in ids))
    elif cmd == "ids":
        special = "--no-special" not in args
        args = [a for a in args if a != "--no-special"]
        tok = Tokenizer.from_file(args[0])
        ids = tok.encode(read_text(args[1]), add_special_tokens=special).ids
        with open(args[2], "w") as f:
            f.write("".join(f"{i}\n" for i in ids))
    elif cmd == "decode":
        tok = Tokenizer.from_file(args[0])
        ids = [int(x) for x in open(args[1]).read().split()]
        with open(args[2], "w", encoding="utf-8") as f:
            f.write(tok.decode(ids))
    elif cmd == "dump":
        with open(args[1], "w") as f:
            f.write("".join(f"{i}\n" for i in read_tokens(args[0])))
    elif cmd == "bench":
        separator = None
        if "--doc-separator" in args:
            k = args.index("--doc-separator")
            separator = args[k + 1]
            del args[k:k + 2]
        tok = Tokenizer.from_file(args[0])
        text = read_text(args[1])
        docs = documents(text, separator)
        nbytes = os.path.getsize(args[1])  # the file's bytes, as flatshard counts them
        tok.encode_batch(docs[:1000])  # warm-up
        times, cpus = [], []
        for _ in range(3):
            t0, c0 = time.perf_counter(), time.process_time()
            out = tok.encode_batch(docs)
            times.append(time.perf_counter() - t0)
            cpus.append(time.process_time() - c0)  # all of the process's threads
        eos = eos_of(tok)
        ids = array.array("I")
        for e in out:
            ids.extend(e.ids)
            ids.append(eos)
        med = sorted(times)[1]
        print(f"tokens={len(ids)} bytes={nbytes} median_s={med:.3f} min_s={min(times):.3f} "
              f"max_s={max(times):.3f} cpu_s={sorted(cpus)[1]:.3f} MB/s={nbytes / med / 1e6:.2f} "
              f"sha256={hashlib.sha256(ids.tobytes()).hexdigest()[:16]}")
    elif cmd == "hash":
        ids = array.array("I", read_tokens(args[0]))
        print(f"tokens={len(ids)} sha256={hashlib.sha256(ids.tobytes()).hexdigest()[:16]}")
    else:
        raise SystemExit(__doc__)


if __name__ == "__main__":
    main()
