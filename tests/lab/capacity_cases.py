"""Hand-made measurements for the capacity-model tests (the numbers are chosen, not measured)."""

from __future__ import annotations

from d3ray.lab.bench.capacity_measure import AllReduceTiming, MeasuredConstants, ModelTiming, SnapshotTiming

# GPT-2 with l = 1, h = 4, a = 2, V = 10, T = 3: N = 304, F = 1896 FLOPs per token (test_capacity_model.py).
CONFIG = {"model_type": "gpt2", "n_layer": 1, "n_embd": 4, "n_head": 2, "n_inner": 16, "vocab_size": 10,
          "n_positions": 3, "tie_word_embeddings": True}


def hand_measured(device: str = "cpu (test)") -> MeasuredConstants:
    """The hand GPT-2 timed at 2 s a step and 0.5 s an influence batch (0.2 s of it forward+backward), a
    1,000-byte snapshot (put 1 s, get 0.5 s), a 2-process all-reduce (10 floats 4 ms, 1,000 floats 10 ms)."""
    timing = ModelTiming(
        model="hand", preset="hand", config=CONFIG, params=304, batch_size=8, seq_len=3, scored_sequences=1,
        step_sec=2.0, influence_sec_per_batch=0.5, stats_sec_per_batch=0.2, potential_sec_per_batch=0.01, drift_sec=0.02,
        load_sec=0.01,
        repeats={},
    )
    return MeasuredConstants(
        device=device, threads=1, memory_bytes=1e9, copy_bytes_per_sec=1e9, models=[timing],
        snapshot=SnapshotTiming(bytes=1000, put_sec=1.0, get_sec=0.5),
        allreduce=AllReduceTiming(world_size=2, sec_by_floats={10: 0.004, 1000: 0.01}), notes=[],
    )
