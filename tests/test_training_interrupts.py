"""A fit whose checkpoint cannot be written (a real full disk) stops in one line naming the file, and the
checkpoint written before it stays whole: Lightning's own write copied a temporary file from the system's
temp folder into ``last.ckpt``, which a full disk cut short."""

from __future__ import annotations

import contextlib
import shutil
import subprocess
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
