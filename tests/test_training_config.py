"""han-train's config checked before any data is read: model sizes, the run's folders, OMP_NUM_THREADS, a
misspelt key or broken YAML, each refused (or ignored) in one line naming the option or file."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from han import environment
from tests.conftest import REPO
from training.cli import main
from training.module import HANModule

SMOKE = REPO / "data" / "configs" / "smoke.yaml"


def refused(tmp_path: Path, capsys: pytest.CaptureFixture[str], *args: str) -> str:
    """`han-train fit` on the smoke config with training data that does not exist, so that an error about
    reading it shows the check came too late; returns stderr, after checking the exit status is 2."""
    with pytest.raises(SystemExit) as exit_info:
        main(["fit", "--config", str(SMOKE), "--data.train", str(tmp_path / "absent.jsonl"), *args])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and "absent.jsonl" not in err
    return err


@pytest.mark.parametrize(("name", "value"), [("attention_dim", 0), ("embed_dim", 0), ("word_hidden", -4),
                                              ("sentence_hidden", 0)])
def test_a_model_size_below_one_is_refused_in_one_line_before_the_data_is_read(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], name: str, value: int
) -> None:
    root = tmp_path / "run"
    err = refused(tmp_path, capsys, f"--model.{name}", str(value), "--trainer.default_root_dir", str(root),
                  "--data.cache_dir", str(tmp_path / "cache"))
    assert err.strip().splitlines()[-1] == f"han-train: error: model.{name} must be at least 1, not {value}"
    assert not root.exists() and not (tmp_path / "cache").exists()


def test_a_module_built_in_code_refuses_an_attention_of_no_dimensions() -> None:
    with pytest.raises(ValueError, match=r"^model.attention_dim must be at least 1, not 0$"):
        HANModule(vocab_size=20, num_labels=2, attention_dim=0)
    HANModule(vocab_size=20, num_labels=2, attention_dim=1)


@pytest.mark.parametrize("option", ["--trainer.default_root_dir", "--data.cache_dir"])
def test_a_file_or_an_impossible_place_for_a_folder_is_named_with_its_option(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], option: str
) -> None:
    other = "--data.cache_dir" if option == "--trainer.default_root_dir" else "--trainer.default_root_dir"
    (a_file := tmp_path / "in.csv").write_text("id,text\n")
    cases = [(a_file, "a file, not a folder"), (a_file / "sub", "cannot be made (Not a directory)")]
    if Path("/proc").is_dir():  # no permission bit says /proc refuses new folders
        cases.append((Path("/proc/x"), "cannot be made (No such file or directory)"))
    for folder, why in cases:
        err = refused(tmp_path, capsys, option, str(folder), other, str(tmp_path / "fine" / "new"))
        assert err.strip().splitlines()[-1] == f"han-train: error: {option} {folder}: {why}"
    assert not (tmp_path / "fine").exists(), "a folder made to check it is removed again"


@pytest.mark.parametrize("value", ["abc", "1.5", "-2", "0"])
def test_an_omp_num_threads_that_is_no_count_is_ignored_with_a_warning(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, value: str
) -> None:
    """As han-score, han-label and han-model (and torch's OpenMP) ignore it: `fit --help` still answers."""
    monkeypatch.setenv("OMP_NUM_THREADS", value)
    assert environment.pinned_threads() is None
    threads = torch.get_num_threads()
    try:
        with pytest.raises(SystemExit) as exit_info:
            main(["fit", "--help"])
    finally:
        torch.set_num_threads(threads)  # main sets every usable core
    assert exit_info.value.code == 0
    err = capsys.readouterr().err
    assert err.strip().splitlines() == [f"han-train: warning: OMP_NUM_THREADS={value!r} is not a number of threads "
                                        "(a whole number above 0): ignored"]


def test_omp_num_threads_counts_and_lists_are_read(monkeypatch: pytest.MonkeyPatch) -> None:
    for value, threads in (("3", 3), ("4,2", 4), (" 2 ", 2)):
        monkeypatch.setenv("OMP_NUM_THREADS", value)
        assert (environment.pinned_threads(), environment.ignored_threads()) == (threads, None)
    monkeypatch.delenv("OMP_NUM_THREADS")
    assert (environment.pinned_threads(), environment.ignored_threads()) == (None, None)


def test_a_misspelt_key_is_one_line_naming_the_config_file(tmp_path: Path,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    config = tmp_path / "typo.yaml"
    config.write_text(SMOKE.read_text().replace("  lr: 0.03", "  lrr: 0.03"))
    with pytest.raises(SystemExit) as exit_info:
        main(["fit", "--config", str(config)])
    assert exit_info.value.code == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        f"han-train: error: {config}: Subcommand 'fit' does not accept option 'model.lrr'",
        "  (han-train fit --help lists the options)"]


def test_broken_yaml_is_named_with_its_file_and_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = tmp_path / "broken.yaml"
    config.write_text("trainer:\n  max_epochs: 1\n model: [\n")
    with pytest.raises(SystemExit) as exit_info:
        main(["fit", f"--config={config}"])
    assert exit_info.value.code == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith(f"han-train: error: {config}, line 3, column 2: not valid YAML: ")
