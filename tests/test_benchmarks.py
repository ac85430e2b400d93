"""Smoke tests of the benchmarks: tiny settings, so that a change that breaks a benchmark fails here, not
when someone next measures. The figures themselves are measured by hand (docs/RESULTS.md), never here."""
from __future__ import annotations

import json

import pytest


def test_bench_certify_writes_rates_for_every_side(tmp_path, classifier_dir):
    from benchmarks import bench_certify

    out = tmp_path / "certify.json"
    assert bench_certify.main(["--images", "1", "--n0", "5", "--n", "40", "--batch", "16", "--baseline-batch", "32",
                               "--classifier", str(classifier_dir), "--device", "cpu", "--precision", "fp32,bf16",
                               "--repeats", "1", "--peak", "--json", str(out)]) == 0
    result = json.loads(out.read_text())
    row = result["pipelines"]["mnist"]
    # --peak: the float32 matmul rate measured beside the sides, and each side's share of it
    assert result["fp32_matmul_peak_tflops"]["peak"] > 0
    assert set(row["fraction_of_fp32_peak"]) == set(row["tflops"])
    assert row["tflops_for_3x"] == pytest.approx(3 * row["tflops"]["cohen@32"])
    assert set(row["samples_per_second"]) == {"cohen@32", "ours:fp32", "ours:bf16"}
    assert all(rate > 0 for rate in row["samples_per_second"].values())
    assert row["noisy_samples"] == 45 and row["speedup"]["cohen@32"] == 1.0
    # cnn28 + the paper's autoencoder: about 41 MFLOP per sample (torch.utils.flop_counter)
    assert 35e6 < row["flops_per_sample"] < 50e6 and row["tflops"]["ours:fp32"] > 0


def test_bench_certify_refuses_unknown_pipelines_and_precisions(capsys):
    from benchmarks import bench_certify

    for argv in (["--pipeline", "svhn"], ["--precision", "int8"]):
        with pytest.raises(SystemExit):
            bench_certify.main(argv)
    err = capsys.readouterr().err
    assert "--pipeline: unknown svhn" in err and "--precision: expected fp32, bf16, fp16" in err


def test_bench_training_quick_times_every_row_against_nonprivate(tmp_path):
    pytest.importorskip("opacus")
    from benchmarks import bench_training

    out = tmp_path / "training.json"
    assert bench_training.main(["--quick", "--smin", "--smin-widths", "1", "--smin-examples", "2",
                                "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    assert len(result["grid"]) == 2
    for entry in result["grid"].values():
        assert set(entry["rows"]) == set(bench_training.ROWS)
        for row in entry["rows"].values():
            assert len(row["examples_per_second"]) == 2 and row["median_examples_per_second"] > 0
            assert row["fraction_of_nonprivate"] > 0
        assert entry["sepdp_over_opacus_hooks"] > 0 and entry["transdenoiser_cost_over_sepdp"] > 0
        assert entry["sepdp_execution"]["clipping"] in ("ghost", "vmap")
    assert result["smin_cost"][0]["smin"] >= 0


def test_bench_adaptive_quick_compares_every_side_on_the_same_images(tmp_path, classifier_dir):
    from benchmarks import bench_adaptive

    out = tmp_path / "adaptive.json"
    assert bench_adaptive.main(["--quick", "--classifier", str(classifier_dir), "--denoiser", "none",
                                "--lookahead-ab", "--json", str(out)]) == 0
    result = json.loads(out.read_text())
    sides = result["sides"]
    adaptive = {"decide_r0.25", "decide_r0.5", "decide_r0.75", "estimate"}
    assert set(sides) == {"fixed_n200", "fixed_n400", *adaptive, *(name + "_ahead_every" for name in adaptive)}
    assert set(result["lookahead_ab"]) == adaptive
    assert all(ab["answers_identical"] for ab in result["lookahead_ab"].values())
    assert result["complete"] and sides["fixed_n200"]["images"] == 4 and sides["fixed_n400"]["images"] == 2
    assert sides["fixed_n200"]["mean_samples_per_image"] == 300  # n0 + n, every image
    for name in ("decide_r0.5", "estimate"):
        assert 100 < sides[name]["mean_samples_per_image"] <= 500 and sides[name]["seconds_per_image"] > 0
    gap = result["accuracy_gaps_points"]["decide_r0.5_vs_fixed_n200"]
    assert gap["images"] == 4 and gap["decide_minus_fixed"] == pytest.approx(gap["decide"] - gap["fixed"])
    assert result["ratios"]["decide_r0.5_vs_fixed_n200"] == pytest.approx(
        300 / sides["decide_r0.5"]["mean_samples_per_image"])


def test_bench_launches_quick_counts_fewer_launches_with_the_same_answers(tmp_path, classifier_dir):
    from benchmarks import bench_launches

    out = tmp_path / "launches.json"
    assert bench_launches.main(["--quick", "--classifier", str(classifier_dir), "--denoiser", "none",
                                "--lookahead-ab", "--json", str(out)]) == 0
    result = json.loads(out.read_text())
    plain, filled = result["sides"]["0"], result["sides"]["4096"]
    for fill in ("0", "4096"):  # drawn ahead only when expected to be used: never more evaluated than every launch
        every = result["sides"][f"{fill}_ahead_every"]
        assert every["every_launch_ahead"] and not result["sides"][fill]["every_launch_ahead"]
        assert result["sides"][fill]["estimation_samples_evaluated"] <= every["estimation_samples_evaluated"]
    assert result["answers_identical"] and result["plan"]["block_min_samples"] == 64  # the CUDA plan
    assert plain["estimation_samples_used"] == filled["estimation_samples_used"]
    assert filled["launches"] <= plain["launches"] and plain["launches"] >= 1
    assert filled["estimation_samples_evaluated"] >= plain["estimation_samples_evaluated"] >= \
        plain["estimation_samples_used"]


def test_bench_rule_host_quick_gives_the_same_answers_block_by_block(tmp_path):
    from benchmarks import bench_rule_host

    out = tmp_path / "rule_host.json"
    assert bench_rule_host.main(["--quick", "--json", str(out)]) == 0
    modes = json.loads(out.read_text())["modes"]
    assert set(modes) == {"decide", "estimate"}
    for mode in modes.values():
        assert mode["answers_identical"] and mode["ms_per_image_block"] > 0 and mode["ms_per_image_look"] > 0
        assert mode["ms_per_image_across"] > 0
        assert 100 < mode["mean_samples"] <= 2000


@pytest.mark.parametrize("pipelined", [False, True])
def test_bench_scheduler_host_quick_runs_the_real_scheduler(tmp_path, pipelined):
    """The scheduler's host-time benchmark: an estimate answer per image, the same in every repeat and on both
    sides (overlap on with a plain or a pipelined stand-in), and at least n0 + n samples computed for each."""
    from benchmarks import bench_scheduler_host

    out = tmp_path / "scheduler_host.json"
    argv = ["--quick", "--overlap-ab", "--device-us-per-sample", "1", "--json", str(out)]
    assert bench_scheduler_host.main(argv + (["--pipelined"] if pipelined else [])) == 0
    record = json.loads(out.read_text())
    assert record["answers_same_every_repeat"] and record["host_ms_per_image"] > 0  # overlap on and off alike
    assert {side: 0 < figures["device_busy_share"] < 1 for side, figures in record["overlap_ab"].items()} == {
        "off": True, "on": True}
    assert len(record["answers"]) == 4 and all(outcome == "estimated" for _, outcome, *_ in record["answers"])
    assert record["samples"] >= sum(100 + n for _, _, n, *_ in record["answers"])


def test_bench_scheduler_host_probes_change_no_answer(tmp_path):
    """The requests' disconnection probes (the server's watch, Starlette's) cost host time, never an answer."""
    from benchmarks import bench_scheduler_host

    digests = {}
    for probe in ("none", "watch", "starlette"):
        out = tmp_path / f"{probe}.json"
        assert bench_scheduler_host.main(["--quick", "--mode", "decide", "--client-probe", probe,
                                          "--json", str(out)]) == 0
        digests[probe] = json.loads(out.read_text())["answers_digest"]
    assert len(set(digests.values())) == 1


def test_bench_calibration_quick_times_each_input(tmp_path):
    from benchmarks import bench_calibration

    out = tmp_path / "calibration.json"
    assert bench_calibration.main(["--quick", "--json", str(out)]) == 0
    rows = json.loads(out.read_text())["rows"]
    assert len(rows) == 3 and all(row["seconds"] >= 0 for row in rows)
    assert [row["seconds"] for row in rows] == sorted((row["seconds"] for row in rows), reverse=True)
    assert all((row["noise_multiplier"] is None) != (row["refused"] is None) for row in rows)


def test_bench_sequential_quick_reports_cost_and_boundary_errors(tmp_path):
    from benchmarks import bench_sequential

    out = tmp_path / "sequential.json"
    assert bench_sequential.main(["--quick", "--json", str(out)]) == 0
    result = json.loads(out.read_text())
    assert set(result["cost"]) == {"union-cp", "beta-mixture", "fixed-level-cp"}
    for costs in result["cost"].values():
        assert costs["1.0"]["certified"] == 1.0 and 0 < costs["1.0"]["mean_samples"] <= 5000
        assert costs["0.9"]["certified"] == 0.0
    for row in result["boundary"].values():
        assert row["streams"] == 2000 and row["rate"] == row["wrong_certified"] / 2000


def test_bench_stobatch_quick_times_both_samplers_on_the_same_bits(tmp_path):
    from benchmarks import bench_stobatch

    out = tmp_path / "stobatch.json"
    assert bench_stobatch.main(["--quick", "--json", str(out)]) == 0
    result = json.loads(out.read_text())
    assert result["batch"] == 8 and result["hidden_shape"] == [32, 28, 28]
    assert set(result["seconds"]) == {"noise_plain", "noise_in_place", "batch_plain", "batch_in_place"}
    assert all(len(v) == 1 and v[0] > 0 for v in result["seconds"].values())
    assert result["speedup"]["noise"] > 0 and result["speedup"]["batch"] > 0


def test_bench_stobatch_refuses_a_batch_below_one(capsys):
    from benchmarks import bench_stobatch

    with pytest.raises(SystemExit):
        bench_stobatch.main(["--batch", "0"])
    assert "--batch must be >= 1, got 0" in capsys.readouterr().err


def test_bench_sound_noise_quick(tmp_path):
    from benchmarks import bench_sound_noise

    out = tmp_path / "sound.json"
    assert bench_sound_noise.main(["--quick", "--json", str(out)]) == 0
    record = json.loads(out.read_text())
    assert set(record["median_seconds"]) == {"gaussian", "sound"} and record["ratio_sound_to_gaussian"] > 0


def test_bench_gc_pause_quick_times_collections_with_timers_kept_and_cancelled(tmp_path, random_classifier_dir,
                                                                                 monkeypatch):
    import gc

    from benchmarks import bench_gc_pause
    from tests.conftest import forget_bentoml_metrics

    monkeypatch.delenv("TRANSDENOISER_API_KEY", raising=False)
    monkeypatch.setenv("TRANSDENOISER_MODEL_DIR", "")  # the benchmark sets both; monkeypatch restores them
    monkeypatch.setenv("TRANSDENOISER_DEVICE", "cpu")
    out = tmp_path / "gc.json"
    try:
        assert bench_gc_pause.main(["--quick", "--classifier-dir", str(random_classifier_dir), "--out", str(out)]) == 0
    finally:
        forget_bentoml_metrics()
        gc.unfreeze()
    result = json.loads(out.read_text())
    assert result["probes"] == 200 and result["frozen_at_start_up"] > 100_000
    kept, cancelled = result["after_probes"]["timers_kept"], result["after_probes"]["timers_cancelled"]
    assert kept["timers_left"]["median"] == 200 and cancelled["timers_left"]["median"] == 0
    # each kept timer holds its request's context: about 5 objects, 20 with BentoML's tracing on (its spans)
    assert kept["objects_added"]["median"] > 4 * 200 and cancelled["objects_added"]["median"] < 200
    assert all(result[mode]["cpu_s"]["median"] >= 0 for mode in ("frozen", "unfrozen"))


@pytest.mark.parametrize(("module", "argv", "message"), [
    ("bench_burst_ab", ["--before", "{missing}", "--after", "."], "is not a checkout of transdenoiser"),
    ("bench_burst_ab", ["--before", ".", "--after", "{tmp}"], "is not a checkout of transdenoiser"),
    ("bench_burst_ab", ["--before", ".", "--after", ".", "--rounds", "0"], "--rounds"),
    ("bench_burst_ab", ["--before", ".", "--after", ".", "--loop-seconds", "-1"], "--loop-seconds"),
    ("bench_burst_ab", ["--before", ".", "--after", ".", "--classifier-dir", "{tmp}"], "not a classifier checkpoint"),
    ("bench_burst_ab", ["--after", "."], "--before"),
    ("bench_burst_ab", ["--before", ".", "--after", ".", "--before-setting", "round_samples"], "is not KEY=VALUE"),
    ("bench_burst_ab", ["--before", ".", "--after", ".", "--body-bytes", "1000"], "must be from 16384 to"),
    ("bench_overload", ["--body-bytes", "3000000"], "must be from 16384 to"),
    ("bench_probe_cost", ["--after", "."], "--before is required"),
    ("bench_probe_cost", ["--before", "{missing}"], "is not a checkout of transdenoiser"),
    ("bench_probe_cost", ["--before", ".", "--rounds", "0"], "--rounds"),
    ("bench_probe_cost", ["--before", ".", "--seconds", "0"], "--seconds"),
    ("bench_probe_cost", ["--quick", "--classifier-dir", "{tmp}"], "not a classifier checkpoint"),
    ("bench_round_size", ["--sizes", "100", "0"], "--sizes"),
    ("bench_round_size", ["--rounds", "0"], "--rounds"),
    ("bench_round_size", ["--quick", "--classifier-dir", "{tmp}"], "not a classifier checkpoint"),
    ("bench_serving", ["--clients", "1,x"], "--clients '1,x': comma-separated whole numbers"),
    ("bench_serving", ["--clients", "0"], "--clients '0'"),
    ("bench_serving", ["--warmup-seconds", "-1"], "--warmup-seconds"),
    ("bench_serving", ["--classifier-dir", "{tmp}"], "not a classifier checkpoint"),
])
def test_two_server_benchmarks_refuse_bad_arguments(module, argv, message, tmp_path, capsys):
    """Only their argument checks: a run starts two real servers and takes minutes (their figures are measured by
    hand, docs/results/serving.md)."""
    import importlib

    main = importlib.import_module(f"benchmarks.{module}").main
    argv = [arg.format(missing=tmp_path / "missing", tmp=tmp_path) for arg in argv]
    with pytest.raises(SystemExit) as info:
        main(argv)
    err = capsys.readouterr().err
    assert info.value.code == 2 and message in err, err
    assert len([line for line in err.splitlines() if "error:" in line]) == 1


def test_bench_probe_cost_certifies_one_grey_image_of_the_classifiers_shape(random_classifier_dir):
    import numpy as np

    from benchmarks.bench_probe_cost import KINDS, request_bodies

    kinds = request_bodies(str(random_classifier_dir))
    assert set(kinds) == set(KINDS) and kinds["predict_400"] == KINDS["predict_400"]
    method, path, body = kinds["certify_n100"]
    payload = json.loads(body)
    assert (method, path, payload["n"]) == ("POST", "/predict", 100)
    shape = json.loads((random_classifier_dir / "metadata.json").read_text())["input_shape"]
    assert np.asarray(payload["images"]).shape == (1, *shape) and np.all(np.asarray(payload["images"]) == 0.5)


def test_bench_probe_cost_reads_the_event_loop_threads_cpu():
    """The figure's source: the main thread's CPU time grows with work done on it, not with other threads'."""
    import threading

    import psutil

    from benchmarks.bench_probe_cost import main_thread_cpu_s

    me = psutil.Process()
    spin = threading.Thread(target=lambda: sum(i * i for i in range(3_000_000)))
    before = main_thread_cpu_s(me)
    spin.start()
    spin.join()
    other = main_thread_cpu_s(me) - before
    started = main_thread_cpu_s(me)
    sum(i * i for i in range(3_000_000))
    own = main_thread_cpu_s(me) - started
    assert own > 0.05 and other < own / 2, (own, other)


def test_bench_work_build_quick_times_each_kind_as_built_and_the_alternative(tmp_path):
    from benchmarks import bench_work_build

    out = tmp_path / "work_build.json"
    assert bench_work_build.main(["--quick", "--out", str(out)]) == 0
    rows = json.loads(out.read_text())["rows"]
    assert set(rows) == {"certify n=1000", "certify n=10000", "decide n_max=10000", "estimate n_max=10000"}
    assert all(value > 0 for figures in rows.values() for value in figures.values())
    assert set(rows["certify n=10000"]) == {"as_built_ms", "every_seed_up_front_ms"}


def test_the_small_request_client_sends_from_go_until_finish_in_a_process_of_its_own():
    """bench_overload's small requests come from benchmarks/small_client.py: connected before go, one request
    after another (each body as given) until finish, each with its send time, status and latency."""
    import threading
    import time
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    from benchmarks.bench_overload import SmallClient

    bodies: list[bytes] = []

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def _answer(self, status: int) -> None:
            self.send_response(status)
            self.send_header("content-length", "2")
            self.end_headers()
            self.wfile.write(b"{}")

        def do_GET(self):  # noqa: N802 - http.server's name
            self._answer(200 if self.path == "/livez" else 404)

        def do_POST(self):  # noqa: N802
            bodies.append(self.rfile.read(int(self.headers["content-length"])))
            self._answer(200 if self.path == "/predict" else 404)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        client = SmallClient(f"http://127.0.0.1:{server.server_address[1]}", b'{"images": []}')
        client.start()
        assert bodies == []  # nothing sent before go
        client.go()
        # until the second request has arrived, not a fixed 0.5 s: a client process that a loaded machine starts late
        # (by 0.3 s would do) must not leave the test with one request
        deadline = time.monotonic() + 60
        while len(bodies) < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        results = client.finish()
    finally:
        server.shutdown()
    assert 2 <= len(results) == len(bodies) and set(bodies) == {b'{"images": []}'}
    assert [r["status"] for r in results] == [200] * len(results)
    gaps = [later["sent_s"] - earlier["sent_s"] for earlier, later in zip(results, results[1:], strict=False)]
    assert results[0]["sent_s"] < 0.1 and min(gaps) >= 0.2


def test_bench_parse_quick_times_both_decoders_on_each_body(tmp_path):
    from benchmarks import bench_parse

    out = tmp_path / "parse.json"
    assert bench_parse.main(["--quick", "--out", str(out)]) == 0
    bodies = json.loads(out.read_text())["bodies"]
    assert len(bodies) == 3
    for row in bodies.values():
        assert row["bytes"] > 0 and all(value > 0 for key, value in row.items() if key.endswith("_ms"))


def test_bench_layer_pieces_quick_times_every_piece(tmp_path, capsys):
    from benchmarks import bench_layer_pieces

    out = tmp_path / "pieces.json"
    assert bench_layer_pieces.main(["--quick", "--json", str(out)]) == 0
    record = json.loads(out.read_text())
    pieces = record["ms_per_call"]
    assert record["layer"] == {"batch": 4, "width": 8, "size": 8, "groups": 2}
    # on CPU one setting of the convolutions (four ways of the per-example weight gradients counted), four ways of
    # GroupNorm's per-example gradients, the norms and sum
    assert len(pieces) == 11 and all(ms > 0 for ms in pieces.values())
    assert "GroupNorm per-example gradients: GroupNorm backward kernel, the forward's statistics (ghost engine)" in (
        pieces)
    with pytest.raises(SystemExit):
        bench_layer_pieces.main(["--width", "10", "--groups", "4"])
    assert "--groups 4 does not divide --width 10" in capsys.readouterr().err


def test_a_serving_run_records_the_commit_it_is_told_where_the_tree_has_no_git_of_its_own(monkeypatch):
    from benchmarks.serving_common import run_record

    monkeypatch.setenv("TRANSDENOISER_COMMIT", "abc1234")
    record = run_record(["--quick"], "benchmarks.bench_serving")
    assert record["commit"] == "abc1234" and record["uncommitted_serving_changes"] is None
    assert record["command"] == "python -m benchmarks.bench_serving --quick"
    monkeypatch.delenv("TRANSDENOISER_COMMIT")
    assert run_record([], "benchmarks.bench_serving")["commit"] != "abc1234"


def test_bench_serving_adaptive_refuses_a_compared_setting_it_sets_itself_or_a_bad_one(capsys):
    from benchmarks import bench_serving_adaptive

    for argv, message in ((["--compare", "noise_key=" + "k" * 40], "--compare noise_key: set by the benchmark itself"),
                          (["--compare", "overlap=maybe"], 'overlap must be true, false or "auto"'),
                          (["--compare", "overlap"], "'overlap' is not KEY=VALUE"),
                          (["--model-dir", "no/such"], "--model-dir: model directory no/such: no such directory")):
        with pytest.raises(SystemExit):
            bench_serving_adaptive.main(argv)
        assert message in capsys.readouterr().err


def test_bench_serving_warms_each_server_then_takes_their_phases_in_turn(monkeypatch):
    """bench_serving's phases: one discarded warm-up per server at the measured client count, then the servers in
    turn, the order reversed every other repeat; each speed-up is the ratio of the medians, and each repeat's ratio
    is kept."""
    from benchmarks import bench_serving

    calls = []
    rates = {"a": iter([4.0, 9.0, 5.0, 6.0]), "b": iter([2.0, 3.0, 1.0, 3.0]), "c": iter([4.0, 4.0, 4.0, 8.0])}

    def phase(url, image, n, clients, max_seconds, max_requests):
        calls.append((url, max_seconds))
        return {"requests": 5, "failures": [], "requests_per_s": 99.0 if max_seconds == 0.5 else next(rates[url])}

    monkeypatch.setattr(bench_serving, "run_phase", phase)
    result = bench_serving.measure({"adaptive": "a", "one-at-a-time": "b", "whole-requests": "c"}, [], n=10,
                                   clients=4, seconds=2.0, repeats=4, warmup_seconds=0.5)
    assert [url for url, _ in calls] == list("abc" + "abc" + "cba" + "abc" + "cba")
    assert [seconds for _, seconds in calls] == [0.5] * 3 + [2.0] * 12
    assert result["median_requests_per_s"] == {"adaptive": 5.5, "one-at-a-time": 2.5, "whole-requests": 4.0}
    assert result["speedup"] == pytest.approx({"one-at-a-time": 5.5 / 2.5, "whole-requests": 5.5 / 4.0})
    assert result["speedup_per_repeat"]["one-at-a-time"] == pytest.approx([4 / 2, 9 / 3, 5 / 1, 6 / 3])
    assert result["speedup_per_repeat"]["whole-requests"] == pytest.approx([1, 9 / 4, 5 / 4, 6 / 8])
    assert bench_serving.mode_settings(1000)["whole-requests"] == {"batching": False, "round_samples": 1100}
    calls.clear()
    rates = {"a": iter([4.0]), "b": iter([2.0])}
    bench_serving.measure({"adaptive": "a", "one-at-a-time": "b"}, [], n=10, clients=1, seconds=2.0, repeats=1,
                          warmup_seconds=0)  # no warm-up asked: none
    assert calls == [("a", 2.0), ("b", 2.0)]

    def unanswered(url, image, n, clients, max_seconds, max_requests):
        return {"requests": 0, "failures": ["503: busy"], "requests_per_s": 0.0}

    monkeypatch.setattr(bench_serving, "run_phase", unanswered)
    with pytest.raises(RuntimeError, match=r"no adaptive request was answered: \['503: busy'\]"):
        bench_serving.measure({"adaptive": "a", "one-at-a-time": "b"}, [], n=10, clients=1, seconds=1.0, repeats=1,
                              warmup_seconds=0)


def test_every_benchmark_record_names_the_commit_it_ran_at(tmp_path, monkeypatch):
    """write_result stamps the commit and whether tracked files had changed, unless the record says itself."""
    from benchmarks import COMMIT_ENV, write_result

    monkeypatch.setenv(COMMIT_ENV, "abc1234")
    record = json.loads(write_result(tmp_path / "a.json", {"figure": 1.0}).read_text())
    assert record == {"figure": 1.0, "commit": "abc1234", "uncommitted_changes": None}  # no .git: not known
    kept = json.loads(write_result(tmp_path / "b.json", {"commit": "def5678", "uncommitted_serving_changes": False})
                      .read_text())
    assert kept == {"commit": "def5678", "uncommitted_serving_changes": False}
    monkeypatch.delenv(COMMIT_ENV)
    record = json.loads(write_result(tmp_path / "c.json", {}).read_text())
    from benchmarks import checkout_commit

    in_git = checkout_commit() is not None  # a checkout with git: its HEAD, and a known answer
    assert record["commit"] == checkout_commit() != "abc1234"
    assert isinstance(record["uncommitted_changes"], bool) if in_git else record["uncommitted_changes"] is None


def test_a_serving_benchmark_refuses_a_denoiser_dir_that_is_not_a_checkpoint(tmp_path, random_classifier_dir, capsys):
    from benchmarks import bench_serving

    with pytest.raises(SystemExit) as info:
        bench_serving.main(["--quick", "--classifier-dir", str(random_classifier_dir), "--denoiser-dir",
                            str(tmp_path / "missing")])
    err = capsys.readouterr().err
    assert info.value.code == 2 and f"--denoiser-dir {tmp_path / 'missing'}: not a denoiser checkpoint" in err, err


@pytest.mark.server
def test_bench_retry_storm_quick_counts_every_attempt_of_clients_that_obey_retry_after(tmp_path,
                                                                                   random_classifier_dir):
    """One run of 5 s against a real server (8 clients, lighter heavy requests): the record adds up."""
    from benchmarks import bench_retry_storm

    out = tmp_path / "storm.json"
    assert bench_retry_storm.main(["--quick", "--classifier-dir", str(random_classifier_dir), "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    run, total = result["runs"][0], result["totals"]
    assert total["runs"] == 1 and run["attempts"] == sum(run["statuses"].values()) > 0
    assert run["admitted"] == run["answered"] + run["admitted_then_504"] and run["answered"] > 0
    assert run["small"]["attempts"] + run["heavy"]["attempts"] == run["attempts"]
    assert run["small"]["idle_p50_s"] > 0 and run["compute_rate"]["min"] > 0
    assert total["goodput"] == run["goodput"] == run["answered"] / run["admitted"]
    assert result["settings"]["heavy"]["samples"] == 16 * (bench_retry_storm.QUICK_HEAVY_N + 100)


def test_bench_retry_storm_refuses_bad_arguments(capsys, tmp_path):
    from benchmarks import bench_retry_storm

    for argv, message in ((["--heavy-share", "1.5"], "--heavy-share must lie in [0, 1]"),
                          (["--classifier-dir", str(tmp_path)], "not a classifier checkpoint"),
                          (["--runs", "0"], "--runs")):
        with pytest.raises(SystemExit) as info:
            bench_retry_storm.main(argv)
        assert info.value.code == 2 and message in capsys.readouterr().err
