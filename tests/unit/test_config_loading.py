"""RunConfig from YAML + dotted overrides: types checked, unknown keys named."""

import pytest

from d3ray.config import RunConfig
from d3ray.config_loading import ConfigError, apply_overrides, from_dict, load_config, to_dict
from d3ray.schedule.config import RandomScheduleConfig, SequentialScheduleConfig


def test_load_config_yaml_and_overrides_apply_in_order(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text("name: a\ntrain:\n  steps: 50\nschedule:\n  type: sequential\n  L: 4\n")
    cfg = load_config(RunConfig, path, ["--train.steps=200", "--data.train_paths=[x, y]"])
    assert cfg.name == "a"
    assert cfg.train.steps == 200
    assert cfg.data.train_paths == ["x", "y"]
    assert isinstance(cfg.schedule, SequentialScheduleConfig) and cfg.schedule.L == 4


def test_load_config_unknown_nested_key_names_the_path(tmp_path):
    with pytest.raises(ConfigError, match=r"train\.stepz"):
        load_config(RunConfig, None, ["--train.stepz=3"])


def test_load_config_wrong_type_names_key_and_value():
    with pytest.raises(ConfigError, match=r"train\.steps.*'ten'"):
        load_config(RunConfig, None, ["--train.steps=ten"])


def test_load_config_unknown_schedule_type_lists_known():
    with pytest.raises(ConfigError, match=r"schedule\.type.*known:.*random"):
        load_config(RunConfig, None, ["--schedule.type=nope"])


def test_load_config_invalid_value_reports_field_validation():
    with pytest.raises(ConfigError, match="global_batch_size"):
        load_config(RunConfig, None, ["--train.global_batch_size=7"])


def test_config_round_trip_through_dict_is_identity():
    cfg = load_config(
        RunConfig, None, ["--schedule.type=random", "--schedule.L=5", "--model.overrides={n_layer: 3}"]
    )
    again = from_dict(RunConfig, to_dict(cfg))
    assert again == cfg
    assert isinstance(again.schedule, RandomScheduleConfig)


def test_apply_overrides_rejects_value_without_equals():
    with pytest.raises(ConfigError, match="key.path=value"):
        apply_overrides({}, ["--train.steps"])


def test_load_config_plain_string_selects_a_choice_with_its_defaults(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text("schedule:\n  type: d3\n  placement: actors\n  influence:\n    estimator: gnb\n")

    from_file = load_config(RunConfig, path)
    from_cli = load_config(RunConfig, None, ["--schedule.type=d3", "--schedule.placement=actors",
                                            "--schedule.influence.estimator=fisher"])

    assert type(from_file.schedule.influence.estimator).__name__ == "GnbConfig"
    assert from_file.schedule.influence.estimator.samples == 1
    assert type(from_cli.schedule.influence.estimator).__name__ == "FisherConfig"


def test_load_config_sub_key_override_after_plain_string_keeps_the_named_choice(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text("schedule:\n  type: d3\n  placement: actors\n  influence:\n    estimator: hutchinson\n")

    cfg = load_config(RunConfig, path, ["--schedule.influence.estimator.probes=4"])

    assert cfg.schedule.influence.estimator.type_name == "hutchinson"
    assert cfg.schedule.influence.estimator.probes == 4


def test_load_config_plain_string_of_unknown_choice_lists_known():
    with pytest.raises(ConfigError, match=r"estimator\.type.*known:.*fisher.*hutchinson"):
        load_config(RunConfig, None, ["--schedule.type=d3", "--schedule.influence.estimator=hessian"])


def test_load_config_choice_knob_of_another_choice_is_an_unknown_key():
    with pytest.raises(ConfigError, match=r"unknown key 'schedule\.influence\.estimator\.probes'"):
        load_config(RunConfig, None, ["--schedule.type=d3", "--schedule.influence.estimator=fisher",
                                      "--schedule.influence.estimator.probes=2"])


@pytest.mark.parametrize(
    "overrides, dtype",
    [
        (["--schedule.type=d3", "--schedule.placement.type=actors"], "bfloat16"),  # the influence actors take 16 bits
        (["--schedule.type=d3", "--schedule.placement={type: actors, snapshot_dtype: float32}"], "float32"),
        (["--schedule.type=loss_reweight", "--schedule.order.type=d3"], "bfloat16"),  # only d3 reads weights
        (["--schedule.type=loss", "--schedule.order.type=d3"], "float32"),  # the loss scorer reads them too
        (["--schedule.type=curriculum"], "float32"),
    ],
)
def test_snapshot_dtype_is_16_bit_only_when_every_weights_reader_takes_it(overrides, dtype):
    assert load_config(RunConfig, None, overrides).schedule.trainer_requests().snapshot.dtype == dtype


def test_the_no_argument_d3_publishes_no_snapshot_its_trainers_score_the_potential():
    requests = load_config(RunConfig, None, ["--schedule.type=d3"]).schedule.trainer_requests()
    assert requests.snapshot is None and requests.sketch is not None and requests.sketch.influence.potential_alone


def test_bad_snapshot_dtype_names_the_field():
    from d3ray.schedule.order.d3 import ActorsPlacement

    with pytest.raises(ConfigError, match=r"schedule\.placement\.snapshot_dtype.*'float16'"):
        load_config(RunConfig, None, ["--schedule.type=d3", "--schedule.placement={type: actors, snapshot_dtype: float16}"])
    with pytest.raises(ValueError, match=r"schedule\.placement\.snapshot_dtype='float16' must be one of bfloat16, float32"):
        ActorsPlacement(snapshot_dtype="float16")
