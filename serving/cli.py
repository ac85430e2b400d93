"""``transdenoiser serve``: check a model directory, then hand over to ``bentoml serve``."""
from __future__ import annotations

import argparse
import ipaddress
import os
import sys
from pathlib import Path

from serving.auth import API_KEY_ENV, api_key_from_env
from serving.config import DEVICE_ENV, MODEL_DIR_ENV
from transdenoiser.argtypes import positive_int
from transdenoiser.errors import UserError

SERVICE_TARGET = "serving.service:TransDenoiser"
DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 3000


def _port(text: str) -> int:
    value = positive_int(text)
    if value > 65535:
        raise argparse.ArgumentTypeError(f"must be a TCP port in 1..65535, got {value}")
    return value


def serve_command(host: str = DEFAULT_HOST, port: int = DEFAULT_PORT) -> list[str]:
    """The ``bentoml serve`` command line (run with TRANSDENOISER_MODEL_DIR set)."""
    working_dir = Path(__file__).resolve().parent.parent  # where the serving package is importable from
    return [sys.executable, "-m", "bentoml", "serve", SERVICE_TARGET, "--host", host, "--port", str(port),
            "--working-dir", str(working_dir)]


def serve_environment(model_dir: Path, device: str) -> dict[str, str]:
    env = dict(os.environ)
    env[MODEL_DIR_ENV] = str(model_dir.resolve())
    env[DEVICE_ENV] = device
    env.setdefault("BENTOML_DO_NOT_TRACK", "True")  # no usage statistics unless the user opted in explicitly
    return env


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _serve(args: argparse.Namespace) -> int:
    from serving.bundle import load_model_dir

    model_dir = args.model_dir or os.environ.get(MODEL_DIR_ENV)
    if not model_dir:
        raise UserError(f"give --model-dir DIR or set {MODEL_DIR_ENV}")
    model_dir = Path(model_dir)
    bundle = load_model_dir(model_dir, device="cpu")  # every setting and both checkpoints, before starting
    auth = api_key_from_env() is not None
    if not auth and not _is_loopback(args.host):
        print(f"transdenoiser serve: warning: listening on {args.host} without an API key; set {API_KEY_ENV} "
              f"to require one", file=sys.stderr)
    command = serve_command(args.host, args.port)
    if args.dry_run:
        print(f"{MODEL_DIR_ENV}={model_dir.resolve()} {DEVICE_ENV}={args.device} " + " ".join(command))
        return 0
    print(f"transdenoiser serve: {model_dir} (sigma={bundle.config.sigma}, n0={bundle.config.n0}, "
          f"n={bundle.config.n}, alpha={bundle.config.alpha}) on http://{args.host}:{args.port}, API key "
          f"{'required' if auth else 'off'}; Ctrl-C stops", file=sys.stderr, flush=True)
    os.execve(command[0], command, serve_environment(model_dir, args.device))
    return 0  # not reached


def register(subparsers, common) -> None:
    """Add this area's subcommands to the ``transdenoiser`` parser."""
    p = subparsers.add_parser(
        "serve", parents=[common], help="serve certified predictions over HTTP (BentoML)",
        description="Serve a model directory (see serving.bundle.write_model_dir) with 'bentoml serve': "
                    "POST /predict, POST /metadata, GET /healthz /readyz /livez /metrics. Each image's noise is "
                    "keyed to the model, the image and the settings, so --seed is not used. Set "
                    f"{API_KEY_ENV} to require an API key.")
    p.add_argument("--model-dir", default=None,
                   help=f"model directory with serving.toml and the checkpoints (default: ${MODEL_DIR_ENV})")
    p.add_argument("--host", default=DEFAULT_HOST, help=f"address to listen on (default: {DEFAULT_HOST}; "
                                                        "0.0.0.0 exposes the server to the network)")
    p.add_argument("--port", type=_port, default=DEFAULT_PORT, help=f"TCP port (default: {DEFAULT_PORT})")
    p.add_argument("--dry-run", action="store_true",
                   help="check the model directory and print the bentoml command instead of running it")
    p.set_defaults(handler=_serve)
