"""A real Label Studio for the tests: the PyPI package, installed in a virtual environment of its own
(its pins never touch the project's), started on a free loopback port with a data folder of its own
(SQLite), a user and an API token the test knows, offline; stopped and deleted at the end. With it a
tiny client (``requests``) for what ``han-label`` meets: projects, task import with predictions,
tasks as the data manager lists them, annotations, exports.

The environment is cached between runs (``~/.cache/han-tests/label-studio-VERSION/``, or under
``$XDG_CACHE_HOME``): a ``complete`` marker is written only after pip and the first database
migration both succeeded, so a half install is redone. The first install takes 1.5 to 3 minutes on
2 cores (pip, 1 GB of packages); with the cache, a server is up in 5 to 10 s.

What Label Studio 1.23.2 does, read from its source (``label_studio/server.py``, ``core/settings``):

- Settings are read with ``get_env(NAME)``, which tries ``LABEL_STUDIO_NAME``, ``HEARTEX_NAME`` and then
  the bare ``NAME``: a ``HOST``, ``PORT``, ``DEBUG`` or ``USERNAME`` in the caller's environment would
  leak in. The server runs with a minimal environment of our own, every setting ``LABEL_STUDIO_``-prefixed.
- ``label-studio start`` creates the user ``LABEL_STUDIO_USERNAME`` / ``LABEL_STUDIO_PASSWORD`` when both
  are set and sets its legacy API token to ``LABEL_STUDIO_USER_TOKEN`` (more than 5 characters). A new
  organisation accepts legacy tokens (``Authorization: Token ...``) only with
  ``LABEL_STUDIO_ENABLE_LEGACY_API_TOKEN=true`` (or ``--enable-legacy-api-token``); otherwise they are
  refused with 401 ("legacy token authentication has been disabled"). Personal access tokens (JWT,
  ``Authorization: Bearer``) are made from the web UI or by a logged-in session and expire; the legacy
  token, known before the server starts, is what a test wants.
- Offline: ``LATEST_VERSION_CHECK=false`` (else it asks pypi.org for the latest version when it loads),
  ``SENTRY_DSN`` and ``FRONTEND_SENTRY_DSN`` empty (else Sentry is on, with HumanSignal's DSN),
  ``COLLECT_ANALYTICS=false`` (usage events). Feature flags are read offline by default.
- ``POST /api/projects/{id}/import`` validates predictions against the labelling config but, by
  default, only logs the errors and answers 201; the flag
  ``fflag_feat_utc_210_prediction_validation_15082025=true`` (a flag set through the environment)
  makes it answer 400 with the errors, so a malformed pre-annotation fails the test where it is made.
- Migrating a fresh SQLite database takes about a minute on 2 cores, starting on a migrated one 5 s:
  the cache holds a migrated, empty database (no user) that every server starts from a copy of.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import requests

from service.process import free_port, stop_process_group
from tests.server_lifetime import ready_or_stopped

VERSION = "1.23.2"
USERNAME = "han-tests@example.com"
PASSWORD = "han-tests-password"
TOKEN = "han-tests-label-studio-token-0123456789"
DATABASE = "label_studio.sqlite3"


def cache_dir() -> Path:
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return base / "han-tests" / f"label-studio-{VERSION}"


def _server_env(home: Path, data: Path, venv: Path) -> dict[str, str]:
    """A minimal environment: nothing of the caller's leaks into Label Studio's settings."""
    return {
        "PATH": f"{venv / 'bin'}{os.pathsep}{os.environ.get('PATH', '/usr/bin:/bin')}",
        "HOME": str(home),  # appdirs' data and cache folders: never the user's
        "LANG": "C.UTF-8",
        "PYTHONUNBUFFERED": "1",
        "TMPDIR": str(home),
        "LABEL_STUDIO_BASE_DATA_DIR": str(data),
        "LABEL_STUDIO_DJANGO_DB": "sqlite",
        "LABEL_STUDIO_DATABASE_NAME": str(data / DATABASE),
        "LABEL_STUDIO_LATEST_VERSION_CHECK": "false",
        "LABEL_STUDIO_COLLECT_ANALYTICS": "false",
        "LABEL_STUDIO_SENTRY_DSN": "",
        "LABEL_STUDIO_FRONTEND_SENTRY_DSN": "",
        "LABEL_STUDIO_DEBUG": "false",
        "LABEL_STUDIO_LOG_LEVEL": "WARNING",
        "LABEL_STUDIO_ENABLE_LEGACY_API_TOKEN": "true",
        "fflag_feat_utc_210_prediction_validation_15082025": "true",
    }


def install(timeout: float = 1200) -> Path:
    """The cached environment (installed on first use, under a lock); returns its folder."""
    folder = cache_dir()
    folder.parent.mkdir(parents=True, exist_ok=True)
    marker = folder / "complete"
    with open(folder.parent / f"{folder.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if marker.is_file():
            return folder
        shutil.rmtree(folder, ignore_errors=True)  # a half install from an interrupted run
        folder.mkdir()
        venv = folder / "venv"
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
        clean = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV"))}
        pip = subprocess.run(
            [str(venv / "bin/pip"), "install", "--quiet", "--disable-pip-version-check", f"label-studio=={VERSION}"],
            env=clean, capture_output=True, text=True, timeout=timeout,
        )
        if pip.returncode != 0:
            raise RuntimeError(f"pip install label-studio=={VERSION} failed:\n{pip.stderr[-3000:]}")
        # The template database: `label-studio version` applies every migration, then prints the version.
        template = folder / "template"
        template.mkdir()
        home = Path(tempfile.mkdtemp(prefix="han-test-label-studio-home-"))
        try:
            migrated = subprocess.run([str(venv / "bin/label-studio"), "version"], cwd=home,
                                      env=_server_env(home, template, venv), capture_output=True, text=True,
                                      timeout=600)
        finally:
            shutil.rmtree(home, ignore_errors=True)
        if migrated.returncode != 0 or VERSION not in migrated.stdout or not (template / DATABASE).is_file():
            raise RuntimeError(f"migrating Label Studio's database failed:\n{migrated.stdout[-2000:]}"
                               f"{migrated.stderr[-2000:]}")
        marker.write_text(VERSION + "\n")
        return folder


def require_label_studio() -> Path:
    """The cached environment; skips the test when it cannot be installed (no registry), except under
    CI=true, where it fails."""
    try:
        return install()
    except (RuntimeError, subprocess.SubprocessError, OSError) as error:
        if os.environ.get("CI") == "true":
            pytest.fail(f"Label Studio {VERSION} could not be installed: {error}")
        pytest.skip(f"Label Studio {VERSION} could not be installed: {error}")


@dataclass
class LabelStudioServer:
    process: subprocess.Popen[bytes]
    folder: Path
    port: int
    token: str = TOKEN
    session: requests.Session = field(default_factory=requests.Session)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @classmethod
    def start(cls, timeout: float = 180) -> LabelStudioServer:
        installed = require_label_studio()
        venv = installed / "venv"
        folder = Path(tempfile.mkdtemp(prefix="han-test-label-studio-"))
        data, home = folder / "data", folder / "home"
        data.mkdir()
        home.mkdir()
        shutil.copy(installed / "template" / DATABASE, data / DATABASE)  # migrated once, at install
        env = _server_env(home, data, venv) | {
            "LABEL_STUDIO_USERNAME": USERNAME, "LABEL_STUDIO_PASSWORD": PASSWORD, "LABEL_STUDIO_USER_TOKEN": TOKEN,
        }
        port = free_port()
        with (folder / "server.log").open("wb") as log:
            process = subprocess.Popen(
                [str(venv / "bin/label-studio"), "start", "--no-browser", "--internal-host", "127.0.0.1",
                 "--port", str(port)],
                cwd=home, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        server = cls(process, folder, port)
        server.session.headers["Authorization"] = f"Token {TOKEN}"
        return ready_or_stopped(server, lambda: server._wait_ready(timeout))

    def _wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while True:
            if self.process.poll() is not None:
                raise RuntimeError(f"Label Studio exited with {self.process.returncode}:\n{self.log()[-3000:]}")
            try:
                if requests.get(self.url + "/health", timeout=2).status_code == 200:
                    break
            except (requests.ConnectionError, requests.Timeout):
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"Label Studio not ready after {timeout} s:\n{self.log()[-3000:]}")
            time.sleep(0.2)
        me = self.session.get(self.url + "/api/current-user/whoami", timeout=30)
        if me.status_code != 200 or me.json().get("email") != USERNAME:
            raise RuntimeError(f"Label Studio refuses the test's token: {me.status_code} {me.text[:500]}")

    def log(self) -> str:
        path = self.folder / "server.log"
        return path.read_text(errors="replace") if path.is_file() else ""

    def stop(self) -> None:
        """SIGTERM (Django's runserver exits at once), SIGKILL if it hangs; the data folder is deleted."""
        stop_process_group(self.process, timeout=20)
        self.session.close()
        shutil.rmtree(self.folder, ignore_errors=True)

    # The API (Label Studio 1.23: /api/..., `Authorization: Token`).

    def _call(self, method: str, path: str, **kwargs: Any) -> requests.Response:
        response = self.session.request(method, self.url + path, timeout=120, **kwargs)
        if not response.ok:
            raise AssertionError(f"{method} {path}: {response.status_code} {response.text[:3000]}")
        return response

    def create_project(self, title: str, label_config: str) -> int:
        """POST /api/projects/ {title, label_config}; returns the project's id."""
        return self._call("POST", "/api/projects/", json={"title": title, "label_config": label_config}).json()["id"]

    def project(self, project: int) -> dict:
        return self._call("GET", f"/api/projects/{project}/").json()

    def import_tasks(self, project: int, tasks: list[dict]) -> list[int]:
        """POST /api/projects/{id}/import with a JSON list of tasks ({"data": ..., "predictions": [...]});
        synchronous in the Community edition. Returns the new tasks' ids, in order."""
        answer = self._call("POST", f"/api/projects/{project}/import", params={"return_task_ids": "true"},
                            json=tasks).json()
        assert answer["task_count"] == len(tasks), answer
        return answer["task_ids"]

    def tasks(self, project: int) -> list[dict]:
        """Every task of a project with its predictions and annotations, as the data manager lists them:
        GET /api/tasks/?project=ID&fields=all, paged ({"total": N, "tasks": [...]})."""
        found: list[dict] = []
        page = 1
        while True:
            answer = self._call("GET", "/api/tasks/", params={"project": project, "fields": "all", "page": page,
                                                               "page_size": 100}).json()
            found += answer["tasks"]
            if not answer["tasks"] or len(found) >= answer["total"]:
                return found
            page += 1

    def task(self, task: int) -> dict:
        """GET /api/tasks/{id}/: the task with its predictions and annotations."""
        return self._call("GET", f"/api/tasks/{task}/").json()

    def annotate(self, task: int, result: list[dict], *, was_cancelled: bool = False,
                 parent_prediction: int | None = None, lead_time: float | None = None) -> dict:
        """POST /api/tasks/{id}/annotations/: what an annotator's Submit makes (``parent_prediction``: the
        prediction it started from); ``was_cancelled`` is Skip."""
        body: dict[str, Any] = {"result": result, "was_cancelled": was_cancelled}
        if parent_prediction is not None:
            body["parent_prediction"] = parent_prediction
        if lead_time is not None:
            body["lead_time"] = lead_time
        return self._call("POST", f"/api/tasks/{task}/annotations/", json=body).json()

    def export(self, project: int, export_type: str = "JSON", download_all_tasks: bool = False) -> bytes:
        """GET /api/projects/{id}/export?exportType=JSON|JSON_MIN|CSV|TSV|...: the file the UI's Export
        downloads, made at once. Without ``download_all_tasks`` only tasks with an annotation (a
        skipped one too) are exported."""
        return self._call("GET", f"/api/projects/{project}/export",
                          params={"exportType": export_type,
                                  "download_all_tasks": json.dumps(download_all_tasks)}).content

