"""A fit's checkpoints against what else happens to its run folder: a full disk (a real one) stops the fit in
one line naming the file and keeps the checkpoint before it whole (Lightning's own write copied a temporary
file from the system's temp folder into the checkpoint's name, which the full disk cut short); a second fit
into a folder a running fit writes is refused (it deleted the first fit's checkpoints, which then failed)."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from tests.conftest import REPO
from training.cli import main

SMOKE = str(REPO / "data" / "configs" / "smoke.yaml")
QUICK = ("--trainer.max_epochs", "1", "--export.faithfulness", "0", "--export.baseline", "false")


def _fit(tmp_path: Path, checkpoints: Path) -> None:
    main(["fit", "--config", SMOKE, "--trainer.default_root_dir", str(tmp_path / "run"), "--data.cache_dir",
          str(tmp_path / "cache"), "--checkpoint.dirpath", str(checkpoints), *QUICK])


def test_a_checkpoint_a_full_disk_cuts_short_leaves_the_one_before_whole(tmp_path: Path,
                                                                        capsys: pytest.CaptureFixture[str]) -> None:
    first = tmp_path / "first"
    _fit(tmp_path, first)
    before = (first / "last.ckpt").read_bytes()
    disk = tmp_path / "disk"
    disk.mkdir()
    size = (len(before) // 4096 + 8) * 4096  # room for the earlier checkpoint and a little more
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(disk)], capture_output=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs (needs root): {mounted.stderr.decode().strip()}")
    try:
        shutil.copy(first / "last.ckpt", disk / "last.ckpt")
        with open(disk / "fill", "wb", buffering=0) as f, contextlib.suppress(OSError):
            while True:
                f.write(b"\0" * 4096)
        capsys.readouterr()
        with pytest.raises(SystemExit) as stopped:
            _fit(tmp_path, disk)
        err = capsys.readouterr().err
        assert stopped.value.code == 2, err[-1000:]
        assert err.strip().splitlines()[-1].startswith(f"han-train: error: cannot write the checkpoint {disk}/"), err
        assert "No space left on device" in err and "Traceback" not in err
        assert (disk / "last.ckpt").read_bytes() == before  # whole, and still loadable
        torch.load(disk / "last.ckpt", weights_only=True)
        assert sorted(p.name for p in disk.iterdir()) == ["fill", "last.ckpt"]  # no temporary file left
    finally:
        subprocess.run(["umount", "-l", str(disk)], check=False)


def test_a_second_fit_into_a_folder_a_running_fit_writes_is_refused(tmp_path: Path,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    root, log = tmp_path / "run", tmp_path / "first.txt"
    with log.open("w") as stderr:
        first = subprocess.Popen([sys.executable, "-m", "training.launch", "fit", "--config", SMOKE,
                                  "--trainer.max_epochs", "100000", "--trainer.default_root_dir", str(root),
                                  "--data.cache_dir", str(tmp_path / "cache"), "--export.register", "false"],
                                 cwd=REPO, stdout=subprocess.DEVNULL, stderr=stderr,
                                 env={**os.environ, "PYTHONPATH": str(REPO)})
        try:
            deadline = time.monotonic() + 120
            while not (root / "checkpoints" / "last.ckpt").exists() and first.poll() is None and \
                    time.monotonic() < deadline:
                time.sleep(0.1)
            assert first.poll() is None, log.read_text()[-1000:]
            capsys.readouterr()
            with pytest.raises(SystemExit) as stopped:
                main(["fit", "--config", SMOKE, "--trainer.max_epochs", "1", "--trainer.default_root_dir", str(root),
                      "--data.cache_dir", str(tmp_path / "cache2"), *QUICK[2:]])
            err = capsys.readouterr().err
            assert stopped.value.code == 2, err[-1000:]
            assert err.strip().splitlines()[-1] == (
                f"han-train: error: {root}: another han-train fit (pid {first.pid} on {os.uname().nodename}, started "
                f"{err.split('started ')[-1].split(')')[0]}) is writing this run folder; wait for it to end, or give "
                "this fit another --trainer.default_root_dir"), err[-1000:]
            assert first.poll() is None and (root / "checkpoints" / "last.ckpt").exists()
        finally:
            first.send_signal(signal.SIGTERM)
            first.wait(timeout=120)
    assert first.returncode == 143 and (root / ".fit.lock").read_text().startswith("pid ")  # it held the lock


def test_a_fit_into_the_folder_of_a_self_training_run_is_refused_while_its_teacher_trains(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The teacher trains in RUN/teacher and the second fit in RUN: a plain fit into RUN meanwhile was let in,
    and the self-training run was refused only after its whole teacher."""
    import json

    root, log = tmp_path / "run", tmp_path / "first.txt"
    unlabelled = tmp_path / "unlabelled.jsonl"
    unlabelled.write_text("".join(json.dumps({"text": json.loads(line)["text"]}) + "\n" for line in
                                  (REPO / "data" / "fixtures" / "reviews.jsonl").read_text().splitlines() if line))
    with log.open("w") as stderr:
        first = subprocess.Popen([sys.executable, "-m", "training.launch", "fit", "--config", SMOKE,
                                  "--trainer.max_epochs", "100000", "--trainer.default_root_dir", str(root),
                                  "--data.unlabeled", str(unlabelled), "--self_training.fraction", "0.5",
                                  "--data.cache_dir", str(tmp_path / "cache"), "--export.register", "false"],
                                 cwd=REPO, stdout=subprocess.DEVNULL, stderr=stderr,
                                 env={**os.environ, "PYTHONPATH": str(REPO)})
        try:
            deadline = time.monotonic() + 120
            while not (root / "teacher" / "checkpoints" / "last.ckpt").exists() and first.poll() is None and \
                    time.monotonic() < deadline:
                time.sleep(0.1)
            assert first.poll() is None, log.read_text()[-1000:]
            capsys.readouterr()
            with pytest.raises(SystemExit) as stopped:
                main(["fit", "--config", SMOKE, "--trainer.default_root_dir", str(root),
                      "--data.cache_dir", str(tmp_path / "cache2"), *QUICK])
            err = capsys.readouterr().err
            assert stopped.value.code == 2, err[-1000:]
            assert err.strip().splitlines()[-1].startswith(f"han-train: error: {root}: another han-train fit (pid "
                                                           f"{first.pid} on "), err[-1000:]
        finally:
            first.send_signal(signal.SIGTERM)
            first.wait(timeout=120)
