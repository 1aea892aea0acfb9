"""An asyncio front over a batch generation engine: many concurrent trajectories, one decoding call.

Agent loops (`verl.experimental.agent_loop`) run one coroutine per trajectory and call
`await server.generate(request_id, prompt_ids=..., sampling_params=...)` for each assistant turn.
The server queues the requests; a scheduler task takes every pending request with the same
sampling settings, runs them as one batched call of the engine (in a worker thread, so tool
coroutines keep running while the model decodes) and resolves each request's future with its
`TokenOutput`. A trajectory waiting on a slow tool simply has no pending request: the others are
batched without it, and it joins the next batch when its observation is ready.

Batch composition depends on when tools return, so sampled tokens are not reproducible across runs
with tools of varying latency (each batch still draws from the seeded global generator).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from verl.workers.rollout.replica import TokenOutput

__all__ = ["TokenOutput", "GenerationRequest", "BatchingGenerationServer"]


@dataclass
class GenerationRequest:
    request_id: str
    prompt_ids: list[int]
    max_tokens: int
    sampling: tuple  # (do_sample, temperature, top_k, top_p): requests batch together only when equal
    future: asyncio.Future = field(repr=False, default=None)


SAMPLING_KEYS = ("do_sample", "temperature", "top_k", "top_p")


class BatchingGenerationServer:
    """Batch concurrent `generate` calls into engine calls.

    Args:
        generate_batch: `fn(prompt_ids_list, max_tokens_list, sampling: dict) -> list[TokenOutput]`,
            blocking; run in a single worker thread (calls never overlap).
        max_batch_size: most requests per engine call (None: all pending).
        gather_rounds: event-loop rounds the scheduler waits before taking a batch, so coroutines
            woken by the previous batch can submit their next turn first.
    """

    def __init__(self, generate_batch: Callable, max_batch_size: int | None = None, gather_rounds: int = 4):
        self.generate_batch = generate_batch
        self.max_batch_size = max_batch_size
        self.gather_rounds = gather_rounds
        self._pending: list[GenerationRequest] = []
        self._wake: asyncio.Event | None = None
        self._task: asyncio.Task | None = None
        self._executor = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="verl-generate")
        self.stats = {"batches": 0, "requests": 0, "generate_s": 0.0, "max_batch": 0}

    async def generate(
        self, request_id: str, *, prompt_ids: list[int], sampling_params: dict, image_data=None
    ) -> TokenOutput:
        if image_data is not None:
            raise NotImplementedError("image_data: multimodal generation is not supported by the hf rollout")
        max_tokens = int(sampling_params.get("max_tokens", 0) or 0)
        if max_tokens < 1:
            raise ValueError(f"generate({request_id!r}): sampling_params['max_tokens'] must be >= 1, got {max_tokens}")
        loop = asyncio.get_running_loop()
        if self._wake is None or self._task is None or self._task.done():
            self._wake = asyncio.Event()
            self._task = loop.create_task(self._schedule())
        req = GenerationRequest(
            request_id,
            list(prompt_ids),
            max_tokens,
            tuple(sampling_params.get(k) for k in SAMPLING_KEYS),
            loop.create_future(),
        )
        self._pending.append(req)
        self._wake.set()
        return await req.future

    async def _schedule(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            await self._wake.wait()
            for _ in range(self.gather_rounds):
                await asyncio.sleep(0)
            self._wake.clear()
            while self._pending:
                key = self._pending[0].sampling
                batch = [r for r in self._pending if r.sampling == key]
                if self.max_batch_size:
                    batch = batch[: self.max_batch_size]
                taken = {id(r) for r in batch}
                self._pending = [r for r in self._pending if id(r) not in taken]
                sampling = dict(zip(SAMPLING_KEYS, key, strict=True))
                start = time.perf_counter()
                try:
                    outs = await loop.run_in_executor(
                        self._executor,
                        self.generate_batch,
                        [r.prompt_ids for r in batch],
                        [r.max_tokens for r in batch],
                        sampling,
                    )
                    if len(outs) != len(batch):
                        raise RuntimeError(
                            f"the generation engine returned {len(outs)} outputs for {len(batch)} requests"
                        )
                except BaseException as exc:  # noqa: BLE001 - delivered to every waiting trajectory
                    for r in batch:
                        if not r.future.done():
                            r.future.set_exception(exc)
                    continue
                self.stats["batches"] += 1
                self.stats["requests"] += len(batch)
                self.stats["generate_s"] += time.perf_counter() - start
                self.stats["max_batch"] = max(self.stats["max_batch"], len(batch))
                for r, out in zip(batch, outs, strict=True):
                    if not r.future.done():
                        r.future.set_result(out)
                for _ in range(self.gather_rounds):
                    await asyncio.sleep(0)

    def close(self) -> None:
        if self._task is not None and not self._task.done():
            self._task.cancel()
        self._executor.shutdown(wait=False)
