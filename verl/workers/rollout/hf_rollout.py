"""`HFRollout`: batched sampling with a KV cache on a Hugging Face causal LM (CPU and GPU).

The engine runs its own decoding loop on `model(...)` with a `DynamicCache` rather than
`generate()`, because it must control exactly what the trainer relies on:

- the log-probability of every sampled token under the distribution it was sampled from
  (`log_softmax(logits / T)`, T = the sampling temperature; greedy decoding reports T = 1 unless a
  temperature > 0 is configured, so that the learner, which divides by the same T, agrees);
- exact EOS handling: the first EOS is kept, every later position is padding with mask 0;
- identical prompts (the trainer repeats each prompt `rollout.n` times) are prefilled once and
  their KV cache is copied to the repeats;
- FSDP2: with 2+ ranks the full parameters are gathered once for the whole generation
  (`fsdp_utils.full_parameters`); decoding then runs without collectives, so ranks may stop after
  different numbers of steps. With one rank the actor's module is used as it is (no copy).

Sampling: temperature, top-k (-1 = off), top-p (1.0 = off), or greedy (`do_sample=False`).
Validation (`meta_info["validate"]`) uses `rollout.val_kwargs`. Randomness comes from torch's
global generator (seeded per rank by the worker, saved in checkpoints), or from a generator seeded
with `meta_info["seed"]` when the caller gives one. Rows that have finished are dropped from the
decoding batch (and their KV cache) once a quarter of the batch is done.

Decoding writes each token's keys/values into a per-layer buffer allocated once after the prefill
(`_preallocate_cache`), and for plain Llama models runs each step through
`lean_decode.LlamaDecodeStep` (the model's own sub-modules without transformers' per-call
overhead; bitwise the same logits).
"""

from __future__ import annotations

import contextlib
import functools
import inspect

import torch

from verl.utils.fsdp_utils import autocast_context, full_parameters
from verl.utils.model import accepts_logits_to_keep, unwrap_peft_model
from verl.workers.rollout.base import (
    BaseRollout,
    assemble_rollout_output,
    eos_id_list,
    logprob_temperature,
    register_rollout,
)
from verl.workers.rollout.lean_decode import LlamaDecodeStep

__all__ = ["HFRollout", "filter_logits_top_k_top_p"]


def filter_logits_top_k_top_p(logits: torch.Tensor, top_k: int = -1, top_p: float = 1.0) -> torch.Tensor:
    """Set logits outside the top-k / nucleus (top-p) set to -inf. [b, V] -> [b, V].

    top-p keeps the smallest set of most likely tokens whose probability mass reaches `top_p`
    (the most likely token is always kept).
    """
    if top_k is not None and 0 < top_k < logits.shape[-1]:
        kth = torch.topk(logits, top_k, dim=-1).values[:, -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p is not None and top_p < 1.0:
        sorted_logits, sorted_idx = torch.sort(logits, dim=-1, descending=True)
        probs = torch.softmax(sorted_logits, dim=-1)
        mass_before = probs.cumsum(dim=-1) - probs
        drop_sorted = mass_before >= top_p
        drop_sorted[:, 0] = False
        drop = torch.zeros_like(drop_sorted).scatter(-1, sorted_idx, drop_sorted)
        logits = logits.masked_fill(drop, float("-inf"))
    return logits


@functools.lru_cache(maxsize=1)
def _buffered_layer_class() -> type | None:
    """The preallocated KV-cache layer (a `DynamicLayer` writing into a fixed buffer), or None with
    a transformers that has no per-layer cache objects."""
    try:
        from transformers.cache_utils import DynamicLayer
    except ImportError:
        return None

    class _BufferedLayer(DynamicLayer):
        def __init__(self, keys: torch.Tensor, values: torch.Tensor, cap: int):
            super().__init__()
            self.device = keys.device
            self.is_initialized = True
            self._n = keys.shape[-2]
            self._k = keys.new_empty((*keys.shape[:-2], max(cap, self._n), keys.shape[-1]))
            self._v = values.new_empty((*values.shape[:-2], max(cap, self._n), values.shape[-1]))
            self._k[..., : self._n, :].copy_(keys)
            self._v[..., : self._n, :].copy_(values)
            self._views()

        def _views(self):
            self.keys = self._k[..., : self._n, :]
            self.values = self._v[..., : self._n, :]

        def update(self, key_states, value_states, *args, **kwargs):
            end = self._n + key_states.shape[-2]
            if end > self._k.shape[-2]:  # past the planned length: grow (not expected in decoding)
                grow = max(end, 2 * self._k.shape[-2]) - self._k.shape[-2]
                self._k = torch.cat(
                    [self._k, self._k.new_empty((*self._k.shape[:-2], grow, self._k.shape[-1]))], dim=-2
                )
                self._v = torch.cat(
                    [self._v, self._v.new_empty((*self._v.shape[:-2], grow, self._v.shape[-1]))], dim=-2
                )
            self._k[..., self._n : end, :].copy_(key_states)
            self._v[..., self._n : end, :].copy_(value_states)
            self._n = end
            self._views()
            return self.keys, self.values

        def _select(self, idx):
            self._k = self._k.index_select(0, idx.to(self._k.device))
            self._v = self._v.index_select(0, idx.to(self._v.device))
            self._views()

        def batch_select_indices(self, indices):
            self._select(indices)

        def reorder_cache(self, beam_idx):
            self._select(beam_idx)

        def crop(self, max_length):
            if max_length < 0:
                max_length = self._n + max_length
            self._n = min(self._n, max_length)
            self._views()

        def reset(self):
            self._n = 0
            self._views()

    return _BufferedLayer


def _preallocate_cache(cache, capacity: int) -> int:
    """Give each plain `DynamicLayer` of `cache` a buffer of `capacity` positions, so that decoding
    writes every new key/value in place instead of re-concatenating the whole cache at each token
    (the cat was ~43% of decoding time with 64-token responses). Other layer kinds (sliding
    window, linear attention, ...) are left as they are. Returns the number of layers converted.

    The layers' `keys` / `values` stay what transformers reads (views of the first `n` buffer
    positions), so attention sees exactly the same tensors as with the dynamic cache.
    """
    buffered = _buffered_layer_class()
    layers = getattr(cache, "layers", None)
    if buffered is None or not isinstance(layers, list):
        return 0
    from transformers.cache_utils import DynamicLayer

    converted = 0
    for i, layer in enumerate(layers):
        if type(layer) is DynamicLayer and layer.is_initialized and layer.keys.dim() == 4:
            layers[i] = buffered(layer.keys, layer.values, capacity)
            converted += 1
    return converted


def _next_token(logits, temperature: float, greedy: bool, params: dict, generator=None):
    """One decoding step's choice. logits: [B, V] fp32. Returns (token ids [B], log-probs [B, V] of
    the temperature-scaled distribution the sampler draws from; greedy takes the argmax)."""
    scaled = logits / temperature
    logp = torch.log_softmax(scaled, dim=-1)
    if greedy:
        return logits.argmax(dim=-1), logp
    filtered = filter_logits_top_k_top_p(scaled, params["top_k"], params["top_p"])
    tok = torch.multinomial(torch.softmax(filtered, dim=-1), num_samples=1, generator=generator).squeeze(-1)
    return tok, logp


@register_rollout("hf")
class HFRollout(BaseRollout):
    """Rollout on a Hugging Face causal LM.

    Args:
        module: the policy (the actor's FSDP2/plain module, or a separate copy).
        config: `RolloutConfig`.
        compute_dtype: autocast dtype of the forward passes (the actor's), or None.
        owns_module: True when `module` is a separate copy that receives the actor's weights
            through `update_weights` (e.g. a bf16 copy); False (default) when it *is* the actor.
    """

    def __init__(
        self, module: torch.nn.Module, config, compute_dtype: torch.dtype | None = None, owns_module: bool = False
    ):
        super().__init__(config)
        self.module = module
        self.compute_dtype = compute_dtype
        self.owns_module = owns_module

    # ------------------------------------------------------------------------------------------

    def shares_weights_with(self, module: torch.nn.Module) -> bool:
        return not self.owns_module and module is self.module

    def _cache_kwarg(self) -> str:
        # transformers >= 5.2x names the KV-cache argument `cache` (`past_key_values` is deprecated)
        params = inspect.signature(
            type(unwrap_peft_model(self.module)).forward
        ).parameters  # a peft model passes kwargs on
        return "cache" if "cache" in params else "past_key_values"

    @staticmethod
    def _out_cache(out):
        # outputs are ModelOutput mappings; newer transformers name the field `cache`
        for key in ("cache", "past_key_values"):
            if key in out.keys() and out[key] is not None:
                return out[key]
        raise RuntimeError(
            f"{type(out).__name__} returned no KV cache (use_cache=True); this model cannot be used by the hf rollout"
        )

    @property
    def _device(self) -> torch.device:
        return next(self.module.parameters()).device

    @property
    def _device_type(self) -> str:
        return "cuda" if self._device.type == "cuda" else "cpu"

    def _sampling_params(self, meta: dict) -> dict:
        cfg = self.config
        if meta.get("validate", False):
            vk = cfg.val_kwargs
            params = {"do_sample": vk.do_sample, "temperature": vk.temperature, "top_k": vk.top_k, "top_p": vk.top_p}
        else:
            params = {
                "do_sample": meta.get("do_sample", cfg.do_sample),
                "temperature": meta.get("temperature", cfg.temperature),
                "top_k": meta.get("top_k", cfg.top_k),
                "top_p": meta.get("top_p", cfg.top_p),
            }
        if params["do_sample"] and not params["temperature"] > 0:
            raise ValueError(
                f"sampling needs temperature > 0, got {params['temperature']} (use do_sample=False for greedy)"
            )
        return params

    @torch.no_grad()
    def generate_sequences(self, prompts):
        """See `BaseRollout.generate_sequences`. `rollout.micro_batch_size` bounds the rows per
        decoding batch (null = all rows at once)."""
        meta = prompts.meta_info
        params = self._sampling_params(meta)
        eos_ids = eos_id_list(
            meta.get("eos_token_id", getattr(getattr(self.module, "generation_config", None), "eos_token_id", None))
        )
        pad_id = meta.get("pad_token_id")
        if pad_id is None:
            pad_id = getattr(getattr(self.module, "config", None), "pad_token_id", None)
        if pad_id is None:
            pad_id = eos_ids[0] if eos_ids else 0
        resp_len = int(meta.get("response_length", self.config.response_length))
        input_ids = prompts.batch["input_ids"]
        attention_mask = prompts.batch["attention_mask"]
        position_ids = prompts.batch["position_ids"]
        n = input_ids.shape[0]
        chunk = self.config.micro_batch_size or n
        generator = None
        if meta.get("seed") is not None:
            # reproducible sampling for this call, independent of the global RNG stream
            generator = torch.Generator(device=self._device).manual_seed(int(meta["seed"]))
        tokens, log_probs = [], []
        was_training = self.module.training
        self.module.eval()
        try:
            with full_parameters(self.module):
                for start in range(0, n, chunk):
                    sl = slice(start, start + chunk)
                    t, lp = self._generate_chunk(
                        input_ids[sl],
                        attention_mask[sl],
                        position_ids[sl],
                        resp_len,
                        params,
                        eos_ids,
                        int(pad_id),
                        generator,
                    )
                    tokens.append(t)
                    log_probs.append(lp)
        finally:
            self.module.train(was_training)
        responses = torch.cat(tokens, dim=0)
        lps = torch.cat(log_probs, dim=0) if self.config.calculate_log_probs else None
        return assemble_rollout_output(
            input_ids,
            attention_mask,
            position_ids,
            responses,
            lps,
            eos_ids,
            int(pad_id),
            ignore_eos=bool(self.config.ignore_eos),
        )

    def _prefill(self, input_ids, attention_mask, position_ids):
        """Forward the prompts once per distinct prompt; return last-position logits and the cache
        expanded to every row."""
        b = input_ids.shape[0]
        # only the last position's logits are needed (a [b, P, V] tensor otherwise)
        last_only = {"logits_to_keep": 1} if accepts_logits_to_keep(self.module) else {}
        key = torch.cat([input_ids, attention_mask.to(input_ids.dtype)], dim=1)
        uniq, inverse = torch.unique(key, dim=0, return_inverse=True)
        if uniq.shape[0] < b:
            first = torch.full((uniq.shape[0],), b, dtype=torch.long, device=input_ids.device)
            first = first.scatter_reduce(0, inverse, torch.arange(b, device=input_ids.device), reduce="amin")
            out = self.module(
                input_ids=input_ids[first],
                attention_mask=attention_mask[first],
                position_ids=position_ids[first],
                use_cache=True,
                **last_only,
            )
            cache = self._out_cache(out)
            cache.reorder_cache(inverse)
            return out.logits[:, -1, :].float()[inverse], cache
        out = self.module(
            input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, use_cache=True, **last_only
        )
        return out.logits[:, -1, :].float(), self._out_cache(out)

    def _generate_chunk(
        self,
        input_ids,
        attention_mask,
        position_ids,
        resp_len: int,
        params: dict,
        eos_ids: list[int],
        pad_id: int,
        generator=None,
    ):
        device = self._device
        input_ids = input_ids.to(device)
        attention_mask = attention_mask.to(device)
        position_ids = position_ids.to(device)
        b = input_ids.shape[0]
        greedy = not params["do_sample"]
        temperature = logprob_temperature(params["temperature"])
        eos = torch.tensor(eos_ids, device=device, dtype=torch.long) if eos_ids and not self.config.ignore_eos else None
        tokens = torch.full((b, resp_len), pad_id, dtype=torch.long, device=device)
        lps = torch.zeros((b, resp_len), dtype=torch.float32, device=device)
        # rows still in the decoding batch (indices into the chunk) and which of them are done
        active = torch.arange(b, device=device)
        finished = torch.zeros(b, dtype=torch.bool, device=device)
        mask = attention_mask
        last_pos = position_ids[:, -1]
        cache_kw = self._cache_kwarg()
        with autocast_context(self._device_type, self.compute_dtype):
            logits, cache = self._prefill(input_ids, attention_mask, position_ids)
            _preallocate_cache(cache, input_ids.shape[1] + resp_len)
            # the same decoder step without transformers' per-call overhead, where it applies
            lean = LlamaDecodeStep.build(self.module, cache, _buffered_layer_class())
            # the lean step runs a plain model (no FSDP / peft hooks, see LlamaDecodeStep.build):
            # inference mode skips autograd's per-op bookkeeping (~5% of decoding, same kernels and
            # numbers); `tokens` / `lps` were made outside it and written in place, so what this
            # returns are normal tensors
            with torch.inference_mode(lean is not None):
                for t in range(resp_len):
                    tok, logp = _next_token(logits, temperature, greedy, params, generator)
                    tok = torch.where(finished, torch.full_like(tok, pad_id), tok)
                    tokens[active, t] = tok
                    lps[active, t] = torch.where(
                        finished, torch.zeros((), device=device), logp.gather(-1, tok.unsqueeze(-1)).squeeze(-1)
                    )
                    alive = ~finished
                    n_done = 0  # nothing can finish without EOS ids (ignore_eos): no host sync then
                    if eos is not None:
                        finished = finished | torch.isin(tok, eos)
                        n_done = int(finished.sum())  # the one host sync of a decoding step
                    if t == resp_len - 1 or n_done == finished.numel():
                        break
                    # the token just generated is attended to if it was generated while alive (EOS too)
                    mask = torch.cat([mask, alive.to(mask.dtype).unsqueeze(1)], dim=1)
                    last_pos = last_pos + 1
                    if n_done and n_done * 4 >= finished.numel():
                        # drop finished rows once a quarter of the batch is done: later steps cost less
                        keep = (~finished).nonzero().squeeze(1)
                        cache.batch_select_indices(keep)
                        mask, last_pos, tok, active, finished = (
                            mask[keep],
                            last_pos[keep],
                            tok[keep],
                            active[keep],
                            finished[keep],
                        )
                    if lean is not None:
                        logits = lean.step(tok, mask, last_pos).float()
                    else:
                        out = self.module(
                            input_ids=tok.unsqueeze(1),
                            attention_mask=mask,
                            position_ids=last_pos.unsqueeze(1),
                            use_cache=True,
                            **{cache_kw: cache},
                        )
                        cache = self._out_cache(out)
                        logits = out.logits[:, -1, :].float()
        return tokens.cpu(), lps.cpu()

    # ------------------------------------------------------------------------------------------
    # weights

    @torch.no_grad()
    def update_weights(self, weights) -> None:
        """Copy the actor's full weights into a separate module (strict: every name and shape
        must match, else RuntimeError). A no-op when the engine shares the actor's module."""
        if not self.owns_module:
            return
        state = dict(weights.items() if hasattr(weights, "items") else weights)
        result = self.module.load_state_dict(state, strict=False)
        missing = [k for k in result.missing_keys]
        if missing or result.unexpected_keys:
            raise RuntimeError(
                f"rollout weight sync failed: missing {missing[:10]} unexpected {list(result.unexpected_keys)[:10]}"
            )

    @torch.no_grad()
    def probe_log_probs(self, input_ids, attention_mask, position_ids, responses) -> torch.Tensor:
        device = self._device
        resp_len = responses.shape[1]
        ctx = full_parameters(self.module) if not self.owns_module else contextlib.nullcontext()
        with ctx, autocast_context(self._device_type, self.compute_dtype):
            logits = self.module(
                input_ids=input_ids.to(device),
                attention_mask=attention_mask.to(device),
                position_ids=position_ids.to(device),
                use_cache=False,
            ).logits
        logits = logits[:, -resp_len - 1 : -1].float()
        lp = torch.log_softmax(logits, dim=-1).gather(-1, responses.to(device).unsqueeze(-1)).squeeze(-1)
        return lp.cpu()

    # ------------------------------------------------------------------------------------------
    # token lists (the agent loop's batched server; see verl/workers/rollout/async_server.py)

    @contextlib.contextmanager
    def generation_context(self):
        """Eval mode and gathered parameters for a series of `generate_token_lists` calls. With FSDP
        2+ ranks the gathering is one collective, so the whole multi-turn rollout of a rank runs
        inside one context and the ranks may make different numbers of calls."""
        was_training = self.module.training
        self.module.eval()
        try:
            with full_parameters(self.module):
                yield
        finally:
            self.module.train(was_training)

    @torch.no_grad()
    def generate_token_lists(
        self,
        prompt_ids: list[list[int]],
        max_tokens: list[int],
        sampling: dict,
        eos_ids: list[int],
        pad_id: int,
        generator=None,
    ):
        """Generate one continuation per prompt (a list of ids, no padding) and return a list of
        `TokenOutput`: the ids up to and including the first EOS, or `max_tokens[i]` ids
        (`stop_reason="length"`), with their log-probs under the sampling distribution.

        Must run inside `generation_context()`. Rows are left-padded into one batch (chunks of
        `rollout.micro_batch_size`) and decoded for max(max_tokens) steps; a row's tokens beyond its
        own budget are discarded.
        """
        from verl.workers.rollout.async_server import TokenOutput

        if len(prompt_ids) != len(max_tokens):
            raise ValueError(f"generate_token_lists: {len(prompt_ids)} prompts but {len(max_tokens)} max_tokens")
        params = {
            "do_sample": bool(sampling.get("do_sample", True)),
            "temperature": sampling.get("temperature", 1.0),
            "top_k": sampling.get("top_k", -1),
            "top_p": sampling.get("top_p", 1.0),
        }
        if params["do_sample"] and not (params["temperature"] or 0) > 0:
            raise ValueError(
                f"sampling needs temperature > 0, got {params['temperature']} (use do_sample=False for greedy)"
            )
        eos_set = set(eos_ids) if not self.config.ignore_eos else set()
        results: list = [None] * len(prompt_ids)
        chunk = self.config.micro_batch_size or len(prompt_ids)
        for start in range(0, len(prompt_ids), chunk):
            rows = list(range(start, min(start + chunk, len(prompt_ids))))
            width = max(len(prompt_ids[i]) for i in rows)
            ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
            mask = torch.zeros((len(rows), width), dtype=torch.long)
            for j, i in enumerate(rows):
                p = prompt_ids[i]
                if not p:
                    raise ValueError("generate_token_lists: an empty prompt has no position to continue from")
                ids[j, width - len(p) :] = torch.tensor(p, dtype=torch.long)
                mask[j, width - len(p) :] = 1
            pos = (mask.cumsum(-1) - 1).clamp(min=0)
            steps = max(max_tokens[i] for i in rows)
            tokens, lps = self._generate_chunk(ids, mask, pos, steps, params, eos_ids, int(pad_id), generator)
            for j, i in enumerate(rows):
                toks, lp = tokens[j].tolist(), lps[j].tolist()
                n, reason = max_tokens[i], "length"
                for t in range(min(n, len(toks))):
                    if toks[t] in eos_set:
                        n, reason = t + 1, "eos"
                        break
                results[i] = TokenOutput(token_ids=toks[:n], log_probs=[float(x) for x in lp[:n]], stop_reason=reason)
        return results
