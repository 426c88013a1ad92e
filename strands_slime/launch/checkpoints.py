"""How often the run checkpoints, which checkpoints Megatron keeps, and the disk they need.

A checkpoint of Qwen3-8B is ~115 GB (bf16 weights, fp32 master weights, two Adam moments). The cadence
keeps at most ``SAVE_HOURS`` of steps at risk: from the pilot's measured p90 step time, else from the
user's ``STEP_MINUTES`` estimate; a pilot itself saves once, halfway, so the save is timed.
"""

from __future__ import annotations

import math
import shutil
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from strands_slime.launch.settings import LaunchSettings

GIB = 2**30


@dataclass(frozen=True)
class Cadence:
    """Steps between saves, and the one line that says where that number came from (None: nothing to say)."""

    interval: int
    why: str | None = None
    problem: str | None = None
    """Set when no step time sizes the cadence: a real run refuses; a dry run shows ``interval`` 1."""


def job_steps(settings: LaunchSettings) -> int:
    """Steps of the job this launch submits: the pilot's, or the run's."""
    return settings.pilot_steps if settings.pilot else settings.num_rollout


def save_cadence(settings: LaunchSettings, pilot_settings: Mapping[str, str]) -> Cadence:
    """Steps between checkpoints: at most ``SAVE_HOURS`` of steps, never more than the job has."""
    steps = job_steps(settings)
    hours = float(settings.save_hours)
    if settings.pilot:
        return Cadence(settings.pilot_steps // 2)
    if settings.save_interval is not None:
        return Cadence(
            min(settings.save_interval, steps),
            f"checkpoints every {settings.save_interval} steps (SAVE_INTERVAL)",
        )
    if Path(settings.pilot_json).is_file():
        from strands_slime.launch.pilot import PilotMismatch, save_interval_from_pilot

        try:
            interval, step_p90 = save_interval_from_pilot(
                Path(settings.pilot_json), hours, settings.num_rollout, pilot_settings
            )
        except PilotMismatch as error:
            return Cadence(1, problem=f"PILOT_JSON: {error} (or set SAVE_INTERVAL)")
        return Cadence(
            min(interval, steps),
            f"checkpoints every {interval} steps: {settings.save_hours} h at the pilot's p90 step time of "
            f"{step_p90:.1f} s ({settings.pilot_json})",
        )
    if settings.step_minutes:
        interval = max(1, int(hours * 60 / float(settings.step_minutes)))
        return Cadence(
            min(interval, steps),
            f"checkpoints every {interval} steps: {settings.save_hours} h at STEP_MINUTES={settings.step_minutes} "
            "(an estimate; --pilot measures it)",
        )
    return Cadence(
        1,
        problem=(
            f"no step time to size checkpoints by ({settings.save_hours} h of steps at most): run --pilot first "
            f"(it writes {settings.pilot_json}), or set STEP_MINUTES (your estimate) or SAVE_INTERVAL"
        ),
    )


def retain_interval(steps: int, save_interval: int) -> int:
    """Megatron's ``--save-retain-interval`` that keeps only the latest checkpoint.

    Megatron deletes the previous checkpoint once the next is written, unless its iteration is a
    multiple of this (which must be a multiple of ``--save-interval``). slime saves iteration
    ``k * save_interval - 1``, never such a multiple (for intervals above 1), so only the latest stays;
    one interval past the job's end makes that hold for an interval of 1 too.
    """
    return (steps // save_interval + 1) * save_interval


def free_gb(path: str, disk_usage: Callable[[str], int] | None = None) -> int | None:
    """GB free on the filesystem that holds ``path`` (its nearest existing folder); None if unknown."""
    existing = Path(path)
    while not existing.is_dir() and existing != existing.parent:
        existing = existing.parent
    try:
        free = disk_usage(str(existing)) if disk_usage else shutil.disk_usage(existing).free
    except OSError:
        return None
    return free // GIB


def room_checks(
    settings: LaunchSettings, save_interval: int, disk_usage: Callable[[str], int] | None = None
) -> tuple[list[str], list[str]]:
    """(problems, notes): the checkpoint folder holds the checkpoints kept at once; logs and Ray have room."""
    steps = job_steps(settings)
    size = settings.checkpoint_gb
    if settings.keep_checkpoints == "latest":
        # Megatron writes the next checkpoint before it deletes the previous one: two at once.
        kept = 2
        why = f"two {size} GB checkpoints at once: the next is written before the previous goes"
    else:
        kept = math.ceil(steps / save_interval)
        why = f"KEEP_CHECKPOINTS=all: {kept} checkpoints of {size} GB; KEEP_CHECKPOINTS=latest needs two"
    wanted = [
        ("PILOT_DIR", settings.pilot_dir, kept * size, f"the pilot's own checkpoint: {why}")
        if settings.pilot
        else ("SAVE_DIR", settings.save_dir, kept * size, why),
        ("RUN_DIR", settings.run_dir, 1, "logs and run state"),
        ("note: RAY_TEMP_DIR", settings.ray_temp_dir, 20, "Ray's session logs and object spilling"),
    ]
    problems: list[str] = []
    notes: list[str] = []
    for what, path, need, reason in wanted:
        free = free_gb(path, disk_usage)
        if free is None:
            notes.append(f"note: cannot read the free space under {path}; {what} needs ~{need} GB ({reason})")
        elif free < need:
            if what.startswith("note: "):
                notes.append(
                    f"note: {what.removeprefix('note: ')} ({path}) has {free} GB free, less than {need} GB ({reason})"
                )
            else:
                problems.append(f"{what} ({path}) has {free} GB free, less than {need} GB ({reason})")
    if len(settings.ray_temp_dir) > 40:
        notes.append(
            f"note: RAY_TEMP_DIR ({settings.ray_temp_dir}) is {len(settings.ray_temp_dir)} characters: Ray's socket "
            "paths under it may pass the 107-byte limit; keep it under 40"
        )
    return problems, notes
