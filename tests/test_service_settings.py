"""Settings the service refuses at start, in one line, rather than serving on badly (service/settings.py):
a mistyped feedback-store URL (its password never shown), a SQLite store that cannot be created, a huge
HAN_WORKERS, a HAN_API_KEYS with no key in it, and a BENTOML_HOME that is a file."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from monitoring.feedback_store import StoreError, open_store
from service.auth import KeysError, load_keys
from service.settings import Settings
from tests.service_server import REPO, base_env, free_port

MISTYPED = "postgresql:/u:s3cretpw@localhost:5432/db"  # one slash missing


def serve_fails(env: dict[str, str], cwd: Path = REPO) -> list[str]:
    """``bentoml serve`` with ``env``: it must stop at once; its non-blank stderr lines."""
    command = [sys.executable, "-m", "bentoml", "serve", "service.service:HANClassifier", "--port", str(free_port())]
    done = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode != 0, done.stdout[-2000:]
    assert "s3cret" not in done.stdout + done.stderr
    return [line for line in done.stderr.splitlines() if line.strip()]


def run_fails(env: dict[str, str], *command: str) -> tuple[int, list[str]]:
    done = subprocess.run(list(command or (sys.executable, "-m", "service.run", "--port", str(free_port()))),
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert "Traceback" not in done.stderr and "training" not in done.stdout.lower(), done.stdout + done.stderr
    return done.returncode, [line for line in done.stderr.splitlines() if line.strip()]


def test_a_store_url_missing_a_slash_is_refused_with_its_password_hidden(tmp_path):
    env = {**base_env(tmp_path / "bentoml"), "HAN_MODEL_TAG": "han-test:latest", "HAN_FEEDBACK_STORE": MISTYPED}
    assert serve_fails(env) == ["error: HAN_FEEDBACK_STORE must be a file path, sqlite:///path or "
                                "postgresql://user:password@host:port/db, not 'postgresql:/u:***@localhost:5432/db'"]
    assert not (REPO / "postgresql:").exists() and not (tmp_path / "bentoml" / "deployments").exists()
    for value in ("postgres:u:pw123@h/db", "SQLITE:/x.sqlite3"):
        with pytest.raises(ValueError, match="must be a file path") as refused:
            Settings.read({"HAN_FEEDBACK_STORE": value})
        assert "pw123" not in str(refused.value)
    with pytest.raises(StoreError) as error:  # han-model monitor --store: its message hides the password too
        open_store(MISTYPED, tmp_path / "default.sqlite3", existing=True)
    assert "s3cret" not in str(error.value) and "u:***@localhost" in str(error.value)


def test_a_sqlite_store_that_cannot_be_created_is_refused_at_start(tmp_path):
    env = {**base_env(tmp_path / "bentoml"), "HAN_MODEL_TAG": "han-test:latest", "HAN_FEEDBACK_STORE": str(tmp_path)}
    assert serve_fails(env) == [f"error: HAN_FEEDBACK_STORE={tmp_path}: the feedback store cannot be opened there: "
                                "it is a folder, not a file"]
    (blocker := tmp_path / "a-file").write_text("x")
    for value, why in ((f"{blocker}/sub/fb.sqlite3", "is not a folder"),
                       ("/proc/fb.sqlite3", "cannot create a file in /proc")):
        with pytest.raises(ValueError, match=f"HAN_FEEDBACK_STORE={value}: .*{why}"):
            Settings.read({"HAN_FEEDBACK_STORE": value})
    fine = tmp_path / "new" / "deeper" / "fb.sqlite3"  # missing folders: the store creates them
    assert Settings.read({"HAN_FEEDBACK_STORE": f"sqlite:///{fine}"}).feedback_store == f"sqlite:///{fine}"
    assert not fine.parent.exists() and not list(tmp_path.glob(".han-store-check-*"))  # the check leaves nothing
    # A PostgreSQL server is not reached at start: it may come up after the service.
    assert Settings.read({"HAN_FEEDBACK_STORE": "postgresql://u@localhost:1/db"}).feedback_store


def test_a_huge_worker_count_is_refused(tmp_path):
    huge = "99999999999999999999999"
    with pytest.raises(ValueError, match="HAN_WORKERS must be at most") as refused:  # first: a server would grow GBs
        Settings.read({"HAN_WORKERS": huge})
    most = int(str(refused.value).split("at most ")[1].split()[0])
    assert most >= 64 and Settings.read({"HAN_WORKERS": str(most)}).workers == most
    env = {**base_env(tmp_path / "bentoml"), "HAN_MODEL_TAG": "han-test:latest", "HAN_WORKERS": huge}
    assert serve_fails(env) == [f"error: HAN_WORKERS must be at most {most} processes, not '{huge}'"]


def test_api_keys_with_no_key_in_them_are_refused_as_an_empty_keys_file_is(tmp_path):
    with pytest.raises(KeysError, match="HAN_API_KEYS holds no key"):
        load_keys(Settings.read({"HAN_API_KEYS": ", ,"}))
    code, lines = run_fails({**base_env(tmp_path / "bentoml"), "HAN_API_KEYS": ", ,"})
    assert code == 1 and len(lines) == 1 and lines[0].startswith("error: HAN_API_KEYS holds no key"), lines


def test_a_bentoml_home_that_is_a_file_is_one_line_in_each_command(tmp_path):
    (home := tmp_path / "store.csv").write_text("id,text\n")
    env = base_env(home)
    env.pop("HAN_MODEL_TAG", None)
    pointer = f"{home}/deployments/han-imdb/production.json: the production pointer cannot be read"
    code, lines = run_fails(env)
    assert code == 1 and len(lines) == 1 and lines[0].startswith(f"error: {pointer}"), lines
    assert lines[0].endswith(f"(BENTOML_HOME={home})"), lines
    bin_dir = Path(sys.executable).parent
    docs = str(REPO / "data" / "fixtures" / "reviews.jsonl")
    for command in ((str(bin_dir / "han-score"), docs, str(tmp_path / "out.jsonl"), "--quiet"),
                    (str(bin_dir / "han-label"), "next", docs, "--n", "3", "--out", str(tmp_path / "q.json"),
                     "--quiet")):
        code, lines = run_fails(env, *command)
        assert code == 2 and len(lines) == 1 and pointer in lines[0] and "BENTOML_HOME" in lines[0], lines
        assert not (tmp_path / "out.jsonl").exists() and not (tmp_path / "q.json").exists()


def test_the_first_run_names_the_store_it_trains_into(tmp_path):
    env = base_env(home := tmp_path / "empty-store")
    home.mkdir()
    env.pop("HAN_MODEL_TAG", None)
    process = subprocess.Popen([sys.executable, "-m", "service.run", "--port", str(free_port())], cwd=REPO, env=env,
                               stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, start_new_session=True)
    try:
        line = process.stdout.readline()
    finally:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait(30)
    assert line.startswith(f"No han-imdb:production model in the model store ({home}) yet: training"), line


def test_a_relative_store_path_is_the_users_folder_not_the_checkouts(tmp_path, monkeypatch):
    """`python -m service.run` starts the server in the checkout: `HAN_FEEDBACK_STORE=fb/feedback.db` was
    checked in the user's folder and then opened in the checkout (feedback written inside the repository)."""
    from service.settings import absolute_store

    monkeypatch.chdir(tmp_path)
    assert absolute_store("fb/feedback.db") == str(tmp_path / "fb" / "feedback.db")
    assert absolute_store(" ../x.db ") == str(tmp_path.parent / "x.db")
    for unchanged in ("", "/srv/fb.db", "sqlite:////srv/fb.db", "postgresql://u@h/db"):
        assert absolute_store(unchanged) is None
