"""--sound-noise in the server: the bundle records it in serving.toml, the answer and the model card state it,
off-grid images are refused with a one-line 400, and answers match the offline sampler."""
from __future__ import annotations

import numpy as np
import torch

from certify.core import Smooth
from serving.bundle import load_model_dir
from serving.compute.counter import VoteCounter
from serving.compute.engine import NoiseJob
from serving.config import load_config
from tests.conftest import in_process_service
from transdenoiser.cli import main as cli_main


def test_bundle_and_server_with_sound_noise(random_classifier_dir, tmp_path, capsys):
    out = tmp_path / "model"
    code = cli_main(["bundle", "--classifier", str(random_classifier_dir), "--sigma", "0.25", "--n0", "10",
                     "--n", "50", "--max-n", "100", "--sound-noise", "--out", str(out)])
    assert code == 0 and "sound noise" in capsys.readouterr().out
    assert load_config(out).sound_noise is True and "sound_noise = true" in (out / "serving.toml").read_text()
    image = torch.randint(0, 256, (1, 28, 28)).float().div(255)
    with in_process_service(out) as client:
        response = client.post("/predict", json={"images": [image.tolist()], "n": 50})
        assert response.status_code == 200, response.text
        assert response.json()["noise"] == "sound"
        refused = client.post("/predict", json={"images": [(image * 0.999).tolist()], "n": 50})
        assert refused.status_code == 400 and "image 0" in refused.text and "8-bit grid" in refused.text
        card = client.post("/metadata").json()
        assert card["certification"]["sound_noise"] is True
        assert "sound noise" in card["runtime"]["base_classifier_as_run"]


def test_vote_counter_draws_sound_noise_like_smooth(random_classifier_dir, tmp_path):
    """The server's noise job and the offline sampler draw the same noisy samples from the same seed."""
    out = tmp_path / "model"
    assert cli_main(["bundle", "--classifier", str(random_classifier_dir), "--sigma", "0.25", "--sound-noise",
                     "--out", str(out)]) == 0
    pipeline = load_model_dir(out).pipeline
    smooth = Smooth(pipeline.classifier, pipeline.num_classes, 0.25, batch_size=64, workers=1, noise="sound")
    image = torch.randint(0, 256, (1, 28, 28)).float().div(255)
    served = VoteCounter(smooth)([NoiseJob(image, 300, 11)])[0]
    offline = smooth.sample_counts(image, 300, smooth.generator(11))
    assert isinstance(served, np.ndarray) and (served == offline).all()
