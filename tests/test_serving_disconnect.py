"""The server's disconnection probe (serving.disconnect.DisconnectWatch): what it reads, that a look takes no turn
of the event loop, and that it leaves no task behind."""
from __future__ import annotations

import asyncio

from starlette.requests import Request

from serving.disconnect import MAX_OTHER_MESSAGES, DisconnectWatch


def _receive_until(gone: asyncio.Event):
    """An ASGI receive as uvicorn's once the body has been read: it waits until the client goes."""
    calls = []

    async def receive():
        calls.append(1)
        await gone.wait()
        return {"type": "http.disconnect"}

    return receive, calls


def test_a_look_reads_false_until_the_client_goes_then_true():
    async def run():
        gone = asyncio.Event()
        receive, calls = _receive_until(gone)
        watch = DisconnectWatch(receive)
        seen = [await watch()]  # starts the watch
        for _ in range(3):
            await asyncio.sleep(0)
            seen.append(await watch())
        gone.set()
        for _ in range(3):
            await asyncio.sleep(0)
        seen.append(await watch())
        watch.close()
        return seen, len(calls)

    seen, calls = asyncio.run(run())
    assert seen == [False, False, False, False, True]
    assert calls == 1  # one receive awaited for the whole request, not one per look


def test_a_look_takes_no_turn_of_the_event_loop_where_starlettes_probe_takes_one_each():
    async def turns_during(probe, looks: int) -> int:
        turns = 0
        stop = False

        async def count_turns():
            nonlocal turns
            while not stop:
                turns += 1
                await asyncio.sleep(0)

        counter = asyncio.get_running_loop().create_task(count_turns())
        await asyncio.sleep(0)
        before = turns
        for _ in range(looks):
            assert await probe() is False
        during = turns - before
        stop = True
        await counter
        return during

    async def run():
        never = asyncio.Event()
        receive, _ = _receive_until(never)
        watch = DisconnectWatch(receive)
        ours = await turns_during(watch, 200)
        watch.close()
        request = Request({"type": "http", "method": "POST", "headers": [], "path": "/predict"}, receive)
        theirs = await turns_during(request.is_disconnected, 200)
        return ours, theirs

    ours, theirs = asyncio.run(run())
    assert ours == 0
    assert theirs >= 200  # the cost this probe removes: one turn (other tasks first) per look


def test_close_stops_the_watch_and_leaves_no_task():
    async def run():
        receive, _ = _receive_until(asyncio.Event())
        watch = DisconnectWatch(receive)
        await watch()
        await asyncio.sleep(0)
        watch.close()
        await asyncio.sleep(0)
        others = [task for task in asyncio.all_tasks() if task is not asyncio.current_task()]
        return others, watch.gone

    others, gone = asyncio.run(run())
    assert others == [] and gone is False


def test_close_before_any_look_is_a_no_op():
    watch = DisconnectWatch(_receive_until(asyncio.Event())[0])
    watch.close()
    assert watch.gone is False


def test_a_failing_or_chattering_receive_never_reads_as_gone(recwarn):
    async def failing():
        raise OSError("connection reset")

    chatter = []

    async def chattering():  # a receive that keeps answering at once with something else
        chatter.append(1)
        return {"type": "http.request", "body": b"", "more_body": False}

    async def run(receive):
        watch = DisconnectWatch(receive)
        seen = [await watch()]
        for _ in range(2 * MAX_OTHER_MESSAGES):
            await asyncio.sleep(0)
            seen.append(await watch())
        watch.close()
        return seen

    assert not any(asyncio.run(run(failing)))
    assert not any(asyncio.run(run(chattering)))
    assert len(chatter) == MAX_OTHER_MESSAGES  # it gives up rather than spin
    assert not [w for w in recwarn if "never retrieved" in str(w.message)]
