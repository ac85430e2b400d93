"""``transdenoiser demo``: the main job end to end on the embedded mnist10k data.

It runs the same subcommands a user would (so what it prints is what they print), one after another:
data -> pretrain -> train (the recipe: DP-SGD with objective stability+mse, configs/demo.toml) -> certify -> a model
directory to serve.
Finished steps are reused when the demo runs again (nothing is overwritten or lost); delete the output
folder to start over.
"""
from __future__ import annotations

import json
import os
import shlex
import sys
from pathlib import Path

from transdenoiser.argtypes import positive_int

DEMO_CONFIG = Path(__file__).resolve().parents[1] / "configs" / "demo.toml"
SIGMA = 0.25


def register(subparsers, common) -> None:
    p = subparsers.add_parser(
        "demo", parents=[common], help="run the main job end to end on the embedded data",
        description="On mnist10k: pretrain the classifier on the public split, train a private denoiser "
                    "(the recipe, configs/demo.toml: DP-SGD at epsilon 1, MSE on the public split then the frozen "
                    "classifier's stability loss on the private split) and print its privacy report, "
                    "certify test images by randomized smoothing and print the certified-accuracy table, and write "
                    "a model directory that `transdenoiser serve` serves. 102-107 s on 2 quiet CPU cores (AMD EPYC, "
                    "docs/RESULTS.md); several times longer on a busy machine.")
    p.add_argument("--out", type=Path, default=Path("runs/demo"), help="where the demo writes (default: runs/demo)")
    p.add_argument("--pretrain-epochs", type=positive_int, default=8, help="classifier epochs (default: 8)")
    p.add_argument("--skip", type=positive_int, default=10,
                   help="certify every SKIP-th test image (default: 10, i.e. 201 images)")
    p.add_argument("--n", type=positive_int, default=500, help="estimation samples per image (default: 500)")
    p.set_defaults(handler=cmd_demo)


def command_prefix() -> str:
    """How to run ``transdenoiser`` from a fresh shell in the current folder: the console script installed next to
    this interpreter (``.venv/bin/transdenoiser`` after ``make demo``; relative when it lies below the current
    folder), else ``python -m transdenoiser`` with this interpreter's full path. Never a bare name that needs an
    activated environment."""
    executable = Path(sys.executable)
    script = executable.parent / "transdenoiser"
    if script.is_file() and os.access(script, os.X_OK):
        target = script.absolute()
    else:
        return f"{shlex.quote(str(executable.absolute()))} -m transdenoiser"
    try:
        return shlex.quote(str(target.relative_to(Path.cwd())))
    except ValueError:
        return shlex.quote(str(target))


def next_steps(serve_dir: Path) -> list[str]:
    """The lines the demo ends with: each command works pasted into a fresh shell in the current folder."""
    prefix = command_prefix()
    example = Path(__file__).resolve().parents[1] / "docs" / "examples" / "digit7.png"
    try:
        example = example.relative_to(Path.cwd())
    except ValueError:
        pass
    directory = shlex.quote(str(serve_dir))
    return ["Done. Serve the certified predictions (Ctrl-C stops the server):",
            f"  {prefix} serve --model-dir {directory}",
            "then, from another terminal in this folder, ask for one (the answer is JSON):",
            f"  curl -s -X POST http://127.0.0.1:3000/predict -F images=@{shlex.quote(str(example))}",
            f"  curl -s -X POST http://127.0.0.1:3000/predict -F images=@{shlex.quote(str(example))} -F radius=0.5",
            f"Every command has --help: {prefix} --help. To type plain `transdenoiser`, first run: "
            f"source {shlex.quote(str(Path(prefix).parent / 'activate'))}" if prefix.endswith("transdenoiser")
            and " " not in prefix else f"Every command has --help: {prefix} --help."]


def _step(number: int, text: str) -> None:
    print(f"\n=== [{number}/5] {text}", flush=True)


def _done(directory: Path) -> bool:
    return (directory / "metadata.json").is_file()


def cmd_demo(args) -> int:
    import sys

    from transdenoiser.cli import main
    from transdenoiser.errors import UserError

    sys.stdout.reconfigure(line_buffering=True)  # show each step as it happens, also in a log file
    common = ["--device", args.device, "--seed", str(args.seed)]
    out: Path = args.out
    classifier, denoiser = out / "classifier", out / "denoiser"
    certify_dir, serve_dir = out / "certify", out / "serve"

    def run(argv: list[str]) -> None:
        from transdenoiser.cli import COMMON_OPTIONS_USED

        used = COMMON_OPTIONS_USED.get(argv[0], ("device", "seed"))  # only the options the command takes
        code = main(argv + [word for flag, value in zip(common[::2], common[1::2], strict=True)
                            if flag.lstrip("-") in used for word in (flag, value)])
        if code != 0:
            raise UserError(f"step `transdenoiser {' '.join(argv)}` failed (exit {code})")

    _step(1, "data: the embedded mnist10k and its three disjoint splits")
    run(["data", "--dataset", "mnist10k"])

    _step(2, "pretrain the classifier on the public split (someone else's frozen model)")
    if _done(classifier):
        meta = json.loads((classifier / "metadata.json").read_text())
        print(f"reusing {classifier}: test accuracy {meta['test_accuracy']:.4f} (delete it to retrain)")
    else:
        run(["pretrain", "--dataset", "mnist10k", "--epochs", str(args.pretrain_epochs), "--out", str(classifier)])

    _step(3, "train the denoiser with differential privacy (the recipe: MSE on the public split, then the "
             "classifier's stability loss on the private split, DP-SGD at epsilon 1)")
    if not DEMO_CONFIG.is_file():
        raise UserError(f"{DEMO_CONFIG} is missing: run the demo from a checkout of the repository")
    if _done(denoiser):
        print(f"found {denoiser}: resuming it (finishes any epochs left; delete it to retrain)")
        run(["train", "--out", str(denoiser), "--resume"])
    else:
        run(["train", "--config", str(DEMO_CONFIG), "--classifier", str(classifier), "--out", str(denoiser)])

    _step(4, f"certify every {args.skip}th test image by randomized smoothing (sigma {SIGMA}, n0 100, n {args.n})")
    run(["certify", "--classifier", str(classifier), "--denoiser", str(denoiser), "--sigma", str(SIGMA),
         "--n0", "100", "--n", str(args.n), "--alpha", "0.001", "--skip", str(args.skip), "--out", str(certify_dir)])

    _step(5, "a model directory for the prediction API")
    if (serve_dir / "serving.toml").is_file() or (serve_dir.is_dir() and any(serve_dir.iterdir())):
        print(f"reusing {serve_dir}")
    else:
        from serving.bundle import write_model_dir

        write_model_dir(serve_dir, classifier, denoiser, sigma=SIGMA, n0=100, n=1000, max_n=10000, alpha=0.001)
        print(f"wrote {serve_dir}")
    print("\n" + "\n".join(next_steps(serve_dir)))
    return 0
