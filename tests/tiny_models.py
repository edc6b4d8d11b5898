"""Tiny random Llama models for the runtime tests (no hub, float64 so argmax never ties)."""

import copy

import torch


def tiny(layers, hidden, vocab=40, seed=0, dtype=torch.float64, max_positions=1024):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=max_positions)
    return LlamaForCausalLM(cfg).eval().to(dtype)


def tiny_trio(max_positions=1024):
    """(target, a perturbed copy of it: partial acceptance, a smaller unrelated draft)."""
    target = tiny(2, 32, seed=0, max_positions=max_positions)
    close = copy.deepcopy(target)
    with torch.no_grad():
        for p in close.parameters():
            p.add_(0.01 * torch.randn_like(p))
    return target, close, tiny(1, 16, seed=1, max_positions=max_positions)
