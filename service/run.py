"""``make run``: serve the default model on http://localhost:3000, training it first if there is none.

    python -m service.run [--host 127.0.0.1] [--port 3000] [--tag han-imdb:production] [--allow-anonymous]
                          [--ssl-certfile cert.pem --ssl-keyfile key.pem]

The model is ``--tag``, else ``$HAN_MODEL_TAG``, else ``han-imdb:production``; when the store has no
``han-imdb`` at all, it is trained here first (``data/configs/imdb_quick.yaml``, a few minutes); any other
missing model (another name, a version, a production pointer naming a deleted version) is an error.
Beyond loopback it needs API keys (service/auth.py) or ``--allow-anonymous``.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import socket
import ssl
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

from han.environment import apply_defaults
from model_store import DEFAULT_MODEL_TAG, ModelNotFoundError, default_model_tag, first_version, resolve_tag
from model_store.production import (
    MODEL_TAG_ENV,
    PromotionError,
    bentoml_home,
    follows_pointer,
    production_tag,
    split_tag,
)
from model_store.upgrade import served_before
from service.auth import KeysError, startup_keys
from service.process import REPO, start_server, wait_ready
from service.settings import ANONYMOUS_ENV, FEEDBACK_STORE_ENV, KEYS_ENV, KEYS_FILE_ENV, Settings, absolute_store

QUICK_CONFIG = "data/configs/imdb_quick.yaml"


def port_number(value: str) -> int:
    try:
        port = int(value)
    except ValueError:
        port = 0
    if not 1 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"a port is a number from 1 to 65535, not {value!r}")
    return port


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m service.run", description=__doc__.split("\n\n")[0])
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1: this machine only)")
    parser.add_argument("--port", type=port_number, default=3000, help="port (default 3000)")
    parser.add_argument("--tag", default=None, help=f"model to serve (default ${MODEL_TAG_ENV} or {DEFAULT_MODEL_TAG})")
    parser.add_argument("--allow-anonymous", action="store_true",
                        help=f"serve on a non-loopback --host without API keys (${KEYS_FILE_ENV} / ${KEYS_ENV})")
    parser.add_argument("--ssl-certfile", help="serve HTTPS with this certificate (PEM; with --ssl-keyfile)")
    parser.add_argument("--ssl-keyfile", help="the certificate's private key (PEM)")
    args = parser.parse_args(argv)
    if bool(args.ssl_certfile) != bool(args.ssl_keyfile):
        parser.error("--ssl-certfile and --ssl-keyfile go together")
    for path in filter(None, (args.ssl_certfile, args.ssl_keyfile)):
        if not Path(path).is_file():
            parser.error(f"{path}: no such file")
    return args


def missing_model(tag: str) -> str | None:
    """Why the store cannot serve ``tag`` (None: it can)."""
    try:
        resolve_tag(tag)
    except ModelNotFoundError as e:
        name = split_tag(tag)[0]
        pointed = production_tag(name) if follows_pointer(tag) else None
        if pointed is not None:
            return (f"{name}'s production pointer names {pointed}, which is not in the model store: promote "
                    f"a stored version (`han-model status {name}`, `han-model promote {name}:VERSION`)")
        return str(e)
    return None


def port_taken(host: str, port: int) -> bool:
    """Whether something already listens on ``host``:``port`` (another server, an earlier ``make run``)."""
    try:
        family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]
    except socket.gaierror:
        return False  # the server names the bad address itself
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the server binds: TIME_WAIT is no clash
        try:
            probe.bind((host, port))
        except OSError:
            return True
    return False


def pass_on_stop_signals(child: subprocess.Popen) -> None:
    """SIGTERM or SIGHUP to this process (``kill``, a service manager, a closed terminal) reaches ``child`` too:
    a training or a server left running would go on holding the cores or the port."""
    def forward(signum: int, frame: object) -> None:
        if child.poll() is None:
            child.send_signal(signum)

    for number in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(number, forward)


def train_default_model() -> None:
    """Train and register the quick IMDB model (``han-imdb``) with the project's training CLI."""
    script = Path(sys.executable).with_name("han-train")
    command = [str(script)] if script.is_file() else [shutil.which("han-train") or "han-train"]
    command += ["fit", "--config", QUICK_CONFIG]
    print(f"No {DEFAULT_MODEL_TAG} model in the model store ({bentoml_home()}) yet: training the quick IMDB model "
          "first.", flush=True)
    print(f"  $ {' '.join(command)}", flush=True)
    try:
        training = subprocess.Popen(command, cwd=REPO)
    except FileNotFoundError:
        sys.exit("han-train is not installed: run `make install` (or `pip install -e .`) first")
    pass_on_stop_signals(training)
    try:
        code = training.wait()
    except KeyboardInterrupt:  # Ctrl+C reached han-train too: it stops with its own one line
        try:
            training.wait(60)
        except (KeyboardInterrupt, subprocess.TimeoutExpired):
            training.kill()
        sys.exit(130)
    if code in (130, -signal.SIGINT):  # Ctrl+C: han-train has said so in one line (this process may ignore SIGINT)
        sys.exit(130)
    if code != 0:
        sys.exit(f"training the default model failed (exit status {code})")


def served_or_trained(tag: str) -> None:
    """Exit with one line unless the store can serve ``tag``; on the first run (no han-imdb), train it first."""
    if (why := missing_model(tag)) is not None:
        name = split_tag(tag)[0]
        first_run = (split_tag(tag)[1] in (None, "production", "latest") and first_version(name) is None
                     and production_tag(name) is None)  # a pointer at a deleted version is no first run
        if name != split_tag(DEFAULT_MODEL_TAG)[0] or not first_run:
            sys.exit(f"error: {why}")
        train_default_model()  # the store has no han-imdb at all: the first `make run`
        if (why := missing_model(tag)) is not None:
            sys.exit(f"error: training finished but {why}")
    if follows_pointer(tag) and (note := served_before(split_tag(tag)[0])):  # a store an earlier release made
        print(note, flush=True)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    apply_defaults()
    if store := absolute_store(os.environ.get(FEEDBACK_STORE_ENV, "")):
        os.environ[FEEDBACK_STORE_ENV] = store  # the server runs from the checkout, the user from elsewhere
    try:  # before any training: a server that would refuse to start says so now
        startup_keys(args.host, replace(Settings.read(), allow_anonymous=args.allow_anonymous))
    except (KeysError, ValueError) as e:
        sys.exit(f"error: {e}")
    tag = args.tag or default_model_tag()
    if Path(tag).is_dir():
        sys.exit(f"error: {tag} is a model directory; the service serves a model of the BentoML model store by "
                 "its tag (han-train fit registers each model it trains; han-score and han-label take a directory)")
    if port_taken(args.host, args.port):
        sys.exit(f"error: port {args.port} on {args.host} is in use (another server, or a `make run` still "
                 "running?): stop it or pass --port")
    if (home := os.environ.get("BENTOML_HOME")) and not Path(home).expanduser().exists():
        # a mistyped store would read as an empty one, and the first fit would train into it for minutes
        sys.exit(f"error: BENTOML_HOME={home}: no such folder; create it, or unset BENTOML_HOME to use the default "
                 "store (~/bentoml)")
    try:
        served_or_trained(tag)
    except PromotionError as e:  # BENTOML_HOME a file, or a production pointer that cannot be read
        sys.exit(f"error: {e} (BENTOML_HOME={bentoml_home()})")
    host = "localhost" if args.host in ("127.0.0.1", "localhost") else args.host
    scheme = "https" if args.ssl_certfile else "http"
    url = f"{scheme}://{host}:{args.port}"
    print(f"Starting the service for {tag} on {url} ...", flush=True)
    # The server runs from the checkout: files named relative to where the user is are made absolute.
    tls = (("--ssl-certfile", str(Path(args.ssl_certfile).resolve()), "--ssl-keyfile",
            str(Path(args.ssl_keyfile).resolve())) if args.ssl_certfile else ())
    env = {ANONYMOUS_ENV: "1"} if args.allow_anonymous else None
    process = start_server(tag, args.port, host=args.host, env=env, own_session=False, args=tls)  # Ctrl+C too
    pass_on_stop_signals(process)
    local = f"{scheme}://127.0.0.1:{args.port}" if args.host in ("0.0.0.0", "::") else url
    context = None
    if tls:  # readiness of our own server on this machine: the certificate is the client's to check
        context = ssl.create_default_context()
        context.check_hostname, context.verify_mode = False, ssl.CERT_NONE
    try:
        if wait_ready(local, process, context=context):
            print(f"\n  Ready: {url}   (web page {url}/, API docs {url}/docs; Ctrl+C stops it)\n", flush=True)
        return process.wait()
    except KeyboardInterrupt:
        process.send_signal(signal.SIGINT)
        try:
            return process.wait(20)
        except subprocess.TimeoutExpired:
            process.terminate()
            return process.wait()


if __name__ == "__main__":
    sys.exit(main())
