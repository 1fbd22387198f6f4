"""Chapter 7, a config that grows with the package: `extends_config` and `complete_config`.

Claims: chapter 7's `SchedulerConfig` (`scheduler/config.py`) holds only chapter 7's settings, and
the one every front end imports (`minisgl.scheduler.SchedulerConfig`) adds those of the modules that
bring them (prefix reuse, overlap, lpm-aged's bound), after the base's fields; a part's check runs
after the base's; a part may not declare a setting the config already has; the complete config
pickles (as the server's scheduler process and the tensor-parallel ranks receive it) and
`dataclasses.replace` runs every check again; `--schedule-policy` offers the policies registered
when the command line is built, not those registered when `config.py` was imported.
"""

from __future__ import annotations

import pickle
from dataclasses import FrozenInstanceError, dataclass, field, fields, replace
from typing import List

import pytest

from helpers import TINY_LLAMA
from minisgl.engine import EngineConfig
from minisgl.scheduler import SchedulerConfig, config
from minisgl.scheduler.prefill import SCHEDULE_POLICIES, FirstComeFirstServed, register_schedule_policy
from minisgl.utils.settings import complete_config, config_parts, extends_config

CHAPTER_7 = ["engine", "max_extend_tokens", "schedule_policy", "offline", "check_integrity"]
CALLS: List[str] = []  # the order in which the toy config's checks ran


@dataclass(frozen=True)
class Toy:
    """a base config"""

    size: int = 1

    def __post_init__(self) -> None:
        CALLS.append("base")
        if self.size < 1:
            raise ValueError("size must be >= 1")


@extends_config(Toy)
@dataclass(frozen=True)
class ToyColour:
    colour: str = "red"

    def __post_init__(self) -> None:
        super().__post_init__()
        CALLS.append("colour")
        if self.colour not in ("red", "blue"):
            raise ValueError("colour must be red or blue")


@extends_config(Toy)
@dataclass(frozen=True)
class ToyShape:  # no check of its own
    shape: str = field(default="round", metadata={"help": "the shape"})


ToyBase = Toy
Toy = complete_config(ToyBase, __name__)  # bound under the base's name, as it says it is: so that it pickles


def test_chapter_7_declares_its_own_settings_and_the_modules_add_theirs():
    assert [f.name for f in fields(config.SchedulerConfig)] == CHAPTER_7
    assert [f.name for f in fields(SchedulerConfig)] == CHAPTER_7 + ["prefix_cache", "lpm_max_wait", "overlap"]
    owners = {f.name: part.__module__ for part in config_parts(config.SchedulerConfig) for f in fields(part)}
    assert owners == {"prefix_cache": "minisgl.scheduler.prefix", "overlap": "minisgl.scheduler.overlap",
                      "lpm_max_wait": "minisgl.scheduler.aging"}
    assert issubclass(SchedulerConfig, config.SchedulerConfig) and SchedulerConfig.__qualname__ == "SchedulerConfig"
    with pytest.raises(TypeError, match="overlap"):
        config.SchedulerConfig(overlap=False)  # the base alone has no such setting


def test_the_parts_fields_follow_the_bases_and_their_checks_run_after_its_check():
    assert [f.name for f in fields(Toy)] == ["size", "colour", "shape"]
    CALLS.clear()
    toy = Toy(size=2, colour="blue")
    assert (toy.size, toy.colour, toy.shape) == (2, "blue", "round") and CALLS == ["base", "colour"]
    CALLS.clear()
    with pytest.raises(ValueError, match="size must be"):
        Toy(size=0, colour="green")  # the base's check speaks first
    assert CALLS == ["base"]
    with pytest.raises(FrozenInstanceError):
        toy.colour = "red"  # type: ignore[misc]


def test_the_schedulers_checks_run_base_first():
    engine = EngineConfig(model_path=str(TINY_LLAMA), device="cpu")
    with pytest.raises(ValueError, match="max_extend_tokens must be >= 1"):
        SchedulerConfig(engine=engine, max_extend_tokens=0, prefix_cache="bogus")
    with pytest.raises(ValueError, match="prefix_cache must be one of naive, radix"):
        SchedulerConfig(engine=engine, prefix_cache="bogus")
    with pytest.raises(ValueError, match="needs a prefix cache that keeps prefixes"):
        SchedulerConfig(engine=engine, schedule_policy="lpm", prefix_cache="naive")  # lpm's own check
    with pytest.raises(ValueError, match="lpm_max_wait is read only by schedule_policy lpm-aged"):
        SchedulerConfig(engine=engine, lpm_max_wait=3)


def test_a_part_may_not_declare_a_setting_the_config_has():
    @dataclass(frozen=True)
    class Again:
        size: int = 2

    @dataclass(frozen=True)
    class ColourAgain:
        colour: str = "blue"

    base = ToyBase
    with pytest.raises(TypeError, match="declares size, which Toy already has"):
        extends_config(base)(Again)
    with pytest.raises(TypeError, match="declares colour"):
        extends_config(base)(ColourAgain)
    with pytest.raises(TypeError, match="declares overlap, which SchedulerConfig already has"):
        extends_config(config.SchedulerConfig)(dataclass(frozen=True)(type("Overlap", (), {"__annotations__": {
            "overlap": "bool"}, "overlap": True})))
    with pytest.raises(TypeError, match="must be a frozen dataclass"):
        extends_config(base)(dataclass(type("Loose", (), {"__annotations__": {"loose": "int"}, "loose": 0})))
    assert [f.name for f in fields(complete_config(base, __name__))] == ["size", "colour", "shape"]  # none registered


def test_the_complete_config_pickles_and_replace_checks_again():
    toy = Toy(size=3, shape="square")
    assert pickle.loads(pickle.dumps(toy)) == toy and type(pickle.loads(pickle.dumps(toy))) is Toy
    cfg = SchedulerConfig(engine=EngineConfig(model_path=str(TINY_LLAMA), device="cpu"), schedule_policy="lpm-aged",
                          lpm_max_wait=4, overlap=False)
    back = pickle.loads(pickle.dumps(cfg))
    assert back == cfg and type(back) is SchedulerConfig
    assert (back.prefix_cache, back.lpm_max_wait, back.overlap) == ("radix", 4, False)
    assert replace(cfg, overlap=True).overlap is True and replace(cfg, overlap=True).lpm_max_wait == 4
    with pytest.raises(ValueError, match="lpm_max_wait must be a whole number"):
        replace(cfg, lpm_max_wait=-1)
    with pytest.raises(ValueError, match="keeps prefixes"):
        replace(cfg, prefix_cache="naive")


def test_schedule_policy_choices_are_read_when_the_command_line_is_built():
    meta = {f.name: f for f in fields(SchedulerConfig)}["schedule_policy"].metadata
    assert meta["choices"] == ("fcfs", "lpm", "lpm-aged") and "lpm-aged: " in meta["help"]
    register_schedule_policy("arrival")(type("Arrival", (FirstComeFirstServed,), {"summary": "arrival: fcfs again"}))
    try:
        assert meta["choices"][-1] == "arrival" and meta["help"].endswith("arrival: fcfs again")
    finally:
        del SCHEDULE_POLICIES["arrival"]
    assert "arrival" not in meta["choices"]
