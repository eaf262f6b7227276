"""``make run``: serve the default model on http://localhost:3000, training it first if there is none.

    python -m service.run [--host 127.0.0.1] [--port 3000] [--tag han-imdb:latest]

The model is ``--tag``, else ``$HAN_MODEL_TAG``, else ``han-imdb:latest``. If the BentoML model
store has no ``han-imdb`` model, the quick IMDB model is trained first
(``han-train fit --config data/configs/imdb_quick.yaml``, a few minutes on 2 cores), which
registers it; the next run finds it and starts in seconds. Another tag that is missing is an
error: only the default model is trained here.
"""

from __future__ import annotations

import argparse
import shutil
import signal
import subprocess
import sys
from pathlib import Path

from han.environment import apply_defaults
from model_store import DEFAULT_MODEL_TAG, MODEL_TAG_ENV, ModelNotFoundError, default_model_tag, model_path
from service.process import REPO, start_server, wait_ready

QUICK_CONFIG = "data/configs/imdb_quick.yaml"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m service.run", description=__doc__.split("\n\n")[0])
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1: this machine only)")
    parser.add_argument("--port", type=int, default=3000, help="port (default 3000)")
    parser.add_argument("--tag", default=None, help=f"model to serve (default ${MODEL_TAG_ENV} or {DEFAULT_MODEL_TAG})")
    return parser.parse_args(argv)


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
    tag = args.tag or default_model_tag()
    if not has_model(tag):
        if tag.split(":")[0] != DEFAULT_MODEL_TAG.split(":")[0]:
            sys.exit(f"no model {tag!r} in the BentoML model store (see `bentoml models list`)")
        train_default_model()
        if not has_model(tag):
            sys.exit(f"training finished but the model store still has no {tag!r}")

    host = "localhost" if args.host in ("127.0.0.1", "localhost") else args.host
    url = f"http://{host}:{args.port}"
    print(f"Starting the service for {tag} on {url} ...", flush=True)
    process = start_server(tag, args.port, host=args.host, own_session=False)  # Ctrl+C reaches it too
    try:
        if wait_ready(f"http://127.0.0.1:{args.port}" if args.host in ("0.0.0.0", "::") else url, process):
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
