"""The one place for the process environment every entry point wants: offline, no telemetry.

Nothing here downloads models or data at run time, and BentoML must not phone home; the
entry points (han-train, han-score, the service, ``make run``) call ``apply_defaults`` first.
A value the user already set wins.
"""

from __future__ import annotations

import os

DEFAULTS = {
    "BENTOML_DO_NOT_TRACK": "true",
    "HF_DATASETS_OFFLINE": "1",
    "HF_HUB_OFFLINE": "1",
    "TOKENIZERS_PARALLELISM": "false",
    # Ray (han-score --engine ray): no usage stats sent, no dashboard metrics exporter.
    "RAY_USAGE_STATS_ENABLED": "0",
    "RAY_ENABLE_RECORD_ACTOR_TASK_LOGGING": "0",
}


def apply_defaults(env: dict[str, str] | None = None) -> dict[str, str]:
    """Set each default in ``env`` (``os.environ`` if None) unless already set; returns ``env``."""
    target = os.environ if env is None else env
    for key, value in DEFAULTS.items():
        target.setdefault(key, value)
    return target  # type: ignore[return-value]


def usable_cores() -> int:
    """The cores this process may run on (its CPU affinity, e.g. under ``taskset`` or a container)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1
