"""A lean one-token decoding step for Hugging Face Llama models (the hf rollout's fast path).

With small models a decoding step is dominated by the per-call overhead of the transformers model
(keyword plumbing, output capturing, building the 4-D attention mask, the cache object's
bookkeeping) rather than by arithmetic: about 1 ms of a 6.4 ms step for 128 rows of the embedded
1M Llama. `LlamaDecodeStep` runs the same decoder for one new token per row by calling the model's
own sub-modules (embedding, rotary embedding, norms, projections, MLP), the `apply_rotary_pos_emb`
the model's attention calls (transformers', or `verl.utils.model.rotary_pos_emb`, bitwise the same)
and transformers' `sdpa_attention_forward`, in the same order and on the same tensors, so
its logits are bitwise those of `model(...)` (tests/workers/rollout/test_rollout_lean_decode.py).
Only the wrapper work is skipped: the mask is the boolean `[b, 1, 1, L]` padding mask (None when
nothing is padded, as transformers does for one query token), and the keys/values go straight into
the rollout's preallocated per-layer buffers.

It applies only where that equivalence is known to hold (`LlamaDecodeStep.build` returns None
otherwise and the rollout calls the model as usual): a transformers `LlamaForCausalLM` (the class
itself), sdpa attention (transformers' or `verl.utils.model.GROUPED_SDPA`, which is transformers'
for one query token), default rope, `pretraining_tp` 1, plain `nn.Linear` projections (no LoRA
wrappers), no forward hooks anywhere (FSDP2 and peft install some), plain tensors as parameters
(no DTensor), eval mode, and every cache layer one of the rollout's preallocated buffers.
"""

from __future__ import annotations

import torch

from verl.utils.model import GROUPED_SDPA


def _has_hooks(module: torch.nn.Module) -> bool:
    from torch.nn.modules import module as nn_module

    if nn_module._global_forward_hooks or nn_module._global_forward_pre_hooks:
        return True
    return any(m._forward_hooks or m._forward_pre_hooks for m in module.modules())


class LlamaDecodeStep:
    """`step(tokens, mask, positions)`: logits of the next token for every row, writing the rows'
    keys/values into the cache's buffers (what `model(input_ids=tokens[:, None], ...)` returns)."""

    def __init__(self, model, layers, cache_layers, attention, rotary):
        self.model = model
        self.layers = layers
        self.cache_layers = cache_layers
        self._attention = attention
        self._rotary = rotary

    @classmethod
    def build(cls, model: torch.nn.Module, cache, buffered_layer_type: type) -> LlamaDecodeStep | None:
        """The lean step for `model` and `cache`, or None where it does not apply (see the module
        docstring); `buffered_layer_type` is the rollout's preallocated cache layer class."""
        try:
            from transformers.integrations.sdpa_attention import sdpa_attention_forward
            from transformers.models.llama import modeling_llama as ml
        except ImportError:
            return None
        if type(model) is not ml.LlamaForCausalLM or model.training:
            return None
        cfg = model.config
        rope = getattr(cfg, "rope_parameters", None) or {}
        if (
            getattr(cfg, "_attn_implementation", None) not in ("sdpa", GROUPED_SDPA)
            or rope.get("rope_type", "default") != "default"
            or getattr(cfg, "pretraining_tp", 1) != 1
        ):
            return None
        layers = list(model.model.layers)
        if len(layers) != cfg.num_hidden_layers or _has_hooks(model):
            return None
        from torch.distributed.tensor import DTensor

        if any(isinstance(p, DTensor) for p in model.parameters()):
            return None
        for layer in layers:
            at, mlp = layer.self_attn, layer.mlp
            linears = (at.q_proj, at.k_proj, at.v_proj, at.o_proj, mlp.gate_proj, mlp.up_proj, mlp.down_proj)
            norms = (layer.input_layernorm, layer.post_attention_layernorm)
            if type(layer) is not ml.LlamaDecoderLayer or type(at) is not ml.LlamaAttention:
                return None
            if type(mlp) is not ml.LlamaMLP or any(type(m) is not torch.nn.Linear for m in linears):
                return None
            # a hub kernel (transformers' `kernels` integration) replaces forward on the instance
            if any(type(n) is not ml.LlamaRMSNorm or "forward" in vars(n) for n in norms):
                return None
        if type(model.model.norm) is not ml.LlamaRMSNorm or "forward" in vars(model.model.norm):
            return None
        cache_layers = getattr(cache, "layers", None)
        if not isinstance(cache_layers, list) or len(cache_layers) != len(layers):
            return None
        if any(type(c) is not buffered_layer_type for c in cache_layers):
            return None
        step = cls(model, layers, cache_layers, sdpa_attention_forward, ml.apply_rotary_pos_emb)
        return step

    def step(self, tokens: torch.Tensor, mask: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """One decoding step.

        Args:
            tokens: [b] int64, the token each row just produced.
            mask: [b, L] attention mask over the cached positions plus this token (1 = attend).
            positions: [b] int64 position id of `tokens`.
        Returns:
            [b, V] logits (the model's dtype), for the token after `tokens`.
        """
        b = tokens.shape[0]
        inner = self.model.model
        hidden = inner.embed_tokens(tokens.unsqueeze(1))  # [b, 1, H]
        cos, sin = inner.rotary_emb(hidden, positions.unsqueeze(1))
        # transformers passes no mask for one query token when nothing is padded
        attn_mask = None if bool(mask.all()) else mask.bool()[:, None, None, :]
        for layer, cache_layer in zip(self.layers, self.cache_layers, strict=True):
            at = layer.self_attn
            residual = hidden
            x = layer.input_layernorm(hidden)
            shape = (b, 1, -1, at.head_dim)
            q = at.q_proj(x).view(shape).transpose(1, 2)
            k = at.k_proj(x).view(shape).transpose(1, 2)
            v = at.v_proj(x).view(shape).transpose(1, 2)
            q, k = self._rotary(q, k, cos, sin)
            k, v = cache_layer.update(k, v)
            out, _ = self._attention(at, q, k, v, attn_mask, dropout=0.0, scaling=at.scaling)
            out = at.o_proj(out.reshape(b, 1, -1).contiguous())
            hidden = residual + out
            residual = hidden
            hidden = residual + layer.mlp(layer.post_attention_layernorm(hidden))
        hidden = inner.norm(hidden)
        return self.model.lm_head(hidden)[:, -1, :]
