"""A reference Llama in plain PyTorch, for checking flatshard against.

Written from the architecture as Hugging Face's LlamaForCausalLM defines it (not copied from
it): token embedding; per block RMSNorm -> causal self-attention with rotary embeddings in
the "rotate half" layout and grouped-query attention -> residual -> RMSNorm -> SwiGLU MLP
-> residual; final RMSNorm; LM head (optionally the embedding matrix). No biases. Parameters
live in a dict keyed by the Hugging Face tensor names, so a flatshard safetensors file maps
onto it one to one. Everything is float32 and computed the straightforward way.
"""
import math

import torch
import torch.nn.functional as F


class Config:
    FIELDS = ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
              "num_key_value_heads", "vocab_size", "max_position_embeddings", "rms_norm_eps",
              "rope_theta", "tie_word_embeddings")

    def __init__(self, d):
        self.hidden_size = int(d["hidden_size"])
        self.intermediate_size = int(d["intermediate_size"])
        self.num_hidden_layers = int(d["num_hidden_layers"])
        self.num_attention_heads = int(d["num_attention_heads"])
        self.num_key_value_heads = int(d.get("num_key_value_heads") or self.num_attention_heads)
        self.vocab_size = int(d["vocab_size"])
        self.max_position_embeddings = int(d.get("max_position_embeddings", 2048))
        self.rms_norm_eps = float(d.get("rms_norm_eps", 1e-6))
        self.rope_theta = float(d.get("rope_theta", 10000.0))
        self.tie_word_embeddings = bool(d.get("tie_word_embeddings", False))
        self.head_dim = self.hidden_size // self.num_attention_heads


def parameter_shapes(cfg):
    """Hugging Face name -> shape of every parameter."""
    C, FF, V = cfg.hidden_size, cfg.intermediate_size, cfg.vocab_size
    HS, NH, NKV = cfg.head_dim, cfg.num_attention_heads, cfg.num_key_value_heads
    shapes = {"model.embed_tokens.weight": (V, C), "model.norm.weight": (C,)}
    for i in range(cfg.num_hidden_layers):
        p = f"model.layers.{i}."
        shapes[p + "input_layernorm.weight"] = (C,)
        shapes[p + "post_attention_layernorm.weight"] = (C,)
        shapes[p + "self_attn.q_proj.weight"] = (NH * HS, C)
        shapes[p + "self_attn.k_proj.weight"] = (NKV * HS, C)
        shapes[p + "self_attn.v_proj.weight"] = (NKV * HS, C)
        shapes[p + "self_attn.o_proj.weight"] = (C, NH * HS)
        shapes[p + "mlp.gate_proj.weight"] = (FF, C)
        shapes[p + "mlp.up_proj.weight"] = (FF, C)
        shapes[p + "mlp.down_proj.weight"] = (C, FF)
    if not cfg.tie_word_embeddings:
        shapes["lm_head.weight"] = (V, C)
    return shapes


def rms_norm(x, weight, eps):
    variance = x.pow(2).mean(-1, keepdim=True)
    return weight * (x * torch.rsqrt(variance + eps))


def rope_cos_sin(cfg, T):
    """cos and sin of shape (T, HS): the angle of pair (i, i + HS/2) at position t is
    t * theta^(-2i/HS), in float32 as Hugging Face computes it."""
    HS = cfg.head_dim
    inv_freq = 1.0 / (cfg.rope_theta ** (torch.arange(0, HS, 2, dtype=torch.int64).float() / HS))
    t = torch.arange(T, dtype=torch.int64).float()
    freqs = torch.outer(t, inv_freq)
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos(), emb.sin()


def rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def attention(x, p, prefix, cfg, cos, sin):
    B, T, C = x.shape
    NH, NKV, HS = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
    q = F.linear(x, p[prefix + "q_proj.weight"]).view(B, T, NH, HS).transpose(1, 2)
    k = F.linear(x, p[prefix + "k_proj.weight"]).view(B, T, NKV, HS).transpose(1, 2)
    v = F.linear(x, p[prefix + "v_proj.weight"]).view(B, T, NKV, HS).transpose(1, 2)
    q = q * cos + rotate_half(q) * sin
    k = k * cos + rotate_half(k) * sin
    group = NH // NKV
    k = k.repeat_interleave(group, dim=1)  # kv head g serves query heads g*group .. g*group+group-1
    v = v.repeat_interleave(group, dim=1)
    scores = (q @ k.transpose(-1, -2)) / math.sqrt(HS)
    mask = torch.ones(T, T, dtype=torch.bool).triu(1)
    scores = scores.masked_fill(mask, float("-inf"))
    out = torch.softmax(scores, dim=-1) @ v
    out = out.transpose(1, 2).reshape(B, T, NH * HS)
    return F.linear(out, p[prefix + "o_proj.weight"])


def mlp(x, p, prefix):
    gate = F.linear(x, p[prefix + "gate_proj.weight"])
    up = F.linear(x, p[prefix + "up_proj.weight"])
    return F.linear(F.silu(gate) * up, p[prefix + "down_proj.weight"])


def forward(p, cfg, inputs):
    """Logits (B, T, V) for int64 token ids (B, T)."""
    B, T = inputs.shape
    cos, sin = rope_cos_sin(cfg, T)
    x = F.embedding(inputs, p["model.embed_tokens.weight"])
    for i in range(cfg.num_hidden_layers):
        pre = f"model.layers.{i}."
        h = rms_norm(x, p[pre + "input_layernorm.weight"], cfg.rms_norm_eps)
        x = x + attention(h, p, pre + "self_attn.", cfg, cos, sin)
        h = rms_norm(x, p[pre + "post_attention_layernorm.weight"], cfg.rms_norm_eps)
        x = x + mlp(h, p, pre + "mlp.")
    x = rms_norm(x, p["model.norm.weight"], cfg.rms_norm_eps)
    head = p["model.embed_tokens.weight"] if cfg.tie_word_embeddings else p["lm_head.weight"]
    return F.linear(x, head)


def loss_fn(logits, targets):
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


def init_params(cfg, seed, initializer_range=0.02):
    """Fresh parameters: matrices N(0, initializer_range^2), norm weights one."""
    g = torch.Generator().manual_seed(seed)
    params = {}
    for name, shape in parameter_shapes(cfg).items():
        if len(shape) == 1:
            params[name] = torch.ones(shape)
        else:
            params[name] = torch.randn(shape, generator=g) * initializer_range
    return params
