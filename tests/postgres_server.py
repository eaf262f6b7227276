"""A private PostgreSQL server for the tests: initdb in a temporary folder, started on a free loopback
port (its unix socket in that folder too), trust authentication, stopped and deleted at the end.

Debian's ``postgresql`` package provides the binaries (``/usr/lib/postgresql/*/bin``); .ci/run installs
it. Without it the tests that need a server are skipped, except under CI=true, where they fail: a CI run
must not pass by skipping them. PostgreSQL refuses to run as root, so as root the server runs as the
``postgres`` system user. One server is shared by every test module of a pytest session
(``shared_postgres``); each test takes a fresh database of its own (``PostgresServer.create_database``).
"""

from __future__ import annotations

import os
import pwd
import shutil
import signal
import subprocess
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from service.process import free_port
from tests.server_lifetime import ready_or_stopped, shared

USER = "postgres"  # the database superuser initdb creates; also the system user the server runs as under root


def postgres_bin() -> Path | None:
    """The newest installed PostgreSQL's bin folder, or None."""
    found = sorted(Path("/usr/lib/postgresql").glob("*/bin/initdb"), key=lambda p: int(p.parent.parent.name)
                   if p.parent.parent.name.isdigit() else 0)
    return found[-1].parent if found else None


def require_postgres() -> Path:
    """The bin folder; skips the test without PostgreSQL (fails it under CI=true)."""
    found = postgres_bin()
    if found is None:
        message = "PostgreSQL is not installed (apt-get install postgresql; .ci/run does)"
        if os.environ.get("CI") == "true":
            pytest.fail(message)
        pytest.skip(message)
    return found


@dataclass
class PostgresServer:
    process: subprocess.Popen[bytes]
    folder: Path
    port: int

    @property
    def url(self) -> str:
        """The maintenance database's URL (trust authentication: no password)."""
        return f"postgresql://{USER}@127.0.0.1:{self.port}/postgres"

    @classmethod
    def start(cls, timeout: float = 60) -> PostgresServer:
        bin_dir = require_postgres()
        folder = Path(tempfile.mkdtemp(prefix="han-test-postgres-"))
        as_user: dict[str, Any] = {}
        if os.geteuid() == 0:
            try:
                account = pwd.getpwnam(USER)
            except KeyError:
                pytest.fail(f"running as root, and there is no {USER!r} system user to run PostgreSQL as")
            os.chown(folder, account.pw_uid, account.pw_gid)
            as_user = {"user": account.pw_uid, "group": account.pw_gid, "extra_groups": []}
        data = folder / "data"
        subprocess.run([bin_dir / "initdb", "-D", data, "-U", USER, "-A", "trust", "-E", "UTF8", "--no-locale",
                        "--no-sync"], cwd=folder, check=True, capture_output=True, timeout=120, **as_user)
        port = free_port()
        log = open(folder / "server.log", "wb")  # noqa: SIM115  (the server writes it until stopped)
        # The server is a test fixture: fsync and friends off, for speed; nothing must survive a crash.
        process = subprocess.Popen(
            [bin_dir / "postgres", "-D", data, "-p", str(port), "-k", folder, "-c", "listen_addresses=127.0.0.1",
             "-c", "fsync=off", "-c", "synchronous_commit=off", "-c", "full_page_writes=off"],
            cwd=folder, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, **as_user)
        log.close()
        server = cls(process, folder, port)
        return ready_or_stopped(server, lambda: server._wait_ready(timeout))

    def _wait_ready(self, timeout: float) -> None:
        import psycopg

        deadline = time.monotonic() + timeout
        while True:
            if self.process.poll() is not None:
                raise RuntimeError(f"PostgreSQL exited with {self.process.returncode}:\n{self.log()[-3000:]}")
            try:
                with psycopg.connect(self.url, connect_timeout=2):
                    return
            except psycopg.OperationalError as error:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"PostgreSQL not ready after {timeout} s: {error}\n{self.log()[-3000:]}") \
                        from error
                time.sleep(0.1)

    def log(self) -> str:
        return (self.folder / "server.log").read_text(errors="replace")

    def create_database(self) -> str:
        """A new empty database; returns its URL."""
        import psycopg

        name = f"t_{uuid.uuid4().hex[:12]}"
        with psycopg.connect(self.url, autocommit=True) as conn:
            conn.execute(f"CREATE DATABASE {name}")
        return f"postgresql://{USER}@127.0.0.1:{self.port}/{name}"

    def stop(self) -> None:
        """Fast shutdown (SIGINT: sessions are ended, nothing waits for clients), SIGKILL if that hangs."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGINT)
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait(10)
        shutil.rmtree(self.folder, ignore_errors=True)


def shared_postgres(config: pytest.Config) -> PostgresServer:
    """The session's one server (started on first use, stopped when the session ends); skips the test
    without PostgreSQL, except under CI=true."""
    return shared(config, "postgres", PostgresServer.start)
