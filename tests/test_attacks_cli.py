"""``transdenoiser attack`` / ``audit``, the evaluation library, the report overlay and the certificate audit."""
from __future__ import annotations

import json
import shutil

import pytest
import torch

from certify.attacks.evaluate import (
    AttackConfig,
    AuditConfig,
    audit_certify_run,
    evenly_spaced,
    read_run_to_audit,
    run_attack_eval,
)
from certify.attacks.report import overlay_attack_runs, run_label
from certify.core import Smooth
from certify.pipeline import load_pipeline
from transdenoiser.cli import main
from transdenoiser.errors import UserError

SIGMA = 0.25
CERTIFY_ALPHA = 0.001


def tiny_attack_args(classifier_dir, out, *extra):
    return ["attack", "--classifier", str(classifier_dir), "--attack", "pgd", "--norm", "l2", "--eps", "0.5,1.5",
            "--threat", "smoothed", "--max", "8", "--steps", "2", "--eot", "2", "--n", "20", "--device", "cpu",
            "--out", str(out), *extra]


@pytest.fixture(scope="module")
def attack_run(classifier_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("attack") / "run"
    assert main(tiny_attack_args(classifier_dir, out)) == 0
    return out


def test_attack_cli_writes_json_tsv_png(attack_run):
    assert {p.name for p in attack_run.iterdir()} >= {"attack.json", "attack.tsv", "attack.png"}
    record = json.loads((attack_run / "attack.json").read_text())
    assert record["settings"]["threat"] == "smoothed" and record["settings"]["eps"] == [0.5, 1.5]
    assert record["num_images"] == 8 and len(record["image_indices"]) == 8
    assert record["classifier_metadata"]["kind"] == "classifier" and record["denoiser_metadata"] is None
    assert record["hardware"]
    assert [row["eps"] for row in record["results"]] == [0.5, 1.5]
    for row in record["results"]:
        assert row["max_norm"] <= row["eps"]
        for key in ("smoothed_accuracy", "smoothed_abstain_rate", "noisy_accuracy", "base_accuracy"):
            assert 0.0 <= row[key] <= 1.0
    assert record["clean"]["smoothed_accuracy"] > record["results"][-1]["smoothed_accuracy"]
    for row in (record["clean"], *record["results"]):  # per image, in image_indices order: the accuracy's parts
        assert len(row["smoothed_correct"]) == 8 and set(row["smoothed_correct"]) <= {0, 1}
        assert sum(row["smoothed_correct"]) / 8 == pytest.approx(row["smoothed_accuracy"])
    tsv = (attack_run / "attack.tsv").read_text().splitlines()
    assert tsv[0].split("\t")[:3] == ["row", "eps", "smoothed_accuracy"] and len(tsv) == 1 + 1 + 2
    assert (attack_run / "attack.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_overlay_labels_runs_and_arms(attack_run, tmp_path):
    second = tmp_path / "dp_arm"
    second.mkdir()
    record = json.loads((attack_run / "attack.json").read_text())
    record["denoiser_metadata"] = {"privacy": {"arm": "dp-sgd"}}
    (second / "attack.json").write_text(json.dumps(record))
    files = overlay_attack_runs([attack_run, second], tmp_path / "report")
    assert {f.name for f in files} == {"attacks_overlay.png", "attacks_overlay.md"}
    table = (tmp_path / "report" / "attacks_overlay.md").read_text()
    assert "PGD l2, threat smoothed, no denoiser" in table and "arm dp-sgd" in table
    assert "eps 0.5" in table and "eps 1.5" in table
    assert run_label({"denoiser_metadata": {}}) == "? ?, threat ?, denoiser"  # tolerant of missing keys
    with pytest.raises(UserError):
        overlay_attack_runs([tmp_path], tmp_path / "none")


def test_run_attack_eval_repeats_exactly_with_its_seed(classifier_dir, mnist10k):
    pipeline = load_pipeline(classifier_dir)
    images, labels = mnist10k.test.subset(evenly_spaced(len(mnist10k.test), 6)).tensors()
    config = AttackConfig(attack="mim", norm="linf", eps=(0.1,), threat="pipeline", sigma=SIGMA, steps=2, eot=2, n=20)
    first = run_attack_eval(pipeline, images, labels, config, seed=3)
    again = run_attack_eval(pipeline, images, labels, config, seed=3)
    strip = [{k: v for k, v in row.items() if "seconds" not in k} for row in first["results"]]
    assert strip == [{k: v for k, v in row.items() if "seconds" not in k} for row in again["results"]]
    assert first["clean"] == again["clean"]
    with pytest.raises(UserError):
        run_attack_eval(pipeline, images, labels, AttackConfig("pgd", "l2", (1.0,), "pipeline", SIGMA, eot=0), 0)


@pytest.mark.parametrize("flag,value", [("--eps", "-0.5"), ("--eps", "1,-1"), ("--norm", "l3"), ("--attack", "cw"),
                                        ("--threat", "oracle"), ("--steps", "0"), ("--step-size", "0"),
                                        ("--step-size", "-1"), ("--eot", "0"), ("--n", "0")])
def test_attack_bad_input_exits_2(flag, value, classifier_dir, tmp_path, capsys):
    args = tiny_attack_args(classifier_dir, tmp_path / "out")
    if flag in args:
        args[args.index(flag) + 1] = value
    else:
        args += [flag, value]
    with pytest.raises(SystemExit) as exc:
        main(args)
    assert exc.value.code == 2
    assert flag in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_attack_missing_checkpoint_is_one_line_error(tmp_path, capsys):
    assert main(tiny_attack_args(tmp_path / "nothing", tmp_path / "out")) == 2
    assert "no such directory (a checkpoint is a directory" in capsys.readouterr().err


# ------------------------------------------------------------------------------------ audit

def write_certify_run(run_dir, classifier_dir, mnist10k, count=12, inflate_radius=None):
    """A certify run in the certification engineer's format, made with the core ``Smooth.certify``."""
    pipeline = load_pipeline(classifier_dir)
    smooth = Smooth(pipeline.classifier, pipeline.num_classes, SIGMA)
    indices = evenly_spaced(len(mnist10k.test), count)
    images, labels = mnist10k.test.subset(indices).tensors()
    generator = smooth.generator(0)
    lines = ["idx\tlabel\tpredict\tradius\tcorrect\ttime"]
    for idx, x, y in zip(indices, images, labels, strict=True):
        cert = smooth.certify(x, n0=32, n=200, alpha=CERTIFY_ALPHA, generator=generator)
        radius = inflate_radius if (inflate_radius is not None and not cert.abstained) else cert.radius
        lines.append(f"{idx}\t{int(y)}\t{cert.prediction}\t{radius:.4f}\t{int(cert.prediction == int(y))}\t0.01")
    run_dir.mkdir(parents=True)
    (run_dir / "certify.tsv").write_text("\n".join(lines) + "\n")
    settings = {"classifier": str(classifier_dir), "denoiser": None, "dataset": "mnist10k", "data_root": None,
                "split_seed": 0, "split": "test", "sigma": SIGMA, "n0": 32, "n": 200, "alpha": CERTIFY_ALPHA,
                "seed": 0}
    summary = {"task": "certify", "images": count, "sigma": SIGMA, "n0": 32, "n": 200, "alpha": CERTIFY_ALPHA,
               "settings": settings}  # what the audit reads of a summary: the record's required fields, the settings
    (run_dir / "summary.json").write_text(json.dumps(summary))
    return run_dir


@pytest.fixture(scope="module")
def certify_run(classifier_dir, mnist10k, tmp_path_factory):
    return write_certify_run(tmp_path_factory.mktemp("certify") / "run", classifier_dir, mnist10k)


AUDIT_FLAGS = ["--steps", "4", "--m", "4", "--n", "200", "--device", "cpu"]


def test_audit_of_a_valid_certify_run_finds_no_violation(certify_run, capsys):
    assert main(["audit", str(certify_run), *AUDIT_FLAGS]) == 0
    result = json.loads((certify_run / "audit.json").read_text())
    certified = sum(1 for line in (certify_run / "certify.tsv").read_text().splitlines()[1:]
                    if line.split("\t")[2] != "-1")
    assert result["audited"] == certified > 0
    assert result["changed"] == 0 and not result["failed"]
    assert result["kept"] + result["abstained"] == certified
    assert result["alpha"] == CERTIFY_ALPHA and result["null_rate"] == 2 * CERTIFY_ALPHA
    assert all(row["norm"] <= row["eps"] < row["radius"] for row in result["examples"])
    out = capsys.readouterr().out
    assert "CHANGED 0" in out and "allowed rate" in out
    assert len((certify_run / "audit.tsv").read_text().splitlines()) == 1 + certified


def test_audit_fails_loudly_when_radii_are_overstated(classifier_dir, mnist10k, tmp_path, capsys):
    bogus = write_certify_run(tmp_path / "bogus", classifier_dir, mnist10k, count=8, inflate_radius=6.0)
    assert main(["audit", str(bogus), *AUDIT_FLAGS]) == 1
    captured = capsys.readouterr()
    assert "AUDIT FAILED" in captured.err
    result = json.loads((bogus / "audit.json").read_text())
    assert result["failed"] and result["changed"] >= 3 and result["pvalue"] < CERTIFY_ALPHA


def test_audit_library_counts_and_refuses_bad_runs(certify_run, classifier_dir, mnist10k, tmp_path):
    run = read_run_to_audit(certify_run)
    images, _ = mnist10k.test.tensors()
    pipeline = load_pipeline(classifier_dir)
    result = audit_certify_run(run, pipeline, images, AuditConfig(steps=2, m=2, n=100, max_examples=3), seed=0)
    assert result["audited"] == 3 and result["kept"] + result["abstained"] + result["changed"] == 3
    with pytest.raises(UserError):
        AuditConfig(margin=1.0).validate()
    with pytest.raises(UserError, match="missing"):
        read_run_to_audit(tmp_path)
    predicted = tmp_path / "predicted"
    shutil.copytree(certify_run, predicted)
    summary = json.loads((predicted / "summary.json").read_text())
    (predicted / "summary.json").write_text(json.dumps({**summary, "task": "predict"}))
    with pytest.raises(UserError, match="summary.json is for task 'predict', not certify"):
        read_run_to_audit(predicted)
    broken = tmp_path / "broken"
    shutil.copytree(certify_run, broken)
    (broken / "certify.tsv").write_text("idx\tlabel\n1\t2\n")
    with pytest.raises(UserError, match="columns"):
        read_run_to_audit(broken)
    mismatched = tmp_path / "mismatched"
    shutil.copytree(certify_run, mismatched)
    rows = (mismatched / "certify.tsv").read_text().splitlines()
    fields = rows[1].split("\t")
    fields[1] = str((int(fields[1]) + 1) % 10)
    rows[1] = "\t".join(fields)
    (mismatched / "certify.tsv").write_text("\n".join(rows) + "\n")
    assert main(["audit", str(mismatched), *AUDIT_FLAGS]) == 2


def test_attack_refuses_a_sigma_the_denoiser_was_not_trained_at(classifier_dir, mnist10k, tmp_path, capsys):
    from training.checkpoint import load_checkpoint
    from training.private_train import train_denoiser
    from training.train_config import TrainConfig

    denoiser = tmp_path / "den"
    config = TrainConfig(arm="nodp", denoiser="tiny", denoiser_kwargs={"width": 2}, epochs=1, batch_size=32,
                         train_examples=32, eval_examples=20, sigma=0.25)
    train_denoiser(config, mnist10k, load_checkpoint(classifier_dir, kind="classifier"), torch.device("cpu"),
                   checkpoint_dir=denoiser)
    args = tiny_attack_args(classifier_dir, tmp_path / "out") + ["--denoiser", str(denoiser), "--sigma", "0.5"]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert "sigma" in err and "0.25" in err and "--allow-sigma-mismatch" in err
    assert not (tmp_path / "out").exists()
