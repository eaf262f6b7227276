"""The README's commands name things that exist, and the documentation's links resolve.

Each ```bash block of README.md (and of docs/*.md) is read line by line, continuation lines joined;
a command that starts with ``.venv/bin/``, ``make`` or ``curl`` (after any ``VAR=value``) is checked:

- ``make TARGET``: a target of the Makefile;
- ``.venv/bin/NAME``: a script of the project (pyproject.toml) or of the environment;
- ``han-train SUBCOMMAND``: a LightningCLI subcommand; ``--config`` files exist; ``--data.KEY``,
  ``--model.KEY``, ``--export.KEY``, ``--self_training.KEY``, ``--checkpoint.KEY`` and
  ``--trainer.KEY`` name a parameter of HANDataModule, HANModule, ExportModel, SelfTraining,
  ModelCheckpoint and Trainer (``inspect.signature``);
- ``han-score``: every option is one of scoring/arguments.py's parser;
- ``python -m MODULE`` and ``python SCRIPT``: the module or script exists and names every option given;
- ``pip install -e '.[EXTRA]'``: an extra of pyproject.toml;
- ``curl``: the path is one the service serves, and a ``-d`` body is JSON with the request's fields;
- in every command, a path into the repository (``data/...``, ``tests/...``, ...) exists.

Links: every relative markdown link (``](path)``, images too) in README.md and docs/*.md points at an
existing file, and an ``#anchor`` at a heading of it. An image that is not there yet must be a
screenshot the browser test writes, and the page must say how to make it.
"""

from __future__ import annotations

import ast
import functools
import inspect
import json
import os
import re
import shlex
import sys
import tomllib
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
README = REPO / "README.md"
PAGES = [README, *sorted((REPO / "docs").glob("*.md"))]
REPO_PREFIXES = ("data/", "tests/", "benchmarks/", "training/", "scoring/", "service/", "han/", "model_store/", "docs/")
TOP_LEVEL_TRAIN = {"config", "print_config", "ckpt_path", "seed_everything"}
SUBCOMMANDS = {"fit", "validate", "test", "predict"}
OPERATORS = {";", "|", "||", "&&", "&"}


# ---------------------------------------------------------------- reading the pages


def bash_commands(page: Path) -> Iterator[tuple[int, str, list[str]]]:
    """(line number, command text, words) of every command in the page's ```bash blocks."""
    text = page.read_text(encoding="utf-8")
    for block in re.finditer(r"^```bash\n(.*?)^```", text, re.M | re.S):
        first = text.count("\n", 0, block.start(1)) + 1
        lines = block.group(1).split("\n")
        i = 0
        while i < len(lines):
            start, line = first + i, lines[i]
            while line.rstrip().endswith("\\") and i + 1 < len(lines):
                i += 1
                line = line.rstrip()[:-1] + " " + lines[i].strip()
            i += 1
            lexer = shlex.shlex(line, posix=True, punctuation_chars=";|&")
            lexer.whitespace_split, lexer.commenters = True, "#"
            words: list[str] = []
            for word in [*lexer, ";"]:
                if word in OPERATORS:
                    if words:
                        yield start, line.strip(), words
                    words = []
                else:
                    words.append(word)


def checked(words: list[str]) -> list[str] | None:
    """The command without its VAR=value prefix, if it is one this test checks."""
    while words and re.match(r"^[A-Za-z_][A-Za-z0-9_]*=", words[0]):
        words = words[1:]
    if words and (words[0].startswith(".venv/bin/") or words[0] in ("make", "curl")):
        return words
    return None


def options(args: list[str]) -> Iterator[tuple[str, str | None]]:
    """(--name, value or None) of each option: ``--a.b x``, ``--a.b=x``, ``--a.b+=x``."""
    for i, arg in enumerate(args):
        if not arg.startswith("--"):
            continue
        if "=" in arg:
            name, value = arg.split("=", 1)
            yield name.rstrip("+"), value
        else:
            following = args[i + 1] if i + 1 < len(args) else None
            yield arg, None if following is None or following.startswith("-") else following


# ---------------------------------------------------------------- what exists


@functools.cache
def pyproject() -> dict:
    return tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))


@functools.cache
def make_targets() -> set[str]:
    makefile = (REPO / "Makefile").read_text(encoding="utf-8")
    return set(re.findall(r"^([A-Za-z0-9_.-]+):(?!=)", makefile, re.M))


@functools.cache
def train_parameters() -> dict[str, set[str]]:
    """han-train's sections and the parameters each takes."""
    import pytorch_lightning as pl
    from pytorch_lightning.callbacks import ModelCheckpoint

    from training.data import HANDataModule
    from training.export import ExportModel
    from training.module import HANModule
    from training.self_training import SelfTraining

    classes = {
        "data": HANDataModule,
        "model": HANModule,
        "export": ExportModel,
        "self_training": SelfTraining,
        "checkpoint": ModelCheckpoint,
        "trainer": pl.Trainer,
    }
    return {section: set(inspect.signature(cls.__init__).parameters) - {"self"} for section, cls in classes.items()}


@functools.cache
def score_options() -> set[str]:
    from scoring.arguments import build_parser

    return set(build_parser()._option_string_actions)


@functools.cache
def service_paths() -> set[str]:
    """The paths the service answers: its routes and BentoML's own health and metrics endpoints."""
    source = "\n".join(p.read_text(encoding="utf-8") for p in sorted((REPO / "service").glob("*.py")))
    return set(re.findall(r"""["'](/[a-z][a-z0-9_.-]*)["']""", source)) | {"/", "/metrics"}


@functools.cache
def request_fields() -> set[str]:
    """The fields of ``POST /classify``'s body (service/api.py's ClassifyRequest), read without importing the
    service."""
    tree = ast.parse((REPO / "service" / "api.py").read_text(encoding="utf-8"))
    [request] = [node for node in tree.body if isinstance(node, ast.ClassDef) and node.name == "ClassifyRequest"]
    return {
        node.target.id
        for node in request.body
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.target.id != "model_config"
    }


def module_source(module: str) -> str:
    """The source of a module of this repository, and of the sibling modules a script imports."""
    path = REPO / Path(*module.split("."))
    path = path / "__main__.py" if path.is_dir() else path.with_suffix(".py")
    return path.read_text(encoding="utf-8") if path.is_file() else ""


def script_source(script: Path) -> str:
    text = script.read_text(encoding="utf-8")
    siblings = [
        (script.parent / f"{name}.py").read_text(encoding="utf-8")
        for node in ast.walk(ast.parse(text))
        for name in (
            [node.module]
            if isinstance(node, ast.ImportFrom) and node.module
            else [a.name for a in node.names]
            if isinstance(node, ast.Import)
            else []
        )
        if (script.parent / f"{name}.py").is_file()
    ]
    return "\n".join([text, *siblings])


# ---------------------------------------------------------------- the checks


def problems_of(words: list[str]) -> list[str]:
    """What the command names that does not exist (empty: nothing)."""
    problems = [
        f"{w} does not exist"
        for w in words[1:]
        for value in [w.split("=", 1)[-1]]
        if value.startswith(REPO_PREFIXES) and not (REPO / value).exists()
    ]
    tool, args = words[0], words[1:]
    if tool == "make":
        problems += [
            f"make has no target {t!r}"
            for t in args
            if not t.startswith("-") and "=" not in t and t not in make_targets()
        ]
        return problems
    if tool == "curl":
        return problems + curl_problems(args)
    name = tool.removeprefix(".venv/bin/")
    if name not in pyproject()["project"]["scripts"] and not (Path(sys.executable).parent / name).exists():
        return [*problems, f"{tool}: no such script in pyproject.toml or the environment"]
    if name == "han-train":
        problems += train_problems(args)
    elif name == "han-score":
        problems += [f"han-score has no option {o}" for o, _ in options(args) if o not in score_options()]
    elif name.startswith("python"):
        problems += python_problems(args)
    elif name.startswith("pip") and args[:1] == ["install"]:
        extras = pyproject()["project"]["optional-dependencies"]
        for arg in args:
            if m := re.fullmatch(r"\.\[([a-z0-9_,-]+)\]", arg):
                problems += [f"pyproject.toml has no extra {e!r}" for e in m.group(1).split(",") if e not in extras]
    return problems


def train_problems(args: list[str]) -> list[str]:
    if not args or args[0] not in SUBCOMMANDS:
        return [f"han-train needs a subcommand ({', '.join(sorted(SUBCOMMANDS))}), not {args[:1]}"]
    problems = []
    sections = train_parameters()
    for option, value in options(args[1:]):
        name = option[2:]
        if name == "config" and (value is None or not (REPO / value).is_file()):
            problems.append(f"--config {value}: no such config file")
        elif "." in name:
            section, key = name.split(".")[:2]
            if section not in sections:
                problems.append(f"han-train has no section {section!r} ({option})")
            elif key not in sections[section]:
                problems.append(f"{option}: {section} takes no parameter {key!r}")
        elif name not in TOP_LEVEL_TRAIN:
            problems.append(f"han-train has no option {option}")
    return problems


def python_problems(args: list[str]) -> list[str]:
    if args[:1] == ["-m"] and len(args) > 1:
        module, rest = args[1], args[2:]
        if module == "pytest":
            return []
        source = module_source(module)
        if not source:
            return [f"python -m {module}: no such module in the repository"]
    elif args and args[0].endswith(".py"):
        script, rest = REPO / args[0], args[1:]
        if not script.is_file():
            return [f"{args[0]}: no such script"]
        source = script_source(script)
    else:
        return []
    return [
        f"{option} is not an option of {args[1] if args[0] == '-m' else args[0]}"
        for option, _ in options(rest)
        if f'"{option}"' not in source
    ]


def feedback_fields() -> set[str]:
    """The fields of ``POST /feedback``'s body (service/feedback.py builds it with create_model)."""
    source = (REPO / "service" / "feedback.py").read_text(encoding="utf-8")
    call = source[source.index('create_model(\n        "FeedbackRequest"'):]
    return set(re.findall(r"^\s+(\w+)=\(list", call, re.M))


def curl_problems(args: list[str]) -> list[str]:
    problems = []
    fields = feedback_fields() if any(re.search(r"(?:localhost|127\.0\.0\.1)(?::\d+)?/feedback\b", a) for a in args) \
        else request_fields()
    for i, arg in enumerate(args):
        if arg in ("-d", "--data") and i + 1 < len(args):
            try:
                body = json.loads(args[i + 1])
            except json.JSONDecodeError as e:
                problems.append(f"the request body is not JSON ({e})")
                continue
            problems += [f"the request has no field {k!r}" for k in body if k not in fields]
        elif not arg.startswith("-") and (
            m := re.match(r"^(?:https?://)?(?:localhost|127\.0\.0\.1)(?::\d+)?(/\S*)?$", arg)
        ):
            path = "/" + (m.group(1) or "/").strip("/").split("/")[0]
            if path not in service_paths():
                problems.append(f"the service serves no {path}")
    return problems


# ---------------------------------------------------------------- links


def slug(heading: str) -> str:
    """The anchor GitHub gives a heading."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower().replace("`", ""))
    return text.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    text = re.sub(r"^```.*?^```", "", page.read_text(encoding="utf-8"), flags=re.M | re.S)
    return {slug(h) for h in re.findall(r"^#{1,6} (.+)$", text, re.M)}


def links(page: Path) -> Iterator[tuple[bool, str]]:
    """(is an image, target) of every markdown link outside code."""
    text = re.sub(r"^```.*?^```", "", page.read_text(encoding="utf-8"), flags=re.M | re.S)
    text = re.sub(r"`[^`\n]*`", "", text)
    for m in re.finditer(r"(!?)\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)", text):
        yield m.group(1) == "!", m.group(2)


def link_problems(page: Path) -> list[str]:
    problems = []
    browser_test = (REPO / "tests" / "test_browser.py").read_text(encoding="utf-8")
    for image, target in links(page):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
            continue
        path_part, _, anchor = target.partition("#")
        path = (page.parent / path_part).resolve() if path_part else page
        if not path.exists():
            made = (
                image
                and f'"{path.name}"' in browser_test
                and f"HAN_SCREENSHOT_DIR={os.path.relpath(path.parent, REPO)}" in page.read_text(encoding="utf-8")
            )
            if not made:
                problems.append(
                    f"{target}: no such file"
                    + (" (nor a screenshot the browser test writes, with the page saying how)" if image else "")
                )
            continue
        if anchor and path.suffix == ".md" and anchor not in anchors(path):
            problems.append(f"{target}: {path.name} has no heading #{anchor}")
    return problems


# ---------------------------------------------------------------- the tests


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_every_command_names_things_that_exist(page: Path) -> None:
    wrong = [
        f"{page.name}:{line}: {text}\n    {problem}"
        for line, text, words in bash_commands(page)
        if (command := checked(words))
        for problem in problems_of(command)
    ]
    assert not wrong, "\n".join(wrong)


def test_the_readme_shows_each_kind_of_command() -> None:
    """The parser sees the README's commands: an empty harvest would pass the test above vacuously."""
    tools = {command[0] for _, _, words in bash_commands(README) if (command := checked(words))}
    assert {"make", "curl", ".venv/bin/han-train", ".venv/bin/han-score", ".venv/bin/python"} <= tools, tools


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_every_relative_link_resolves(page: Path) -> None:
    assert not (wrong := link_problems(page)), "\n".join(f"{page.name}: {p}" for p in wrong)


def test_the_checks_catch_what_is_missing(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text(
        "```bash\n"
        ".venv/bin/han-train fit --config data/configs/nope.yaml --data.lang de --model.embedings x\n"
        ".venv/bin/han-train fit --data.train data/fixtures/missing.csv --export.nme x --traner.devices 2\n"
        ".venv/bin/han-score a.csv b.csv --top-sentence 3 && make deploy\n"
        'curl -s localhost:3000/clasify -d \'{"documents": ["x"], "explian": true}\'\n'
        "HAN_X=1 .venv/bin/python -m service.run --hots 0.0.0.0; .venv/bin/pip install -e '.[gpu]'\n"
        "```\n[a](nowhere.md) [b](#no-heading) ![c](docs/nothing.png)\n",
        encoding="utf-8",
    )
    found = "\n".join(p for _, _, words in bash_commands(page) if (c := checked(words)) for p in problems_of(c))
    for expected in [
        "--config data/configs/nope.yaml",
        "data takes no parameter 'lang'",
        "model takes no parameter 'embedings'",
        "data/fixtures/missing.csv does not exist",
        "export takes no parameter 'nme'",
        "no section 'traner'",
        "no option --top-sentence",
        "no target 'deploy'",
        "serves no /clasify",
        "no field 'explian'",
        "--hots is not an option of service.run",
        "no extra 'gpu'",
    ]:
        assert expected in found, f"{expected!r} not reported in:\n{found}"
    assert len(link_problems(page)) == 3, link_problems(page)
