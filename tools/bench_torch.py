"""The PyTorch peer of flatshard's CPU benchmark (bench/pytorch.sh): the Llama flatshard trains
(tools/bench_torch_gpu.py's build_model: Hugging Face LlamaForCausalLM's architecture with
scaled_dot_product_attention) trained on CPU the way a PyTorch user trains it at their best,
single process or on W ranks with gloo, and timed the way `flatshard train --metrics` times
itself.

    python3 tools/bench_torch.py --config small.json --mode fsdp2 --ranks 2 --precision bf16 \
        --batch 4 --seq 256 --threads 1 --steps 6

Modes: single (one process), ddp (DistributedDataParallel), zero1 (DDP and
ZeroRedundancyOptimizer: the optimizer state sharded), fsdp2 (`fully_shard` on every block
and on the root).

At its best means:
  * attention by F.scaled_dot_product_attention(is_causal=True);
  * --precision bf16: fp32 parameters, AdamW state and gradients with the forward and the
    loss under torch.autocast("cpu", dtype=torch.bfloat16) (oneDNN's bf16 kernels, on AMX
    where the CPU has it) for single, ddp and zero1; for fsdp2 FSDP2's own policy,
    MixedPrecisionPolicy(param_dtype=bfloat16, reduce_dtype=float32): bf16 parameters
    gathered and computed with, gradients reduced in fp32 into fp32 shards. These are the
    bf16 policies flatshard's --precision bf16 is compared with. --precision fp32: plain fp32;
  * --compile: torch.compile of the model, loss included (for fsdp2, of each block, as
    FSDP2's documentation does); should compiling fail, the run goes on eager and says so
    ("compile": false, "compile_error");
  * AdamW with flatshard's hyperparameters (lr 3e-4, betas 0.9/0.95, eps 1e-8, weight decay
    0.1 on matrices only; foreach, PyTorch's default on CPU) and the gradient norm clipped
    to 1.0, as flatshard's step does.

The batches are random tokens (the same shapes flatshard trains on; content does not change
the work), a fresh batch per step. The first --warmup steps (compiling ones included) are
not measured. Prints one JSON line: the median over the measured steps of the slowest
rank's step time, tokens/s of all ranks together, every rank's peak RSS (ru_maxrss) and
what ran ("attention", "autocast", "mixed_precision", "compile"). An error prints
{"error": ...} and exits 1.
"""
import argparse
import json
import os
import resource
import socket
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_torch_gpu as gpu_peer  # noqa: E402  — one model for both peers

LR = 3e-4  # bench/pytorch.sh trains flatshard with --lr 3e-4 too


def one_line(e):
    return gpu_peer.one_line(e)


def build(torch, args, shape):
    """The model on this rank, wrapped for its mode, and a step function."""
    torch.manual_seed(1)
    model = gpu_peer.build_model(torch, shape, args.seq, "repeat")
    info = {"attention": "sdpa(is_causal)", "autocast": None, "mixed_precision": None,
            "compile": False, "compile_error": None}
    if args.mode in ("ddp", "zero1"):
        model = torch.nn.parallel.DistributedDataParallel(model)
    if args.mode == "fsdp2":
        try:
            from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
        except ImportError:
            from torch.distributed._composable.fsdp import MixedPrecisionPolicy, fully_shard
        kw = {}
        if args.precision == "bf16":
            kw["mp_policy"] = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
            info["mixed_precision"] = "param bf16, reduce fp32"
        for i, layer in enumerate(model.layers):
            if args.compile:
                model.layers[i] = layer = torch.compile(layer)
            fully_shard(layer, **kw)
        fully_shard(model, **kw)
    params = list(model.parameters())
    decay = [p for p in params if p.dim() >= 2]
    no_decay = [p for p in params if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": gpu_peer.WEIGHT_DECAY},
              {"params": no_decay, "weight_decay": 0.0}]
    hp = dict(lr=LR, betas=gpu_peer.ADAMW["betas"], eps=gpu_peer.ADAMW["eps"])
    if args.mode == "zero1":
        from torch.distributed.optim import ZeroRedundancyOptimizer
        opt = ZeroRedundancyOptimizer(params, optimizer_class=torch.optim.AdamW,
                                      weight_decay=gpu_peer.WEIGHT_DECAY, **hp)
    else:
        opt = torch.optim.AdamW(groups, **hp)
    forward = model
    if args.compile and args.mode != "fsdp2":
        forward = torch.compile(model)
    info["compile"] = bool(args.compile)
    use_autocast = args.precision == "bf16" and args.mode != "fsdp2"
    if use_autocast:
        info["autocast"] = "bf16"

    def step(inputs, targets):
        if use_autocast:
            with torch.autocast("cpu", dtype=torch.bfloat16):
                loss = forward(inputs, targets)
        else:
            loss = forward(inputs, targets)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, gpu_peer.CLIP)
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss

    return step, info


def run_rank(rank, args, port, results):
    import torch
    import torch.distributed as dist
    torch.set_num_threads(args.threads)
    world = args.ranks
    try:
        if args.mode != "single":
            dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
        shape = gpu_peer.Shape(gpu_peer.config_dict(args.config))
        step, info = build(torch, args, shape)
        g = torch.Generator().manual_seed(1000 + rank)

        def timed():
            tokens = torch.randint(0, shape.V, (args.batch, args.seq + 1), generator=g)
            inputs, targets = tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()
            if args.mode != "single":
                dist.barrier()
            t0 = time.perf_counter()
            step(inputs, targets)
            if args.mode != "single":
                dist.barrier()
            return time.perf_counter() - t0

        t0 = time.perf_counter()
        try:
            for _ in range(args.warmup):
                timed()
        except Exception as e:  # noqa: BLE001 — whatever the compiler raises
            if not args.compile or args.mode != "single":
                raise
            info["compile_error"] = one_line(e)
            info["compile"] = False
            args.compile = False
            step, _ = build(torch, args, shape)
            for _ in range(args.warmup):
                timed()
        warmup_s = time.perf_counter() - t0
        times = [timed() for _ in range(args.steps)]
        rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        mine = (times, rss, info, warmup_s, None)
    except Exception as e:  # noqa: BLE001
        mine = (None, 0, None, 0.0, f"rank {rank}: {one_line(e)}")
    if args.mode != "single" and dist.is_initialized():
        gathered = [None] * world
        dist.all_gather_object(gathered, mine)
        dist.destroy_process_group()
    else:
        gathered = [mine]
    if rank == 0:
        results.put(gathered)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0].replace("\n", " "),
                                 epilog="Details: the docstring at the top of this file.")
    ap.add_argument("--config", required=True, help="a Hugging Face config.json (or a preset: tiny, small)")
    ap.add_argument("--mode", choices=["single", "ddp", "zero1", "fsdp2"], default="single")
    ap.add_argument("--ranks", type=int, default=1, help="processes (single: 1)")
    ap.add_argument("--precision", choices=["fp32", "bf16"], default="fp32",
                    help="bf16: autocast (single, ddp, zero1) or FSDP2's MixedPrecisionPolicy [default: fp32]")
    ap.add_argument("--compile", action="store_true", help="torch.compile (fsdp2: each block)")
    ap.add_argument("--batch", type=int, default=4, help="sequences per rank per step")
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--threads", type=int, default=1, help="torch threads per rank")
    ap.add_argument("--warmup", type=int, default=1, help="unmeasured steps first [default: 1]")
    ap.add_argument("--steps", type=int, default=5, help="measured steps [default: 5]")
    args = ap.parse_args()
    if args.mode == "single":
        args.ranks = 1
    for k in ("ranks", "batch", "seq", "threads", "steps"):
        if getattr(args, k) < 1:
            ap.error(f"--{k} must be >= 1")
    try:
        import torch
        import torch.multiprocessing as mp
    except Exception as e:  # noqa: BLE001
        gpu_peer.fail(f"import torch failed: {one_line(e)}")
    version = tuple(int(x) for x in torch.__version__.split("+")[0].split(".")[:2])
    if version < (2, 6):
        gpu_peer.fail(f"torch {torch.__version__}: the peer needs torch >= 2.6 (FSDP2's fully_shard and "
                      "MixedPrecisionPolicy, SDPA, torch.compile on CPU); bench/pytorch.sh installs one in .venv-bench")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    procs = [ctx.Process(target=run_rank, args=(r, args, port, results)) for r in range(args.ranks)]
    for p in procs:
        p.start()
    gathered = results.get()
    for p in procs:
        p.join()
    errors = [g[4] for g in gathered if g[4]]
    if errors:
        gpu_peer.fail(f"{args.mode} {args.precision}: {errors[0]}")
    step = statistics.median(max(g[0][i] for g in gathered) for i in range(args.steps))
    print(json.dumps({
        "peer": "pytorch", "torch": torch.__version__, "mode": args.mode, "ranks": args.ranks,
        "precision": args.precision, "threads": args.threads, "batch": args.batch, "seq": args.seq,
        "warmup": args.warmup, "steps": args.steps, "step_s": step,
        "tokens_per_s": args.ranks * args.batch * args.seq / step,
        "peak_rss_bytes": [g[1] for g in gathered], "warmup_s": round(gathered[0][3], 1),
        **gathered[0][2]}), flush=True)


if __name__ == "__main__":
    main()
