"""The patches of BentoML's and uvicorn's internals (serving/library_patches.py) check those internals first: on the
installed versions they apply (idempotently), and a changed internal stops the start with one clear line."""
from __future__ import annotations

import asyncio
import contextvars
import gc
import weakref

import pytest

from serving.library_patches import (
    LibraryInternalsChanged,
    bound_request_labels,
    cancel_request_timers,
    check_app_factory_internals,
    check_library_internals,
    check_protocol_internals,
    check_request_metrics_internals,
    check_timeout_internals,
    check_tracing_internals,
    json_protocol_errors,
    serve_behind_front_door,
    trace_only_when_exported,
)


def test_the_installed_libraries_pass_and_the_patches_apply_once():
    from bentoml._internal.server.http.instruments import RunnerTrafficMetricsMiddleware
    from uvicorn.protocols.http.h11_impl import H11Protocol

    check_library_internals()
    from bentoml._internal.server.http.traffic import TimeoutMiddleware

    for _ in range(2):
        bound_request_labels(frozenset({"/predict"}))
        json_protocol_errors()
        cancel_request_timers()
    from _bentoml_sdk.service.factory import Service

    import serving.service as service_module  # applies the front-door patch to the served service, at import

    for _ in range(2):
        serve_behind_front_door(service_module.TransDenoiser, service_module._front_door)
    assert Service.to_asgi is not Service._transdenoiser_original_to_asgi
    check_library_internals()  # still passes once patched (it checks the originals)
    assert RunnerTrafficMetricsMiddleware._transdenoiser_bounded and H11Protocol._transdenoiser_json_400
    assert TimeoutMiddleware._transdenoiser_cancels_timers
    assert TimeoutMiddleware.__call__ is not TimeoutMiddleware._transdenoiser_original_call
    assert 'scope["path"]' in __import__("inspect").getsource(RunnerTrafficMetricsMiddleware
                                                              ._transdenoiser_original_call)


class _Middleware:
    def __init__(self, app, namespace="x"):
        self.app = app

    async def __call__(self, scope, receive, send):
        endpoint = scope["path"]
        await self.app(scope, receive, send)
        return endpoint


class _RenamedLabel(_Middleware):
    async def __call__(self, scope, receive, send):
        await self.app(scope, receive, send)
        return scope["route"]


class _NewCallSignature(_Middleware):
    async def __call__(self, request):
        return request["path"]


class _NoAppAttribute(_Middleware):
    def __init__(self, inner):
        self.inner = inner


APP = "middlewares.append(Middleware(_Middleware)); _RenamedLabel; _NewCallSignature; _NoAppAttribute"


@pytest.mark.parametrize(("middleware", "app_source", "message"), [
    (_RenamedLabel, APP, r"no longer labels requests with scope\['path'\]"),
    (_NewCallSignature, APP, r"no longer takes \(scope, receive, send\)"),
    (_NoAppAttribute, APP, "no longer keeps the wrapped app"),
    (_Middleware, "middlewares.append(Middleware(OtherMetrics))", "no longer installs _Middleware"),
])
def test_changed_bentoml_internals_stop_the_start(middleware, app_source, message):
    assert check_request_metrics_internals(_Middleware, APP) is _Middleware
    with pytest.raises(LibraryInternalsChanged, match=message) as info:
        check_request_metrics_internals(middleware, app_source)
    assert str(info.value).startswith("bentoml ") and "serving/library_patches.py" in str(info.value)
    assert "\n" not in str(info.value)
    with pytest.raises(LibraryInternalsChanged, match="^bentoml "):  # the patch checks before patching
        bound_request_labels(frozenset({"/predict"}), middleware=middleware)
    assert not hasattr(middleware, "_transdenoiser_bounded")


def _recording_metrics_middleware():
    """A stand-in for BentoML's request-metrics middleware, under its name (BentoML's app installs a class of that
    name, which the patch checks), recording the label it takes from the path."""
    class RunnerTrafficMetricsMiddleware:
        labels: list[str] = []

        def __init__(self, app, namespace="x"):
            self.app = app

        async def __call__(self, scope, receive, send):
            type(self).labels.append(scope["path"])
            await self.app(scope, receive, send)

    return RunnerTrafficMetricsMiddleware


def test_static_paths_share_one_bounded_metric_label_while_the_app_sees_the_real_path():
    """BentoML's static files (its Swagger UI's scripts and styles under /static_content/) get one label between
    them, any unknown path the one UNKNOWN_PATH label, routes their own; the application behind still gets every
    request's real path."""
    from serving.library_patches import UNKNOWN_PATH

    middleware = _recording_metrics_middleware()
    bound_request_labels(frozenset({"/predict", "/docs.json"}), middleware=middleware)
    seen: list[str] = []

    async def app(scope, receive, send):
        seen.append(scope["path"])

    paths = ["/static_content/swagger-ui-bundle.js", "/static_content/a/b/index.css", "/docs.json", "/predict",
             "/probe-1", "/probe-2"]
    for path in paths:
        asyncio.run(middleware(app)({"type": "http", "method": "GET", "path": path, "headers": []}, None, None))
    assert seen == paths
    assert middleware.labels == ["/static_content/{path}"] * 2 + ["/docs.json", "/predict"] + [UNKNOWN_PATH] * 2


class _Protocol:
    def send_400_response(self, msg):
        self.transport.write(self.conn.send(msg))


class _HttpTools:
    pass


class _NewSignature(_Protocol):
    def send_400_response(self, msg, status):
        self.transport.write(self.conn.send(msg))


def test_changed_uvicorn_internals_stop_the_start():
    assert check_protocol_internals(_Protocol, _Protocol) is _Protocol
    with pytest.raises(LibraryInternalsChanged, match="httptools installed") as info:
        json_protocol_errors(_Protocol, _HttpTools)
    assert str(info.value).startswith("uvicorn ") and not hasattr(_Protocol, "_transdenoiser_json_400")
    with pytest.raises(LibraryInternalsChanged, match=r"send_400_response\(self, msg\) is gone or changed"):
        check_protocol_internals(_NewSignature, _NewSignature)
    with pytest.raises(LibraryInternalsChanged, match="is gone or changed"):
        check_protocol_internals(_HttpTools, _HttpTools)


def test_serve_refuses_to_start_when_the_internals_changed(monkeypatch, tmp_path, capsys):
    """``transdenoiser serve`` runs the checks before starting BentoML: one line, exit status 2."""
    import uvicorn.protocols.http.auto as auto

    from tests.conftest import serve_dry_run
    from transdenoiser.cli import main

    monkeypatch.setattr(auto, "AutoHTTPProtocol", _HttpTools)
    model_dir = tmp_path / "model"
    model_dir.mkdir()
    (model_dir / "serving.toml").write_text('sigma = 0.25\nclassifier = "classifier"\n')
    (model_dir / "classifier").mkdir()
    (model_dir / "classifier" / "metadata.json").write_text("{}")  # the cheap checks pass; the patch check runs next
    status = main(serve_dry_run(model_dir))
    err = capsys.readouterr().err
    assert status == 2 and "uvicorn" in err and "httptools installed" in err, err


# ------------------------------------------------------------------------------------- BentoML's request timeout

_REQUEST = contextvars.ContextVar("request")


class _RequestContext:
    """Stands for what a request puts in its context (OpenTelemetry's span, ...)."""


async def _answer(scope, receive, send):
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b"ok"})


def _timeout_middleware(app, timeout):
    from bentoml._internal.server.http.traffic import TimeoutMiddleware

    cancel_request_timers()
    return TimeoutMiddleware(app, timeout=timeout)


def _run(call, middleware, requests: int, scope=None):
    """``requests`` requests, each its own task (as uvicorn runs them) with its own context object, through
    ``call(middleware, ...)``; then the messages sent, the request contexts still alive and the timers pending."""
    alive, sent = weakref.WeakSet(), []

    async def receive():
        return {"type": "http.request", "body": b""}

    async def send(message):
        sent.append(message)

    async def request():
        context = _RequestContext()
        alive.add(context)
        _REQUEST.set(context)
        await call(middleware, scope or {"type": "http", "path": "/livez"}, receive, send)

    async def main():
        for _ in range(requests):
            await asyncio.create_task(request())
        await asyncio.sleep(0)
        gc.collect()
        pending = sum(not handle.cancelled() for handle in asyncio.get_running_loop()._scheduled)
        return sent, len(alive), pending

    return asyncio.run(main())


def test_request_timers_are_cancelled_and_free_the_request_context():
    """BentoML's own TimeoutMiddleware keeps every request's context until its timer fires (600 s); patched, no
    request's context outlives the request."""
    middleware = _timeout_middleware(_answer, timeout=600)
    original = type(middleware)._transdenoiser_original_call
    sent, alive, pending = _run(original, middleware, 200)
    assert (alive, pending) == (200, 200)  # the leak the patch removes (if this fails, BentoML changed)
    sent_patched, alive, pending = _run(type(middleware).__call__, middleware, 200)
    assert (alive, pending) == (0, 0)
    assert sent_patched == sent and len(sent) == 400


async def _slow(scope, receive, send):
    await asyncio.sleep(5)
    await _answer(scope, receive, send)


async def _starts_then_slow(scope, receive, send):
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await asyncio.sleep(0.1)
    await send({"type": "http.response.body", "body": b"late"})


async def _fails(scope, receive, send):
    raise RuntimeError("the application failed")


@pytest.mark.parametrize("app", [_answer, _slow, _starts_then_slow], ids=["answer", "504", "slow-answer"])
def test_request_timeout_answers_are_unchanged(app):
    """The same messages as BentoML's own middleware: the answer, the 504 of a request that sent nothing within the
    timeout, a slow answer that started in time; and no timer left."""
    middleware = _timeout_middleware(app, timeout=0.05)
    original = type(middleware)._transdenoiser_original_call
    sent, _, _ = _run(original, middleware, 1)
    sent_patched, alive, pending = _run(type(middleware).__call__, middleware, 1)
    assert sent_patched == sent and (alive, pending) == (0, 0)
    if app is _slow:
        assert sent[0]["status"] == 504 and b"Not able to process the request in 0.05 seconds" in sent[1]["body"]
    lifespan, _, _ = _run(type(middleware).__call__, _timeout_middleware(_answer, 600), 1, {"type": "lifespan"})
    assert lifespan[0]["status"] == 200


async def _ends_without_answering(scope, receive, send):
    await receive()  # e.g. the client went away mid-body: nothing to answer


def test_an_application_that_ends_without_answering_is_not_waited_for():
    """BentoML's middleware waits its whole timeout, then sends nothing; the patched one sends nothing at once
    (an upload abandoned mid-body no longer holds its request for 600 s)."""
    import time

    middleware = _timeout_middleware(_ends_without_answering, timeout=0.5)
    started = time.perf_counter()
    sent, _, _ = _run(type(middleware)._transdenoiser_original_call, middleware, 1)
    assert sent == [] and time.perf_counter() - started >= 0.5
    started = time.perf_counter()
    assert _run(type(middleware).__call__, middleware, 1) == ([], 0, 0)
    assert time.perf_counter() - started < 0.25


def test_a_failing_application_is_answered_as_before():
    """An application that fails before answering: BentoML's middleware waits for its timer (the failure is never
    awaited) and sends nothing; the patched one does the same and leaves no timer."""
    middleware = _timeout_middleware(_fails, timeout=0.05)
    sent, _, _ = _run(type(middleware)._transdenoiser_original_call, middleware, 1)
    assert _run(type(middleware).__call__, middleware, 1) == (sent, 0, 0) and sent == []


class _Timeout:
    def __init__(self, app, timeout):
        self.app = app
        self.timeout = timeout

    def _set_timer_out(self, waiter):
        pass


class _NoTimer(_Timeout):
    """BentoML's code with the timer armed differently (``loop.call_later`` gone)."""

    async def __call__(self, scope, receive, send):
        if scope["type"] not in ("http", "websocket"):
            return await self.app(scope, receive, send)
        loop = asyncio.get_running_loop()
        waiter = loop.create_future()
        loop.call_at(loop.time() + self.timeout, self._set_timer_out, waiter)

        async def _send(message):
            waiter.set_result(None)
            await send(message)

        fut = asyncio.ensure_future(self.app(scope, receive, _send), loop=loop)
        try:
            await waiter
        except asyncio.TimeoutError:
            if fut.cancel():
                body = {"error": f"Not able to process the request in {self.timeout} seconds"}  # noqa: F841
                return {"status_code=504"}
        else:
            await fut


class _NewTimeoutSignature(_Timeout):
    async def __call__(self, request):
        pass


def _exact():
    from bentoml._internal.server.http.traffic import TimeoutMiddleware

    return TimeoutMiddleware


class _NoTimerOut(_NoTimer):
    _set_timer_out = None


class _NewInit(_NoTimer):
    def __init__(self, app, seconds):
        self.app = app


FACTORY = ("Middleware(TimeoutMiddleware, timeout=self.timeout) Middleware(_NoTimer, timeout=self.timeout) "
           "Middleware(_NewTimeoutSignature, timeout=self.timeout) Middleware(_NoTimerOut, timeout=self.timeout) "
           "Middleware(_NewInit, timeout=self.timeout)")


@pytest.mark.parametrize(("middleware", "factory", "message"), [
    (_NoTimer, FACTORY, r"__call__ changed \(no longer has `loop.call_later"),
    (_NewTimeoutSignature, FACTORY, r"no longer takes \(scope, receive, send\)"),
    (_NoTimerOut, FACTORY, r"_set_timer_out\(self, waiter\) is gone or changed"),
    (_NewInit, FACTORY, "no longer keeps \\(app, timeout\\)"),
    (None, "results.append(Middleware(OtherTimeout, timeout=self.timeout))", "no longer installs TimeoutMiddleware"),
])
def test_changed_bentoml_timeout_stops_the_start(middleware, factory, message):
    middleware = middleware or _exact()
    assert check_timeout_internals(_exact(), FACTORY) is _exact()
    with pytest.raises(LibraryInternalsChanged, match=message) as info:
        check_timeout_internals(middleware, factory)
    assert str(info.value).startswith("bentoml ") and "\n" not in str(info.value)
    if factory == FACTORY:
        with pytest.raises(LibraryInternalsChanged, match="^bentoml "):  # the patch checks before patching
            cancel_request_timers(middleware)
        assert not hasattr(middleware, "_transdenoiser_cancels_timers")


class _Service:
    def to_asgi(self, is_main=True):
        return ("bentoml's app", self, is_main)


class _NewToAsgi:
    def to_asgi(self, main_service):
        return "app"


WORKER = "asgi_app = service.to_asgi(is_main=server_context.service_type == 'entry_service')"


def test_the_front_door_wraps_only_its_own_service():
    """``to_asgi`` of the service given returns its front door around BentoML's app; another service of the same
    class gets BentoML's app unchanged; a second call replaces the door instead of stacking two."""
    class Service(_Service):
        pass

    served, other = Service(), Service()
    serve_behind_front_door(served, lambda app: ("door 1", app), worker_source=WORKER)
    serve_behind_front_door(served, lambda app: ("door", app), worker_source=WORKER)
    assert served.to_asgi(is_main=False) == ("door", ("bentoml's app", served, False))
    assert other.to_asgi() == ("bentoml's app", other, True)
    assert Service._transdenoiser_original_to_asgi is _Service.to_asgi


@pytest.mark.parametrize(("service_class", "worker_source", "message"), [
    (_Service, "asgi_app = build_app(service)", r"no longer builds the served app with service.to_asgi\(\)"),
    (_NewToAsgi, WORKER, r"Service.to_asgi\(self, is_main\) is gone or changed"),
])
def test_changed_bentoml_app_factory_stops_the_start(service_class, worker_source, message):
    assert check_app_factory_internals(_Service, WORKER) is _Service
    with pytest.raises(LibraryInternalsChanged, match=message) as info:
        serve_behind_front_door(service_class(), lambda app: app, worker_source=worker_source)
    assert str(info.value).startswith("bentoml ") and "\n" not in str(info.value)
    assert not hasattr(service_class, "_transdenoiser_front_doors")  # checked before patching


def test_bentoml_traces_requests_only_with_an_exporter_configured():
    """The served app leaves out OpenTelemetry's middleware while BentoML has no trace exporter (its default: the
    spans would go nowhere) and keeps it, with BentoML's other middlewares unchanged, once one is configured."""
    from _bentoml_impl.server.app import ServiceAppFactory
    from bentoml._internal.configuration.containers import BentoMLContainer

    import serving.service as service_module  # applies the patch, at import

    trace_only_when_exported()  # idempotent
    service = service_module.TransDenoiser
    service.inject_config()  # what to_asgi does before it builds the app
    exporter = BentoMLContainer.config.tracing.exporter_type

    def installed() -> list[str]:
        return [entry.cls.__name__ for entry in ServiceAppFactory(service, is_main=True).middlewares]

    assert exporter.get() is None
    untraced = installed()
    try:
        exporter.set("in_memory")
        traced = installed()
    finally:
        exporter.set(None)
    assert "OpenTelemetryMiddleware" not in untraced and "AccessLogMiddleware" in untraced
    assert [name for name in traced if name != "OpenTelemetryMiddleware"] == untraced
    assert traced.count("OpenTelemetryMiddleware") == 1
    assert installed() == untraced


class _Tracing:
    class exporter_type:  # noqa: N801 - BentoML's configuration item: .get()
        @staticmethod
        def get():
            return None


class _Entry:
    def __init__(self, cls):
        self.cls = cls


class OpenTelemetryMiddleware:  # stands for OpenTelemetry's, by name
    pass


class _Factory:
    @property
    def middlewares(self) -> list:
        """Installs OpenTelemetryMiddleware."""
        return [_Entry(OpenTelemetryMiddleware), _Entry(_Middleware)]


class _FactoryWithoutProperty:
    def middlewares(self) -> list:  # a method now: OpenTelemetryMiddleware
        return []


class _FactoryWithoutTracing:
    @property
    def middlewares(self) -> list:
        return [_Entry(_Middleware)]


def test_the_tracing_patch_filters_by_exporter():
    class Factory(_Factory):
        pass

    trace_only_when_exported(Factory, _Tracing)
    assert [entry.cls for entry in Factory().middlewares] == [_Middleware]

    class Exported(_Tracing):
        class exporter_type:  # noqa: N801
            @staticmethod
            def get():
                return "otlp"

    class Traced(_Factory):
        pass

    trace_only_when_exported(Traced, Exported)
    assert [entry.cls for entry in Traced().middlewares] == [OpenTelemetryMiddleware, _Middleware]


@pytest.mark.parametrize(("factory", "tracing", "message"), [
    (_FactoryWithoutProperty, _Tracing, "no longer a property that installs OpenTelemetryMiddleware"),
    (_FactoryWithoutTracing, _Tracing, "no longer a property that installs OpenTelemetryMiddleware"),
    (_Factory, object, r"no longer holds tracing.exporter_type"),
])
def test_changed_bentoml_tracing_stops_the_start(factory, tracing, message):
    class Factory(factory):
        pass

    assert check_tracing_internals(_Factory, _Tracing) == (_Factory, _Tracing)
    with pytest.raises(LibraryInternalsChanged, match=message) as info:
        trace_only_when_exported(Factory, tracing)
    assert str(info.value).startswith("bentoml ") and "\n" not in str(info.value)
    assert not hasattr(Factory, "_transdenoiser_traces_when_exported")  # checked before patching
