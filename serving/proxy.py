"""An nginx reverse proxy in front of the server, for slow clients: read timeouts and a connection cap.

uvicorn, under BentoML 1.4, has no timeout for a request's headers or body (its ``timeout_keep_alive`` only
covers idle keep-alive connections) and no cap on open connections (``limit_concurrency`` answers 503 once a
request is complete, and BentoML does not expose it), so a client that opens connections and never finishes
its headers holds them forever. nginx does this well: ``serving/nginx.conf.template`` sets the timeouts and
the cap; this module fills it in and, for tests and benchmarks, runs nginx on loopback.

    python -m serving.proxy --listen 127.0.0.1:8080 --upstream 127.0.0.1:3000 --out runs/proxy
    nginx -c "$PWD/runs/proxy/nginx.conf" -p "$PWD/runs/proxy"
"""
from __future__ import annotations

import argparse
import re
import shutil
import socket
import subprocess
import time
from dataclasses import asdict, dataclass
from pathlib import Path

TEMPLATE = Path(__file__).with_name("nginx.conf.template")


@dataclass(frozen=True)
class ProxySettings:
    header_timeout_s: int = 10  # the request line and headers must arrive within this
    body_timeout_s: int = 10  # longest pause between two reads of the body
    send_timeout_s: int = 30  # longest pause between two writes to the client
    keepalive_timeout_s: int = 15  # idle keep-alive connections close after this
    max_connections: int = 4096  # open connections, clients and upstream together
    max_body_bytes: int = 2 * 1024 * 1024  # keep equal to the server's max_payload_bytes
    upstream_read_timeout_s: int = 630  # above the server's deadline and BentoML's 600 s traffic timeout
    backlog: int = 4096  # pending connections the kernel queues before nginx accepts them

    def __post_init__(self) -> None:
        for key, value in asdict(self).items():
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{key} must be an integer >= 1, got {value!r}")


def render_config(listen: str, upstream: str, prefix: Path, settings: ProxySettings = ProxySettings()) -> str:
    """The nginx configuration: listen on ``listen`` (host:port), forward to ``upstream`` (host:port)."""
    values = {"LISTEN": listen, "UPSTREAM": upstream, "PREFIX": str(Path(prefix).resolve()),
              "RLIMIT_NOFILE": str(2 * settings.max_connections + 64),
              **{key.upper(): str(value) for key, value in asdict(settings).items()}}
    text = TEMPLATE.read_text()
    for key, value in values.items():
        text = text.replace(f"@{key}@", value)
    if re.search(r"@[A-Z_]+@", "\n".join(line.split("#")[0] for line in text.splitlines())):
        raise ValueError("nginx.conf.template has a placeholder this module does not fill")
    return text


def write_config(listen: str, upstream: str, out_dir: Path, settings: ProxySettings = ProxySettings()) -> Path:
    """Write ``out_dir/nginx.conf`` (and the temp directories nginx needs); return its path."""
    out_dir = Path(out_dir)
    for name in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi"):
        (out_dir / name).mkdir(parents=True, exist_ok=True)
    path = out_dir / "nginx.conf"
    path.write_text(render_config(listen, upstream, out_dir, settings))
    return path


def nginx_binary() -> str | None:
    return shutil.which("nginx") or next((p for p in ("/usr/sbin/nginx", "/usr/local/sbin/nginx")
                                          if Path(p).is_file()), None)


class ProxyProcess:
    """nginx on 127.0.0.1:``port`` in front of ``upstream_url``; started at once, stopped with ``stop``."""

    def __init__(self, upstream_url: str, out_dir: Path, port: int, settings: ProxySettings = ProxySettings()):
        binary = nginx_binary()
        if binary is None:
            raise FileNotFoundError("nginx is not installed (Debian: apt-get install nginx-light)")
        self.port = port
        self.url = f"http://127.0.0.1:{port}"
        self.out_dir = Path(out_dir).resolve()
        upstream = upstream_url.split("://", 1)[-1].rstrip("/")
        config = write_config(f"127.0.0.1:{port}", upstream, self.out_dir, settings)
        self.process = subprocess.Popen([binary, "-c", str(config), "-p", str(self.out_dir), "-e",
                                         str(self.out_dir / "error.log")],
                                        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)

    def wait_ready(self, timeout: float = 10) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"nginx exited with {self.process.returncode}: "
                                   f"{self.process.stderr.read().decode(errors='replace')[-2000:]}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=1):
                    return
            except OSError:
                time.sleep(0.1)
        raise RuntimeError("nginx did not start listening in time")

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=5)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m serving.proxy", description="write an nginx configuration "
                                     "for a reverse proxy in front of transdenoiser serve")
    parser.add_argument("--listen", default="127.0.0.1:8080", help="host:port nginx listens on")
    parser.add_argument("--upstream", default="127.0.0.1:3000", help="host:port of transdenoiser serve")
    parser.add_argument("--out", required=True, help="directory for nginx.conf, its logs and temp files")
    args = parser.parse_args(argv)
    path = write_config(args.listen, args.upstream, Path(args.out))
    print(f"wrote {path}; run: nginx -c {path.resolve()} -p {path.parent.resolve()}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
