"""``make run``: serve the default model on http://localhost:3000, training it first if there is none.

    python -m service.run [--host 127.0.0.1] [--port 3000] [--tag han-imdb:production] [--allow-anonymous]
                          [--ssl-certfile cert.pem --ssl-keyfile key.pem]

The model is ``--tag``, else ``$HAN_MODEL_TAG``, else ``han-imdb:production``; only that default is
trained here when missing (``data/configs/imdb_quick.yaml``, a few minutes), another missing tag is an
error. Beyond loopback it needs API keys (service/auth.py) or ``--allow-anonymous``.
"""

from __future__ import annotations

import argparse
import shutil
import signal
import ssl
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

from han.environment import apply_defaults
from model_store import DEFAULT_MODEL_TAG, ModelNotFoundError, default_model_tag, model_path
from model_store.production import MODEL_TAG_ENV
from service.auth import KeysError, startup_keys
from service.process import REPO, start_server, wait_ready
from service.settings import ANONYMOUS_ENV, KEYS_ENV, KEYS_FILE_ENV, Settings

QUICK_CONFIG = "data/configs/imdb_quick.yaml"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m service.run", description=__doc__.split("\n\n")[0])
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1: this machine only)")
    parser.add_argument("--port", type=int, default=3000, help="port (default 3000)")
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


def has_model(tag: str) -> bool:
    try:
        model_path(tag)
    except ModelNotFoundError:
        return False
    return True


def train_default_model() -> None:
    """Train and register the quick IMDB model (``han-imdb``) with the project's training CLI."""
    script = Path(sys.executable).with_name("han-train")
    command = [str(script)] if script.is_file() else [shutil.which("han-train") or "han-train"]
    command += ["fit", "--config", QUICK_CONFIG]
    print(f"No {DEFAULT_MODEL_TAG} model in the model store yet: training the quick IMDB model first.", flush=True)
    print(f"  $ {' '.join(command)}", flush=True)
    try:
        subprocess.run(command, cwd=REPO, check=True)
    except FileNotFoundError:
        sys.exit("han-train is not installed: run `make install` (or `pip install -e .`) first")
    except subprocess.CalledProcessError as e:
        sys.exit(f"training the default model failed (exit status {e.returncode})")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    apply_defaults()
    try:  # before any training: a server that would refuse to start says so now
        startup_keys(args.host, replace(Settings.read(), allow_anonymous=args.allow_anonymous))
    except (KeysError, ValueError) as e:
        sys.exit(f"error: {e}")
    tag = args.tag or default_model_tag()
    if not has_model(tag):
        if tag.split(":")[0] != DEFAULT_MODEL_TAG.split(":")[0]:
            sys.exit(f"no model {tag!r} in the BentoML model store (see `bentoml models list`)")
        train_default_model()
        if not has_model(tag):
            sys.exit(f"training finished but the model store still has no {tag!r}")

    host = "localhost" if args.host in ("127.0.0.1", "localhost") else args.host
    scheme = "https" if args.ssl_certfile else "http"
    url = f"{scheme}://{host}:{args.port}"
    print(f"Starting the service for {tag} on {url} ...", flush=True)
    # The server runs from the checkout: files named relative to where the user is are made absolute.
    tls = (("--ssl-certfile", str(Path(args.ssl_certfile).resolve()), "--ssl-keyfile",
            str(Path(args.ssl_keyfile).resolve())) if args.ssl_certfile else ())
    env = {ANONYMOUS_ENV: "1"} if args.allow_anonymous else None
    process = start_server(tag, args.port, host=args.host, env=env, own_session=False, args=tls)  # Ctrl+C too
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
