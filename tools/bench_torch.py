"""The PyTorch peer of flatshard's benchmarks: the reference Llama of tools/llama_ref.py
(identical in architecture to flatshard's model) trained on CPU, single process or on W ranks
with gloo, and timed the way `flatshard train --metrics` times itself.

    /usr/bin/python3 tools/bench_torch.py --config small.json --mode ddp --ranks 2 \
        --batch 4 --seq 256 --threads 1 --steps 5

Modes: single (one process), ddp (DistributedDataParallel), zero1 (DDP and
ZeroRedundancyOptimizer: the optimizer state sharded), fsdp2 (`fully_shard` on every block
and the root; needs torch >= 2.4). Prints one JSON line: the median step time over the steps
after the first, tokens/s of all ranks together, and every rank's peak RSS (ru_maxrss).

The batches are random tokens (the same shapes flatshard trains on; their content does not
change the work). AdamW with PyTorch's defaults except lr 3e-4, weight decay 0.1.
"""
import argparse
import json
import os
import resource
import socket
import statistics
import sys
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import llama_ref  # noqa: E402


class Block(torch.nn.Module):
    """One decoder block's parameters under their Hugging Face names (dots become '__')."""

    def __init__(self, params, prefix):
        super().__init__()
        self.prefix = prefix
        self.p = torch.nn.ParameterDict(
            {k[len(prefix):].replace(".", "__"): torch.nn.Parameter(v) for k, v in params.items()
             if k.startswith(prefix)})

    def named(self):
        return {self.prefix + k.replace("__", "."): v for k, v in self.p.items()}

    def forward(self, x, cfg, cos, sin):
        p, pre = self.named(), self.prefix
        h = llama_ref.rms_norm(x, p[pre + "input_layernorm.weight"], cfg.rms_norm_eps)
        x = x + llama_ref.attention(h, p, pre + "self_attn.", cfg, cos, sin)
        h = llama_ref.rms_norm(x, p[pre + "post_attention_layernorm.weight"], cfg.rms_norm_eps)
        return x + llama_ref.mlp(h, p, pre + "mlp.")


class Llama(torch.nn.Module):
    """llama_ref.forward as modules, so that DDP and FSDP see parameters and blocks."""

    def __init__(self, cfg, seed):
        super().__init__()
        self.cfg = cfg
        params = llama_ref.init_params(cfg, seed)
        self.blocks = torch.nn.ModuleList(
            [Block(params, f"model.layers.{i}.") for i in range(cfg.num_hidden_layers)])
        self.embed = torch.nn.Parameter(params["model.embed_tokens.weight"])
        self.norm = torch.nn.Parameter(params["model.norm.weight"])
        self.head = None if cfg.tie_word_embeddings else torch.nn.Parameter(params["lm_head.weight"])

    def forward(self, inputs, targets):
        cfg = self.cfg
        cos, sin = llama_ref.rope_cos_sin(cfg, inputs.shape[1])
        x = torch.nn.functional.embedding(inputs, self.embed)
        for b in self.blocks:
            x = b(x, cfg, cos, sin)
        x = llama_ref.rms_norm(x, self.norm, cfg.rms_norm_eps)
        logits = torch.nn.functional.linear(x, self.embed if self.head is None else self.head)
        return llama_ref.loss_fn(logits, targets)


def run_rank(rank, args, port, results):
    torch.set_num_threads(args.threads)
    world = args.ranks
    if args.mode != "single":
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    cfg = llama_ref.Config(json.load(open(args.config)))
    model = Llama(cfg, seed=1)
    if args.mode == "ddp" or args.mode == "zero1":
        model = torch.nn.parallel.DistributedDataParallel(model)
    if args.mode == "fsdp2":
        try:
            from torch.distributed.fsdp import fully_shard
        except ImportError:
            from torch.distributed._composable.fsdp import fully_shard
        for b in model.blocks:
            fully_shard(b)
        fully_shard(model)
    hp = dict(lr=3e-4, weight_decay=0.1)
    if args.mode == "zero1":
        from torch.distributed.optim import ZeroRedundancyOptimizer
        opt = ZeroRedundancyOptimizer(model.parameters(), optimizer_class=torch.optim.AdamW, **hp)
    else:
        opt = torch.optim.AdamW(model.parameters(), **hp)
    g = torch.Generator().manual_seed(1000 + rank)
    times = []
    for _ in range(args.steps):
        tokens = torch.randint(0, cfg.vocab_size, (args.batch, args.seq + 1), generator=g)
        t0 = time.perf_counter()
        loss = model(tokens[:, :-1], tokens[:, 1:])
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if args.mode != "single":
            dist.barrier()
        times.append(time.perf_counter() - t0)
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    if args.mode != "single":
        gathered = [None] * world
        dist.all_gather_object(gathered, (times, rss))
        dist.destroy_process_group()
    else:
        gathered = [(times, rss)]
    if rank == 0:
        results.put(gathered)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--config", required=True, help="a Hugging Face config.json")
    ap.add_argument("--mode", choices=["single", "ddp", "zero1", "fsdp2"], default="single")
    ap.add_argument("--ranks", type=int, default=1)
    ap.add_argument("--batch", type=int, default=4, help="sequences per rank per step")
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--threads", type=int, default=1, help="torch threads per rank")
    ap.add_argument("--steps", type=int, default=5, help="steps, the first not measured")
    args = ap.parse_args()
    if args.mode == "single":
        args.ranks = 1
    if args.mode == "fsdp2" and tuple(int(x) for x in torch.__version__.split(".")[:2]) < (2, 4):
        print(json.dumps({"mode": "fsdp2", "skipped": f"torch {torch.__version__} has no fully_shard"}))
        return
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
    step = statistics.median(max(g[0][i] for g in gathered) for i in range(1, args.steps))
    print(json.dumps({
        "peer": "pytorch", "torch": torch.__version__, "mode": args.mode, "ranks": args.ranks,
        "threads": args.threads, "batch": args.batch, "seq": args.seq, "step_s": step,
        "tokens_per_s": args.ranks * args.batch * args.seq / step,
        "peak_rss_bytes": [g[1] for g in gathered]}))


if __name__ == "__main__":
    main()
