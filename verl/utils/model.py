"""Building Hugging Face models for the workers: causal LM (actor, reference, rollout), value model
(critic) and reward model, plus small helpers on position ids and model configs.

Every builder takes a local directory or hub name; `None` selects the embedded default model
(`verl.utils.embedded_default.default_model_path()`).
"""

from __future__ import annotations

import inspect
import logging
import os
import sys
from typing import Any

import torch

__all__ = [
    "compute_position_id_with_mask",
    "resolve_model_path",
    "load_model_config",
    "update_model_config",
    "get_generation_config",
    "build_causal_lm",
    "build_value_model",
    "build_reward_model",
    "get_model_size",
    "print_model_size",
    "torch_dtype_from_name",
    "accepts_logits_to_keep",
    "is_peft_model",
    "unwrap_peft_model",
    "apply_lora",
    "count_parameters",
    "rotary_pos_emb",
    "install_rotary_pos_emb",
]

logger = logging.getLogger(__name__)

_DTYPES = {
    "fp32": torch.float32,
    "float32": torch.float32,
    "bf16": torch.bfloat16,
    "bfloat16": torch.bfloat16,
    "fp16": torch.float16,
    "float16": torch.float16,
}


def torch_dtype_from_name(name: str | torch.dtype | None) -> torch.dtype | None:
    """`"bf16"`/`"bfloat16"`/`"fp32"`/... -> torch dtype (None stays None)."""
    if name is None or isinstance(name, torch.dtype):
        return name
    try:
        return _DTYPES[str(name).lower()]
    except KeyError:
        raise ValueError(f"dtype {name!r} is not understood; accepted: {sorted(_DTYPES)}") from None


def compute_position_id_with_mask(mask: torch.Tensor) -> torch.Tensor:
    """Position ids of a (left- or right-) padded batch: 0, 1, 2... over the valid tokens.

    Args:
        mask: [B, S] attention mask (1 = token, 0 = padding).
    Returns:
        [B, S] int64; padding before the first token gets 0, padding after the last token keeps
        counting (it is masked out, so its value never matters).
    """
    return torch.clip(torch.cumsum(mask.long(), dim=-1) - 1, min=0)


def resolve_model_path(path: str | None) -> str:
    """`path`, or the embedded default model directory when `path` is None."""
    if path is not None:
        return str(path)
    try:
        from verl.utils.embedded_default import default_model_path
    except ImportError as exc:
        raise RuntimeError(
            "model.path is null, which selects the embedded default model, but "
            f"verl.utils.embedded_default is not available ({exc}); set model.path to a model directory"
        ) from exc
    return str(default_model_path())


def update_model_config(module_config, override_config_kwargs: dict[str, Any] | None) -> None:
    """Set attributes of a transformers config in place (nested dicts update nested configs)."""
    for key, value in (override_config_kwargs or {}).items():
        current = getattr(module_config, key, None)
        if isinstance(value, dict) and current is not None and not isinstance(current, dict):
            update_model_config(current, value)
        else:
            setattr(module_config, key, value)


def load_model_config(path: str, override_config: dict | None = None, trust_remote_code: bool = False):
    """`AutoConfig` of `path` with `override_config` applied."""
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(path, trust_remote_code=trust_remote_code)
    update_model_config(config, override_config)
    return config


def get_generation_config(path: str, trust_remote_code: bool = False):
    """The model's `GenerationConfig`, or one derived from its config when the file is absent."""
    from transformers import GenerationConfig

    try:
        return GenerationConfig.from_pretrained(path)
    except OSError:
        try:
            return GenerationConfig.from_model_config(load_model_config(path, trust_remote_code=trust_remote_code))
        except OSError:
            return None


# the default attention: transformers' "sdpa", with grouped-query heads given to torch unrepeated
# on CPU (see `grouped_sdpa_attention`); `override_config.attn_implementation=sdpa` selects the
# plain one
GROUPED_SDPA = "verl_sdpa"


def grouped_sdpa_attention(
    module, query, key, value, attention_mask, dropout: float = 0.0, scaling=None, is_causal=None, **kwargs
):
    """transformers' `sdpa` attention function, except on CPU for a query of more than one token
    with grouped-query heads (fewer key/value heads than query heads): there the key/value heads
    go to torch's SDPA as they are (`enable_gqa=True`) instead of being repeated per query head
    first (transformers' `repeat_kv`, which it keeps for CUDA, where a mask with grouped heads
    falls back to the slow kernel). The forward values are the same (bitwise in
    tests/utils/test_model_attention.py); the key/value gradients are summed over each group in a
    different order (~1e-7). It saves the copy and its backward: 3-6% of an update of the
    embedded 1M and the 30M model. Everything else (CUDA, one-token decoding, position
    bias, softcap, the static-cache prefill crop) is transformers' own function.

    Args/returns: as transformers' attention interface: query [b, h, q, d], key/value
    [b, h_kv, k, d], attention_mask [b, 1, q, k] bool/additive or None -> ([b, q, h, d], None).
    """
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    q_len = query.shape[2]
    causal = attention_mask is None and bool(getattr(module, "is_causal", True) if is_causal is None else is_causal)
    if (
        query.device.type != "cpu"
        or getattr(module, "num_key_value_groups", 1) <= 1
        or q_len == 1
        or (causal and key.shape[2] > q_len)
        or kwargs.get("position_bias") is not None
        or kwargs.get("softcap") is not None
        or kwargs.get("output_attentions", False)
        or torch.jit.is_tracing()
    ):
        return sdpa_attention_forward(
            module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, is_causal=is_causal, **kwargs
        )
    out = torch.nn.functional.scaled_dot_product_attention(
        query, key, value, attn_mask=attention_mask, dropout_p=dropout, scale=scaling, is_causal=causal, enable_gqa=True
    )
    return out.transpose(1, 2).contiguous(), None


def register_grouped_sdpa() -> str:
    """Register `grouped_sdpa_attention` (and sdpa's mask builder) with transformers under
    `GROUPED_SDPA`; returns the name. Idempotent."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(GROUPED_SDPA, grouped_sdpa_attention)
    AttentionMaskInterface.register(GROUPED_SDPA, sdpa_mask)
    return GROUPED_SDPA


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """`x * cos + rotate_half(x) * sin` with `rotate_half(x) = cat(-x2, x1)` (x1, x2 the halves of
    the last dimension): the same three float operations per element as transformers', with the
    rotated copy written in place instead of built by `neg` + `cat`."""
    half = x.shape[-1] // 2
    rotated = torch.empty_like(x)
    torch.neg(x[..., half:], out=rotated[..., :half])
    rotated[..., half:].copy_(x[..., :half])
    rotated.mul_(sin)
    return (x * cos).add_(rotated)


def _rotate_grad(grad: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Gradient of `_rotate` w.r.t. x: `grad * cos + rotate_half^T(grad * sin)` with
    `rotate_half^T(y) = cat(y2, -y1)`. Autograd's backward of transformers' formula adds the same
    two terms per element (the slices' backward pads with exact zeros), so this is bitwise its
    result, without the two zero-filled full-size tensors and their additions."""
    half = grad.shape[-1] // 2
    scaled = grad * sin
    rotated = torch.empty_like(scaled)
    rotated[..., :half].copy_(scaled[..., half:])
    torch.neg(scaled[..., :half], out=rotated[..., half:])
    return (grad * cos).add_(rotated)


class _RotaryPosEmb(torch.autograd.Function):
    """Rotary embedding of q and k with the hand-written backward `_rotate_grad` (cos and sin
    take no gradient)."""

    @staticmethod
    def forward(ctx, q, k, cos, sin):
        ctx.save_for_backward(cos, sin)
        q_embed, k_embed = _rotate(q, cos, sin), _rotate(k, cos, sin)
        # as with transformers' formula, an output of an input without gradient has none
        ctx.mark_non_differentiable(*[out for out, x in ((q_embed, q), (k_embed, k)) if not x.requires_grad])
        return q_embed, k_embed

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_q, grad_k):
        cos, sin = ctx.saved_tensors
        dq = _rotate_grad(grad_q, cos, sin) if grad_q is not None and ctx.needs_input_grad[0] else None
        dk = _rotate_grad(grad_k, cos, sin) if grad_k is not None and ctx.needs_input_grad[1] else None
        return dq, dk, None, None


_TRANSFORMERS_ROTARY: dict[str, Any] = {}  # module name -> transformers' own apply_rotary_pos_emb


def rotary_pos_emb(q, k, cos, sin, unsqueeze_dim: int = 1):
    """transformers' Llama `apply_rotary_pos_emb` (same signature, bitwise the same outputs and
    gradients) with fewer full-size temporaries: its forward builds `rotate_half` with `neg` +
    `cat`, and autograd's backward of that pads each half's gradient into a zero-filled full-size
    tensor and adds them up. Here the rotated copy is written in place and the backward is
    written out (`_RotaryPosEmb`): ~6% of an update of the embedded 1M model
    (docs/performance.md). Anything outside the plain case (mixed dtypes, cos/sin needing a
    gradient, tracing or compiling) takes transformers' function.

    Args:
        q: [b, h, s, d]; k: [b, h_kv, s, d] (d even); cos, sin: [b, s, d] (or broadcastable after
            `unsqueeze(unsqueeze_dim)`).
    Returns:
        (q_embed, k_embed) with the shapes of q and k.
    """
    dtypes = {q.dtype, k.dtype, cos.dtype, sin.dtype}
    if (
        len(dtypes) != 1
        or not q.dtype.is_floating_point
        or q.shape[-1] % 2
        or k.shape[-1] % 2
        or cos.requires_grad
        or sin.requires_grad
        or torch.jit.is_tracing()
        or torch.compiler.is_compiling()
    ):
        return _TRANSFORMERS_ROTARY["transformers.models.llama.modeling_llama"](q, k, cos, sin, unsqueeze_dim)
    cos = cos.unsqueeze(unsqueeze_dim)
    sin = sin.unsqueeze(unsqueeze_dim)
    if torch.is_grad_enabled() and (q.requires_grad or k.requires_grad):
        return _RotaryPosEmb.apply(q, k, cos, sin)
    return _rotate(q, cos, sin), _rotate(k, cos, sin)


def install_rotary_pos_emb() -> bool:
    """Make transformers' Llama attention use `rotary_pos_emb` (it looks `apply_rotary_pos_emb` up
    in its module at every call; this replaces that module attribute, process-wide, once).
    Returns whether it is installed; False when transformers' function there is not its own
    (e.g. replaced by a hub kernel) or transformers has no Llama."""
    name = "transformers.models.llama.modeling_llama"
    try:
        import importlib

        module = importlib.import_module(name)
    except ImportError:
        return False
    current = getattr(module, "apply_rotary_pos_emb", None)
    if current is rotary_pos_emb:
        return True
    if current is None or getattr(current, "__module__", None) != name:
        return False
    _TRANSFORMERS_ROTARY[name] = current
    module.apply_rotary_pos_emb = rotary_pos_emb
    return True


def _split_overrides(override_config: dict | None) -> tuple[dict, str | None]:
    """(`override_config` without `attn_implementation`, the attention asked for or None)."""
    override = dict(override_config or {})
    attn = override.pop("attn_implementation", None)
    install_rotary_pos_emb()
    return override, attn


def default_attention(auto_cls, config) -> str:
    """The attention a model gets when `override_config.attn_implementation` is not set: ours
    (`GROUPED_SDPA`) where the architecture supports sdpa, else eager (e.g. Gemma 2, which
    transformers refuses to run with sdpa), logged once per build. A class that cannot be
    resolved here (remote code) gets ours, and transformers says if it does not support it."""
    try:
        model_cls = auto_cls._model_mapping[type(config)]
    except (AttributeError, KeyError):
        model_cls = None
    if model_cls is not None and not getattr(model_cls, "_supports_sdpa", True):
        logger.info(
            "%s does not support sdpa attention; using attn_implementation=eager "
            "(set actor_rollout_ref.model.override_config.attn_implementation to choose another)",
            model_cls.__name__,
        )
        return "eager"
    return register_grouped_sdpa()


def _from_pretrained(
    auto_cls, path: str, override_config: dict | None, torch_dtype, trust_remote_code: bool, seed: int, **extra
):
    override, attn = _split_overrides(override_config)
    config = load_model_config(path, override, trust_remote_code)
    if attn is None:
        attn = default_attention(auto_cls, config)
    for key, value in extra.items():
        setattr(config, key, value)
    # Weights absent from the checkpoint (a fresh value head) are drawn from the CPU torch RNG;
    # seeding it identically on every rank keeps the FSDP shards of those weights consistent. The
    # caller's RNG state is restored afterwards: the workers seed a distinct sampling stream per
    # rank before building their models, and loading a model must not reset it.
    with torch.random.fork_rng(devices=[]):
        torch.random.default_generator.manual_seed(seed)
        model = auto_cls.from_pretrained(
            path,
            config=config,
            dtype=torch_dtype_from_name(torch_dtype) or torch.float32,
            attn_implementation=attn,
            trust_remote_code=trust_remote_code,
        )
    return model


def build_causal_lm(
    path: str,
    override_config: dict | None = None,
    torch_dtype: str | torch.dtype = "fp32",
    trust_remote_code: bool = False,
    seed: int = 0,
):
    """`AutoModelForCausalLM` from `path` (sdpa attention, `GROUPED_SDPA`, unless `override_config`
    says otherwise)."""
    from transformers import AutoModelForCausalLM

    return _from_pretrained(AutoModelForCausalLM, path, override_config, torch_dtype, trust_remote_code, seed)


def build_value_model(
    path: str,
    override_config: dict | None = None,
    torch_dtype: str | torch.dtype = "fp32",
    trust_remote_code: bool = False,
    seed: int = 0,
):
    """A value model V(s_t): `AutoModelForTokenClassification` with one label over the backbone of
    `path` (a causal LM checkpoint: its backbone is loaded, the value head `score` is new unless the
    checkpoint already has one). Classifier dropout is forced to 0 so that values computed in eval
    mode (compute_values) and train mode (update_critic) agree.
    """
    from transformers import AutoModelForTokenClassification

    return _from_pretrained(
        AutoModelForTokenClassification,
        path,
        override_config,
        torch_dtype,
        trust_remote_code,
        seed,
        num_labels=1,
        classifier_dropout=0.0,
        hidden_dropout=0.0,
    )


def build_reward_model(
    path: str,
    override_config: dict | None = None,
    torch_dtype: str | torch.dtype = "fp32",
    trust_remote_code: bool = False,
    seed: int = 0,
):
    """A sequence-classification reward model with one label (`AutoModelForSequenceClassification`)."""
    from transformers import AutoModelForSequenceClassification

    return _from_pretrained(
        AutoModelForSequenceClassification, path, override_config, torch_dtype, trust_remote_code, seed, num_labels=1
    )


def get_model_size(model: torch.nn.Module, scale: str = "auto") -> tuple[float, str]:
    """Number of parameters in units of `scale` ("B", "M", "K", "" or "auto")."""
    n_params = sum(p.numel() for p in model.parameters())
    if scale == "auto":
        scale = "B" if n_params > 1e9 else "M" if n_params > 1e6 else "K" if n_params > 1e3 else ""
    div = {"B": 1e9, "M": 1e6, "K": 1e3, "": 1.0}[scale]
    return n_params / div, scale


def print_model_size(model: torch.nn.Module, name: str | None = None) -> None:
    n, scale = get_model_size(model)
    print(f"{name or type(model).__name__} contains {n:.2f}{scale} parameters")


def accepts_logits_to_keep(module: torch.nn.Module) -> bool:
    """Whether the model's forward takes transformers' `logits_to_keep` (project only the last k
    positions onto the vocabulary). A peft model passes keyword arguments through to the model it
    wraps, so that model's forward is the one inspected."""
    try:
        return "logits_to_keep" in inspect.signature(type(unwrap_peft_model(module)).forward).parameters
    except (TypeError, ValueError):
        return False


# ---------------------------------------------------------------------------------------------
# LoRA (peft)
# ---------------------------------------------------------------------------------------------

# peft task types by the builder that made the model: a causal LM keeps its output head frozen
# (peft's "all-linear" leaves it out); a value/reward model's fresh `score` head is trained in full
# (peft's TOKEN_CLS / SEQ_CLS task types list it in `modules_to_save`)
LORA_TASK_TYPES = ("CAUSAL_LM", "TOKEN_CLS", "SEQ_CLS")


def is_peft_model(module: torch.nn.Module) -> bool:
    """True when `module` is a `peft.PeftModel` (a model with adapters)."""
    if "peft" not in sys.modules:  # no PeftModel can exist before peft is imported (~0.2 s saved)
        return False
    try:
        from peft import PeftModel
    except ImportError:
        return False
    return isinstance(module, PeftModel)


def unwrap_peft_model(module: torch.nn.Module) -> torch.nn.Module:
    """The transformers model inside a peft model (with its adapter layers in place); `module`
    itself otherwise."""
    return module.get_base_model() if is_peft_model(module) else module


def _plain(value):
    """OmegaConf containers -> plain python (peft checks `isinstance(x, (list, str))`)."""
    if value is None or isinstance(value, str):
        return value
    return [str(v) for v in value]


_HEAD_NAMES = ("score", "classifier")


def _exclude_heads(module: torch.nn.Module, exclude):
    """`exclude` plus the value/score head of a classification model: peft trains that head in
    full (`modules_to_save`), so it must not also get an adapter ("all-linear" would give it one,
    since such models have no output embeddings)."""
    heads = [name for name in _HEAD_NAMES if isinstance(getattr(module, name, None), torch.nn.Module)]
    if not heads:
        return exclude
    if exclude is None:
        return heads
    if isinstance(exclude, str):  # a regex matched against full module names
        return f"(?:{exclude})|(?:.*\\.)?(?:{'|'.join(heads)})"
    return list(exclude) + [h for h in heads if h not in exclude]


def apply_lora(module: torch.nn.Module, model_config, task_type: str = "CAUSAL_LM", seed: int = 0) -> torch.nn.Module:
    """Wrap `module` in a peft LoRA model: base weights frozen, adapter weights trainable.

    - `model_config.lora_adapter_path` set: the adapter saved there (peft format) is loaded for
      further training; its rank, alpha and target modules are used.
    - otherwise a new adapter: `LoraConfig(r=lora_rank, lora_alpha, target_modules,
      exclude_modules, bias="none")`. peft initialises B = 0, so the wrapped model computes
      exactly what `module` did until the first update.

    A is drawn from the CPU torch RNG seeded with `seed` (the caller's RNG state is restored), so
    every rank of an FSDP group builds the same adapter and world sizes 1 and N agree.
    Returns the `peft.PeftModel`.
    """
    from peft import LoraConfig, PeftModel, get_peft_model

    if task_type not in LORA_TASK_TYPES:
        raise ValueError(f"LoRA task_type={task_type!r}; accepted: {list(LORA_TASK_TYPES)}")
    adapter_path = model_config.lora_adapter_path
    with torch.random.fork_rng(devices=[]):
        torch.random.default_generator.manual_seed(seed)
        if adapter_path is not None:
            from verl.utils.fs import copy_to_local

            local = copy_to_local(str(adapter_path))
            if not os.path.isfile(os.path.join(local, "adapter_config.json")):
                raise FileNotFoundError(
                    f"model.lora_adapter_path={adapter_path!r} is not a peft adapter directory (no "
                    "adapter_config.json); "
                    "point it at a lora_adapter/ folder of a checkpoint or a directory written by "
                    "PeftModel.save_pretrained"
                )
            peft_model = PeftModel.from_pretrained(module, local, is_trainable=True)
            loaded = peft_model.peft_config["default"]
            if model_config.lora_rank and model_config.lora_rank != loaded.r:
                logger.warning(
                    "model.lora_rank=%s differs from the rank r=%s of the adapter in model.lora_adapter_path=%s; "
                    "the adapter's rank is used",
                    model_config.lora_rank,
                    loaded.r,
                    adapter_path,
                )
            return peft_model
        if model_config.lora_rank <= 0:
            raise ValueError(
                "apply_lora needs model.lora_rank > 0 or model.lora_adapter_path, got "
                f"lora_rank={model_config.lora_rank}"
            )
        exclude = _plain(model_config.exclude_modules)
        if task_type != "CAUSAL_LM":
            exclude = _exclude_heads(module, exclude)
        config = LoraConfig(
            task_type=task_type,
            r=int(model_config.lora_rank),
            lora_alpha=int(model_config.lora_alpha),
            target_modules=_plain(model_config.target_modules),
            exclude_modules=exclude,
            bias="none",
        )
        return get_peft_model(module, config)


def count_parameters(module: torch.nn.Module) -> tuple[int, int]:
    """(trainable, total) parameter counts of `module` (local shards under FSDP2)."""
    trainable = sum(p.numel() for p in module.parameters() if p.requires_grad)
    total = sum(p.numel() for p in module.parameters())
    return trainable, total
