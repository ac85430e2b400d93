"""A request body must keep arriving (serving.limits.BodyPace, PacedReceive; the front door reads at that pace), in
process with short times: a stalled body holds no slot, is answered 408 with ``Connection: close`` and ends; a body
that keeps its pace is read as before."""
from __future__ import annotations

import asyncio
import json
import time

import pytest

from serving.config import ServingConfig, validate_config
from serving.front_door import FrontDoor, Readiness
from serving.limits import SMALL_BODY_BYTES, BodyPace, BodySlots, BodyStalled, PacedReceive, PayloadLimitMiddleware

PACE = BodyPace(timeout_s=0.6, min_bytes_per_s=1000, grace_s=0.1)


def _feeder(chunks: list[tuple[float, bytes]]):
    """A receive giving each ``(delay_s, chunk)`` after its delay, the last one ending the body; then waits forever
    (a client that keeps its connection open)."""
    pending = list(chunks)

    async def receive() -> dict:
        if not pending:
            await asyncio.Event().wait()
        delay_s, chunk = pending.pop(0)
        await asyncio.sleep(delay_s)
        return {"type": "http.request", "body": chunk, "more_body": bool(pending)}

    return receive


async def _read_all(receive: PacedReceive) -> int:
    while not receive.ended:
        await receive()
    return receive.received


def test_the_pace_is_an_average_rate_after_a_grace_and_a_deadline_for_the_whole_body():
    def read(chunks, pace=PACE) -> tuple[int | str, float]:
        async def run():
            started = time.monotonic()
            paced = PacedReceive(_feeder(chunks), pace)
            try:
                async with asyncio.timeout(8):  # a body that is never stopped fails here, not the suite's timeout
                    return await _read_all(paced), time.monotonic() - started
            except BodyStalled as exc:
                return str(exc), time.monotonic() - started

        return asyncio.run(run())

    # 2,000 bytes/s, twice the minimum: read whole
    assert read([(0.05, b"x" * 100)] * 6)[0] == 600
    # a first byte late but within the grace, then fast: read whole
    assert read([(0.08, b"x" * 300), (0.05, b"x" * 300)])[0] == 600
    # 200 bytes/s, a fifth of the minimum: stopped once the bytes so far fall behind 1,000 bytes/s after the grace
    message, elapsed_s = read([(0.05, b"x" * 10)] * 60)
    assert "stopped arriving" in message and "min_body_bytes_per_s" in message and 0.1 <= elapsed_s < 0.4
    # fast enough, but longer than the body's deadline: stopped at the deadline
    message, elapsed_s = read([(0.05, b"x" * 200)] * 30)
    assert "within 0.6 s" in message and 0.55 <= elapsed_s < 0.9
    # nothing after the headers: stopped after the grace
    message, elapsed_s = read([(5.0, b"x")])
    assert "0 bytes" in message and 0.1 <= elapsed_s < 0.3


def test_after_the_body_the_receive_is_not_paced():
    """A client waiting for its answer sends nothing more: the wait for its disconnect is not a stalled body."""
    async def run():
        messages = [{"type": "http.request", "body": b"{}", "more_body": False}]

        async def receive():
            if messages:
                return messages.pop()
            await asyncio.sleep(0.3)  # past the grace at 0 bytes/s
            return {"type": "http.disconnect"}

        paced = PacedReceive(receive, BodyPace(timeout_s=0.2, min_bytes_per_s=1000, grace_s=0.05))
        assert (await paced())["body"] == b"{}" and paced.ended
        return (await paced())["type"]

    assert asyncio.run(run()) == "http.disconnect"


async def _request(door, headers, receive) -> tuple[int, dict, dict, float]:
    sent: list[dict] = []
    started = time.monotonic()

    async def send(message):
        sent.append(message)

    await door({"type": "http", "method": "POST", "path": "/predict", "headers": headers}, receive, send)
    start, body = sent[0], b"".join(m.get("body", b"") for m in sent[1:])
    return start["status"], dict(start["headers"]), json.loads(body) if body else {}, time.monotonic() - started


class _Service:
    """Reads its body whole and answers 200 with its length (the parser's place behind the body limit)."""

    def __init__(self, slots: BodySlots):
        self.slots, self.seen = slots, []

    async def __call__(self, scope, receive, send):
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        self.seen.append((len(body), self.slots.taken))
        payload = json.dumps({"bytes": len(body)}).encode()
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": payload})


def _served(slots: BodySlots, pace: BodyPace = PACE):
    service = _Service(slots)
    return FrontDoor(PayloadLimitMiddleware(service, max_bytes=10**6, slots=slots), slots, Readiness(),
                     api_key=None, pace=pace), service


def test_stalled_bodies_hold_no_slot_and_are_answered_408_and_closed():
    """40 connections stalled after their headers or inside a small body, with one small-body slot: a body that
    arrives is read and answered meanwhile (it finds the slot free); each stalled one gets 408 with Connection:
    close after the grace, never reaching the service."""
    slots = BodySlots(1, 1)
    door, service = _served(slots)
    small = [(b"content-length", b"5000")]

    async def run():
        stalled = [asyncio.create_task(_request(door, small, _feeder([(3, b"x")]))) for _ in range(20)]
        stalled += [asyncio.create_task(_request(door, small, _feeder([(0, b"x" * 13), (3, b"x")])))
                    for _ in range(20)]
        await asyncio.sleep(0.02)
        held = slots.taken
        good = await _request(door, small, _feeder([(0, b"x" * 5000)]))
        async with asyncio.timeout(8):
            return held, good, await asyncio.gather(*stalled)

    held, good, stalled = asyncio.run(run())
    assert held == 0 and good[:3] == (200, {}, {"bytes": 5000}) and service.seen == [(5000, 1)]
    for status, headers, body, elapsed_s in stalled:
        assert status == 408 and headers[b"connection"] == b"close" and "stopped arriving" in body["error"]
        assert PACE.grace_s <= elapsed_s < PACE.grace_s + 0.3
    assert slots.taken == 0


def test_a_large_body_that_stalls_after_its_first_bytes_gives_its_slot_back_at_once():
    """The door takes a large body's slot once its first SMALL_BODY_BYTES have arrived; the rest is held to the
    same pace behind it, and the body-limit middleware answers 408 when it stops, giving the slot back then."""
    slots = BodySlots(1, 1)
    door, service = _served(slots, BodyPace(timeout_s=5, min_bytes_per_s=100_000, grace_s=0.1))
    large = [(b"content-length", str(4 * SMALL_BODY_BYTES).encode())]

    async def run():
        task = asyncio.create_task(_request(door, large, _feeder([(0, b"x" * SMALL_BODY_BYTES), (3, b"x")])))
        await asyncio.sleep(0.05)
        held = slots.taken_large
        async with asyncio.timeout(8):
            return held, await task

    held, (status, headers, body, elapsed_s) = asyncio.run(run())
    assert held == 1 and status == 408 and headers[b"connection"] == b"close" and not service.seen
    assert f"{SMALL_BODY_BYTES} bytes" in body["error"] and elapsed_s < 1.5 and slots.taken == 0


def test_a_body_that_keeps_its_pace_is_answered_whole():
    slots = BodySlots(1, 1)
    door, service = _served(slots)
    size = 3 * SMALL_BODY_BYTES  # large: the door reads the first SMALL_BODY_BYTES, the body limit the rest
    chunks = [(0.01, b"x" * (SMALL_BODY_BYTES // 4))] * 12
    status, _, body, _ = asyncio.run(_request(door, [(b"content-length", str(size).encode())], _feeder(chunks)))
    assert (status, body) == (200, {"bytes": size}) and service.seen == [(size, 1)] and slots.taken == 0


def test_the_pace_is_a_setting():
    config = validate_config({"sigma": 0.25, "body_timeout_ms": 2000, "min_body_bytes_per_s": 100}, "t.toml")
    assert BodyPace.from_config(config) == BodyPace(timeout_s=2.0, min_bytes_per_s=100.0)
    assert BodyPace.from_config() == BodyPace.from_config(ServingConfig(sigma=0.25))
    for key in ("body_timeout_ms", "min_body_bytes_per_s"):
        with pytest.raises(Exception, match=f"{key} must be an integer >= 1"):
            validate_config({"sigma": 0.25, key: 0}, "t.toml")
