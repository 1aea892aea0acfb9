"""Multi-turn generation for the worker (`rollout.multi_turn.enable=True`).

`AgentRollout.generate_sequences(prompts)` runs the agent loop of every sample
(`verl.experimental.agent_loop`) against a `BatchingGenerationServer` over the engine's
`generate_token_lists` (hf or vLLM), inside one `generation_context()` (for hf with FSDP: one
parameter gather per call).
The output layout is `AgentLoopWorker.postprocess`'s.
"""

from __future__ import annotations

import torch

from verl.workers.rollout.async_server import BatchingGenerationServer
from verl.workers.rollout.base import eos_id_list

__all__ = ["AgentRollout"]


class AgentRollout:
    """Args:
    engine: the rollout engine (must provide `generate_token_lists` and `generation_context`).
    config_section: the `actor_rollout_ref` config section (exposed to agent loops).
    rollout_config: `RolloutConfig`.
    tokenizer / processor: the policy's.
    """

    def __init__(self, engine, config_section, rollout_config, tokenizer, processor=None, chat_template_kwargs=None):
        if not hasattr(engine, "generate_token_lists"):
            raise NotImplementedError(
                "actor_rollout_ref.rollout.multi_turn.enable=True needs a token-list engine; "
                f"rollout.name={rollout_config.name!r} "
                f"({type(engine).__name__}) has none (use rollout.name=hf)"
            )
        from verl.experimental.agent_loop.agent_loop import AgentLoopWorker

        self.engine = engine
        self.rollout_config = rollout_config
        self.tokenizer = tokenizer
        self._server = None
        self.worker = AgentLoopWorker(config_section, rollout_config, self, tokenizer, processor, chat_template_kwargs)

    # the AgentLoopWorker's server_manager: delegates to the batching server of the current call
    async def generate(self, request_id, *, prompt_ids, sampling_params, image_data=None):
        return await self._server.generate(
            request_id, prompt_ids=prompt_ids, sampling_params=sampling_params, image_data=image_data
        )

    def sampling_params(self, meta: dict) -> dict:
        cfg = self.rollout_config
        if meta.get("validate", False):
            vk = cfg.val_kwargs
            return {"do_sample": vk.do_sample, "temperature": vk.temperature, "top_k": vk.top_k, "top_p": vk.top_p}
        return {
            "do_sample": meta.get("do_sample", cfg.do_sample),
            "temperature": meta.get("temperature", cfg.temperature),
            "top_k": meta.get("top_k", cfg.top_k),
            "top_p": meta.get("top_p", cfg.top_p),
        }

    def generate_sequences(self, prompts):
        meta = prompts.meta_info
        eos_ids = eos_id_list(meta.get("eos_token_id", self.tokenizer.eos_token_id))
        # a tool-call format whose turns end with a token of its own (Kimi's <|im_end|>) stops there too
        eos_ids += [t for t in self.worker.tool_parser.stop_token_ids if t not in eos_ids]
        pad_id = meta.get("pad_token_id", self.tokenizer.pad_token_id)
        pad_id = int(pad_id if pad_id is not None else (eos_ids[0] if eos_ids else 0))
        generator = None
        if meta.get("seed") is not None:
            # the hf engine samples on its module's device; vLLM draws per-request seeds on the CPU
            device = getattr(self.engine, "_device", "cpu")
            generator = torch.Generator(device=device).manual_seed(int(meta["seed"]))

        def run_batch(ids, max_tokens, sampling):
            return self.engine.generate_token_lists(ids, max_tokens, sampling, eos_ids, pad_id, generator)

        self._server = BatchingGenerationServer(run_batch, max_batch_size=self.rollout_config.micro_batch_size)
        try:
            with self.engine.generation_context():
                out = self.worker.run(prompts, self.sampling_params(meta))
        finally:
            stats = self._server.stats
            self._server.close()
            self._server = None
        out.meta_info["metrics"].update(
            {
                "agent/decode_batches": float(stats["batches"]),
                "agent/decode_s": float(stats["generate_s"]),
                "agent/decode_batch_size/mean": stats["requests"] / stats["batches"] if stats["batches"] else 0.0,
                "agent/decode_batch_size/max": float(stats["max_batch"]),
            }
        )
        return out
