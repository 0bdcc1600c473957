"""The checkpoint cadence (d3ray/train/checkpoint.py ``checkpoint_due``): every N chunks and/or every T
seconds, only at chunk boundaries (where the data cursor and the schedule state are exact), always at the end."""

from __future__ import annotations

import pytest

from d3ray.config import RunConfig
from d3ray.config_loading import ConfigError, load_config
from d3ray.train.checkpoint import checkpoint_due


def due(next_chunk: int, every_chunks: int = 1, since: float = 0.0, every_sec: float = 0.0,
        chunk_done: bool = True, finished: bool = False) -> bool:
    return checkpoint_due(finished=finished, chunk_done=chunk_done, next_chunk=next_chunk, every_chunks=every_chunks,
                          seconds_since_last=since, every_sec=every_sec)


def test_checkpoint_due_default_every_chunk():
    assert [due(c) for c in range(1, 5)] == [True, True, True, True]


def test_checkpoint_due_every_two_chunks_counts_from_run_start():
    assert [due(c, every_chunks=2) for c in range(1, 7)] == [False, True, False, True, False, True]


def test_checkpoint_due_seconds_add_to_the_chunk_cadence():
    assert due(3, every_chunks=100, since=61.0, every_sec=60.0)
    assert not due(3, every_chunks=100, since=59.0, every_sec=60.0)
    assert due(100, every_chunks=100, since=1.0, every_sec=60.0)


def test_checkpoint_due_never_inside_a_chunk_even_when_time_is_up():
    assert not due(4, every_chunks=1, since=1e6, every_sec=1.0, chunk_done=False)


def test_checkpoint_due_always_at_the_end_even_inside_a_chunk():
    assert due(3, every_chunks=100, chunk_done=False, finished=True)


def test_checkpoint_every_sec_negative_refused():
    with pytest.raises(ConfigError, match=r"train\.checkpoint_every_sec=-1"):
        load_config(RunConfig, None, ["--train.checkpoint_every_sec=-1"])


def test_checkpoint_due_by_steps_at_the_chunk_that_crosses_each_multiple():
    """Chunks of 3 steps, a checkpoint every 5 steps: the chunks ending at steps 6, 12 (crossing 5 and 10)
    and 15 (reaching 15) checkpoint; the chunk cadence is replaced, not added to."""
    last, fired = 0, []
    for end_step in range(3, 19, 3):
        if checkpoint_due(finished=False, chunk_done=True, next_chunk=end_step // 3, every_chunks=1,
                          seconds_since_last=0.0, every_sec=0.0, step=end_step, last_checkpoint_step=last,
                          every_steps=5):
            fired.append(end_step)
            last = end_step
    assert fired == [6, 12, 15]


@pytest.mark.parametrize("override, message", [
    ("--train.checkpoint_every_steps=-5", r"train\.checkpoint_every_steps=-5 must be >= 0"),
    ("--train.checkpoint_upload=later", r"train\.checkpoint_upload='later' must be one of auto, direct, async, sync"),
])
def test_checkpoint_cadence_and_upload_bad_values_refused(override, message):
    with pytest.raises(ConfigError, match=message):
        load_config(RunConfig, None, [override])


def test_resume_of_lora_adapters_on_another_base_refused_naming_both(tmp_path):
    """A LoRA checkpoint without its frozen base resumes only on the base it names (the adapters are
    deltas of that base): another ``model.pretrained_path`` is refused before DeepSpeed loads anything."""
    import json

    from d3ray.train.checkpoint import load_checkpoint

    (tmp_path / "model.json").write_text(json.dumps({"config": {}, "lora": {"r": 4}, "base_model": "/models/base-a"}))
    with pytest.raises(ValueError, match="trained on the base model /models/base-a, but this run's "
                                         "model.pretrained_path is /models/base-b"):
        load_checkpoint(None, tmp_path, rank=0, base_model="/models/base-b")
