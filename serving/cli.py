"""``transdenoiser serve``: check a model directory, then hand over to ``bentoml serve``."""
from __future__ import annotations

import argparse
import errno
import ipaddress
import os
import socket
import sys
from pathlib import Path

from serving.auth import API_KEY_ENV, api_key_from_env
from serving.config import DEVICE_ENV, MODEL_DIR_ENV, load_config
from transdenoiser.argtypes import open_unit_interval, positive_float, positive_int
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


def check_port_free(host: str, port: int) -> None:
    """Refuse, in one line, an address that cannot be listened on: a port in use (another server), a host that
    is not this machine's, a privileged port. SO_REUSEADDR as servers set it: a port in TIME_WAIT is free."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as exc:
        raise UserError(f"--host {host}: unknown host ({exc.strerror})") from None
    family, kind, proto, _, address = infos[0]
    with socket.socket(family, kind, proto) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(address)
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                raise UserError(f"port {port} on {host} is already in use (another server running?): stop it or "
                                "pass --port N") from None
            if exc.errno == errno.EADDRNOTAVAIL:
                raise UserError(f"--host {host}: not an address of this machine") from None
            if exc.errno == errno.EACCES:
                raise UserError(f"--port {port}: ports below 1024 need privileges; pass --port 3000 or another "
                                "above 1023") from None
            raise UserError(f"cannot listen on {host}:{port}: {exc.strerror}") from None


def check_model_dir(model_dir: Path) -> None:
    """The cheap checks of a model directory (before torch is imported): it exists, its serving.toml is valid,
    and the checkpoint folders it names are there. Loading it (load_model_dir) checks the rest: hashes, kinds,
    format versions, that the two models fit."""
    config = load_config(model_dir)  # "no such directory", a bad or missing serving.toml: one line
    for key in ("classifier", "denoiser"):
        name = getattr(config, key)
        if name is not None and not (model_dir / name / "metadata.json").is_file():
            raise UserError(f"model directory {model_dir}: {key} = {name!r} names no checkpoint ({model_dir / name} "
                            "has no metadata.json); write model directories with 'transdenoiser bundle'")


def _bundle(args: argparse.Namespace) -> int:
    if args.out.exists() and (not args.out.is_dir() or any(args.out.iterdir())):
        raise UserError(f"--out {args.out} already exists and is not an empty directory")
    if args.sigma is None and args.denoiser is None:
        raise UserError("give --sigma (the smoothing noise; it is taken from the denoiser's training sigma when "
                        "there is a denoiser)")
    from serving.bundle import write_model_dir
    from training.checkpoint import read_record
    from transdenoiser.checks import check_not_worse_than_classifier, check_sigma, denoiser_sigma

    denoiser_meta = read_record(args.denoiser) if args.denoiser is not None else None
    sigma = args.sigma if args.sigma is not None else denoiser_sigma(denoiser_meta)
    if sigma is None:
        raise UserError("give --sigma (the smoothing noise; it is taken from the denoiser's training sigma when "
                        "there is a denoiser)")
    warning = check_sigma(sigma, denoiser_meta, allow_mismatch=args.allow_sigma_mismatch,
                          denoiser=f"denoiser {args.denoiser}")
    if warning:
        print(warning, file=sys.stderr)
    # a denoiser worse than none: one line and exit 2, or with the flag the whole warning (and the card records it)
    warning = check_not_worse_than_classifier(denoiser_meta, allow=args.allow_worse_than_classifier,
                                              denoiser=f"denoiser {args.denoiser}")
    if warning:
        print(warning, file=sys.stderr)
    settings = {key: getattr(args, key) for key in ("batch_size", "max_images") if getattr(args, key) is not None}
    if args.allow_client_seed:
        settings["allow_client_seed"] = True
    if args.allow_worse_than_classifier:
        settings["allow_worse_than_classifier"] = True
    if args.precision != "fp32" or args.compile:
        settings.update(precision=args.precision, compile=args.compile)
    if args.sound_noise:
        settings["sound_noise"] = True
    write_model_dir(args.out, args.classifier, args.denoiser, sigma=sigma, n0=args.n0, n=args.n, max_n=args.max_n,
                    alpha=args.alpha, **settings)
    print(f"wrote {args.out} (sigma {sigma:g}, n0 {args.n0}, n {args.n}, max_n {args.max_n}, alpha {args.alpha:g}, "
          f"precision {args.precision}{', compiled' if args.compile else ''}"
          f"{', sound noise' if args.sound_noise else ''}); "
          f"serve it with: transdenoiser serve --model-dir {args.out}")
    return 0


def _serve(args: argparse.Namespace) -> int:
    model_dir = args.model_dir or os.environ.get(MODEL_DIR_ENV)
    if not model_dir:
        raise UserError(f"give --model-dir DIR or set {MODEL_DIR_ENV}")
    model_dir = Path(model_dir)
    check_model_dir(model_dir)  # before importing torch: a missing or broken model directory is one line at once
    check_port_free(args.host, args.port)

    from serving.bundle import load_model_dir
    from serving.library_patches import check_library_internals
    from transdenoiser.checks import ALLOW_WORSE_FLAG, check_sigma, worse_than_classifier, worse_than_classifier_warning

    check_library_internals()  # the BentoML and uvicorn internals the server patches: one line if they changed

    bundle = load_model_dir(model_dir, device="cpu")  # every setting and both checkpoints, before starting
    warning = check_sigma(bundle.config.sigma, bundle.pipeline.denoiser_record, allow_mismatch=True,
                          where="serving.toml sigma", denoiser="its denoiser")
    if warning:
        print(f"transdenoiser serve: {warning}", file=sys.stderr)
    worse = worse_than_classifier(bundle.pipeline.denoiser_record)
    if worse is not None:
        print(worse_than_classifier_warning(worse, f"{model_dir}'s denoiser")
              + (f" (bundled with {ALLOW_WORSE_FLAG})" if bundle.config.allow_worse_than_classifier else ""),
              file=sys.stderr)
    auth = api_key_from_env() is not None
    if not auth and not _is_loopback(args.host):
        print(f"transdenoiser serve: warning: listening on {args.host} without an API key; set {API_KEY_ENV} "
              f"to require one", file=sys.stderr)
    command = serve_command(args.host, args.port)
    if args.dry_run:
        print(f"{MODEL_DIR_ENV}={model_dir.resolve()} {DEVICE_ENV}={args.device} " + " ".join(command))
        return 0
    print(f"transdenoiser serve: {model_dir} (sigma={bundle.config.sigma}, n0={bundle.config.n0}, "
          f"n={bundle.config.n}, alpha={bundle.config.alpha}, precision={bundle.config.precision}"
          f"{', compiled' if bundle.config.compile else ''}{', sound noise' if bundle.config.sound_noise else ''}) "
          f"on http://{args.host}:{args.port}, API key "
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

    p = subparsers.add_parser(
        "bundle", parents=[common], help="write a servable model directory from checkpoints",
        description="Copy a classifier checkpoint (and a denoiser's) into a new model directory with its "
                    "serving.toml, after checking that they load and fit together; `transdenoiser serve "
                    "--model-dir OUT` serves it. Only the released files are copied (weights and metadata; never a "
                    "training run's private record).")
    p.add_argument("--classifier", type=Path, required=True, help="classifier checkpoint directory")
    p.add_argument("--denoiser", type=Path, default=None, help="denoiser checkpoint directory (optional)")
    p.add_argument("--sigma", type=positive_float, default=None,
                   help="smoothing noise, [0,1]-pixel units (default: the denoiser's training sigma)")
    p.add_argument("--allow-sigma-mismatch", action="store_true",
                   help="accept a --sigma other than the denoiser's training sigma (refused otherwise)")
    p.add_argument("--allow-worse-than-classifier", action="store_true",
                   help="bundle a denoiser that training measured worse than no denoiser (the classifier alone is "
                        "more accurate under the same noise; refused otherwise); recorded in serving.toml and on the "
                        "model card")
    p.add_argument("--n0", type=positive_int, default=100, help="selection samples per image (default: 100)")
    p.add_argument("--n", type=positive_int, default=1000,
                   help="estimation samples per image unless a request asks for another n (default: 1000)")
    p.add_argument("--max-n", type=positive_int, default=10_000, help="largest n a request may ask (default: 10000)")
    p.add_argument("--alpha", type=open_unit_interval, default=0.001,
                   help="each certificate holds with probability >= 1 - alpha (default: 0.001)")
    p.add_argument("--batch-size", type=positive_int, default=None,
                   help="most noisy samples in one shared forward pass (default: the server's, 1000)")
    p.add_argument("--max-images", type=positive_int, default=None, help="images per request (default: 16)")
    p.add_argument("--allow-client-seed", action="store_true",
                   help="accept a client seed (reproducible noise; see docs/SERVING.md)")
    from certify.cli import add_numerics_args, add_sound_noise_arg

    runs = p.add_argument_group("how the server runs the models (recorded in serving.toml)")
    add_numerics_args(runs)
    add_sound_noise_arg(runs)
    p.add_argument("--out", type=Path, required=True, help="model directory to write (new or empty)")
    p.set_defaults(handler=_bundle)
