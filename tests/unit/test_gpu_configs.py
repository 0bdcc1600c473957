"""The realistic GPU config and the LLaMA-Factory / DataFlex page: the config loads and fits the cluster it
is written for; every d3ray key the page names exists in the config tree (so the page cannot drift)."""

from __future__ import annotations

import dataclasses
import re
import types
import typing

from d3ray.config import RunConfig
from d3ray.config_loading import load_config
from d3ray.registry import ChoiceConfig
from d3ray.run.preflight import cluster_problems, environment_problems
from d3ray.schedule.config import ScheduleConfig
from tests.conftest import REPO

GPU_CONFIG = REPO / "jobs" / "configs" / "sft_qwen_lora_gpu.yaml"
PAGE = REPO / "docs" / "coming_from_llamafactory.md"


def test_gpu_sft_config_loads_and_fits_the_four_gpu_node_it_is_written_for():
    cfg = load_config(RunConfig, GPU_CONFIG)
    assert cfg.model.lora is not None and cfg.model.lora.target_modules == []
    assert (cfg.train.zero_stage, cfg.train.precision, cfg.model.attn_implementation) == (2, "bf16", "sdpa")
    assert cluster_problems(cfg, [4.0]) == []
    assert cluster_problems(cfg, [2.0]) != []
    assert environment_problems(cfg, importable=lambda name: True) == []


def _classes(tp: typing.Any) -> list[type]:
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        return [c for arg in typing.get_args(tp) for c in _classes(arg)]
    if isinstance(tp, type) and issubclass(tp, ChoiceConfig) and ChoiceConfig in tp.__bases__:
        return [tp.lookup(name) for name in tp.known()]
    return [tp] if dataclasses.is_dataclass(tp) else []


def key_exists(key: str) -> bool:
    """``a.b.c`` names a field of RunConfig's tree (in any registered type of a choice family)."""
    level = [RunConfig]
    for part in key.split("."):
        if part == "type" and level and all(getattr(c, "type_name", "") for c in level):
            return True  # a choice family's `type:` key
        nxt = []
        for cls in level:
            hints = typing.get_type_hints(cls)
            if part in hints and any(f.name == part for f in dataclasses.fields(cls)):
                nxt.extend(_classes(hints[part]) or [None])
        if not nxt:
            return False
        level = [c for c in nxt if c is not None]
    return True


def page_keys() -> list[tuple[str, str]]:
    """(key, value) of every backticked d3ray config key in the d3ray column of the page's tables."""
    found = []
    for line in PAGE.read_text().splitlines():
        cells = line.split("|")
        if len(cells) < 4 or set(cells[2].strip()) <= {"-"}:
            continue
        for span in re.findall(r"`([^`]+)`", cells[2]):
            m = re.fullmatch(r"([a-z_]+(?:\.[a-z_]+)*)(?:: (.*))?", span)
            if m and ("." in m[1] or m[1] in {"seed", "name", "output_dir"}):
                found.append((m[1], m[2] or ""))
    return found


def test_every_d3ray_key_on_the_llamafactory_page_exists():
    keys = page_keys()
    assert len(keys) > 40
    missing = [k for k, _ in keys if not key_exists(k)]
    assert missing == []
    for key, value in keys:
        sub = re.fullmatch(r"\{([a-z_, ]+)\}", value)
        if sub:  # `model.lora: {r, alpha, dropout}`: each sub-key exists
            assert all(key_exists(f"{key}.{s.strip()}") for s in sub[1].split(",")), (key, value)
        if key == "schedule.type":
            assert value in ScheduleConfig.known(), value


def test_page_scheduler_names_are_registered():
    text = PAGE.read_text()
    listed = re.findall(r"(?:selectors|mixers): ((?:`[a-z_]+`(?:, )?)+)", text)
    names = {n for group in listed for n in re.findall(r"`([a-z_]+)`", group)}
    assert names and names <= set(ScheduleConfig.known())


def test_gpt2_variance_reduced_comparison_builds_every_run_and_fits_one_gpu(tmp_path):
    """jobs/configs/compare_pretrain_gpt2_vr.yaml (issue 28's 124M sizing): every trunk and arm run builds,
    and each fits the one H200 it is sized for (trainer 0.75 GPU + the scheduler's 0.25 actor)."""
    from d3ray.lab.compare.config import CompareConfig
    from d3ray.lab.compare.plan import build_plan

    cfg = load_config(CompareConfig, REPO / "jobs" / "configs" / "compare_pretrain_gpt2_vr.yaml",
                      [f"--output_dir={tmp_path}"])
    plan = build_plan(cfg)
    runs = [r for r in plan.runs] + list(plan.trunks.values())
    assert len(runs) == 12 * 8 + 8 and all(r.config is not None for r in runs)
    for run in runs:
        assert cluster_problems(run.config, [1.0]) == [], run.name
    assert {r.config.model.preset for r in runs} == {"gpt2-124m"}
