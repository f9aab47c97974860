"""The PyTorch peer of flatshard's GPU benchmark (bench/gpu.sh): the Llama flatshard trains
(Hugging Face LlamaForCausalLM's architecture, as tools/llama_ref.py writes it: RMSNorm,
rotary embeddings in the rotate-half layout, grouped-query attention, SwiGLU, no biases,
untied or tied LM head) trained on one NVIDIA GPU the way PyTorch trains it at its best, and
timed the way `flatshard bench step --device cuda --json` times itself.

    python3 tools/bench_torch_gpu.py --config small --batch 16 --seq 1024 --precision bf16

At its best means:
  * fp32 parameters; the bf16 row runs forward and loss under
    torch.autocast("cuda", dtype=torch.bfloat16) (bf16 GEMMs and attention, fp32 master
    weights, gradients and AdamW state: flatshard's bf16 policy); the fp32 row is plain fp32
    with TF32 off (torch.backends.cuda.matmul.allow_tf32 = False, cuDNN's too), as
    flatshard's fp32 GEMMs are (CUBLAS_COMPUTE_32F);
  * attention by F.scaled_dot_product_attention(is_causal=True) (flash attention in bf16,
    memory-efficient attention in fp32); grouped-query attention by repeating each kv head
    over its query heads as Hugging Face's SDPA path does (--gqa native: SDPA's own
    enable_gqa=True, torch >= 2.5);
  * torch.compile of the whole model, loss included (--no-compile: eager); should compiling
    fail, the run falls back to eager and says so ("compile": false, "compile_error");
  * torch.optim.AdamW(fused=True), flatshard's hyperparameters (betas 0.9/0.95, eps 1e-8,
    weight decay 0.1 on matrices only), and the gradient norm clipped to 1.0 as flatshard's
    step does (torch.nn.utils.clip_grad_norm_, foreach on CUDA);
  * the loss F.cross_entropy on fp32 logits.

Tokens are random (the shapes are what costs; content does not change the work), a fresh
batch each step, made on the GPU before the step's clock starts. Each measured step is
timed alone, torch.cuda.synchronize() before and after; the figures are the median step
time, tokens/s = batch x seq / median, MFU = model FLOPs per token x tokens/s over the
peak, with flatshard's FLOP count (fs_layout_train_flops_per_token, src/model/layout.c:
6 x matmul parameters, LM head included even when tied, + 6 x L x C x (T + 1)) and the
data-sheet peaks flatshard uses for H100 SXM and H200 (989.4 TFLOP/s bf16, 66.9 fp32).
Peak memory: torch.cuda.max_memory_allocated() over the whole run (model, gradients,
optimizer state, activations, workspaces), and max_memory_reserved() beside it.

Prints one JSON line per measured block (--runs, default 1) and precision, with the keys of
flatshard's bench step JSON where they mean the same (model, precision, params, batch, seq,
steps, step_s_median, tokens_per_s, flops_per_token, mfu, peak_bytes, device) and
"peer": "pytorch", "compile", "torch". A failure prints {"error": ...} and exits 1.

--serve (one precision) is bench/gpu.sh's way of alternating with flatshard without
compiling again: after building, compiling and the warm-up steps the script prints
{"ready": true, ...}, then for every line "run" on standard input measures one block
(after --rewarm unmeasured steps) and prints its JSON line; "quit" or end of input ends it.
While it waits it returns its cached GPU memory to the driver (torch.cuda.empty_cache()).

--write-config FILE writes the config.json of the --config preset or file (no torch
needed); bench/gpu.sh gives that one file to both sides. --device cpu runs the same code on
the CPU: a check of this script on a machine without a GPU, not a benchmark.
"""
import argparse
import contextlib
import gc
import json
import math
import os
import statistics
import sys
import time

# The shapes of src/model/config.c's presets (byte-level vocabulary), as bench/pytorch.sh
# writes them.
PRESETS = {
    "tiny": dict(hidden_size=256, intermediate_size=768, num_hidden_layers=4, num_attention_heads=4,
                 num_key_value_heads=2, max_position_embeddings=1024),
    "small": dict(hidden_size=768, intermediate_size=3072, num_hidden_layers=12, num_attention_heads=12,
                  num_key_value_heads=4, max_position_embeddings=2048),
}
PEAK_TFLOPS = {"bf16": 989.4, "fp32": 66.9}  # H100 SXM / H200 data sheet, dense (src/device/cuda.c)
ADAMW = dict(lr=1e-3, betas=(0.9, 0.95), eps=1e-8)  # flatshard's defaults (fs_train_config_default)
WEIGHT_DECAY = 0.1
CLIP = 1.0
INIT_STD = 0.02

PROG = os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] else "bench_torch_gpu.py"


def config_dict(spec):
    """A Hugging Face config dict from a preset name or a config.json path."""
    if spec in PRESETS:
        c = dict(PRESETS[spec])
        c.update(vocab_size=256, rms_norm_eps=1e-5, rope_theta=10000.0, tie_word_embeddings=False,
                 initializer_range=INIT_STD, model_type="llama", architectures=["LlamaForCausalLM"])
        return c
    if not os.path.isfile(spec):
        raise ValueError(f"--config {spec}: neither a preset ({', '.join(PRESETS)}) nor a file")
    with open(spec) as f:
        return json.load(f)


class Shape:
    """The fields of a config that the model and the FLOP count read (llama_ref.Config's)."""

    def __init__(self, d):
        self.C = int(d["hidden_size"])
        self.FF = int(d["intermediate_size"])
        self.L = int(d["num_hidden_layers"])
        self.NH = int(d["num_attention_heads"])
        self.NKV = int(d.get("num_key_value_heads") or self.NH)
        self.V = int(d["vocab_size"])
        self.max_pos = int(d.get("max_position_embeddings", 2048))
        self.eps = float(d.get("rms_norm_eps", 1e-6))
        self.theta = float(d.get("rope_theta", 10000.0))
        self.tied = bool(d.get("tie_word_embeddings", False))
        if self.C % self.NH or self.NH % self.NKV or (self.C // self.NH) % 2:
            raise ValueError("the config's heads do not divide its hidden size (or the head size is odd)")
        self.HS = self.C // self.NH


def flops_per_token(s, T):
    """fs_layout_train_flops_per_token (src/model/layout.c), term for term."""
    C, HS = float(s.C), float(s.C) / float(s.NH)
    qkv = (float(s.NH) + 2.0 * float(s.NKV)) * HS
    block = C * qkv + C * C + 3.0 * C * float(s.FF)
    matmul_params = float(s.L) * block + float(s.V) * C
    return 6.0 * matmul_params + 6.0 * float(s.L) * C * (float(T) + 1.0)


def build_model(torch, s, T, gqa):
    """The Llama as torch modules, parameters under Hugging Face's names; built on the current
    default device (the caller's `with torch.device(...)`)."""
    nn, F = torch.nn, torch.nn.functional
    NH, NKV, HS, C = s.NH, s.NKV, s.HS, s.C
    group = NH // NKV

    class RMSNorm(nn.Module):
        def __init__(self):
            super().__init__()
            self.weight = nn.Parameter(torch.ones(C))

        def forward(self, x):  # x is the fp32 residual stream, also under autocast
            return self.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + s.eps))

    def rotate_half(x):
        half = x.shape[-1] // 2
        return torch.cat((-x[..., half:], x[..., :half]), dim=-1)

    class Attention(nn.Module):
        def __init__(self):
            super().__init__()
            self.q_proj = nn.Linear(C, NH * HS, bias=False)
            self.k_proj = nn.Linear(C, NKV * HS, bias=False)
            self.v_proj = nn.Linear(C, NKV * HS, bias=False)
            self.o_proj = nn.Linear(NH * HS, C, bias=False)

        def forward(self, x, cos, sin):
            B, T_, _ = x.shape
            q = self.q_proj(x).view(B, T_, NH, HS).transpose(1, 2)
            k = self.k_proj(x).view(B, T_, NKV, HS).transpose(1, 2)
            v = self.v_proj(x).view(B, T_, NKV, HS).transpose(1, 2)
            cos, sin = cos.to(q.dtype), sin.to(q.dtype)
            q = q * cos + rotate_half(q) * sin
            k = k * cos + rotate_half(k) * sin
            if gqa == "native" and group > 1:
                out = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
            else:
                if group > 1:  # kv head g serves query heads g*group .. g*group+group-1
                    k = k[:, :, None].expand(B, NKV, group, T_, HS).reshape(B, NH, T_, HS)
                    v = v[:, :, None].expand(B, NKV, group, T_, HS).reshape(B, NH, T_, HS)
                out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            return self.o_proj(out.transpose(1, 2).reshape(B, T_, NH * HS))

    class MLP(nn.Module):
        def __init__(self):
            super().__init__()
            self.gate_proj = nn.Linear(C, s.FF, bias=False)
            self.up_proj = nn.Linear(C, s.FF, bias=False)
            self.down_proj = nn.Linear(s.FF, C, bias=False)

        def forward(self, x):
            return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.input_layernorm = RMSNorm()
            self.self_attn = Attention()
            self.post_attention_layernorm = RMSNorm()
            self.mlp = MLP()

        def forward(self, x, cos, sin):
            x = x + self.self_attn(self.input_layernorm(x), cos, sin)
            return x + self.mlp(self.post_attention_layernorm(x))

    class Llama(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed_tokens = nn.Embedding(s.V, C)
            self.layers = nn.ModuleList([Block() for _ in range(s.L)])
            self.norm = RMSNorm()
            self.lm_head = None if s.tied else nn.Linear(C, s.V, bias=False)
            # rotary tables (T, HS): pair (i, i + HS/2) at position t turns by t * theta^(-2i/HS)
            inv_freq = 1.0 / (s.theta ** (torch.arange(0, HS, 2, dtype=torch.int64).float() / HS))
            freqs = torch.outer(torch.arange(T, dtype=torch.int64).float(), inv_freq)
            emb = torch.cat((freqs, freqs), dim=-1)
            self.register_buffer("rope_cos", emb.cos(), persistent=False)
            self.register_buffer("rope_sin", emb.sin(), persistent=False)

        def forward(self, inputs, targets):
            T_ = inputs.shape[1]
            cos, sin = self.rope_cos[:T_], self.rope_sin[:T_]
            x = self.embed_tokens(inputs)
            for layer in self.layers:
                x = layer(x, cos, sin)
            x = self.norm(x)
            head = self.embed_tokens.weight if self.lm_head is None else self.lm_head.weight
            logits = F.linear(x, head).float()
            return F.cross_entropy(logits.view(-1, logits.shape[-1]), targets.reshape(-1))

    model = Llama()
    with torch.no_grad():  # matrices N(0, 0.02^2), norm weights one (flatshard's init)
        for name, p in model.named_parameters():
            if p.dim() >= 2:
                p.normal_(0.0, INIT_STD)
    return model


def fail(msg, code=1):
    print(json.dumps({"peer": "pytorch", "error": msg}), flush=True)
    print(f"{PROG}: {msg}", file=sys.stderr, flush=True)
    sys.exit(code)


def one_line(e):
    text = f"{type(e).__name__}: {e}".strip()
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    line = lines[0] if lines else type(e).__name__
    return line if len(line) <= 300 else line[:297] + "..."


class Trainer:
    """One precision's model, optimizer and step, compiled or eager."""

    def __init__(self, torch, args, shape, precision, compile_):
        self.torch, self.args, self.shape, self.precision = torch, args, shape, precision
        self.device = args.device
        self.compiled = compile_
        torch.manual_seed(1)
        with torch.device(self.device):
            self.model = build_model(torch, shape, args.seq, args.gqa)
        self.params = [p for p in self.model.parameters()]
        decay = [p for p in self.params if p.dim() >= 2]
        no_decay = [p for p in self.params if p.dim() < 2]
        groups = [{"params": decay, "weight_decay": WEIGHT_DECAY}, {"params": no_decay, "weight_decay": 0.0}]
        fused = self.device == "cuda"  # fused=True is the CUDA kernel; --device cpu is only a check
        self.opt = torch.optim.AdamW(groups, fused=fused, **ADAMW)
        self.optimizer = "AdamW(fused)" if fused else "AdamW"
        self.forward = torch.compile(self.model) if compile_ else self.model
        self.gen = torch.Generator(device=self.device)
        self.gen.manual_seed(1000)

    def autocast(self):
        if self.precision == "bf16":
            return self.torch.autocast(self.device, dtype=self.torch.bfloat16)
        return contextlib.nullcontext()

    def batch(self):
        t = self.torch.randint(0, self.shape.V, (self.args.batch, self.args.seq + 1), device=self.device,
                               generator=self.gen)
        return t[:, :-1].contiguous(), t[:, 1:].contiguous()

    def step(self, inputs, targets):
        with self.autocast():
            loss = self.forward(inputs, targets)
        loss.backward()
        self.torch.nn.utils.clip_grad_norm_(self.params, CLIP)
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        return loss

    def sync(self):
        if self.device == "cuda":
            self.torch.cuda.synchronize()

    def timed_step(self):
        inputs, targets = self.batch()
        self.sync()
        t0 = time.perf_counter()
        self.step(inputs, targets)
        self.sync()
        return time.perf_counter() - t0

    def free(self):
        del self.forward, self.opt, self.params, self.model


def release(torch, device):
    gc.collect()
    if hasattr(torch, "_dynamo"):
        torch._dynamo.reset()
    if device == "cuda":
        torch.cuda.empty_cache()


def start(torch, args, shape, precision):
    """A trainer after its warm-up steps; compiling falls back to eager if it fails."""
    compile_ = not args.no_compile
    compile_error = None
    if args.device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    tr = Trainer(torch, args, shape, precision, compile_)
    t0 = time.perf_counter()
    try:
        for _ in range(max(args.warmup, 1 if compile_ else 0)):  # the first step compiles
            tr.timed_step()
    except Exception as e:  # noqa: BLE001 — anything the compiler raises
        oom = args.device == "cuda" and isinstance(e, torch.cuda.OutOfMemoryError)
        if not compile_ or oom:
            raise
        compile_error = one_line(e)
        print(f"{PROG}: torch.compile failed, running eager: {compile_error}", file=sys.stderr, flush=True)
    if compile_error is not None:  # outside the except: its traceback no longer holds the tensors
        tr.free()
        del tr
        release(torch, args.device)
        if args.device == "cuda":
            torch.cuda.reset_peak_memory_stats()
        tr = Trainer(torch, args, shape, precision, False)
        t0 = time.perf_counter()
        for _ in range(args.warmup):
            tr.timed_step()
    tr.warmup_s = time.perf_counter() - t0
    tr.compile_error = compile_error
    return tr


def measure(torch, args, shape, tr, run, info):
    times = [tr.timed_step() for _ in range(args.steps)]
    med = statistics.median(times)
    tokens = args.batch * args.seq
    tps = tokens / med
    fpt = flops_per_token(shape, args.seq)
    peak_tflops = args.peak_tflops if tr.precision == "bf16" else args.peak_tflops_fp32
    row = {
        "bench": "step", "peer": "pytorch", "model": args.name, "precision": tr.precision,
        "params": sum(p.numel() for p in tr.params), "batch": args.batch, "seq": args.seq,
        "steps": args.steps, "warmup": args.warmup, "run": run,
        "step_s_median": round(med, 6), "step_s_min": round(min(times), 6), "step_s_max": round(max(times), 6),
        "tokens_per_s": round(tps, 1), "flops_per_token": fpt, "gflops": round(fpt * tps / 1e9, 2),
        "mfu": round(fpt * tps / (peak_tflops * 1e12), 4), "peak_tflops": peak_tflops,
        "peak_bytes": None, "peak_reserved_bytes": None, "device": args.device,
        "compile": tr.compiled, "compile_error": tr.compile_error, "warmup_s": round(tr.warmup_s, 2),
        "attention": "sdpa(is_causal)", "gqa": args.gqa, "autocast": "bf16" if tr.precision == "bf16" else None,
        "tf32": False, "optimizer": tr.optimizer, "clip": CLIP,
    }
    if args.device == "cuda":
        row["peak_bytes"] = torch.cuda.max_memory_allocated()
        row["peak_reserved_bytes"] = torch.cuda.max_memory_reserved()
    row.update(info)
    print(json.dumps(row), flush=True)


def parse_args():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0].replace("\n", " "),
                                 epilog="Details: the docstring at the top of this file.")
    ap.add_argument("--config", default="small",
                    help="a preset (%s, as src/model/config.c defines them) or a Hugging Face config.json "
                         "[default: small]" % ", ".join(PRESETS))
    ap.add_argument("--name", default=None, help="the model's name in the JSON [default: the --config]")
    ap.add_argument("--batch", type=int, default=16, help="sequences per step [default: 16]")
    ap.add_argument("--seq", type=int, default=1024, help="tokens per sequence [default: 1024]")
    ap.add_argument("--steps", type=int, default=10, help="measured steps per block [default: 10]")
    ap.add_argument("--warmup", type=int, default=3,
                    help="unmeasured steps first, the compiling one included [default: 3]")
    ap.add_argument("--runs", type=int, default=1,
                    help="measured blocks per precision, one JSON line each, after one warm-up [default: 1]")
    ap.add_argument("--precision", choices=["fp32", "bf16", "both"], default="bf16",
                    help="bf16: fp32 weights, bf16 autocast; fp32: fp32, TF32 off; both: one after the other, "
                         "each with its own model, compile and memory peak [default: bf16]")
    ap.add_argument("--no-compile", action="store_true", help="eager PyTorch, no torch.compile")
    ap.add_argument("--gqa", choices=["repeat", "native"], default="repeat",
                    help="grouped-query attention: repeat the kv heads before SDPA (Hugging Face's way), or "
                         "SDPA's enable_gqa=True (torch >= 2.5) [default: repeat]")
    ap.add_argument("--peak-tflops", type=float, default=PEAK_TFLOPS["bf16"],
                    help="the GPU's dense bf16 peak for MFU [default: %(default)s, H100 SXM / H200]")
    ap.add_argument("--peak-tflops-fp32", type=float, default=PEAK_TFLOPS["fp32"],
                    help="the GPU's fp32 (non-tensor-core) peak for the fp32 MFU [default: %(default)s]")
    ap.add_argument("--serve", action="store_true",
                    help="after warm-up print a ready line, then measure one block per 'run' line on stdin")
    ap.add_argument("--rewarm", type=int, default=1,
                    help="--serve: unmeasured steps before each block after waiting [default: 1]")
    ap.add_argument("--device", choices=["cuda", "cpu"], default="cuda",
                    help="cpu: check this script without a GPU (not a benchmark) [default: cuda]")
    ap.add_argument("--write-config", metavar="FILE", default=None,
                    help="write the --config's config.json to FILE and exit (no torch needed)")
    args = ap.parse_args()
    for k in ("batch", "seq", "steps", "runs"):
        if getattr(args, k) < 1:
            ap.error(f"--{k} must be >= 1")
    if args.warmup < 0 or args.rewarm < 0:
        ap.error("--warmup and --rewarm must be >= 0")
    if args.serve and args.precision == "both":
        ap.error("--serve measures one precision: --precision fp32 or bf16")
    if args.name is None:
        args.name = args.config
    return args


def main():
    args = parse_args()
    try:
        cfg = config_dict(args.config)
        shape = Shape(cfg)
    except (ValueError, KeyError, OSError) as e:
        fail(f"--config {args.config}: {one_line(e)}")
    if args.write_config:
        with open(args.write_config, "w") as f:
            json.dump(cfg, f, indent=1)
            f.write("\n")
        return
    if args.seq > shape.max_pos:
        fail(f"--seq {args.seq} exceeds the model's max_position_embeddings {shape.max_pos}")
    try:
        import torch
    except Exception as e:  # noqa: BLE001 — a broken install raises more than ImportError
        fail(f"import torch failed: {one_line(e)}")
    if args.device == "cuda" and not torch.cuda.is_available():
        fail(f"torch {torch.__version__} sees no CUDA GPU (torch.cuda.is_available() is False; "
             f"built for CUDA {torch.version.cuda})")
    if tuple(int(x) for x in torch.__version__.split("+")[0].split(".")[:2]) < (2, 0):
        fail(f"torch {torch.__version__}: torch >= 2.0 is needed (torch.compile, scaled_dot_product_attention)")
    if args.gqa == "native" and tuple(int(x) for x in torch.__version__.split("+")[0].split(".")[:2]) < (2, 5):
        fail(f"--gqa native: torch {torch.__version__} has no enable_gqa (torch >= 2.5)")
    # flatshard's fp32 GEMMs are true fp32 (CUBLAS_COMPUTE_32F): no TF32 here either
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    info = {"torch": torch.__version__, "cuda": torch.version.cuda}
    if args.device == "cuda":
        info["gpu"] = torch.cuda.get_device_name(0)
    precisions = ["fp32", "bf16"] if args.precision == "both" else [args.precision]
    for precision in precisions:
        try:
            tr = start(torch, args, shape, precision)
        except Exception as e:  # noqa: BLE001
            fail(f"{precision}: {one_line(e)}")
        if args.serve:
            print(json.dumps({"peer": "pytorch", "ready": True, "precision": precision, "compile": tr.compiled,
                              "compile_error": tr.compile_error, "warmup_s": round(tr.warmup_s, 2), **info}),
                  flush=True)
            run = 0
            while True:
                if args.device == "cuda":
                    torch.cuda.empty_cache()  # leave the GPU's memory to whoever runs between blocks
                line = sys.stdin.readline()
                if not line or line.strip() == "quit":
                    break
                if line.strip() != "run":
                    continue
                run += 1
                try:
                    for _ in range(args.rewarm):
                        tr.timed_step()
                    measure(torch, args, shape, tr, run, info)
                except Exception as e:  # noqa: BLE001
                    fail(f"{precision} run {run}: {one_line(e)}")
        else:
            try:
                for run in range(1, args.runs + 1):
                    measure(torch, args, shape, tr, run, info)
            except Exception as e:  # noqa: BLE001
                fail(f"{precision}: {one_line(e)}")
        tr.free()
        del tr
        release(torch, args.device)


if __name__ == "__main__":
    main()
