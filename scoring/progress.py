"""What han-score shows: the progress bar and the summary."""

from __future__ import annotations

from typing import Any


def make_progress(quiet: bool) -> Any:
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        ProgressColumn,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )
    from rich.text import Text

    class RateColumn(ProgressColumn):
        def render(self, task: Any) -> Text:
            speed = task.finished_speed or task.speed
            return Text(f"{speed:,.0f} docs/s" if speed else "- docs/s", style="progress.data.speed")

    return Progress(
        TextColumn("[progress.description]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        RateColumn(),
        TimeElapsedColumn(),
        TextColumn("ETA"),
        TimeRemainingColumn(),
        console=Console(stderr=True),
        disable=quiet,
    )


def print_summary(s: dict[str, Any]) -> None:
    from rich.console import Console

    console = Console(stderr=True, highlight=False)
    shard = f" (shard {s['shard'][0]} of {s['shard'][1]})" if s["shard"][1] > 1 else ""
    labels = ", ".join(f"{label} {n:,}" for label, n in s["labels"].items()) or "-"
    lines = [
        f"han-score: wrote {s['output']}{shard}",
        f"  rows read   {s['rows_read']:>12,}",
        f"  scored      {s['scored']:>12,}",
        f"  failed      {s['failed']:>12,}  (details in {s['errors_file']})"
        if s["failed"]
        else f"  failed      {s['failed']:>12,}",
        f"  labels      {labels}",
        f"  wall time   {s['wall_s']:>11.1f}s  "
        f"({s['rows_this_run']:,} rows this run, {s['docs_per_s'] or 0:,.0f} docs/s)",
    ]
    if s["resumed_from_row"] is not None or s["runs"] > 1:
        lines.append(
            f"  resumed     from input row {s['resumed_from_row'] or 0:,}; {s['runs']} runs, "
            f"{s['total_elapsed_s']:.1f}s in all"
        )
    console.print("\n".join(lines), markup=False)
