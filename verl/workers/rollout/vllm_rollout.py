"""`vLLMRollout`: generation with vLLM (optional extra `verl[vllm]`, CUDA GPUs only).

Written against vLLM's documented offline API (`vllm.LLM`, `SamplingParams`, `LLM.sleep` /
`LLM.wake_up` with `enable_sleep_mode=True`, `LLM.apply_model`, token-id prompts). It cannot be
run on the CPU machines this project is developed on: it is imported only when
`rollout.name=vllm`, and its tests skip without vllm and a GPU. Treat it as untested until it has
run on a GPU.

- The engine holds its own copy of the weights; after every actor update the worker pushes the
  FSDP full state dict (`update_weights`), then verifies a probe sequence (`probe_log_probs`
  against the actor's log-probs; a mismatch raises).
- `release()` puts the engine to sleep (level 1: weights to CPU, KV cache dropped) while the
  learner trains; `resume()` wakes it before the next generation.
- Log-probs: vLLM returns the sampled token's log-prob; `logprobs_mode="processed_logprobs"`
  (vLLM >= 0.10.2) makes it the temperature-scaled distribution that the learner uses. On older
  versions the raw (T=1) log-probs are returned and a warning says so.
- Multi-turn (`AgentRollout`): `generate_token_lists` takes token-id prompts and returns the
  generated ids with their sampler log-probs, one `llm.generate` call per batch of requests.
- Knobs come from `rollout.*` (`tensor_model_parallel_size`, `gpu_memory_utilization`,
  `max_num_batched_tokens`, `max_num_seqs`, `enforce_eager`, `enable_chunked_prefill`, `dtype`)
  and `rollout.engine_kwargs.vllm` (passed to `vllm.LLM` as is).
"""

from __future__ import annotations

import contextlib
import logging
import warnings

import torch

from verl.workers.rollout.base import BaseRollout, assemble_rollout_output, eos_id_list

__all__ = ["vLLMRollout"]

logger = logging.getLogger(__name__)


def _import_vllm():
    try:
        import vllm  # noqa: F401
        from vllm import LLM, SamplingParams
    except ImportError as exc:
        raise ImportError(
            "actor_rollout_ref.rollout.name=vllm needs the optional vllm package (pip install 'verl[vllm]'; "
            "CUDA GPUs only). Use rollout.name=hf on CPU."
        ) from exc
    return LLM, SamplingParams


class vLLMRollout(BaseRollout):  # noqa: N801 - upstream class name
    """Rollout on a vLLM engine built from `model_path` (see the module docstring)."""

    def __init__(self, model_path: str, config, tokenizer=None, model_hf_config=None, **kwargs):
        super().__init__(config)
        if not torch.cuda.is_available():
            raise RuntimeError("actor_rollout_ref.rollout.name=vllm needs a CUDA GPU; use rollout.name=hf on CPU")
        LLM, self._SamplingParams = _import_vllm()
        engine_kwargs = dict((config.engine_kwargs or {}).get("vllm", {}) or {})
        engine_kwargs.setdefault("logprobs_mode", "processed_logprobs")
        args = dict(
            model=model_path,
            tensor_parallel_size=config.tensor_model_parallel_size,
            dtype=config.dtype,
            enforce_eager=config.enforce_eager,
            gpu_memory_utilization=config.gpu_memory_utilization,
            max_num_batched_tokens=config.max_num_batched_tokens,
            max_num_seqs=config.max_num_seqs,
            enable_chunked_prefill=config.enable_chunked_prefill,
            max_model_len=config.prompt_length + config.response_length,
            enable_sleep_mode=bool(config.free_cache_engine),
            trust_remote_code=kwargs.get("trust_remote_code", False),
        )
        args.update(engine_kwargs)
        try:
            self.llm = LLM(**args)
        except TypeError as exc:
            if "logprobs_mode" not in str(exc):
                raise
            args.pop("logprobs_mode")
            warnings.warn("this vLLM has no logprobs_mode: rollout_log_probs are at temperature 1", stacklevel=2)
            self.llm = LLM(**args)
        self._asleep = False
        if config.free_cache_engine:
            self.release()

    # ------------------------------------------------------------------------------------------

    def _sampling_params(self, meta: dict, resp_len: int, eos_ids: list[int]):
        cfg = self.config
        if meta.get("validate", False):
            vk = cfg.val_kwargs
            sampling = {"do_sample": vk.do_sample, "temperature": vk.temperature, "top_k": vk.top_k, "top_p": vk.top_p}
        else:
            sampling = {k: meta.get(k, getattr(cfg, k)) for k in ("do_sample", "temperature", "top_k", "top_p")}
        return self._params(sampling, resp_len, eos_ids, logprobs=0 if cfg.calculate_log_probs else None)

    def _params(self, sampling: dict, max_tokens: int, eos_ids: list[int], logprobs=None, seed=None):
        """`SamplingParams` for one request: `sampling` holds do_sample / temperature / top_k / top_p
        (do_sample=False: greedy, temperature 0); decoding stops after an id of `eos_ids` unless
        `rollout.ignore_eos`."""
        do_sample = bool(sampling.get("do_sample", True))
        temperature = sampling.get("temperature", 1.0)
        top_k, top_p = sampling.get("top_k", -1), sampling.get("top_p", 1.0)
        if not do_sample:
            temperature, top_k, top_p = 0.0, -1, 1.0
        return self._SamplingParams(
            n=1,
            temperature=float(temperature),
            top_k=int(top_k) if top_k and top_k > 0 else -1,
            top_p=float(top_p),
            max_tokens=int(max_tokens),
            logprobs=logprobs,
            ignore_eos=bool(self.config.ignore_eos),
            # vLLM stops on stop_token_ids even with ignore_eos
            stop_token_ids=None if self.config.ignore_eos else (eos_ids or None),
            seed=seed,
            detokenize=False,
        )

    @torch.no_grad()
    def generate_sequences(self, prompts):
        meta = prompts.meta_info
        eos_ids = eos_id_list(meta.get("eos_token_id"))
        pad_id = int(meta.get("pad_token_id", eos_ids[0] if eos_ids else 0))
        resp_len = int(meta.get("response_length", self.config.response_length))
        input_ids = prompts.batch["input_ids"]
        attention_mask = prompts.batch["attention_mask"]
        position_ids = prompts.batch["position_ids"]
        rows = [ids[m.bool()].tolist() for ids, m in zip(input_ids, attention_mask, strict=False)]
        self.resume()
        outputs = self.llm.generate(
            [{"prompt_token_ids": r} for r in rows],
            sampling_params=self._sampling_params(meta, resp_len, eos_ids),
            use_tqdm=False,
        )
        b = len(rows)
        responses = torch.full((b, resp_len), pad_id, dtype=torch.long)
        log_probs = torch.zeros((b, resp_len), dtype=torch.float32)
        for i, out in enumerate(outputs):
            completion = out.outputs[0]
            ids = list(completion.token_ids)[:resp_len]
            responses[i, : len(ids)] = torch.tensor(ids, dtype=torch.long)
            if completion.logprobs is not None:
                for t, (tok, entry) in enumerate(zip(ids, completion.logprobs, strict=False)):
                    log_probs[i, t] = float(entry[tok].logprob)
        lps = log_probs if self.config.calculate_log_probs else None
        return assemble_rollout_output(
            input_ids, attention_mask, position_ids, responses, lps, eos_ids, pad_id, bool(self.config.ignore_eos)
        )

    # ------------------------------------------------------------------------------------------
    # token-list interface of the agent loop (`AgentRollout`, same contract as `HFRollout`'s)

    @contextlib.contextmanager
    def generation_context(self):
        """Wakes the engine for a series of `generate_token_lists` calls (vLLM needs no gather)."""
        self.resume()
        yield

    def generate_token_lists(
        self,
        prompt_ids: list[list[int]],
        max_tokens: list[int],
        sampling: dict,
        eos_ids: list[int],
        pad_id: int,
        generator=None,
    ):
        """Generate one continuation per prompt (a list of ids, no padding) with one `llm.generate`
        call and return a list of `TokenOutput`: the ids up to and including the first id of
        `eos_ids` (`stop_reason="eos"`), or `max_tokens[i]` ids (`"length"`), with the sampled
        token's log-prob at each position (`logprobs_mode`, see the module docstring).

        `pad_id` is unused (no padding). With a `generator`, each request gets its own vLLM seed
        drawn from it, so a seeded rollout is reproducible and repeated prompts still differ.
        """
        from verl.workers.rollout.async_server import TokenOutput

        if len(prompt_ids) != len(max_tokens):
            raise ValueError(f"generate_token_lists: {len(prompt_ids)} prompts but {len(max_tokens)} max_tokens")
        if any(not p for p in prompt_ids):
            raise ValueError("generate_token_lists: an empty prompt has no position to continue from")
        if sampling.get("do_sample", True) and not (sampling.get("temperature", 1.0) or 0) > 0:
            raise ValueError(
                f"sampling needs temperature > 0, got {sampling.get('temperature')} (use do_sample=False for greedy)"
            )
        results = [TokenOutput(token_ids=[], log_probs=[], stop_reason="length") for _ in prompt_ids]
        todo = [i for i, n in enumerate(max_tokens) if n > 0]  # vLLM rejects max_tokens=0
        if not todo:
            return results
        seeds = [None] * len(todo)
        if generator is not None:
            seeds = torch.randint(0, 2**31 - 1, (len(todo),), generator=generator, device=generator.device).tolist()
        params = [
            self._params(sampling, max_tokens[i], eos_ids, logprobs=0, seed=s) for i, s in zip(todo, seeds, strict=True)
        ]
        self.resume()
        outputs = self.llm.generate(
            [{"prompt_token_ids": list(prompt_ids[i])} for i in todo], sampling_params=params, use_tqdm=False
        )
        eos_set = set() if self.config.ignore_eos else set(eos_ids)
        for i, out in zip(todo, outputs, strict=True):
            completion = out.outputs[0]
            ids = list(completion.token_ids)[: max_tokens[i]]
            n, reason = len(ids), "length"
            for t, tok in enumerate(ids):
                if tok in eos_set:
                    n, reason = t + 1, "eos"
                    break
            if completion.finish_reason == "stop":
                reason = "eos"  # also when vLLM stopped on the model's own EOS, not in eos_ids
            entries = completion.logprobs
            if entries is None or len(entries) < n:
                raise RuntimeError(f"vLLM returned {len(entries or [])} log-prob entries for {n} generated tokens")
            lps = [float(entry[tok].logprob) for tok, entry in zip(ids[:n], entries[:n], strict=True)]
            results[i] = TokenOutput(token_ids=ids[:n], log_probs=lps, stop_reason=reason)
        return results

    # ------------------------------------------------------------------------------------------

    def update_weights(self, weights) -> None:
        """Load the full state dict into the engine's model (`model.load_weights`), in every
        vLLM worker. Raises when a name of the model receives no weight."""
        items = list(weights.items() if hasattr(weights, "items") else weights)
        self.resume()

        def _load(model):
            loaded = model.load_weights(items)
            return sorted(loaded) if loaded is not None else None

        results = self.llm.apply_model(_load)
        expected = {name for name, _ in items}
        for loaded in results:
            if loaded is not None and not set(loaded):
                raise RuntimeError(f"vLLM weight sync loaded no tensor out of {len(expected)}")

    @torch.no_grad()
    def probe_log_probs(self, input_ids, attention_mask, position_ids, responses) -> torch.Tensor:
        """Teacher-forced log-probs of `responses` from vLLM's prompt log-probs (temperature 1)."""
        resp_len = responses.shape[1]
        rows = [ids[m.bool()].tolist() for ids, m in zip(input_ids, attention_mask, strict=False)]
        params = self._SamplingParams(max_tokens=1, prompt_logprobs=0, temperature=1.0, detokenize=False)
        self.resume()
        outputs = self.llm.generate([{"prompt_token_ids": r} for r in rows], sampling_params=params, use_tqdm=False)
        out = torch.zeros((len(rows), resp_len), dtype=torch.float32)
        resp_mask = attention_mask[:, -resp_len:].bool()
        for i, o in enumerate(outputs):
            n_resp = int(resp_mask[i].sum())
            seq = rows[i]
            entries = o.prompt_logprobs  # one per prompt token (the first is None)
            for j in range(n_resp):
                pos = len(seq) - n_resp + j
                out[i, j] = float(entries[pos][seq[pos]].logprob)
        return out

    def release(self) -> None:
        if self.config.free_cache_engine and not self._asleep:
            self.llm.sleep(level=1)
            self._asleep = True

    def resume(self) -> None:
        if self._asleep:
            self.llm.wake_up()
            self._asleep = False
