"""Typed records (transdenoiser/records.py): they round-trip through JSON key for key, read what today's writers
write (a checkpoint saved at test time, and frozen files under tests/fixtures/records written by
tests/fixtures/records/make_fixtures.py), keep the privacy report and summary.json byte for byte, and refuse a bad
record with one line naming the problem."""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest
import torch

from training.checkpoint import METADATA, load_checkpoint, read_metadata, read_record, save_checkpoint
from transdenoiser.errors import CheckpointError, UserError
from transdenoiser.records import (
    CertificationSummary,
    CheckpointMetadata,
    DatasetRef,
    Epsilon,
    Guarantee,
    PrivacyReport,
    RadiusRow,
    recorded_arm,
)

FIXTURES = Path(__file__).parent / "fixtures" / "records"


def _privacy_report(arm: str = "transdenoiser") -> dict:
    """A released privacy report made by today's writers from a three-step history (no training needed)."""
    from training.privacy.report import build_privacy_report, released_privacy_report

    history = {"batch_size": np.array([3, 0, 5]), "explicit_multiplier": np.array([1.2, 1.1, 0.0]),
               "num_nonnegative": np.array([1, 0, 2]), "smin": np.array([0.1, 0.0, 0.2]),
               "sigma_bar": np.array([1.0, 1.1, 0.9]), "input_multiplier": np.array([0.3, 0.0, 0.4])}
    full = build_privacy_report(arm=arm, sigma=0.25, clip_norm=1.0, xi_low=0.5, xi_up=1.2, sample_rate=0.05,
                                num_examples=80, expected_batch_size=4.0, delta=1e-5, steps_planned=3,
                                history=history, smin_methods=["exact", "", "exact"], max_smin_dim=10,
                                num_parameters=50, noise={"mode": "secret", "seed": None, "source": "CSPRNG"},
                                target_epsilon=None)
    return released_privacy_report(full)


@pytest.fixture(scope="module")
def saved_checkpoint(tmp_path_factory):
    """A tiny denoiser checkpoint written by save_checkpoint with a released privacy report, at test time."""
    from training.models import build_model

    torch.manual_seed(0)
    meta = {"kind": "denoiser", "architecture": "tiny", "arch_kwargs": {"in_channels": 1, "width": 2},
            "input_shape": [1, 28, 28], "classifier": {"num_classes": 10, "architecture": "cnn28"},
            "dataset": {"name": "mnist10k", "split_seed": 0, "trained_on": "private", "train_examples": 80,
                        "fingerprints": {"public": "a" * 64, "test": "b" * 64}, "source": "bundled"},
            "sigma": 0.25, "config": {"arm": "transdenoiser", "sigma": 0.25}, "privacy": _privacy_report()}
    directory = tmp_path_factory.mktemp("records") / "denoiser"
    save_checkpoint(directory, build_model("tiny", in_channels=1, width=2), meta)
    return directory


def _same(record, data: dict) -> None:
    """to_json gives back ``data``: same keys in the same order, same values (so the same JSON bytes)."""
    assert record.to_json() == data
    assert json.dumps(record.to_json()) == json.dumps(data)


# ------------------------------------------------------------------------------------------------ round trips

def test_each_record_round_trips(saved_checkpoint):
    meta = read_metadata(saved_checkpoint)
    dataset, privacy = meta["dataset"], meta["privacy"]
    summary = json.loads((FIXTURES / "run" / "summary.json").read_text())
    for cls, data in ((DatasetRef, dataset), (PrivacyReport, privacy), (CheckpointMetadata, meta),
                      (CertificationSummary, summary), (Guarantee, privacy["guarantees"][0]),
                      (Epsilon, privacy["guarantees"][0]["epsilon"]), (RadiusRow, summary["certified_accuracy"][0])):
        record = cls.from_json(data)
        _same(record, data)
        assert cls.from_json(record.to_json()) == record
        assert record.version == cls.FORMAT_VERSION == 1


def test_records_built_in_code_write_their_fields_then_extra():
    ref = DatasetRef(name="mnist", split_seed=3, extra={"note": "x"})
    assert ref.to_json() == {"name": "mnist", "split_seed": 3, "note": "x"}
    assert DatasetRef.from_json(ref.to_json()) == ref


def test_records_are_frozen_all_the_way_down(saved_checkpoint):
    record = read_record(saved_checkpoint)
    with pytest.raises(dataclasses.FrozenInstanceError):
        record.kind = "classifier"  # type: ignore[misc]
    with pytest.raises(TypeError):
        record.arch_kwargs["width"] = 4  # type: ignore[index]
    copy = record.to_json()
    copy["arch_kwargs"]["width"] = 4  # the dict handed out is the caller's, not the record's
    assert record.arch_kwargs["width"] == 2


# ------------------------------------------------------------------------------------------------ today's files

def test_a_checkpoint_saved_today_reads_as_a_record(saved_checkpoint):
    record = read_record(saved_checkpoint)
    assert (record.kind, record.architecture, record.input_shape) == ("denoiser", "tiny", (1, 28, 28))
    assert record.format_version == 1 and record.weights_sha256 == read_metadata(saved_checkpoint)["files"][
        "weights.safetensors"]
    assert record.dataset.name == "mnist10k" and record.dataset.fingerprint("public") == "a" * 64
    assert record.dataset.fingerprint("private") is None  # never released
    assert record.arm == "transdenoiser" and record.trained_sigma == 0.25 and record.classifier_classes == 10
    assert record.privacy.delta == 1e-5 and record.extra["config"]["arm"] == "transdenoiser"
    assert load_checkpoint(saved_checkpoint).record == record
    # metadata.json written again from the record is the same bytes
    text = (saved_checkpoint / METADATA).read_text()
    assert json.dumps(record.to_json(), indent=2, sort_keys=True) == text


def test_the_privacy_report_keeps_its_bytes_and_types_its_epsilons(saved_checkpoint):
    stored = _privacy_report()
    report = PrivacyReport.from_json(stored)
    assert json.dumps(report.to_json(), indent=2) == json.dumps(stored, indent=2)  # key order included
    assert report.arm == "transdenoiser" and report.noise_mode == "secret"
    assert [g.name for g in report.guarantees] == ["mmga", "data_independent"]
    mmga = report.named("mmga")
    assert mmga.data_independent is False and mmga.epsilon.value("rdp") > 0
    assert mmga.epsilon.analyses["rdp"] and mmga.epsilon.delta == 1e-5
    assert report.named("data_independent").epsilon.value("rdp") == float("inf")  # stored as "inf"
    assert report.data_independent() == []  # no data-independent epsilon is established for this arm


def test_frozen_fixtures_written_by_todays_code_still_load():
    meta_text = (FIXTURES / "denoiser" / "metadata.json").read_text()
    record = read_record(FIXTURES / "denoiser")  # a released model directory (weights left out of the fixture)
    assert record.kind == "denoiser" and record.arm == "sepdp" and record.dataset.name == "mnist10k"
    assert json.dumps(record.to_json(), indent=2, sort_keys=True) == meta_text
    proven = record.privacy.data_independent()
    assert [g.name for g in proven] == ["sepdp"] and proven[0].epsilon.value("rdp") > 0

    privacy_text = (FIXTURES / "privacy.json").read_text()
    stored = json.loads(privacy_text)
    assert json.dumps(PrivacyReport.from_json(stored).to_json(), indent=2) + "\n" == privacy_text
    assert stored == json.loads(meta_text)["privacy"]

    summary_text = (FIXTURES / "run" / "summary.json").read_text()
    summary = CertificationSummary.from_json(json.loads(summary_text))
    assert json.dumps(summary.to_json(), indent=2) + "\n" == summary_text  # certify/rundir.write_json's bytes
    assert (summary.task, summary.images, summary.n, summary.sigma) == ("certify", 4, 20, 0.25)
    assert summary.arm == "sepdp" and summary.precision == summary.settings["precision"]
    assert summary.certified_accuracy[0].radius == 0.0 and summary.denoiser().arm == "sepdp"
    assert summary.privacy() == record.privacy


def test_read_certify_summary_reads_a_run_folder():
    from certify.report import read_certify_summary

    summary = read_certify_summary(FIXTURES / "run")
    assert summary.task == "certify" and summary.version == 1


# ------------------------------------------------------------------------------------------------ where the arm is

def test_the_arm_is_read_from_wherever_its_writer_put_it():
    assert recorded_arm({"privacy": {"arm": "sepdp"}, "arm": "other"}) == "sepdp"  # the denoiser trainers
    assert recorded_arm({"arm": "stobatch", "privacy": {"delta": 1e-5}}) == "stobatch"  # the baselines
    assert recorded_arm({"train": {"arm": "nodp"}}) == "nodp"  # older checkpoints
    assert recorded_arm({"architecture": "x"}) is None and recorded_arm(None) is None
    base = {"kind": "classifier", "architecture": "x"}
    assert CheckpointMetadata.from_json({**base, "arm": "securesgd-prt"}).arm == "securesgd-prt"
    assert CheckpointMetadata.from_json({**base, "train": {"arm": "nodp"}}).arm == "nodp"
    assert CheckpointMetadata.from_json(base).arm is None


def test_the_trained_sigma_reads_the_same_from_a_record_and_a_mapping():
    """``sigma``, else the config's (also when ``sigma`` is recorded as null), else unknown: checks.denoiser_sigma
    gives a plain mapping the answer CheckpointMetadata.trained_sigma gives the record."""
    from transdenoiser.checks import denoiser_sigma

    base = {"kind": "denoiser", "architecture": "x"}
    for metadata, sigma in (({"sigma": 0.25, "config": {"sigma": 0.5}}, 0.25), ({"config": {"sigma": 0.5}}, 0.5),
                            ({"sigma": None, "config": {"sigma": 0.5}}, 0.5), ({}, None),
                            ({"sigma": float("nan")}, None)):
        assert denoiser_sigma({**base, **metadata}) == sigma
        assert CheckpointMetadata.from_json({**base, **metadata}).trained_sigma == sigma


# ------------------------------------------------------------------------------------------------ bad records

def _one_line(excinfo) -> str:
    message = str(excinfo.value)
    assert "\n" not in message and message
    return message


@pytest.mark.parametrize("change, problem", [
    ({"kind": None}, "has no 'kind'"),
    ({"format_version": 2}, "format version 2 is not supported"),
    ({"input_shape": "1x28x28"}, "'input_shape' must be a list"),
    ({"dataset": {"split_seed": 0}}, "'dataset': dataset reference has no 'name'"),
    ({"privacy": {"guarantees": [{"label": "x"}]}}, "'guarantees'[0]: guarantee has no 'name'"),
    ({"privacy": {"delta": "small"}}, "'delta' must be a number"),
    ({"format": "something-else"}, "is not a transdenoiser-checkpoint file"),
])
def test_a_bad_checkpoint_record_is_one_line(change, problem):
    data = {"format": "transdenoiser-checkpoint", "format_version": 1, "kind": "denoiser", "architecture": "tiny"}
    data.update(change)
    data = {k: v for k, v in data.items() if v is not None}
    with pytest.raises(CheckpointError) as excinfo:
        CheckpointMetadata.from_json(data, "checkpoint runs/d: metadata.json")
    message = _one_line(excinfo)
    assert problem in message and message.startswith("checkpoint runs/d: metadata.json: ")


def test_a_tampered_metadata_file_is_refused_by_read_record(saved_checkpoint, tmp_path):
    import shutil

    copy = tmp_path / "copy"
    shutil.copytree(saved_checkpoint, copy)
    meta = json.loads((copy / METADATA).read_text())
    meta["privacy"]["guarantees"] = "none"
    (copy / METADATA).write_text(json.dumps(meta))
    with pytest.raises(CheckpointError) as excinfo:
        read_record(copy)
    assert "'guarantees' must be a list" in _one_line(excinfo)
    with pytest.raises(CheckpointError):
        load_checkpoint(copy)


@pytest.mark.parametrize("change, problem", [
    ({"images": None}, "run summary has no 'images'"),
    ({"format_version": 7}, "format version 7 is not supported"),
    ({"certified_accuracy": [{"certified_accuracy": 0.5}]}, "row has no 'radius'"),
    ({"sigma": "0.25"}, "'sigma' must be a number"),
])
def test_a_bad_summary_is_one_line(change, problem):
    data = json.loads((FIXTURES / "run" / "summary.json").read_text())
    data.update(change)
    data = {k: v for k, v in data.items() if v is not None}
    with pytest.raises(UserError) as excinfo:
        CertificationSummary.from_json(data, "run/summary.json")
    assert problem in _one_line(excinfo)
    assert isinstance(excinfo.value, ValueError)


def test_a_summary_without_a_format_version_is_version_1():
    data = json.loads((FIXTURES / "run" / "summary.json").read_text())
    assert "format_version" not in data  # as written today
    assert CertificationSummary.from_json(data).version == 1
    assert CertificationSummary.from_json({**data, "format_version": 1}).version == 1


def test_not_an_object_is_refused():
    with pytest.raises(UserError, match="privacy report must be a JSON object, got list"):
        PrivacyReport.from_json([1, 2])


# ------------------------------------------------------------------------------------------------ baseline-certify

def test_an_old_baseline_certify_summary_loads_and_renders_its_report(tmp_path):
    """A baseline-certify summary.json written before it had a format version (the fixture: a stobatch run of 4
    images, every certificate abstaining) reads as version 1 of BaselineCertificationSummary, keeps its bytes, and
    `transdenoiser report` renders the run's report.md from it: one section per certificate."""
    from certify.baseline_report import is_baseline_run, render_baseline_run
    from certify.baseline_rows import RADII
    from transdenoiser.cli import main
    from transdenoiser.records import BaselineCertificationSummary

    run = FIXTURES / "baseline_run"
    text = (run / "summary.json").read_text()
    data = json.loads(text)
    assert "format_version" not in data and "task" not in data  # as written before they were added
    summary = BaselineCertificationSummary.from_json(data, "summary.json")
    assert summary.version == 1 and summary.arm == "stobatch" and summary.num_images == 4
    assert json.dumps(summary.to_json(), indent=2, sort_keys=True) == text  # training.checkpoint.write_json's bytes
    assert [radius for radius, _ in summary.phan.table()] == list(RADII)
    assert summary.phan.abstain_rate == 1.0 and summary.smoothing.certified_accuracy["0"] == 0.0
    assert is_baseline_run(run)
    report = render_baseline_run(run, tmp_path / "a").read_text()
    assert "## Own certificate: StoBatch's own certificate (Phan et al. 2020" in report
    assert "L2 = L1 / sqrt(d), d = 784" in report and "## Randomized smoothing of the same randomised model" in report
    assert report.count("| L2 radius | certified accuracy |") == 2
    assert report.count("- abstained (counted wrong): 4 of 4 images (100.0%)") == 2
    assert main(["report", str(run), "--out", str(tmp_path / "b")]) == 0
    assert (tmp_path / "b" / "report.md").read_text() == report


@pytest.mark.parametrize("change, problem", [
    ({"phan": None}, "baseline-certify summary has no 'phan'"),
    ({"smoothing": {"abstain_rate": 0.5}}, "'smoothing': baseline certificate has no 'certified_accuracy'"),
    ({"format_version": 2}, "format version 2 is not supported"),
    ({"task": "certify"}, "is for task 'certify', not baseline-certify"),
])
def test_a_bad_baseline_summary_is_one_line(change, problem):
    from transdenoiser.records import BaselineCertificationSummary

    data = json.loads((FIXTURES / "baseline_run" / "summary.json").read_text())
    data.update(change)
    data = {k: v for k, v in data.items() if v is not None}
    with pytest.raises(UserError) as excinfo:
        BaselineCertificationSummary.from_json(data, "run/summary.json")
    assert problem in _one_line(excinfo) and _one_line(excinfo).startswith("run/summary.json: ")
