"""A registration killed with SIGKILL while it copies into the model store leaves no version there (a
version is whole or absent), and a half-written version folder left by an earlier release is never
chosen as first, production or latest, nor turned into a traceback."""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import yaml

from han import SavedModel
from tests.service_server import REPO, base_env, register_model

NAME = "han-interrupted"

# Registers a model directory; every file copied into the store is followed by a long pause, so the
# test can kill the process while the version is being written.
_SLOW_REGISTER = """
import os, shutil, sys, time
real = shutil.copyfile
def slow(src, dst, *args, **kwargs):
    out = real(src, dst, *args, **kwargs)
    if str(dst).startswith(os.environ["BENTOML_HOME"]):
        print("copying", dst, flush=True)
        time.sleep(60)
    return out
shutil.copyfile = slow
import han
from model_store import register
register(han.SavedModel.load(sys.argv[1]), sys.argv[2])
"""


def _kill_while_registering(model_dir: Path, home: Path) -> None:
    env = {**base_env(home), "TMPDIR": str(home.parent)}  # BentoML's own temporary folder, left by the kill
    child = subprocess.Popen([sys.executable, "-c", _SLOW_REGISTER, str(model_dir), NAME], env=env,
                             cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = child.stdout.readline() if child.stdout else ""
        assert line.startswith("copying"), f"the registration never copied: {line!r} {child.stderr.read()[-2000:]}"
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=30)


def _versions(home: Path) -> list[Path]:
    folder = home / "models" / NAME
    return sorted(p for p in folder.iterdir() if p.is_dir()) if folder.is_dir() else []


def _model_yaml(path: Path) -> dict:
    return yaml.safe_load((path / "model.yaml").read_text(encoding="utf-8"))


def _run(home: Path, command: str, *args: str) -> subprocess.CompletedProcess[str]:
    """A command of this project (han-model) or python, in the store at ``home``."""
    program = sys.executable if command == "python" else str(Path(sys.executable).parent / command)
    return subprocess.run([program, *args], env=base_env(home), cwd=REPO, capture_output=True, text=True,
                          timeout=120)


def test_a_registration_killed_while_it_copies_leaves_no_half_version(tiny_model_dir: Path, tmp_path: Path) -> None:
    home = tmp_path / "home"
    _kill_while_registering(tiny_model_dir, home)
    for version in _versions(home):  # whole or absent: none may be half-written
        assert _model_yaml(version)["version"] == version.name
        SavedModel.load(version)
    tag = register_model(tiny_model_dir, home, NAME)  # the name's next fit: it, not a half one, is production
    assert json.loads((home / "deployments" / NAME / "production.json").read_text())["tag"] == tag
    status = _run(home, "han-model", "status", NAME)
    assert status.returncode == 0 and "Traceback" not in status.stderr, status.stderr
    assert status.stdout.splitlines()[0] == f"{NAME}: production is {tag}"
    assert not list((home / "tmp").glob("han-register-*"))  # the killed registration's staging is swept


def test_a_half_written_version_is_never_chosen(tiny_model_dir: Path, tmp_path: Path) -> None:
    """Folders an interrupted registration by an earlier release left: registered before the whole one, one
    with a cut model.yaml, one with its weights missing; BentoML's `latest` file names one of them."""
    home = tmp_path / "home"
    whole = register_model(tiny_model_dir, home, NAME)
    store = home / "models" / NAME
    good = store / whole.split(":")[1]
    (home / "deployments" / NAME / "production.json").unlink()  # a fresh store: production is the first version
    earlier = _model_yaml(good)["creation_time"].replace("20", "19", 1)  # a century before
    for version, damage in (("aaaacutyaml00000", "yaml"), ("aaaanoweights000", "weights"), ("aaaalfspointer00", "lfs")):
        half = Path(shutil.copytree(good, store / version))
        text = (half / "model.yaml").read_text().replace(good.name, version)
        text = text.replace(str(_model_yaml(good)["creation_time"]), str(earlier))
        (half / "model.yaml").write_text(text[: len(text) // 2] if damage == "yaml" else text)
        if damage == "weights":
            (half / "model.safetensors").unlink()
        if damage == "lfs":  # a Git LFS pointer where the weights were: its first 8 bytes read as a huge header
            (half / "model.safetensors").write_text("version https://git-lfs.github.com/spec/v1\noid sha256:0\n")
    (store / "latest").write_text("aaaanoweights000")

    status = _run(home, "han-model", "status", NAME)
    assert status.returncode == 0 and "Traceback" not in status.stderr, status.stderr
    assert status.stdout.splitlines()[0].startswith(f"{NAME}: production is {whole}")
    assert all(version in status.stderr for version in ("aaaacutyaml00000", "aaaanoweights000", "aaaalfspointer00"))
    assert f"`rm -r {store / 'aaaanoweights000'}` clears it" in status.stderr  # what to do about it
    chosen = _run(home, "python", "-c", _CHOOSE, NAME, "aaaacutyaml00000", "aaaanoweights000", "aaaalfspointer00")
    assert chosen.returncode == 0, chosen.stderr
    lines = chosen.stdout.splitlines()
    assert lines[:3] == [whole, whole, whole]  # latest, first, production
    for version, line in zip(("aaaacutyaml00000", "aaaanoweights000", "aaaalfspointer00"), lines[3:], strict=True):
        assert line.startswith(f"{store / version}"), line  # one line naming it


# What this project chooses for NAME (latest, first, production), and the error opening each named version
# (model_store.open_model: what han-score and han-label report in one line).
_CHOOSE = """
import sys
import model_store as m
name = sys.argv[1]
print(m.resolve_tag(name + ":latest"), m.first_version(name), m.resolve_tag(name), sep="\\n")
for version in sys.argv[2:]:
    try:
        m.open_model(name + ":" + version)
    except m.ModelOpenError as e:
        print(e)
"""


def test_versions_deleted_from_the_store_are_named_and_passed_over(tiny_model_dir: Path, tmp_path: Path) -> None:
    """`bentoml models delete` of versions the pointer's history names (another process, another person):
    status must not report a deleted production version as healthy, promote must not advise a comparison
    that cannot run, and rollback must reach the stored version before them. Promoting the shadowed version
    ends its shadow (production shadowing itself doubled the log)."""
    home = tmp_path / "home"
    registered = _run(home, "python", "-c", "import sys, han\nfrom model_store import register\n"
                      "for _ in range(3): print(register(han.SavedModel.load(sys.argv[1]), sys.argv[2]))",
                      str(tiny_model_dir), NAME)  # three versions in one process: a process each took seconds
    first, second, third = registered.stdout.split()
    assert _run(home, "han-model", "shadow", third, "--fraction", "0.5").returncode == 0
    for tag in (second, third):
        promoted = _run(home, "han-model", "promote", tag, "--force")
        assert promoted.returncode == 0, promoted.stderr
    assert promoted.stdout.splitlines()[-1] == f"{NAME}: the shadow of {third} ended (it is production now)"
    assert not (home / "deployments" / NAME / "shadow.json").exists()
    for tag in (third, second):
        assert _run(home, "bentoml", "models", "delete", tag, "-y").returncode == 0

    status = _run(home, "han-model", "status", NAME)
    assert status.returncode == 1 and "Traceback" not in status.stderr, status.stderr
    lines = status.stdout.splitlines()
    assert lines[0] == f"{NAME}: production is {third}"
    assert lines[1].startswith(f"  {third} is not in the model store (") and lines[1].endswith(
        f"`han-model rollback {NAME}` or `han-model promote {NAME}:VERSION` mends it"), lines[1]
    promote = _run(home, "han-model", "promote", first)
    assert promote.returncode != 0 and "Traceback" not in promote.stderr
    assert f"{third}, the version in production, is no longer in the model store" in promote.stderr, promote.stderr
    assert f"`han-model rollback {NAME}`" in promote.stderr

    rollback = _run(home, "han-model", "rollback", NAME)
    assert rollback.returncode == 0, rollback.stderr
    assert f"{second}: no longer in the model store (deleted), passed over" in rollback.stderr
    status = _run(home, "han-model", "status", NAME)
    assert status.returncode == 0 and status.stdout.splitlines()[0] == f"{NAME}: production is {first}", status.stdout


def test_a_report_from_before_the_clock_stepped_back_is_no_live_worker(tiny_model_dir: Path, tmp_path: Path) -> None:
    """A killed worker's last report, written before the clock was set back 30 minutes, read as a live worker's
    until the clock caught up: status listed it, and promote waited for it and failed with the pointer moved."""
    import time

    home = tmp_path / "home"
    first = register_model(tiny_model_dir, home, NAME)
    replicas = home / "deployments" / NAME / "replicas"
    replicas.mkdir(parents=True)
    (replicas / "gone-1.json").write_text(json.dumps({"serving": first, "seen": time.time() + 1800}))
    (replicas / "live-1.json").write_text(json.dumps({"serving": first, "seen": time.time()}))
    status = _run(home, "han-model", "status", NAME)
    assert status.returncode == 0 and "service gone-1" not in status.stdout, status.stdout
    assert f"service live-1: serving {first}" in status.stdout  # a worker that reported just now still counts
