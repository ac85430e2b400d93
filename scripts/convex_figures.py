"""Accuracy of private linear heads against epsilon (the shape of Ding et al.'s Figs. 2 and 4).

For each epsilon in 0.01..10: OPERA (aGM; sensitivity of Lemma 1, and of the exact minimiser), OutPert (output
perturbation with the classical Gaussian, epsilon <= 1 only), GRPUA (aGM per step, Theorem 7), SgdPert (GRPUA's
loop with the classical Gaussian per step, Theorem 7), GRPUA calibrated by the RDP accountant, DP-SGD on the head
(RDP accountant), and the non-private head. Replace-one (epsilon, delta) throughout. Features: a public-split
classifier's penultimate layer (--classifier) or pixels; each normalised to norm <= 1 (training/linear_probe.py).

    python scripts/convex_figures.py --dataset mnist10k --classifier runs/classifier --out docs/results
    python scripts/convex_figures.py --quick --out /tmp/convex_quick      # seconds: the smoke test's mode
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")  # the CPU is shared: one BLAS thread per run
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import numpy as np  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

EPSILONS = (0.01, 0.03, 0.1, 0.3, 1.0, 3.0, 10.0)
METHODS = ("OPERA", "OPERA (exact minimiser)", "OutPert", "GRPUA", "SgdPert", "GRPUA (RDP)", "DP-SGD head",
           "non-private")


def features(dataset_name: str, classifier: str | None, private_limit: int | None, seed: int):
    import torch

    from training.convex.train import build_probe, embed
    from training.datasets import load_dataset

    torch.set_num_threads(1)
    dataset = load_dataset(dataset_name)
    kind = "penultimate" if classifier else "pixels"
    probe, _, provenance = build_probe(dataset, kind, classifier, torch.device("cpu"))
    private = dataset.private
    if private_limit and private_limit < len(private):
        pick = np.sort(np.random.default_rng(seed).choice(len(private), private_limit, replace=False))
        private = private.subset(pick)
    x_priv, y_priv = private.tensors("cpu")
    x_test, y_test = dataset.test.tensors("cpu")
    return (embed(probe, x_priv, torch.device("cpu")), y_priv.numpy(), embed(probe, x_test, torch.device("cpu")),
            y_test.numpy(), dataset.num_classes, kind, provenance)


def run_task(X, y, Xt, yt, loss, epsilons, delta, reg, repeats, grpua_steps_per_n, opera_steps, dpsgd, seed, log):
    from training.convex import mechanisms as mech

    n = len(X)
    steps = grpua_steps_per_n * n
    rows = {m: {} for m in METHODS}

    def acc(W):
        return float((loss.predict(W, Xt) == yt).mean())

    started = time.perf_counter()
    gd = mech.opera_solve(X, y, loss, reg, steps=opera_steps)
    exact = mech.opera_solve(X, y, loss, reg, sensitivity="minimizer")
    nonprivate = acc(exact.weights)
    for eps in epsilons:
        results = {m: [] for m in METHODS}
        for r in range(repeats):
            rng = np.random.default_rng([seed, r, int(eps * 1000)])
            results["OPERA"].append(acc(mech.opera_release(gd, eps, delta, rng).weights))
            results["OPERA (exact minimiser)"].append(acc(mech.opera_release(exact, eps, delta, rng).weights))
            if eps <= 1:
                results["OutPert"].append(acc(mech.opera_release(gd, eps, delta, rng, "classical").weights))
            results["GRPUA"].append(acc(mech.grpua(X, y, loss, eps, delta, reg, rng, steps=steps).weights))
            results["SgdPert"].append(acc(mech.grpua(X, y, loss, eps, delta, reg, rng, steps=steps,
                                                     calibration="classical").weights))
            results["GRPUA (RDP)"].append(acc(mech.grpua(X, y, loss, eps, delta, reg, rng, steps=steps,
                                                         accountant="rdp").weights))
            results["DP-SGD head"].append(acc(mech.dpsgd_head(X, y, loss, eps, delta, reg, rng, **dpsgd).weights))
            results["non-private"].append(nonprivate)
        for m, values in results.items():
            if values:
                rows[m][eps] = float(np.mean(values))
        log(f"  eps {eps:g}: " + ", ".join(f"{m} {rows[m][eps]:.3f}" for m in METHODS if eps in rows[m])
            + f"  [{time.perf_counter() - started:.0f} s]")
    return {"rows": rows, "n": n, "d": X.shape[1], "sensitivity_gd": gd.sensitivity,
            "sensitivity_minimizer": exact.sensitivity, "grpua_steps": steps, "seconds": time.perf_counter() - started}


def plot(result, title, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from transdenoiser.pngs import save_png

    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    for method, points in result["rows"].items():
        if points:
            eps = sorted(points)
            style = "--" if method == "non-private" else "-o"
            ax.plot(eps, [points[e] for e in eps], style, label=method, markersize=3)
    ax.set_xscale("log")
    ax.set_xlabel("epsilon (replace-one, delta fixed)")
    ax.set_ylabel("test accuracy")
    ax.set_title(title, fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    save_png(fig, path, dpi=110)
    plt.close(fig)


def table(result) -> str:
    eps_all = sorted({e for p in result["rows"].values() for e in p})
    lines = ["| method | " + " | ".join(f"eps {e:g}" for e in eps_all) + " |",
             "|---|" + "---|" * len(eps_all)]
    for method, points in result["rows"].items():
        lines.append(f"| {method} | " + " | ".join(f"{points[e]:.3f}" if e in points else "-" for e in eps_all) + " |")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dataset", default="mnist10k")
    parser.add_argument("--classifier", default=None, help="public-split classifier (penultimate features); "
                                                           "default: pixels")
    parser.add_argument("--losses", default="logistic,huber-svm")
    parser.add_argument("--binary", default=None, help="two classes A,B for a binary task (e.g. 3,8)")
    parser.add_argument("--epsilons", default=",".join(map(str, EPSILONS)))
    parser.add_argument("--delta", type=float, default=1e-5)
    parser.add_argument("--lambda", dest="reg", type=float, default=1e-3)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--grpua-steps-per-n", type=int, default=10, help="GRPUA's T as a multiple of n "
                                                                          "(the paper's T = n^2)")
    parser.add_argument("--opera-steps", type=int, default=500, help="OPERA's gradient steps (Lemma 1 holds for any)")
    parser.add_argument("--private-limit", type=int, default=None, help="use a random subset of the private split")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "results")
    parser.add_argument("--name", default=None, help="file stem (default: from the settings)")
    parser.add_argument("--quick", action="store_true", help="tiny run: 2 epsilons, 1 repeat, 300 examples")
    args = parser.parse_args(argv)
    import torch

    from training.convex.losses import ConvexLoss
    from transdenoiser.runtime import hardware_description

    epsilons = [float(e) for e in args.epsilons.split(",")]
    if args.quick:
        epsilons, args.repeats, args.private_limit, args.grpua_steps_per_n = [0.1, 3.0], 1, 300, 2
        args.opera_steps = 50
    X, y, Xt, yt, classes, kind, provenance = features(args.dataset, args.classifier, args.private_limit, args.seed)
    if args.quick:
        pick = np.random.default_rng(args.seed).choice(len(Xt), min(500, len(Xt)), replace=False)
        Xt, yt = Xt[pick], yt[pick]
    binary = None
    if args.binary:
        a, b = (int(v) for v in args.binary.split(","))
        keep, keep_t = np.isin(y, (a, b)), np.isin(yt, (a, b))
        X, y, Xt, yt = X[keep], (y[keep] == b).astype(np.int64), Xt[keep_t], (yt[keep_t] == b).astype(np.int64)
        binary, classes = (a, b), 2
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                            text=True).stdout.strip()
    stem = args.name or f"convex_{args.dataset}_{kind}" + (f"_{binary[0]}v{binary[1]}" if binary else "")
    args.out.mkdir(parents=True, exist_ok=True)
    record = {"dataset": args.dataset, "features": kind, "provenance": provenance, "binary": binary,
              "delta": args.delta, "lambda": args.reg, "repeats": args.repeats, "commit": commit,
              "hardware": hardware_description(torch.device("cpu")), "command": " ".join(sys.argv), "losses": {}}
    dpsgd = {"batch_size": min(256, len(X) // 4), "epochs": 10, "learning_rate": 1.0}
    for name in args.losses.split(","):
        loss = ConvexLoss(name, classes, binary=binary is not None and name != "softmax")
        print(f"{args.dataset} {kind} {name}{' binary ' + str(binary) if binary else ''}: n={len(X)}, d={X.shape[1]}",
              flush=True)
        result = run_task(X, y, Xt, yt, loss, epsilons, args.delta, args.reg, args.repeats, args.grpua_steps_per_n,
                          args.opera_steps, dpsgd, args.seed, lambda s: print(s, flush=True))
        record["losses"][name] = result
        title = (f"{args.dataset} ({kind}{', ' + str(binary[0]) + ' vs ' + str(binary[1]) if binary else ''}), "
                 f"{name}, n={result['n']}, delta={args.delta:g}, lambda={args.reg:g}")
        plot(result, title, args.out / f"{stem}_{name}.png")
        print(table(result), flush=True)
    (args.out / f"{stem}.json").write_text(json.dumps(record, indent=1, default=str))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
