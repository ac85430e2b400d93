"""The patches of BentoML's and uvicorn's internals (serving/library_patches.py) check those internals first: on the
installed versions they apply (idempotently), and a changed internal stops the start with one clear line."""
from __future__ import annotations

import pytest

from serving.library_patches import (
    LibraryInternalsChanged,
    bound_request_labels,
    check_library_internals,
    check_protocol_internals,
    check_request_metrics_internals,
    json_protocol_errors,
)


def test_the_installed_libraries_pass_and_the_patches_apply_once():
    from bentoml._internal.server.http.instruments import RunnerTrafficMetricsMiddleware
    from uvicorn.protocols.http.h11_impl import H11Protocol

    check_library_internals()
    for _ in range(2):
        bound_request_labels(frozenset({"/predict"}))
        json_protocol_errors()
    check_library_internals()  # still passes once patched (it checks the originals)
    assert RunnerTrafficMetricsMiddleware._transdenoiser_bounded and H11Protocol._transdenoiser_json_400
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

    from serving.process import free_port
    from transdenoiser.cli import main

    monkeypatch.setattr(auto, "AutoHTTPProtocol", _HttpTools)
    model_dir = tmp_path / "model"
    model_dir.mkdir()
    (model_dir / "serving.toml").write_text('sigma = 0.25\nclassifier = "classifier"\n')
    (model_dir / "classifier").mkdir()
    (model_dir / "classifier" / "metadata.json").write_text("{}")  # the cheap checks pass; the patch check runs next
    status = main(["serve", "--model-dir", str(model_dir), "--port", str(free_port()), "--dry-run"])
    err = capsys.readouterr().err
    assert status == 2 and "uvicorn" in err and "httptools installed" in err, err
