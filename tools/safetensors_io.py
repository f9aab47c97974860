"""Reading and writing safetensors files, from the format specification alone.

The format (https://huggingface.co/docs/safetensors, "Format"): an unsigned 64-bit
little-endian header length N, then N bytes of UTF-8 JSON mapping each tensor name to
{"dtype", "shape", "data_offsets": [begin, end]} (offsets relative to the byte after the
header) plus an optional "__metadata__" object of string values, then the data, row-major,
little-endian. This module exists so that flatshard's reference tools need nothing beyond
Debian's python3-torch and python3-numpy (no safetensors package, no hub).
"""
import json
import os
import struct

import numpy as np
import torch

_NP_DTYPES = {"F32": np.float32, "I32": np.int32, "I64": np.int64, "F64": np.float64,
              "U16": np.uint16, "U8": np.uint8}


def _bf16_to_float32(raw):
    """bfloat16 bits (uint16) to float32: the bits are the high half of a float32."""
    return (raw.astype(np.uint32) << 16).view(np.float32)


def read(path):
    """Returns (tensors: dict name -> torch.Tensor, metadata: dict)."""
    with open(path, "rb") as f:
        blob = f.read()
    (n,) = struct.unpack("<Q", blob[:8])
    header = json.loads(blob[8:8 + n].decode("utf-8"))
    data = blob[8 + n:]
    metadata = header.pop("__metadata__", {}) or {}
    tensors = {}
    for name, entry in header.items():
        begin, end = entry["data_offsets"]
        dtype = entry["dtype"]
        shape = entry["shape"]
        raw = data[begin:end]
        if dtype == "BF16":
            arr = _bf16_to_float32(np.frombuffer(raw, dtype=np.uint16))
        else:
            arr = np.frombuffer(raw, dtype=_NP_DTYPES[dtype])
        tensors[name] = torch.from_numpy(arr.copy().reshape(shape))
    return tensors, metadata


def read_model_dir(path):
    """A Hugging Face model directory: (config dict, tensors) from config.json and
    model.safetensors, or model.safetensors.index.json and the shard files it names."""
    with open(os.path.join(path, "config.json")) as f:
        config = json.load(f)
    index = os.path.join(path, "model.safetensors.index.json")
    tensors = {}
    if os.path.exists(index):
        with open(index) as f:
            files = sorted(set(json.load(f)["weight_map"].values()))
    else:
        files = ["model.safetensors"]
    for name in files:
        part, _ = read(os.path.join(path, name))
        tensors.update(part)
    return config, tensors


def _float32_to_bf16_bits(t):
    """Round-to-nearest-even bfloat16 bits (uint16) of a float32 tensor (finite values)."""
    bits = t.contiguous().view(torch.int32).numpy().astype(np.int64) & 0xFFFFFFFF
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
    return (rounded & 0xFFFF).astype(np.uint16)


def write(path, tensors, metadata=None, bf16=False):
    """Writes dict name -> torch.Tensor (float32, int32 or int64) as a safetensors file;
    with bf16=True float32 tensors are stored as BF16 (rounded to nearest even)."""
    names = sorted(tensors)
    header = {}
    if metadata:
        header["__metadata__"] = {k: str(v) for k, v in metadata.items()}
    offset = 0
    chunks = []
    for name in names:
        t = tensors[name].detach().contiguous().cpu()
        if t.dtype == torch.float32 and bf16:
            dtype = "BF16"
        elif t.dtype == torch.float32:
            dtype = "F32"
        elif t.dtype == torch.int32:
            dtype = "I32"
        elif t.dtype == torch.int64:
            dtype = "I64"
        else:
            raise ValueError(f"{name}: unsupported dtype {t.dtype}")
        if dtype == "BF16":
            raw = _float32_to_bf16_bits(t).astype("<u2").tobytes()
        else:
            raw = t.numpy().astype(t.numpy().dtype.newbyteorder("<"), copy=False).tobytes()
        header[name] = {"dtype": dtype, "shape": list(t.shape),
                        "data_offsets": [offset, offset + len(raw)]}
        chunks.append(raw)
        offset += len(raw)
    text = json.dumps(header, separators=(",", ":")).encode("utf-8")
    text += b" " * ((8 - len(text) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for raw in chunks:
            f.write(raw)
