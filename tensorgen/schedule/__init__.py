"""Schedules: States made of Steps, and their lowering to loop IR."""

from tensorgen.schedule.stage import Iterator, Stage
from tensorgen.schedule.state import State
from tensorgen.schedule.steps import STEP_TYPES, Step, register_step

__all__ = ["Iterator", "STEP_TYPES", "Stage", "State", "Step", "register_step"]
