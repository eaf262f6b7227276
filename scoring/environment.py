"""The environment variables han-score sets for the processes it starts: the one module of scoring that
touches the environment (han.environment holds what every entry point shares)."""

from __future__ import annotations

import os

# Ray started here (--engine ray without a Ray session already connected); a value the user set wins.
RAY_DEFAULTS = {
    "RAY_USAGE_STATS_ENABLED": "0",  # no usage statistics sent
    "RAY_ENABLE_RECORD_ACTOR_TASK_LOGGING": "0",  # no dashboard metrics exporter
    # The driver's core worker logs errors to the terminal, one of them on every run of Ray Data's
    # actor pools (ray-project/ray#53727: constructor arguments in the object store).
    "RAY_BACKEND_LOG_LEVEL": "fatal",
    # No worker per CPU before any task asks: they compete with the actors' start-up, and Ray Data
    # starts its own workers anyway.
    "RAY_prestart_worker_first_driver": "0",
}
# Local Ray only: its workers run at nice 15 by default, and here they are the job: at 15 they starve
# beside any other busy process (the local engine's workers run at the normal priority too).
LOCAL_RAY_DEFAULTS = {"RAY_worker_niceness": "0"}
# The local engine's worker pool: multiprocessing's resource tracker warns at exit about a semaphore of
# a worker killed while importing, then finds it already removed: noise, not a leak.
QUIET_RESOURCE_TRACKER = "ignore:resource_tracker:UserWarning"


def apply_ray_defaults(local: bool) -> None:
    """Before ``ray.init``: ``RAY_DEFAULTS``, and ``LOCAL_RAY_DEFAULTS`` when Ray starts on this machine."""
    for key, value in (RAY_DEFAULTS | LOCAL_RAY_DEFAULTS if local else RAY_DEFAULTS).items():
        os.environ.setdefault(key, value)


def quiet_resource_tracker() -> None:
    """Add ``QUIET_RESOURCE_TRACKER`` to ``PYTHONWARNINGS``, which the worker pool's processes inherit."""
    filters = os.environ.get("PYTHONWARNINGS", "")
    if QUIET_RESOURCE_TRACKER not in filters.split(","):
        os.environ["PYTHONWARNINGS"] = f"{filters},{QUIET_RESOURCE_TRACKER}" if filters else QUIET_RESOURCE_TRACKER
