#!/usr/bin/env python3
"""Reference results for flatshard's model tests, computed with PyTorch.

Run with Debian's python3-torch: /usr/bin/python3 tools/torch_reference.py [--mode MODE] ARGS.

--mode train-check (the default): see below.
--mode eval: reads a Hugging Face model directory (--model DIR: config.json with
  model.safetensors or an index of shards) and a batch, and writes "logits" and "loss".
--mode create: creates a model with PyTorch's own random numbers (--seed; normal weights,
  norm weights around one), writes it as a Hugging Face directory (--model DIR: config.json
  from --config, two BF16 shard files and model.safetensors.index.json), and writes the
  "logits" and "loss" of the bf16-rounded weights on the batch.

train-check:

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
import os
import sys

import torch

sys.path.insert(0, __import__("os").path.dirname(__file__))
import llama_ref  # noqa: E402
import safetensors_io  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mode", choices=("train-check", "eval", "create"), default="train-check")
    ap.add_argument("--weights")
    ap.add_argument("--model")
    ap.add_argument("--config")
    ap.add_argument("--seed", type=int, default=0)
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
    batch, _ = safetensors_io.read(args.batch)
    inputs = batch["inputs"].long()
    targets = batch["targets"].long()
    if args.mode == "eval":
        config, weights = safetensors_io.read_model_dir(args.model)
        evaluate(llama_ref.Config(config), weights, inputs, targets, args.out)
        return
    if args.mode == "create":
        create(args, inputs, targets)
        return
    weights, meta = safetensors_io.read(args.weights)
    cfg = llama_ref.Config(json.loads(meta["flatshard_config"]))

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


def evaluate(cfg, weights, inputs, targets, out_path):
    """Logits and loss of a model (tensors widened to float32) on a batch."""
    expected = set(llama_ref.parameter_shapes(cfg))
    params = {k: v.float() for k, v in weights.items() if k in expected}
    missing = expected - set(params)
    if missing:
        sys.exit(f"torch_reference: the model lacks {sorted(missing)}")
    with torch.no_grad():
        logits = llama_ref.forward(params, cfg, inputs)
        loss = llama_ref.loss_fn(logits, targets)
    safetensors_io.write(out_path, {"logits": logits, "loss": loss.reshape(1)})


def create(args, inputs, targets):
    """A model of PyTorch's making, saved as a Hugging Face directory of two BF16 shards."""
    with open(args.config) as f:
        config = json.load(f)
    cfg = llama_ref.Config(config)
    params = llama_ref.init_params(cfg, args.seed)
    g = torch.Generator().manual_seed(args.seed + 1)
    for name, p in params.items():
        if p.dim() == 1:  # norm weights near one, so that they matter
            params[name] = 1.0 + 0.1 * torch.randn(p.shape, generator=g)
    names = sorted(params)
    half = len(names) // 2
    shards = {"model-00001-of-00002.safetensors": names[:half],
              "model-00002-of-00002.safetensors": names[half:]}
    os.makedirs(args.model, exist_ok=True)
    weight_map = {}
    for file, part in shards.items():
        safetensors_io.write(os.path.join(args.model, file), {n: params[n] for n in part}, bf16=True)
        weight_map.update({n: file for n in part})
    with open(os.path.join(args.model, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": 0}, "weight_map": weight_map}, f)
    with open(os.path.join(args.model, "config.json"), "w") as f:
        json.dump(dict(config, torch_dtype="bfloat16"), f)
    # the reference answer is for the weights as stored: rounded to bf16
    rounded = {n: (torch.from_numpy(safetensors_io._float32_to_bf16_bits(p).astype("int32")) << 16).view(torch.float32)
               for n, p in params.items()}
    evaluate(cfg, rounded, inputs, targets, args.out)


if __name__ == "__main__":
    main()
