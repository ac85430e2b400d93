"""The state the service keeps per process (the body slots shared by the front door and the body-limit middleware,
the readiness /readyz answers from) is set by each service from its own model directory: a service built after
another in the same process (as the tests do; a real server runs one) applies its own limits, not the first one's.

Its own module: it builds a service of its own, which cannot coexist in one process with another module's."""
from __future__ import annotations

import serving.service as service_module
from serving.bundle import write_model_dir
from tests.conftest import in_process_service


def test_each_service_takes_its_own_model_directorys_body_slots(classifier_dir, tmp_path):
    service_module.BODY_SLOTS.configure(2, 2)  # as a previous service in this process left them
    service_module.READINESS.ready = True  # as a previous service, warmed up, left it
    model = write_model_dir(tmp_path / "model", classifier_dir, sigma=0.25, n0=20, n=100, max_parsing_requests=5,
                            max_queued_requests=7)
    with in_process_service(model) as client:
        assert (service_module.BODY_SLOTS.limit, service_module.BODY_SLOTS.small_limit) == (5, 7)
        card = client.post("/metadata").json()
        assert card["runtime"]["max_parsing_requests"] == 5
        assert client.get("/readyz").status_code == 200
