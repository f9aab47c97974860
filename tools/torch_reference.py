#!/usr/bin/env python3
"""Reference results for flatshard's model test, computed with PyTorch.

Run with Debian's python3-torch: /usr/bin/python3 tools/torch_reference.py ARGS.

Reads a flatshard weights file (safetensors with the config in its metadata) and a batch
(safetensors with int32 "inputs" and "targets" of shape (B, T)), and writes one safetensors
file with:
  logits          (B, T, V) float32, forward of the given weights
  loss            (1,)      mean cross-entropy
  grad.<name>     the gradient of that loss for every parameter (no clipping)
  losses          (steps,)  the loss before each of `steps` AdamW steps on the same batch,
                            with global-norm clipping at --clip (0: off)
  final.<name>    every parameter after those steps
The optimizer is torch.optim.AdamW (single-tensor implementation, foreach=False) with weight
decay on matrices only, as flatshard applies it; clipping is torch.nn.utils.clip_grad_norm_.
"""
import argparse
import json
import sys

import torch

sys.path.insert(0, __import__("os").path.dirname(__file__))
import llama_ref  # noqa: E402
import safetensors_io  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--weights", required=True)
    ap.add_argument("--batch", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--beta1", type=float, default=0.9)
    ap.add_argument("--beta2", type=float, default=0.95)
    ap.add_argument("--eps", type=float, default=1e-8)
    ap.add_argument("--weight-decay", type=float, default=0.1)
    ap.add_argument("--clip", type=float, default=0.0)
    args = ap.parse_args()

    torch.set_num_threads(1)
    weights, meta = safetensors_io.read(args.weights)
    cfg = llama_ref.Config(json.loads(meta["flatshard_config"]))
    batch, _ = safetensors_io.read(args.batch)
    inputs = batch["inputs"].long()
    targets = batch["targets"].long()

    expected = set(llama_ref.parameter_shapes(cfg))
    if set(weights) != expected:
        sys.exit(f"torch_reference: tensor names differ from the model: "
                 f"extra {sorted(set(weights) - expected)}, missing {sorted(expected - set(weights))}")
    out = {}

    # Phase A: logits, loss and gradients of the given weights.
    params = {k: v.clone().requires_grad_(True) for k, v in weights.items()}
    logits = llama_ref.forward(params, cfg, inputs)
    loss = llama_ref.loss_fn(logits, targets)
    loss.backward()
    out["logits"] = logits.detach()
    out["loss"] = loss.detach().reshape(1)
    for k, p in params.items():
        out["grad." + k] = p.grad.detach()

    # Phase B: `steps` AdamW steps on the same batch.
    params = {k: v.clone().requires_grad_(True) for k, v in weights.items()}
    decay = [p for k, p in params.items() if p.dim() == 2]
    no_decay = [p for k, p in params.items() if p.dim() != 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": args.weight_decay},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=args.lr, betas=(args.beta1, args.beta2), eps=args.eps,
                            foreach=False)
    losses = []
    for _ in range(args.steps):
        opt.zero_grad(set_to_none=True)
        loss = llama_ref.loss_fn(llama_ref.forward(params, cfg, inputs), targets)
        loss.backward()
        if args.clip > 0:
            torch.nn.utils.clip_grad_norm_(list(params.values()), args.clip)
        opt.step()
        losses.append(loss.item())
    out["losses"] = torch.tensor(losses, dtype=torch.float32)
    for k, p in params.items():
        out["final." + k] = p.detach()
    safetensors_io.write(args.out, out)


if __name__ == "__main__":
    main()
