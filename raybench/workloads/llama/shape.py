"""The Llama presets (published configs), the FLOPs of a trained token and the parameter count
of a shape, and the published training figures the report sets beside measured rows."""

from __future__ import annotations

from typing import Any, Literal

import torch

from raybench.workloads import Reference

# Published configs (transformers' config.json of each model on the Hugging Face hub); rope:
# the "llama3" frequency scaling of Llama-3.1 and 3.2. seq_len: the default when a sweep sets
# none (torchtitan's and MLPerf's training length for the real ones).
_LLAMA31_ROPE = {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0,
                 "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                 "original_max_position_embeddings": 8192}
_LLAMA32_ROPE = {**_LLAMA31_ROPE, "factor": 32.0}
PRESETS: dict[str, dict[str, Any]] = {
    "tiny": dict(layers=2, hidden=64, ffn=192, heads=4, kv_heads=2, vocab=512,
                 max_positions=1024, tie_embeddings=False, seq_len=128,
                 rope={"rope_type": "default", "rope_theta": 10000.0}),
    "llama3.2-1b": dict(layers=16, hidden=2048, ffn=8192, heads=32, kv_heads=8, vocab=128256,
                        max_positions=131072, tie_embeddings=True, seq_len=8192,
                        rope=_LLAMA32_ROPE),
    "llama3.2-3b": dict(layers=28, hidden=3072, ffn=8192, heads=24, kv_heads=8, vocab=128256,
                        max_positions=131072, tie_embeddings=True, seq_len=8192,
                        rope=_LLAMA32_ROPE),
    "llama3.1-8b": dict(layers=32, hidden=4096, ffn=14336, heads=32, kv_heads=8, vocab=128256,
                        max_positions=131072, tie_embeddings=False, seq_len=8192,
                        rope=_LLAMA31_ROPE),
    "llama3.1-70b": dict(layers=80, hidden=8192, ffn=28672, heads=64, kv_heads=8, vocab=128256,
                         max_positions=131072, tie_embeddings=False, seq_len=8192,
                         rope=_LLAMA31_ROPE),
}


def _published(gpu: str, tokens_per_s: float, source: str, gpus: int = 8,
               **config: Any) -> Reference:
    """A published tokens/s per GPU of Llama-3.1-8B training at seq 8192 in bf16 (fp8 where
    `workload.fp8` says so), matched to rows of the same preset, length and GPU count."""
    return Reference(gpu, {"workload.name": "llama", "workload.preset": "llama3.1-8b",
                           "llm/seq_len": 8192, "hardware.num_gpus": gpus, **config},
                     "train", "bf16", None, tokens_per_s / 8192, source, "tokens/s", 8192.0)


_TITAN = "torchtitan, benchmarks/llama3_h100_202412_torchtitan.md (2024-12), FSDP, 8 GPUs"
_MEGATRON = ("NVIDIA Megatron-Bridge 25.11, docs/performance-summary.md, FP8, 8 GPUs "
             "(its own layout)")
REFERENCES = (
    _published("H100", 5762.0, _TITAN, **{"workload.parallel.tp": 1, "workload.fp8": False,
                                         "hardware.compile": False}),
    _published("H100", 6667.0, _TITAN + ", torch.compile",
               **{"workload.parallel.tp": 1, "workload.fp8": False, "hardware.compile": True}),
    _published("H100", 8532.0, _TITAN + ", float8", **{"workload.parallel.tp": 1,
                                                       "workload.fp8": True}),
    _published("B200", 8307.0, "torchtitan's mxfp8 notes, bf16 baseline, FSDP, 8 GPUs",
               **{"workload.fp8": False}),
    _published("H100", 14451.0, _MEGATRON, **{"workload.fp8": True}),
    _published("B200", 30624.0, _MEGATRON, **{"workload.fp8": True}),
    _published("GB200", 31508.0, _MEGATRON, **{"workload.fp8": True}),
)


def _served(gpu: str, n_in: int, n_out: int, tokens_per_s: float, source: str,
            scenario: str = "offline") -> Reference:
    """A published output tokens/s of Llama-3.1-8B served on one GPU, matched to serving rows
    of the same preset, lengths and scenario whatever their precision (not like for like)."""
    return Reference(gpu, {"workload.name": "llama", "workload.preset": "llama3.1-8b",
                           "inference.scenario": scenario, "serve/input_tokens": n_in,
                           "serve/output_tokens": n_out}, "serve", "fp8", None, tokens_per_s,
                     source, "output tokens/s", 1.0, like_for_like=False)


_TRTLLM = ("TensorRT-LLM, docs/source/performance/perf-overview.md: FP8, one GPU, its own "
           "engine")
SERVING_REFERENCES = (
    _served("H100", 128, 128, 28312.0, _TRTLLM), _served("H100", 1000, 1000, 15220.0, _TRTLLM),
    _served("H200", 128, 128, 27911.0, _TRTLLM), _served("H200", 1000, 1000, 17744.0, _TRTLLM),
    _served("H100", 2048, 2048, 9305.0, _TRTLLM), _served("H200", 2048, 2048, 12194.0, _TRTLLM),
)
Preset = Literal["tiny", "llama3.2-1b", "llama3.2-3b", "llama3.1-8b", "llama3.1-70b"]


def flops_per_token(shape: dict[str, Any]) -> float:
    """torchtitan's count (PaLM, appendix B) of one trained token: 6 x the weights every token
    multiplies (all but the input embedding; the head counted even where it shares the
    embedding's weights) + 12 x layers x heads x head dim x sequence (attention's two matmuls,
    forward and backward, no discount for the causal mask); norms and recomputation not
    counted."""
    h, layers, heads = shape["hidden"], shape["layers"], shape["heads"]
    head_dim = h // heads
    kv = shape["kv_heads"] * head_dim
    block = h * h * 2 + h * kv * 2 + 3 * h * shape["ffn"] + 2 * h  # q,o + k,v + MLP + norms
    matmul_weights = layers * block + h + h * shape["vocab"]  # + final norm + head
    return 6.0 * matmul_weights + 12.0 * layers * heads * head_dim * shape["seq_len"]


def param_count(shape: dict[str, Any]) -> int:
    """Every parameter of the model (the tied head counted once)."""
    h, kv = shape["hidden"], shape["kv_heads"] * (shape["hidden"] // shape["heads"])
    block = h * h * 2 + h * kv * 2 + 3 * h * shape["ffn"] + 2 * h
    head = 0 if shape["tie_embeddings"] else h * shape["vocab"]
    return shape["layers"] * block + h + h * shape["vocab"] + head


_A, _C = 48271, 12345  # A: a prime dividing no preset's vocabulary (2^8 x 3 x 167, 2^9)


def walk(vocab: int, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(A^i, C x (A^0 + ... + A^(i-1))) mod vocab for i < n: token i = (A^i x token 0 + the
    second) mod vocab."""
    scale, shift = [1], [0]
    for _ in range(n - 1):
        scale.append(scale[-1] * _A % vocab)
        shift.append((shift[-1] * _A + _C) % vocab)
    return torch.tensor(scale)[None], torch.tensor(shift)[None]


def build(shape: dict[str, Any]) -> torch.nn.Module:
    """transformers' LlamaForCausalLM of this shape (on the current default device)."""
    # transformers: seconds to import, and only a rank building the model needs it (expansion,
    # --dry-run and the report do not)
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=shape["vocab"], hidden_size=shape["hidden"],
        intermediate_size=shape["ffn"], num_hidden_layers=shape["layers"],
        num_attention_heads=shape["heads"], num_key_value_heads=shape["kv_heads"],
        max_position_embeddings=shape["max_positions"], rope_parameters=dict(shape["rope"]),
        tie_word_embeddings=shape["tie_embeddings"], rms_norm_eps=1e-5, use_cache=False,
        attn_implementation="sdpa")
    return LlamaForCausalLM(config)
