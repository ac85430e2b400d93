"""The README's promises that a test can hold: every time it gives names the machine and whether it was quiet or
shared; the tour's config is what the README says it is; the first screen says what the product does, then the two
commands, then the install size."""
from __future__ import annotations

import re
from pathlib import Path

from transdenoiser.toml import tomllib

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()
MACHINES = ("AMD EPYC", "Intel Xeon")
TIME = re.compile(r"\b\d+(?:[.,-]\d+)?\s*(?:s|min|minutes|hours?)\b|half an hour")


def prose_sentences(text: str) -> list[str]:
    prose = re.sub(r"```.*?```", " ", text, flags=re.S)  # commands and sample output are not claims of time
    return [s for s in re.split(r"(?<=[.:;])\s+(?=[A-Z`(])", re.sub(r"\s+", " ", prose)) if s]


def test_every_time_names_the_machine_and_whether_it_was_quiet():
    timed = [s for s in prose_sentences(README) if TIME.search(s)]
    assert len(timed) >= 3
    for sentence in timed:
        assert any(machine in sentence for machine in MACHINES), sentence
        assert "quiet" in sentence or "shared" in sentence, sentence


def test_the_tour_config_has_the_defaults_the_readme_describes():
    from training.train_config import TrainConfig

    assert "configs/tour_sigma025.toml" in README
    tour = tomllib.loads((ROOT / "configs" / "tour_sigma025.toml").read_text())
    paper = tomllib.loads((ROOT / "configs" / "mnist_sigma025.toml").read_text())
    assert TrainConfig.from_dict(tour, source="tour").merge_uncredited_noise is True  # the product default
    assert paper["merge_uncredited_noise"] is False and "`merge_uncredited_noise = false`" in README
    assert {k: v for k, v in paper.items() if k != "merge_uncredited_noise"} == tour  # otherwise the same setting
    for line in README.splitlines():
        if "transdenoiser train --config" in line:
            assert "configs/tour_sigma025.toml" in line, line


def test_the_first_screen_says_what_it_does_then_the_two_commands_then_the_install_size():
    words = ["frozen", "differential privacy", "certified predictions over HTTP", "make demo", "make test",
             "Install size"]
    flat = re.sub(r"\s+", " ", README)
    places = [flat.find(word) for word in words]
    assert -1 not in places and places == sorted(places), dict(zip(words, places, strict=True))
    assert README.find("source .venv/bin/activate") < README.find("transdenoiser pretrain")
    assert "secret" in README and "same certificate" in README  # what changes run to run, what does not
