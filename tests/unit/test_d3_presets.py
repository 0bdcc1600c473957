"""The two D3 configurations by name (issue 47.1): the default, an order by the AdamW drift potential (a sort,
no search), and ``schedule.type=d3_paper``, the paper's pipeline; keys that contradict a preset are refused in
one line naming both, and the other departures from the paper's keys are listed for the run's log."""

from __future__ import annotations

import argparse

import pytest

from d3ray.config import RunConfig
from d3ray.config_loading import ConfigError, load_config


def _schedule(*overrides: str):
    return load_config(RunConfig, None, list(overrides)).schedule


def test_d3_paper_preset_sets_the_papers_six_keys():
    s = _schedule("--schedule.type=d3_paper")
    assert s.influence.estimator.type_name == "hutchinson"
    assert s.influence.preconditioner == "none"  # the plain step −γ·∇ℓ
    assert s.influence.sketch.type_name == "sjlt" and s.influence.sketch.k == 3500
    assert s.L == 60 and s.solver.type_name == "rsr"
    assert s.placement.type_name == "actors" and s.staleness == 1  # influence and solver actors, one chunk ahead
    assert s.first_chunk == "stream"  # one chunk ahead: chunk 0 trains while chunk 1 is scored
    assert not s.sorts_potential and s.actor_requests()[1].role == "solver"
    assert s.preset_departures() == []


def test_the_default_d3_sorts_by_the_drift_potential_without_a_solver_actor():
    s = _schedule()
    assert s.type_name == "d3" and s.influence.potential_alone and s.sorts_potential
    assert s.placement.type_name == "in_trainer" and s.actor_requests() == []
    assert "AdamW drift potential" in (type(s).__doc__ or "").split(".")[0]


def test_d3_paper_override_wins_and_the_departure_is_named():
    s = _schedule("--schedule.type=d3_paper", "--schedule.L=16", "--schedule.solver.type=ils",
                  "--schedule.influence.sample_fraction=0.5")
    assert s.influence.estimator.type_name == "hutchinson"  # a nested override keeps the preset's other keys
    assert s.preset_departures() == ["schedule.L=16 (paper: 60)", "schedule.solver.type=ils (paper: rsr)"]


@pytest.mark.parametrize(("overrides", "keys"), [
    (["--schedule.placement.type=in_trainer"], ("schedule.type=d3_paper", "schedule.placement.type=in_trainer")),
    (["--schedule.influence.estimator.type=drift", "--schedule.influence.preconditioner=adam"],
     ("schedule.solver.type=rsr", "schedule.influence.estimator")),
])
def test_d3_paper_refuses_a_contradicting_key_in_one_line_naming_both(overrides, keys):
    with pytest.raises(ConfigError) as err:
        _schedule("--schedule.type=d3_paper", *overrides)
    message = str(err.value)
    assert "\n" not in message and all(k in message for k in keys), message


def test_schedulers_d3_lists_the_presets_and_what_each_sets(capsys):
    from d3ray.schedule.command import run

    run(argparse.Namespace(name="d3"))
    out = capsys.readouterr().out
    assert "presets:" in out and "d3_paper" in out and "schedule.solver.type=rsr" in out
    assert "schedule.influence.sketch.k=3500" in out and "ils" in out  # ILS: stronger than the paper's
    assert "schedule.placement.type=in_trainer" in out and "schedule.placement.type=actors" in out
    placements = out.split("placements:", 1)[1]  # each placement with its first doc line and its keys
    assert "  actors: Influence actors" in placements and "  in_trainer: The trainer ranks" in placements
    assert "num_gpus: 0.0" in placements and "snapshot_dtype: bfloat16" in placements
