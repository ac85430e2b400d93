"""The front door (serving/front_door.py), in process: the health probes and the refusal of a body while every body
slot is taken are answered ahead of BentoML's middlewares, exactly as they were answered behind them; every other
request reaches the app untouched."""
from __future__ import annotations

import asyncio
import json

import pytest

from serving.front_door import FrontDoor, Readiness
from serving.limits import SLOT_KEY, SMALL_BODY_BYTES, BodySlots, PayloadLimitMiddleware, release_body_slot

KEY = b"k" * 32


class _App:
    """Records the requests it sees and answers 200 ``app``."""

    def __init__(self):
        self.seen: list[tuple[str, str]] = []

    async def __call__(self, scope, receive, send):
        self.seen.append((scope["method"], scope["path"]))
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"app"})


def _call(door, method: str, path: str, headers=(), reads: list | None = None) -> tuple[int, dict, bytes]:
    """``door``'s answer to a request whose (empty) body arrives at once; ``reads`` gets one entry per body read."""
    sent: list[dict] = []
    reads = [] if reads is None else reads

    async def receive():
        reads.append(1)
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message):
        sent.append(message)

    scope = {"type": "http", "method": method, "path": path, "headers": list(headers)}
    asyncio.run(door(scope, receive, send))
    start, body = sent[0], b"".join(m.get("body", b"") for m in sent[1:])
    return start["status"], dict(start["headers"]), body


def _door(app, slots=None, ready=True, api_key=None, show_versions=False):
    readiness = Readiness()
    readiness.ready = ready
    refusals: list[int] = []
    door = FrontDoor(app, slots or BodySlots(2, 2), readiness, api_key, show_versions=show_versions,
                     on_full=lambda: refusals.append(1))
    return door, refusals


@pytest.mark.parametrize("path", ["/livez", "/healthz", "/readyz"])
def test_probes_are_answered_as_bentoml_answers_them_without_reaching_the_app(path):
    app = _App()
    door, _ = _door(app)
    status, headers, body = _call(door, "GET", path)
    assert (status, body) == (200, b"\n") and not app.seen
    assert headers == {b"content-type": b"text/plain; charset=utf-8", b"content-length": b"1",
                       b"server": b"transdenoiser"}
    assert _call(door, "HEAD", path)[:2] == (200, headers) and not app.seen
    assert _call(door, "POST", path)[0] == 200 and app.seen == [("POST", path)]  # not a probe: the app's (405)
    assert _call(door, "GET", path + "/")[0] == 200 and app.seen[-1] == ("GET", path + "/")


def test_readyz_is_503_until_the_service_has_warmed_up():
    door, _ = _door(_App(), ready=False)
    status, headers, body = _call(door, "GET", "/readyz")
    assert status == 503 and headers[b"content-type"] == b"application/json"
    assert "warming up" in json.loads(body)["error"]
    assert _call(door, "GET", "/livez")[0] == 200  # alive all the same
    door.readiness.ready = True
    assert _call(door, "GET", "/readyz")[0] == 200


def test_versions_shown_means_no_server_header():
    door, _ = _door(_App(), show_versions=True)
    assert b"server" not in _call(door, "GET", "/livez")[1]


def test_a_body_while_every_slot_is_taken_is_refused_at_the_door_as_the_body_limit_refuses_it():
    """The same status, Retry-After and JSON body as PayloadLimitMiddleware's refusal, counted, the app never
    reached and the body never read; a free slot, or a request without a body, goes through."""
    slots = BodySlots(1, 1)
    app = _App()
    door, refusals = _door(app, slots)
    assert _call(door, "POST", "/predict")[0] == 200 and app.seen == [("POST", "/predict")]
    release = slots.take()
    reads: list[int] = []
    status, headers, body = _call(door, "POST", "/predict", reads=reads)
    assert status == 503 and headers[b"retry-after"] == b"1" and headers[b"server"] == b"transdenoiser"
    assert len(app.seen) == 1 and refusals == [1] and not reads
    inner_refusals: list[int] = []
    inner = PayloadLimitMiddleware(_App(), max_bytes=1000, slots=slots, on_full=lambda: inner_refusals.append(1))
    inner_status, inner_headers, inner_body = _call(inner, "POST", "/predict")
    assert (inner_status, json.loads(inner_body)) == (503, json.loads(body)) and inner_refusals == [1]
    assert "max_parsing_requests" in json.loads(body)["error"]
    assert inner_headers[b"retry-after"] == headers[b"retry-after"]
    assert _call(door, "GET", "/metadata")[0] == 200 and app.seen[-1] == ("GET", "/metadata")
    release()
    assert _call(door, "POST", "/predict")[0] == 200 and len(app.seen) == 3 and refusals == [1]


def test_with_an_api_key_only_an_authenticated_body_is_refused_at_the_door():
    """Slots full: the right key gets the 503 here; a missing or wrong key goes on to the authentication
    middleware (its 401), as before the front door."""
    slots = BodySlots(0, 0)
    app = _App()
    door, refusals = _door(app, slots, api_key=KEY)
    assert _call(door, "POST", "/predict", [(b"x-api-key", KEY)])[0] == 503 and refusals == [1]
    assert _call(door, "POST", "/predict", [(b"authorization", b"Bearer " + KEY)])[0] == 503
    assert _call(door, "POST", "/predict", [(b"x-api-key", b"x" * 32)])[0] == 200
    assert _call(door, "POST", "/predict")[0] == 200
    assert app.seen == [("POST", "/predict")] * 2 and len(refusals) == 2
    assert _call(door, "GET", "/readyz")[0] == 200  # probes are open, key or not


def test_other_scopes_pass_through():
    seen: list[str] = []

    async def app(scope, receive, send):
        seen.append(scope["type"])

    door, _ = _door(app, BodySlots(0, 0))
    asyncio.run(door({"type": "lifespan"}, None, None))
    assert seen == ["lifespan"]


def test_the_door_takes_the_slot_as_the_request_arrives_and_the_body_limit_finds_it_held():
    """A burst arriving at once: each request takes its slot at the door, before the layers behind it run (they
    may run the request as a task of their own, later), so the requests beyond the limit are refused at the door;
    the body-limit middleware behind takes no second slot; the service's early release and the end of the request
    both give the slot back, once."""
    slots = BodySlots(2, 2)
    during: list[tuple[int, bool]] = []
    proceed = asyncio.Event()

    async def service(scope, receive, send):
        message = await receive()
        during.append((slots.taken, SLOT_KEY in scope))
        release_body_slot(scope)  # parsed
        release_body_slot(scope)  # idempotent
        during.append((slots.taken, message["body"] == b"{}"))
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})

    behind = PayloadLimitMiddleware(service, max_bytes=1000, slots=slots)

    async def later(scope, receive, send):  # as BentoML's timeout middleware: the rest runs as its own task
        await proceed.wait()
        await behind(scope, receive, send)

    refusals: list[int] = []
    door = FrontDoor(later, slots, Readiness(), api_key=None, on_full=lambda: refusals.append(1))

    async def call():
        sent: list[dict] = []

        async def receive():
            return {"type": "http.request", "body": b"{}", "more_body": False}

        async def send(message):
            sent.append(message)

        await door({"type": "http", "method": "POST", "path": "/predict", "headers": [(b"content-length", b"2")]},
                   receive, send)
        return sent[0]["status"]

    async def burst():
        tasks = [asyncio.create_task(call()) for _ in range(5)]
        await asyncio.sleep(0.01)
        assert slots.taken == 2 and len(refusals) == 3  # refused at the door, the layers behind not yet run
        proceed.set()
        return await asyncio.gather(*tasks)

    assert sorted(asyncio.run(burst())) == [200, 200, 503, 503, 503]
    assert during[0] == (2, True) and slots.taken == 0
    assert sorted(during) == [(0, True), (1, True), (1, True), (2, True)]


def test_small_and_large_bodies_have_separate_allowances():
    """Bodies over SMALL_BODY_BYTES (by Content-Length) or undeclared (chunked) take the large slots
    (max_parsing_requests), smaller ones the small slots (max_queued_requests), at the door and in the body-limit
    middleware alike: a burst of large bodies cannot refuse a small request, nor many small ones a large one; each
    refusal names the limit that applied."""
    slots = BodySlots(2, 3)
    app = _App()
    door, refusals = _door(app, slots)
    large = [(b"content-length", str(SMALL_BODY_BYTES + 1).encode())]
    small = [(b"content-length", str(SMALL_BODY_BYTES).encode())]
    inner = PayloadLimitMiddleware(_App(), max_bytes=10**6, slots=slots)
    held_large = [slots.take(), slots.take()]
    assert slots.full() and not slots.full(small=True)
    for headers in (large, []):  # declared large, or declared nothing
        status, _, body = _call(door, "POST", "/predict", headers)
        error = json.loads(body)["error"]
        assert status == 503 and f"bodies over {SMALL_BODY_BYTES} bytes" in error and "max_parsing_requests" in error
        assert _call(inner, "POST", "/predict", headers)[0] == 503
    assert len(refusals) == 2 and app.seen == []
    for _ in range(3):  # every small slot free: three small bodies at once
        assert _call(door, "POST", "/predict", small)[0] == 200
    held_small = [slots.take(small=True) for _ in range(3)]
    assert (slots.taken_large, slots.taken_small, slots.taken) == (2, 3, 5)
    status, _, body = _call(door, "POST", "/predict", small)
    error = json.loads(body)["error"]
    assert status == 503 and "max_queued_requests" in error and f"at most {SMALL_BODY_BYTES} bytes" in error
    held_large.pop()()  # a large slot free: a large body goes through although the small slots are full
    assert _call(door, "POST", "/predict", large)[0] == 200 and len(app.seen) == 4
    for release in held_large + held_small:
        release()
    assert slots.taken == 0


def test_an_unauthenticated_body_takes_no_slot():
    slots = BodySlots(1, 1)
    taken: list[int] = []

    async def app(scope, receive, send):
        taken.append(slots.taken)
        await send({"type": "http.response.start", "status": 401, "headers": []})
        await send({"type": "http.response.body", "body": b""})

    door, refusals = _door(app, slots, api_key=KEY)
    assert _call(door, "POST", "/predict")[0] == 401 and taken == [0] and not refusals
    assert _call(door, "POST", "/predict", [(b"x-api-key", KEY)])[0] == 401 and taken == [0, 1]
    assert slots.taken == 0


def test_an_abandoned_upload_gives_its_slot_back_although_the_layers_around_it_wait():
    """A client gone mid-body: the body-limit middleware ends the request at once and gives the door's slot back,
    although BentoML's timeout middleware, between the door and it, waits for an answer that never comes (600 s in
    the server); the slot is not held until then."""
    slots = BodySlots(1, 1)
    never = asyncio.Event()

    async def service(scope, receive, send):
        raise AssertionError("an abandoned upload reached the service")

    behind = PayloadLimitMiddleware(service, max_bytes=10**6, slots=slots)

    async def timeout_like(scope, receive, send):
        await behind(scope, receive, send)  # returns at the disconnect without answering
        await never.wait()  # waits for an answer

    door = FrontDoor(timeout_like, slots, Readiness(), api_key=None)

    async def run():
        messages = [{"type": "http.request", "body": b"x" * SMALL_BODY_BYTES, "more_body": True}]

        async def receive():  # the first SMALL_BODY_BYTES of a large body (the door then takes the slot), then gone
            return messages.pop() if messages else {"type": "http.disconnect"}

        async def send(message):
            raise AssertionError("nothing is sent to a client that has gone")

        scope = {"type": "http", "method": "POST", "path": "/predict", "headers": [(b"content-length", b"200000")]}
        task = asyncio.create_task(door(scope, receive, send))
        await asyncio.sleep(0.01)
        assert SLOT_KEY in scope and slots.taken == 0 and not task.done()
        task.cancel()

    asyncio.run(run())
