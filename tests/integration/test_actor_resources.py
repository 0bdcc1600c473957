"""Scoring and influence actors size themselves from their Ray reservation (d3ray/influence/resources.py):
an actor that reserved 2 CPUs and no GPU runs 2 torch threads on the CPU (the scorer used to force one
thread whatever it reserved), and reads its reservation from Ray, not from the node."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.ray


def test_actors_without_gpu_reservation_use_cpu_and_their_reserved_threads(ray_cluster):
    ray = ray_cluster

    @ray.remote
    class Probe:
        def report(self) -> dict:
            import torch
            import transformers

            from d3ray.influence.config import InfluenceConfig
            from d3ray.influence.resources import actor_resources
            from d3ray.influence.worker import InfluenceWorker
            from d3ray.model import ModelConfig, model_config_dict
            from d3ray.schedule.scoring import ScoringWorker

            model = ModelConfig()
            scorer = ScoringWorker(model_config_dict(model, 64, 8, 0), model)
            scorer_threads = torch.get_num_threads()
            config = transformers.GPT2Config(n_layer=1, n_embd=16, n_head=2, vocab_size=64, n_positions=16).to_dict()
            influence = InfluenceWorker(config, InfluenceConfig(device="auto"))
            return {"resources": actor_resources(), "scorer": str(scorer.device),
                    "scorer_model": str(next(scorer.model.parameters()).device), "scorer_threads": scorer_threads,
                    "influence": str(influence.device), "influence_threads": torch.get_num_threads()}

    out = ray.get(Probe.options(num_cpus=2).remote().report.remote())
    assert out["resources"].get("CPU") == 2.0 and not out["resources"].get("GPU")
    assert out["scorer"] == out["scorer_model"] == "cpu" and out["influence"] == "cpu"
    assert out["scorer_threads"] == 2 and out["influence_threads"] == 2
