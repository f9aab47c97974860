"""Hugging Face's own libraries against flatshard: models that transformers writes, and the
loss transformers computes, for tests/cli/test_hf_interop.sh.

Unlike tools/llama_ref.py and tools/safetensors_io.py (written from the specifications, so
that most tests need only Debian's torch), this uses the real `transformers` and
`safetensors` packages from the test venv that `./quickstart.sh test` creates: what a
flatshard user would actually feed it and load its output with.

    hf_interop.py make OUT      writes OUT/tokens.bin (a flatshard token file), four models
                                saved by LlamaForCausalLM.save_pretrained (untied-fp32,
                                untied-bf16, tied-fp32, tied-bf16) and OUT/reference.json,
                                the loss transformers computes for each on tokens.bin
    hf_interop.py loss OUT DIR[=FP32DIR]...
                                loads each DIR with LlamaForCausalLM.from_pretrained
                                (refusing missing, unexpected or mismatched tensors) and
                                prints one JSON object {DIR: {"loss": on OUT/tokens.bin,
                                "dtypes": of its tensors, "tied": lm_head is the embedding}};
                                with =FP32DIR, DIR is a bf16 export of FP32DIR and
                                "not_rounded" lists its tensors that are not FP32DIR's
                                rounded to nearest even

The loss is over exactly the positions `flatshard eval --batch B --seq T --batches N`
averages: N*B consecutive windows, window w being inputs tokens[w*T : w*T+T] and targets
tokens[w*T+1 : w*T+T+1] (src/data/sampler.c), the mean over all N*B*T next-token
predictions (a mean of N equal-sized batch means is that same mean).

Deliberately not flatshard's own init: the matrices are N(0, 0.1^2) and every norm weight is
uniform in [0.5, 1.5]. With Llama's usual 0.02 and norms of one, the logits are so small
that the loss sits within ~0.05 of ln(256) whatever the model does, and a wrong norm weight,
rotary angle or head mapping would hardly move it; at 0.1 the attention is peaked and the
loss is well above ln(256), so such a bug moves it by far more than the tolerance.
"""
import json
import os
import struct
import sys

import torch
import torch.nn.functional as F

# The shape of flatshard's `tiny` preset (src/model/config.c), so `--model tiny`-sized kernels
# and the preset's grouped-query layout (4 heads, 2 kv heads) are what is compared.
TINY = dict(hidden_size=256, intermediate_size=768, num_hidden_layers=4, num_attention_heads=4,
            num_key_value_heads=2, vocab_size=256, max_position_embeddings=1024,
            rms_norm_eps=1e-5, rope_theta=10000.0, hidden_act="silu")
INIT_STD = 0.1
# eval's batch geometry; T = 64 so the rotary embedding is exercised over many positions
BATCH, SEQ, BATCHES = 2, 64, 2
TOKEN_MAGIC, TOKEN_VERSION_U16 = 20240520, 1
VARIANTS = {  # name -> (tie_word_embeddings, dtype on disk, seed)
    "untied-fp32": (False, torch.float32, 1),
    "untied-bf16": (False, torch.bfloat16, 1),
    "tied-fp32": (True, torch.float32, 2),
    "tied-bf16": (True, torch.bfloat16, 2),
}


def write_token_file(path, tokens):
    """A flatshard/llm.c version-1 token file (docs/formats.md): 256 int32 of header, uint16s."""
    header = [0] * 256
    header[0], header[1], header[2], header[3] = TOKEN_MAGIC, TOKEN_VERSION_U16, len(tokens), 256
    with open(path, "wb") as f:
        f.write(struct.pack("<256i", *header))
        f.write(struct.pack(f"<{len(tokens)}H", *tokens))


def read_token_file(path):
    with open(path, "rb") as f:
        blob = f.read()
    header = struct.unpack("<256i", blob[:1024])
    if header[0] != TOKEN_MAGIC or header[1] != TOKEN_VERSION_U16:
        raise SystemExit(f"{path}: not a version-1 token file")
    n = header[2]
    return torch.tensor(struct.unpack(f"<{n}H", blob[1024:1024 + 2 * n]), dtype=torch.int64)


def windows(tokens):
    """(N*B, T+1): each row a window's T inputs followed by its last target."""
    rows = [tokens[w * SEQ: w * SEQ + SEQ + 1] for w in range(BATCHES * BATCH)]
    return torch.stack(rows)


def hf_loss(model, tokens):
    """transformers' own causal-LM loss (labels = input_ids; it shifts them itself), checked
    against the cross-entropy of logits[:, :T] and the shifted targets, so that both really
    average the same N*B*T predictions (the extra last input only feeds a logit that the
    shift drops, and causal attention keeps it out of the earlier ones)."""
    rows = windows(tokens)
    with torch.no_grad():
        out = model(input_ids=rows, labels=rows)
        logits = out.logits[:, :SEQ].float()
        manual = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), rows[:, 1:].reshape(-1))
    loss = out.loss.item()
    if abs(loss - manual.item()) > 1e-6 * abs(loss):
        raise SystemExit(f"transformers' loss {loss} is not the mean over the {rows.shape[0]}x{SEQ} "
                         f"next-token predictions ({manual.item()}): the positions differ")
    return loss


def load(path):
    """from_pretrained in float32 (a bf16 file's values widened exactly), refusing a load that
    transformers would only warn about: a missing tensor would be silently random."""
    from transformers import LlamaForCausalLM
    model, info = LlamaForCausalLM.from_pretrained(path, torch_dtype=torch.float32,
                                                   attn_implementation="eager",
                                                   output_loading_info=True)
    bad = {k: v for k, v in info.items() if v}
    if bad:
        raise SystemExit(f"{path}: from_pretrained did not load every tensor: {bad}")
    model.eval()
    return model


def make(out):
    from transformers import LlamaConfig, LlamaForCausalLM
    os.makedirs(out, exist_ok=True)
    g = torch.Generator().manual_seed(20240520)
    n_tokens = BATCHES * BATCH * SEQ + 1
    tokens = torch.randint(0, 256, (n_tokens,), generator=g)
    write_token_file(os.path.join(out, "tokens.bin"), tokens.tolist())
    tokens = read_token_file(os.path.join(out, "tokens.bin"))
    reference = {"batch": BATCH, "seq": SEQ, "batches": BATCHES, "losses": {}}
    for name, (tied, dtype, seed) in VARIANTS.items():
        torch.manual_seed(seed)
        cfg = LlamaConfig(**TINY, tie_word_embeddings=tied, initializer_range=INIT_STD,
                          attn_implementation="eager")
        model = LlamaForCausalLM(cfg)
        with torch.no_grad():
            for pname, p in model.named_parameters():
                if pname.endswith("norm.weight"):
                    p.uniform_(0.5, 1.5)
        if tied and model.lm_head.weight.data_ptr() != model.model.embed_tokens.weight.data_ptr():
            raise SystemExit(f"{name}: transformers did not tie lm_head to the embedding")
        path = os.path.join(out, name)
        model.to(dtype).save_pretrained(path, safe_serialization=True)
        want = {torch.float32: "F32", torch.bfloat16: "BF16"}[dtype]
        if file_dtypes(path) != [want]:  # so the bf16 cases really compare bf16 files
            raise SystemExit(f"{path}: tensors are {file_dtypes(path)}, expected only {want}")
        # the reference is the saved file as from_pretrained reads it back, in float32: for
        # bf16 that is the same rounded values flatshard widens to float32
        reference["losses"][name] = hf_loss(load(path), tokens)
    with open(os.path.join(out, "reference.json"), "w") as f:
        json.dump(reference, f, indent=1)
    print(json.dumps(reference))


def file_dtypes(path):
    """The dtypes of path/model.safetensors' tensors, as Hugging Face's safetensors reads them."""
    from safetensors import safe_open
    with safe_open(os.path.join(path, "model.safetensors"), framework="pt") as f:
        return sorted({f.get_slice(name).get_dtype() for name in f.keys()})


def bf16_mismatches(bf16_dir, fp32_dir):
    """Names of the tensors of bf16_dir that are not fp32_dir's rounded to nearest even (what
    torch's .to(bfloat16) does), bit for bit, or that only one of the two files holds."""
    from safetensors.torch import load_file
    a = load_file(os.path.join(bf16_dir, "model.safetensors"))
    b = load_file(os.path.join(fp32_dir, "model.safetensors"))
    return sorted(n for n in set(a) | set(b)
                  if n not in a or n not in b or not torch.equal(a[n], b[n].to(torch.bfloat16)))


def loss(out, specs):
    tokens = read_token_file(os.path.join(out, "tokens.bin"))
    result = {}
    for spec in specs:
        d, _, fp32_dir = spec.partition("=")
        model = load(d)
        tied = model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
        result[d] = {"loss": hf_loss(model, tokens), "dtypes": file_dtypes(d), "tied": tied}
        if fp32_dir:
            result[d]["not_rounded"] = bf16_mismatches(d, fp32_dir)
    print(json.dumps(result))


def main():
    torch.set_num_threads(1)  # the suite shares two cores; this model needs no more
    from transformers.utils import logging
    logging.set_verbosity_error()
    if len(sys.argv) == 3 and sys.argv[1] == "make":
        make(sys.argv[2])
    elif len(sys.argv) >= 4 and sys.argv[1] == "loss":
        loss(sys.argv[2], sys.argv[3:])
    else:
        raise SystemExit(__doc__)


if __name__ == "__main__":
    main()
