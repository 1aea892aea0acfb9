"""An environment as a custom agent loop: the model guesses a secret number, the environment answers
"higher" / "lower" as a user message, the episode reward is 1 when the number is found.

Register it by import (this file is loaded by the config below) and select it per sample with the
dataset column `agent_name: guess_number_agent` (or `rollout.agent.default_agent_loop`):

    actor_rollout_ref.rollout.agent.agent_loop_config_path=docs/examples/agent_loops.yaml

Rows carry the secret in `extra_info.secret`. The reward returned as `reward_score` becomes the
batch's `rm_scores` (on the last generated token), which the reward manager uses instead of a rule
score; a loop that scores must score every sample.
"""

from __future__ import annotations

import re
from typing import Any

from verl.experimental.agent_loop import AgentLoopBase, AgentLoopOutput, register
from verl.experimental.agent_loop.agent_loop import AgentLoopMetrics


@register("guess_number_agent")
class GuessNumberAgentLoop(AgentLoopBase):
    max_guesses = 4

    async def run(self, sampling_params: dict[str, Any], **kwargs) -> AgentLoopOutput:
        secret = int(kwargs["extra_info"]["secret"])
        messages = [dict(m) for m in kwargs["raw_prompt"]]
        prompt_ids = self.renderer.prompt_ids(messages)
        budget = int(self.rollout_config.response_length)
        ids: list[int] = []
        mask: list[int] = []
        logprobs: list[float] = []
        guesses: list[int | None] = []
        reward = 0.0
        for _ in range(self.max_guesses):
            if len(ids) >= budget:
                break
            out = await self.server_manager.generate(
                "guess",
                prompt_ids=prompt_ids + ids,
                sampling_params={**sampling_params, "max_tokens": budget - len(ids)},
            )
            # generated tokens: trained on (mask 1), with the sampler's log-probs
            ids += out.token_ids
            mask += [1] * len(out.token_ids)
            logprobs += out.log_probs
            text = self.tokenizer.decode(out.token_ids, skip_special_tokens=True)
            messages.append({"role": "assistant", "content": text})
            found = re.search(r"-?\d+", text)
            guess = int(found.group()) if found else None
            guesses.append(guess)
            if out.stop_reason != "eos":
                break
            if guess == secret:
                reward = 1.0
                break
            feedback = {
                "role": "user",
                "content": "a number, please" if guess is None else ("higher" if guess < secret else "lower"),
            }
            # environment tokens: a render diff of the new message, never trained on (mask 0)
            obs = self.renderer.observation_ids([feedback])
            if len(ids) + len(obs) >= budget:
                break
            ids += obs
            mask += [0] * len(obs)
            logprobs += [0.0] * len(obs)
            messages.append(feedback)
        return AgentLoopOutput(
            prompt_ids=prompt_ids,
            response_ids=ids,
            response_mask=mask,
            response_logprobs=logprobs,
            reward_score=reward,
            num_turns=len(messages),
            metrics=AgentLoopMetrics(),
            extra_fields={"assistant_turns": len(guesses), "trace": {"guesses": guesses, "secret": secret}},
        )
