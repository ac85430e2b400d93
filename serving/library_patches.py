"""The five library internals the server patches, each checked before it is patched.

Neither library offers an extension point for these (checked against BentoML 1.4's service configuration,
``add_asgi_middleware`` and ``__metrics__`` hook, and uvicorn 0.x's options):

- **BentoML's request metrics** (``bentoml_service_request_*{endpoint}``) are recorded by its
  ``RunnerTrafficMetricsMiddleware`` with the raw request path as the ``endpoint`` label. BentoML places that
  middleware outside every middleware a service adds (``add_asgi_middleware``), and its only metrics settings are
  ``enabled``, ``namespace`` and the duration buckets; turning them off removes ``/metrics`` too. So a client
  (authenticated or not) could add a label per path it invents and grow ``/metrics`` without limit.
  ``bound_request_labels`` wraps that middleware so that it sees a path outside the service's routes as
  ``UNKNOWN_PATH``; the application behind it still receives the real path.
- **uvicorn's own 400** for a request it cannot parse (e.g. a malformed ``Content-Length``) is plain text, sent by
  its protocol before any application sees the request; BentoML starts uvicorn itself, and uvicorn has no option
  for that body. ``json_protocol_errors`` replaces ``H11Protocol.send_400_response`` with one answering our JSON.
- **BentoML's request timeout** (``TimeoutMiddleware``, installed for the service's ``traffic.timeout``) arms
  ``loop.call_later(timeout, ...)`` for every request and never cancels it, so the timer keeps the request's
  context (futures, locks and, with tracing on, its OpenTelemetry spans: about 5 objects, 20 with the spans)
  alive for the whole timeout (600 s here) after the request ended; under steady traffic the heap grows and each
  full garbage collection, during which the event loop and every probe wait, grows with it. Its only setting is
  the timeout itself (``None`` removes the middleware, and with it the 504 of a request that sends nothing for
  that long, e.g. a body trickled in).
  ``cancel_request_timers`` replaces its ``__call__`` with the same code that also cancels the timer when the
  request ends, and stops waiting when the application has ended without answering (BentoML waits the whole
  timeout, then sends nothing): every answer, the 504 included, is unchanged.
- **BentoML's OpenTelemetry middleware** runs for every request even when no trace exporter is configured (BentoML's
  default): it starts and ends three spans per request (the request, its body's receipt, its answer's sending)
  that go nowhere: 0.7 of the 3.2 ms of event-loop CPU a request certified with n = 100 costs (2 AMD EPYC cores,
  docs/results/serving.md, "Tracing only with an exporter"). BentoML's only way to skip it is
  ``tracing.excluded_urls``, which an operator who configures an exporter would then have to undo.
  ``trace_only_when_exported`` leaves the middleware out of the service app while ``tracing.exporter_type`` is
  unset; an operator who configures one gets BentoML's tracing unchanged.

Each patch first checks the internals it relies on (the class, the method's signature, the code that reads the
path or writes the answer, that BentoML's service app uses that middleware, that uvicorn picks its h11 protocol)
and raises ``LibraryInternalsChanged`` naming the library, its version and what changed. The service applies them
at import, in the worker, so a changed library stops the server at start-up instead of silently losing the
protection; ``transdenoiser serve`` runs the checks before it starts BentoML. Idempotent.
"""
from __future__ import annotations

import asyncio
import importlib
import inspect
import json

from transdenoiser.errors import UserError

UNKNOWN_PATH = "/{unknown}"  # the one label every path outside the service's routes shares
_REAL_PATH = "transdenoiser.real_path"


class LibraryInternalsChanged(UserError):
    """A library's internals that the server patches are not what the patch was written for."""


def _changed(library: str, what: str) -> LibraryInternalsChanged:
    try:
        from importlib.metadata import version

        installed = version(library)
    except Exception:  # noqa: BLE001 - the version only makes the message clearer
        installed = "unknown"
    return LibraryInternalsChanged(
        f"{library} {installed}: {what}; transdenoiser patches this internal (serving/library_patches.py) and "
        f"refuses to start without it; install the versions pyproject.toml names, or update the patch")


def _source(function) -> str:
    try:
        return inspect.getsource(function)
    except (OSError, TypeError):
        return ""


def _library_object(library: str, module: str, attribute: str | None, what: str):
    """``module`` (or its ``attribute``), imported; ``LibraryInternalsChanged`` naming ``what`` if it is gone."""
    try:
        found = importlib.import_module(module)
        return getattr(found, attribute) if attribute is not None else found
    except (ImportError, AttributeError) as exc:
        raise _changed(library, f"{what} is gone ({exc})") from None


def check_request_metrics_internals(middleware=None, app_source: str | None = None):
    """BentoML's ``RunnerTrafficMetricsMiddleware`` as ``bound_request_labels`` expects it, or
    ``LibraryInternalsChanged``: it exists, BentoML's service app installs it, ``__init__(self, app, ...)`` keeps
    ``self.app``, and ``__call__(self, scope, receive, send)`` takes the label from ``scope["path"]``."""
    if middleware is None:
        middleware = _library_object("bentoml", "bentoml._internal.server.http.instruments",
                                     "RunnerTrafficMetricsMiddleware", "its request-metrics middleware")
    if app_source is None:
        app_source = _source(_library_object("bentoml", "_bentoml_impl.server.app", None, "its service app module"))
    if middleware.__name__ not in app_source:
        raise _changed("bentoml", f"its service app no longer installs {middleware.__name__}")
    call = getattr(middleware, "_transdenoiser_original_call", None) or middleware.__call__
    init = getattr(middleware, "__init__", None)
    if list(inspect.signature(call).parameters)[:4] != ["self", "scope", "receive", "send"]:
        raise _changed("bentoml", f"{middleware.__name__}.__call__ no longer takes (scope, receive, send)")
    if list(inspect.signature(init).parameters)[:2] != ["self", "app"] or "self.app = app" not in _source(init):
        raise _changed("bentoml", f"{middleware.__name__}.__init__ no longer keeps the wrapped app as self.app")
    if 'scope["path"]' not in _source(call):
        raise _changed("bentoml", f"{middleware.__name__}.__call__ no longer labels requests with scope['path']")
    return middleware


def bound_request_labels(routes: frozenset[str], prefixes: tuple[str, ...] = ("/static_content/",),
                         middleware=None) -> None:
    """BentoML's request metrics labelled by route: a path outside ``routes`` (and outside ``prefixes``, which
    keep their prefix) is seen by its metrics middleware as ``UNKNOWN_PATH``."""
    middleware = check_request_metrics_internals(middleware)
    if getattr(middleware, "_transdenoiser_bounded", False):
        return
    original = middleware.__call__

    def label(path: str) -> str:
        if path in routes:
            return path
        return next((prefix + "{path}" for prefix in prefixes if path.startswith(prefix)), UNKNOWN_PATH)

    async def restore_path(app, scope, receive, send):
        if _REAL_PATH in scope:
            scope = {**{key: value for key, value in scope.items() if key != _REAL_PATH}, "path": scope[_REAL_PATH]}
        return await app(scope, receive, send)

    async def bounded(self, scope, receive, send):
        if not getattr(self, "_transdenoiser_restores", False):
            inner = self.app
            self.app = lambda s, r, w: restore_path(inner, s, r, w)
            self._transdenoiser_restores = True
        path = scope.get("path", "")
        if scope.get("type") == "http" and label(path) != path:
            scope = {**scope, "path": label(path), _REAL_PATH: path}
        return await original(self, scope, receive, send)

    middleware._transdenoiser_original_call = original
    middleware.__call__ = bounded
    middleware._transdenoiser_bounded = True


def check_protocol_internals(protocol=None, auto=None):
    """uvicorn's ``H11Protocol`` as ``json_protocol_errors`` expects it, or ``LibraryInternalsChanged``: uvicorn
    picks it by default (``http="auto"`` resolves to it; with httptools installed it would not, and its 400 is not
    patched), and ``send_400_response(self, msg)`` writes through ``self.conn`` and ``self.transport``."""
    if protocol is None or auto is None:
        try:
            from uvicorn.protocols.http.auto import AutoHTTPProtocol
            from uvicorn.protocols.http.h11_impl import H11Protocol
        except ImportError as exc:
            raise _changed("uvicorn", f"its h11 protocol is gone ({exc})") from None
        protocol = H11Protocol if protocol is None else protocol
        auto = AutoHTTPProtocol if auto is None else auto
    if auto is not protocol:
        raise _changed("uvicorn", f"its default HTTP protocol is {getattr(auto, '__name__', auto)}, not "
                                  f"{protocol.__name__} (httptools installed?), whose 400 answer is not patched; "
                                  "uninstall httptools")
    send_400 = getattr(protocol, "_transdenoiser_original_400", getattr(protocol, "send_400_response", None))
    if send_400 is None or list(inspect.signature(send_400).parameters) != ["self", "msg"]:
        raise _changed("uvicorn", f"{protocol.__name__}.send_400_response(self, msg) is gone or changed")
    source = _source(send_400)
    if "self.conn.send" not in source or "self.transport" not in source:
        raise _changed("uvicorn", f"{protocol.__name__}.send_400_response no longer writes through self.conn and "
                                  "self.transport")
    return protocol


def json_protocol_errors(protocol=None, auto=None) -> None:
    """uvicorn's h11 protocol answers an unparsable request (e.g. a malformed Content-Length) with our JSON error
    instead of plain text."""
    protocol = check_protocol_internals(protocol, auto)
    if getattr(protocol, "_transdenoiser_json_400", False):
        return
    import h11

    def send_400_response(self, msg: str) -> None:
        body = json.dumps({"error": f"malformed HTTP request ({msg.rstrip('.')})"}).encode()
        event = h11.Response(status_code=400, reason=b"Bad Request",
                             headers=[(b"content-type", b"application/json"), (b"connection", b"close"),
                                      (b"content-length", str(len(body)).encode()), (b"server", b"transdenoiser")])
        for output in (self.conn.send(event), self.conn.send(h11.Data(data=body)),
                       self.conn.send(h11.EndOfMessage())):
            self.transport.write(output)
        self.transport.close()

    protocol._transdenoiser_original_400 = protocol.send_400_response
    protocol.send_400_response = send_400_response
    protocol._transdenoiser_json_400 = True


# The lines of BentoML's TimeoutMiddleware.__call__ that ``cancel_request_timers`` reproduces, checked before patching.
_TIMEOUT_CALL_LINES = (
    'if scope["type"] not in ("http", "websocket"):',
    "waiter = loop.create_future()",
    "loop.call_later(self.timeout, self._set_timer_out, waiter)",
    "waiter.set_result(None)",
    "asyncio.ensure_future(self.app(scope, receive, _send), loop=loop)",
    "await waiter",
    "except asyncio.TimeoutError:",
    "if fut.cancel():",
    '"error": f"Not able to process the request in {self.timeout} seconds"',
    "status_code=504",
    "await fut",
)


def check_timeout_internals(middleware=None, base_source: str | None = None):
    """BentoML's ``TimeoutMiddleware`` as ``cancel_request_timers`` expects it, or ``LibraryInternalsChanged``:
    BentoML's app factory installs it with ``timeout=self.timeout``, ``__init__(self, app, timeout)`` keeps both,
    ``_set_timer_out(self, waiter)`` exists, and ``__call__(self, scope, receive, send)`` is the code the
    replacement reproduces (``_TIMEOUT_CALL_LINES``)."""
    if middleware is None:
        middleware = _library_object("bentoml", "bentoml._internal.server.http.traffic", "TimeoutMiddleware",
                                     "its request-timeout middleware")
    if base_source is None:
        base_source = _source(_library_object("bentoml", "bentoml._internal.server.base_app", None,
                                              "its app factory module"))
    name = middleware.__name__
    if f"Middleware({name}, timeout=self.timeout)" not in base_source:
        raise _changed("bentoml", f"its app factory no longer installs {name}(timeout=self.timeout)")
    init = getattr(middleware, "__init__", None)
    init_source = _source(init)
    if (list(inspect.signature(init).parameters)[:3] != ["self", "app", "timeout"]
            or "self.app = app" not in init_source or "self.timeout = timeout" not in init_source):
        raise _changed("bentoml", f"{name}.__init__ no longer keeps (app, timeout) as self.app and self.timeout")
    timer_out = getattr(middleware, "_set_timer_out", None)
    if timer_out is None or list(inspect.signature(timer_out).parameters) != ["self", "waiter"]:
        raise _changed("bentoml", f"{name}._set_timer_out(self, waiter) is gone or changed")
    call = getattr(middleware, "_transdenoiser_original_call", None) or middleware.__call__
    if list(inspect.signature(call).parameters) != ["self", "scope", "receive", "send"]:
        raise _changed("bentoml", f"{name}.__call__ no longer takes (scope, receive, send)")
    call_source = _source(call)
    missing = next((line for line in _TIMEOUT_CALL_LINES if line not in call_source), None)
    if missing is not None:
        raise _changed("bentoml", f"{name}.__call__ changed (no longer has `{missing}`)")
    return middleware


def cancel_request_timers(middleware=None) -> None:
    """BentoML's request timeout cancels its timer when the request ends, so that the timer no longer keeps the
    request's context alive for the whole timeout; and a request whose application ended without answering (e.g.
    an upload abandoned mid-body: there is no one to answer) ends then, instead of waiting the whole timeout to
    send nothing. The code is otherwise BentoML 1.4's (the same 504 and body; an application that fails before
    answering is still waited for, as BentoML does)."""
    middleware = check_timeout_internals(middleware)
    if getattr(middleware, "_transdenoiser_cancels_timers", False):
        return
    from starlette.responses import JSONResponse

    async def call(self, scope, receive, send):
        if scope["type"] not in ("http", "websocket"):
            return await self.app(scope, receive, send)
        loop = asyncio.get_running_loop()
        waiter = loop.create_future()
        timer = loop.call_later(self.timeout, self._set_timer_out, waiter)

        async def _send(message) -> None:
            if not waiter.done():
                waiter.set_result(None)
            await send(message)

        fut = asyncio.ensure_future(self.app(scope, receive, _send), loop=loop)

        def _ended(done) -> None:  # the second change: an app that ended without answering is not waited for
            if not waiter.done() and not done.cancelled() and done.exception() is None:
                waiter.set_result(None)

        fut.add_done_callback(_ended)
        try:
            try:
                await waiter
            except asyncio.TimeoutError:
                if fut.cancel():
                    resp = JSONResponse({"error": f"Not able to process the request in {self.timeout} seconds"},
                                        status_code=504)
                    await resp(scope, receive, send)
            else:
                await fut  # wait for the future to finish
        finally:
            timer.cancel()  # the first change: the timer (and the request's context it holds) goes with the request

    middleware._transdenoiser_original_call = middleware.__call__
    middleware.__call__ = call
    middleware._transdenoiser_cancels_timers = True


def check_app_factory_internals(service_class=None, worker_source: str | None = None):
    """BentoML's ``Service`` as ``serve_behind_front_door`` expects it, or ``LibraryInternalsChanged``: its worker
    builds the app it serves with ``service.to_asgi(...)``, and ``to_asgi(self, is_main)`` exists."""
    if service_class is None:
        service_class = _library_object("bentoml", "_bentoml_sdk.service.factory", "Service", "its Service class")
    if worker_source is None:
        worker_source = _source(_library_object("bentoml", "_bentoml_impl.worker.service", None, "its worker"))
    if "service.to_asgi(" not in worker_source:
        raise _changed("bentoml", "its worker no longer builds the served app with service.to_asgi()")
    to_asgi = getattr(service_class, "_transdenoiser_original_to_asgi", getattr(service_class, "to_asgi", None))
    if to_asgi is None or list(inspect.signature(to_asgi).parameters)[:2] != ["self", "is_main"]:
        raise _changed("bentoml", "Service.to_asgi(self, is_main) is gone or changed")
    return service_class


def serve_behind_front_door(service, front_door, service_class=None, worker_source: str | None = None) -> None:
    """The app ``service.to_asgi`` returns is ``front_door(app)`` (``app``: the one BentoML builds); every other
    service's app is BentoML's. Idempotent per service (the last ``front_door`` given is used)."""
    service_class = check_app_factory_internals(service_class or type(service), worker_source)
    doors = getattr(service_class, "_transdenoiser_front_doors", None)
    if doors is None:
        doors = {}
        original = service_class.to_asgi

        def to_asgi(self, is_main: bool = True):
            app = original(self, is_main=is_main)
            door = doors.get(id(self))
            return app if door is None else door(app)

        service_class._transdenoiser_original_to_asgi = original
        service_class._transdenoiser_front_doors = doors
        service_class.to_asgi = to_asgi
    doors[id(service)] = front_door


def check_tracing_internals(factory=None, tracing=None):
    """BentoML's ``ServiceAppFactory`` and tracing settings as ``trace_only_when_exported`` expects them, or
    ``LibraryInternalsChanged``: ``middlewares`` is a property of the factory whose code installs OpenTelemetry's
    ASGI middleware, and the settings hold ``tracing.exporter_type``, read after the service's configuration is
    loaded (``to_asgi`` loads it before it builds the app)."""
    if factory is None:
        factory = _library_object("bentoml", "_bentoml_impl.server.app", "ServiceAppFactory",
                                  "its service app factory")
    if tracing is None:
        container = _library_object("bentoml", "bentoml._internal.configuration.containers", "BentoMLContainer",
                                    "its configuration container")
        tracing = getattr(getattr(container, "config", None), "tracing", None)
    middlewares = (getattr(factory, "_transdenoiser_original_middlewares", None)
                   or inspect.getattr_static(factory, "middlewares", None))
    if not isinstance(middlewares, property) or "OpenTelemetryMiddleware" not in _source(middlewares.fget):
        raise _changed("bentoml", f"{factory.__name__}.middlewares is no longer a property that installs "
                                  "OpenTelemetryMiddleware")
    if not hasattr(getattr(tracing, "exporter_type", None), "get"):
        raise _changed("bentoml", "its configuration no longer holds tracing.exporter_type")
    return factory, tracing


def trace_only_when_exported(factory=None, tracing=None) -> None:
    """BentoML's service app leaves out OpenTelemetry's middleware unless a trace exporter is configured
    (``tracing.exporter_type`` in BentoML's configuration): without one, its spans go nowhere. With one, the
    middlewares are BentoML's, unchanged."""
    factory, tracing = check_tracing_internals(factory, tracing)
    if getattr(factory, "_transdenoiser_traces_when_exported", False):
        return
    original = inspect.getattr_static(factory, "middlewares")

    def middlewares(self) -> list:
        installed = original.fget(self)
        if tracing.exporter_type.get() is not None:
            return installed
        return [entry for entry in installed if getattr(entry.cls, "__name__", None) != "OpenTelemetryMiddleware"]

    factory._transdenoiser_original_middlewares = original
    factory.middlewares = property(middlewares, doc=original.__doc__)
    factory._transdenoiser_traces_when_exported = True


def check_library_internals() -> None:
    """All five checks (``transdenoiser serve`` runs them before starting BentoML)."""
    check_request_metrics_internals()
    check_protocol_internals()
    check_timeout_internals()
    check_app_factory_internals()
    check_tracing_internals()
