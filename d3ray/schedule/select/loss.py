"""The loss selector: keep the window's candidates of highest loss under the current weights."""

from __future__ import annotations

from typing import Any

from d3ray.data.chunker import Chunk
from d3ray.schedule.scheduler import BuildContext, SubmitContext
from d3ray.schedule.scoring import start_scorer
from d3ray.schedule.select.base import SelectHead


class LossSelectHead(SelectHead):
    def __init__(self, cfg: Any, ctx: BuildContext) -> None:
        super().__init__(cfg, ctx.seed, "loss")
        self.scorer = start_scorer(ctx, None, cfg.scorer_num_cpus, cfg.scorer_num_gpus, "loss-scorer")

    def score(self, chunk: Chunk, batch_refs: tuple, context: SubmitContext) -> Any:
        if context.weights is None:
            raise ValueError("no weights snapshot published in time")
        return self.scorer.losses.remote(context.weights, list(batch_refs))

    def actors(self) -> dict[str, list[Any]]:
        return {"scorer": [self.scorer]}

    def close(self) -> None:
        import ray

        ray.kill(self.scorer)
