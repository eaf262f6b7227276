"""The bento a user ships: built, exported, installed from its own requirements in a fresh virtual
environment (the project not installed there) and served from outside the checkout, the way the
image that ``bentoml containerize`` writes starts it (its entrypoint, its variables).

Not in ``make test`` (it stays within its ten minutes): ``make test-bento``, which .ci/run runs too.
80 to 150 s on 2 cores (80 s quiet): ``bentoml build`` and ``export`` 10 s, the fresh environment 45 s (pip's
cache warm), the server 10 s. The fresh environment reaches the registries as this machine does;
pip runs with ``--retries 0`` because the bento names PyTorch's CPU index, which only a container
build reaches (here the same torch wheel comes from the local registry).
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import urllib.request
from pathlib import Path

import pytest
import yaml

from service.process import free_port, stop_process_group, wait_ready
from tests.service_server import REPO, base_env, register_model, tiny_model_dir_quickly

SERVICE_NEEDS = ("torch", "numpy", "pydantic", "pyyaml", "safetensors", "spacy", "bentoml", "scipy", "psycopg",
                 "psycopg-binary", "threadpoolctl")  # what service/ and monitoring/ import (psycopg for a PostgreSQL
# feedback store; threadpoolctl: a worker caps numpy's BLAS threads)


def runtime_closure(roots: tuple[str, ...] = SERVICE_NEEDS) -> dict[str, str]:
    """Every package the service's own needs pull in, installed here, by normalised name: its version."""
    from packaging.requirements import Requirement

    found: dict[str, str] = {}
    stack = list(roots)
    while stack:
        name = re.sub(r"[-_.]+", "-", stack.pop()).lower()
        if name in found:
            continue
        try:
            dist = importlib.metadata.distribution(name)
        except importlib.metadata.PackageNotFoundError:
            continue
        found[name] = dist.version.split("+")[0]  # torch 2.13.0+cpu: the index decides the build
        for line in dist.requires or []:
            requirement = Requirement(line)
            if requirement.marker is None or requirement.marker.evaluate({"extra": ""}):
                stack.append(requirement.name)
    return found


pytestmark = [pytest.mark.slow, pytest.mark.bento, pytest.mark.timeout(1500)]  # pip may be slow on a cold cache
KEY = "bento-test-key-0123456789abcdef"


@pytest.fixture(scope="module")
def bento(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> dict:
    """A bento built from a small trained model, exported, unpacked outside the checkout and
    installed into a fresh virtual environment from its own requirements."""
    root = tmp_path_factory.mktemp("bento")
    home = root / "build-home"
    tag = register_model(tiny_model_dir_quickly(request), home)
    env = base_env(home) | {"HAN_MODEL_TAG": tag}
    env.pop("PYTHONPATH")  # the build reads the checkout as its context, nothing else
    bentoml = [sys.executable, "-m", "bentoml"]
    built = subprocess.run([*bentoml, "build", "--output", "tag"], cwd=REPO, env=env, capture_output=True, text=True,
                           timeout=300)
    assert built.returncode == 0, built.stderr[-3000:]
    bento_tag = re.findall(r"__tag__:(\S+)", built.stdout)[-1]
    archive = root / "han.bento"
    exported = subprocess.run([*bentoml, "export", bento_tag, str(archive)], env=env, capture_output=True,
                              text=True, timeout=300)
    assert exported.returncode == 0, exported.stderr[-3000:]

    deploy = root / "deploy"  # what an image holds: the bento at $BENTO_PATH, nothing of the checkout
    with tarfile.open(archive) as tar:
        tar.extractall(deploy / "bento", filter="data")
    venv = deploy / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV", "BENTOML"))}
    installed = subprocess.run(
        [str(venv / "bin/pip"), "install", "--quiet", "--retries", "0", "-r",
         str(deploy / "bento/env/python/requirements.txt")],
        env=clean, capture_output=True, text=True, timeout=900,
    )
    assert installed.returncode == 0, installed.stderr[-3000:]
    return {"bento": deploy / "bento", "venv": venv, "model": tag, "bento_tag": bento_tag, "env": clean,
            "root": root}


def serve(bento: dict, *args: str, extra_env: dict[str, str] | None = None) -> tuple[subprocess.Popen, str, Path]:
    """The image's entrypoint, run with the variables the Dockerfile sets, from the bento's folder."""
    port, path = free_port(), bento["bento"]
    env = bento["env"] | {
        "PATH": f"{bento['venv'] / 'bin'}{os.pathsep}{os.environ['PATH']}",
        "BENTO_PATH": str(path), "BENTOML_HOME": str(bento["root"] / "image-home"), "BENTOML_CONTAINERIZED": "true",
        "BENTOML_PORT": str(port), "LANG": "C.UTF-8", "PYTHONUNBUFFERED": "1", "BENTOML_DO_NOT_TRACK": "true",
        **(extra_env or {}),
    }
    log = bento["root"] / f"serve-{port}.log"
    with log.open("wb") as out:
        process = subprocess.Popen(["bash", str(path / "env/docker/entrypoint.sh"), *args], cwd=path, env=env,
                                   stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    return process, f"http://127.0.0.1:{port}", log


def call(url: str, body: dict | None = None, key: str | None = None) -> tuple[int, dict | str]:
    headers = {"Content-Type": "application/json"} | ({"Authorization": f"Bearer {key}"} if key else {})
    request = urllib.request.Request(url, data=None if body is None else json.dumps(body).encode(), headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            text = response.read().decode()
            return response.status, json.loads(text) if "json" in response.headers.get("content-type", "") else text
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read().decode())


def test_requirements_pin_each_package_once_at_the_tested_version(bento: dict) -> None:
    lines = (bento["bento"] / "env/python/requirements.txt").read_text().splitlines()
    pins = [line for line in lines if line.strip() and not line.startswith(("#", "-"))]
    names = [re.split(r"==", pin)[0].strip().lower() for pin in pins]
    assert len(names) == len(set(names)), f"a package pinned twice: {pins}"
    for pin in pins:
        name, _, version = pin.partition("==")
        assert version, f"{pin}: not an exact pin"
        assert importlib.metadata.version(name).split("+")[0] == version, f"{pin}: the tests run with another version"
    assert {"torch", "bentoml", "spacy", "safetensors", "pydantic", "numpy"} <= set(names)
    normalised = {re.sub(r"[-_.]+", "-", name) for name in names}
    missing = sorted(set(runtime_closure()) - normalised)
    assert not missing, (f"not pinned in service/requirements.txt: {missing}; regenerate it with "
                         "`.venv/bin/python -m tests.test_bento > service/requirements.txt`")
    dockerfile = (bento["bento"] / "env/docker/Dockerfile").read_text()
    assert "pip install -r $BENTO_PATH/env/python/requirements.txt" in dockerfile  # the image installs these
    assert "--extra-index-url https://download.pytorch.org/whl/cpu" in lines  # torch's CPU wheel in the image


def test_the_bento_holds_every_service_module_and_its_model(bento: dict) -> None:
    src = bento["bento"] / "src"
    imported = set()
    for path in (REPO / "service").glob("*.py"):
        imported |= set(re.findall(r"^(?:from|import) ((?:service|han|model_store|monitoring)\.\w+)", path.read_text(),
                                   re.M))
    for module in imported:
        assert (src / (module.replace(".", "/") + ".py")).is_file(), f"{module} is missing from the bento"
    name, version = bento["model"].split(":")
    assert (bento["bento"] / "models" / name / version / "model.safetensors").is_file()
    info = yaml.safe_load((bento["bento"] / "bento.yaml").read_text())
    assert info["services"][0]["models"][0]["tag"] == bento["model"]


def test_the_bento_serves_from_a_fresh_environment(bento: dict) -> None:
    """No checkout on the path, nothing of the project installed: what a container runs."""
    check = subprocess.run([str(bento["venv"] / "bin/python"), "-c", "import han"], cwd=bento["root"],
                           env=bento["env"], capture_output=True, text=True)
    assert check.returncode != 0, "the project is importable outside the bento: the test would prove nothing"
    process, url, log = serve(bento)
    try:
        assert wait_ready(url, process, timeout=180), log.read_text()[-4000:]
        status, body = call(url + "/classify", {"documents": ["A wonderful film. I loved it."],
                                                "explain": "occlusion"})
        assert status == 200, body
        result = body["results"][0]
        assert result["label"] in ("neg", "pos") and result["method"] == "occlusion"
        assert result["sentences"][0]["words"], "no word weights"
        assert body["model"] == bento["model"]
        status, info = call(url + "/model")
        assert status == 200 and info["tag"] == bento["model"] and info["labels"] == ["neg", "pos"]
        status, page = call(url + "/")
        assert status == 200 and "<html" in page
        assert "ModuleNotFoundError" not in log.read_text()
    finally:
        stop_process_group(process)


def test_an_exposed_container_needs_keys_from_a_mounted_file(bento: dict, tmp_path: Path) -> None:
    """``docker run ... --host 0.0.0.0``: refused without keys, served with a keys file."""
    process, url, log = serve(bento, "--host", "0.0.0.0")
    try:
        assert process.wait(120) != 0
    finally:
        stop_process_group(process)
    assert "no API key is set" in log.read_text()
    assert "Traceback" not in log.read_text()

    keys = tmp_path / "keys.txt"  # what -v keys.txt:/run/secrets/han-keys:ro mounts
    keys.write_text(KEY + "\n")
    process, url, log = serve(bento, "--host", "0.0.0.0", extra_env={"HAN_API_KEYS_FILE": str(keys)})
    try:
        assert wait_ready(url, process, timeout=180), log.read_text()[-4000:]
        assert call(url + "/classify", {"documents": ["Fine."]})[0] == 401
        status, body = call(url + "/classify", {"documents": ["Fine."], "explain": False}, key=KEY)
        assert status == 200 and body["model"] == bento["model"]
    finally:
        stop_process_group(process)


@pytest.fixture(scope="module", autouse=True)
def _cleanup(bento: dict):
    yield
    shutil.rmtree(bento["root"], ignore_errors=True)



if __name__ == "__main__":  # service/requirements.txt, from the versions installed here
    print(__import__("pathlib").Path("service/requirements.txt").read_text().split("\n\n")[0] + "\n")
    for name, version in sorted(runtime_closure().items()):
        if name != "bentoml":  # BentoML writes the one that builds the bento
            print(f"{name}=={version}")
