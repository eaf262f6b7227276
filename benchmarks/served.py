"""A ``bentoml serve`` of the service under measurement, for the serving benchmarks: its processes'
CPU time and memory, its metrics, and how its workers share the clients' connections."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import tempfile
import urllib.request
from pathlib import Path

from service.process import free_port, start_server, stop_process_group, wait_ready

REPO = Path(__file__).resolve().parent.parent
# Every request carries this key, whether or not the server checks keys (--compare-keys), so that the
# two differ only in the check.
AUTH = {"Authorization": "Bearer serve-load-bench-key-0123456789"}
WORKER_MODULE = b"_bentoml_impl.worker.service"  # in a serving worker's command line


def exit_on_signals() -> None:
    """SIGTERM and SIGHUP (a ``kill``, a CI timeout, a closed terminal) raise ``SystemExit(128 + signum)`` in
    the main thread, as Ctrl-C raises KeyboardInterrupt, so that a script's ``finally`` blocks run: they stop
    its server (in a session of its own, the signal never reaches it), its busy loops, and put back what it
    changed. A second signal during that cleanup is ignored rather than cutting it short."""

    def handler(signum: int, frame: object) -> None:
        for number in (signal.SIGTERM, signal.SIGHUP):
            signal.signal(number, signal.SIG_IGN)
        raise SystemExit(128 + signum)

    for number in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(number, handler)


class Server:
    """``bentoml serve`` of ``service`` from the checkout ``repo``, on a free loopback port, its output in a log."""

    def __init__(
        self, tag: str, workers: int | None, service: str, extra_env: dict[str, str], repo: Path = REPO
    ) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        env = {"HAN_WORKERS": str(workers)} if workers else {}
        env.update(extra_env)
        self.service = service
        self.log_path = Path(tempfile.gettempdir()) / f"serve_load-{self.port}.log"
        self.log = open(self.log_path, "wb")  # noqa: SIM115 - closed in stop()
        self.process = start_server(tag, self.port, env=env, log=self.log, service=service, repo=repo)

    def wait_ready(self, timeout: float = 180) -> None:
        if wait_ready(self.url, self.process, timeout):
            return
        if self.process.poll() is not None:
            raise SystemExit(f"the server exited ({self.process.returncode}); see {self.log_path}")
        raise SystemExit(f"the server was not ready in {timeout} s; see {self.log_path}")

    def processes(self) -> list[int]:
        """The server and its descendants (BentoML's workers run in sessions of their own)."""
        parents: dict[int, int] = {}
        for stat in Path("/proc").glob("[0-9]*/stat"):
            try:
                parents[int(stat.parent.name)] = int(stat.read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
        found, frontier = [self.process.pid], [self.process.pid]
        while frontier:
            frontier = [pid for pid, parent in parents.items() if parent in frontier]
            found += frontier
        return found

    def cpu_seconds(self) -> float:
        """User + system CPU time of the server's processes so far."""
        total = 0
        for pid in self.processes():
            try:
                fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            total += int(fields[11]) + int(fields[12])
        return total / os.sysconf("SC_CLK_TCK")

    def rss_mb(self) -> dict[int, float]:
        """RSS in MiB of each of the server's descendant processes (the serving workers), by pid."""
        sizes = {}
        for pid in self.processes()[1:]:
            try:
                pages = int(Path(f"/proc/{pid}/statm").read_text().split()[1])
            except (OSError, ValueError, IndexError):
                continue
            sizes[pid] = pages * os.sysconf("SC_PAGE_SIZE") / 2**20
        return sizes

    def worker_rss_mb(self) -> float:
        """The largest RSS among the serving workers, in MiB."""
        return max(self.rss_mb().values(), default=0.0)

    def metric(self, name: str) -> float:
        request = urllib.request.Request(self.url + "/metrics", headers=AUTH)
        with urllib.request.urlopen(request, timeout=10) as response:
            text = response.read().decode()
        return sum(float(v) for v in re.findall(rf"^{name}(?:{{[^}}]*}})? (\S+)$", text, re.MULTILINE))

    def stop(self) -> None:
        pids = self.processes()
        stop_process_group(self.process, timeout=30)
        for pid in pids[1:]:  # a worker the server did not take down with it (checked: still ours)
            with contextlib.suppress(OSError):
                if self.service.encode() in Path(f"/proc/{pid}/cmdline").read_bytes():
                    os.kill(pid, signal.SIGKILL)
        self.log.close()

    def connections(self) -> list[int]:
        """Established client connections each serving worker holds (Linux: ``/proc``): how the
        workers' accepts spread the clients."""
        port, established = f":{self.port:04X}", set()
        for table in ("/proc/net/tcp", "/proc/net/tcp6"):
            with contextlib.suppress(OSError):
                for line in Path(table).read_text().splitlines()[1:]:
                    fields = line.split()
                    if fields[1].endswith(port) and fields[3] == "01":  # local port, ESTABLISHED
                        established.add(f"socket:[{fields[9]}]")
        counts = []
        for pid in self.processes()[1:]:
            with contextlib.suppress(OSError):
                if WORKER_MODULE in Path(f"/proc/{pid}/cmdline").read_bytes():
                    counts.append(sum(_link(fd) in established for fd in Path(f"/proc/{pid}/fd").iterdir()))
        return counts


def _link(path: Path) -> str:
    try:
        return os.readlink(path)
    except OSError:
        return ""
