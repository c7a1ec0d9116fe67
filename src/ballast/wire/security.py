"""TLS credentials and the server-side security set-up shared by brokers and gateways.

`server_ssl_context` turns the `tls` section into the TLS context of every client port and
link port (a certificate chain, and with `require_client_cert` the CA that client
certificates must chain to); `channel_credentials` is what a gateway uses to dial brokers
that serve TLS (their CA, and its own certificate for mTLS). `token_authority` checks
tokens when the `auth` section asks for JWT tokens and `interceptors` puts it in front of
every call.
"""

from __future__ import annotations

import ssl
from collections.abc import Callable
from pathlib import Path

import grpc

from ballast.config import BallastConfig, TlsSettings
from ballast.wire.auth import AuthInterceptor, TokenAuthority
from ballast.wire.rpc import WrappingInterceptor

__all__ = [
    "channel_credentials",
    "client_ssl_context",
    "interceptors",
    "server_ssl_context",
    "token_authority",
]


def _pem(path: str | None, what: str) -> bytes | None:
    if not path:
        return None
    try:
        return Path(path).read_bytes()
    except OSError as exc:
        raise ValueError(f"tls.{what} {path}: cannot read ({exc.strerror})") from None


def channel_credentials(tls: TlsSettings) -> grpc.ChannelCredentials | None:
    """Credentials to dial TLS brokers (None: plaintext), presenting our certificate."""
    if not tls.enabled:
        return None
    return grpc.ssl_channel_credentials(
        root_certificates=_pem(tls.ca_file, "ca_file"),
        private_key=_pem(tls.key_file, "key_file"),
        certificate_chain=_pem(tls.cert_file, "cert_file"),
    )


def server_ssl_context(tls: TlsSettings) -> ssl.SSLContext | None:
    """TLS for a client port (the wire layer adds ALPN h2) or a broker's TCP link port
    (None: plaintext)."""
    if not tls.enabled:
        return None
    assert tls.cert_file and tls.key_file  # the config validator requires them
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    _load_chain(context, tls)
    if tls.require_client_cert:
        context.verify_mode = ssl.CERT_REQUIRED
        context.load_verify_locations(cafile=tls.ca_file)
    return context


def client_ssl_context(tls: TlsSettings) -> ssl.SSLContext | None:
    """What `channel_credentials` is for a broker's TCP link port (None: plaintext)."""
    if not tls.enabled:
        return None
    context = ssl.create_default_context(cafile=tls.ca_file)
    if tls.cert_file and tls.key_file:
        _load_chain(context, tls)
    return context


def _load_chain(context: ssl.SSLContext, tls: TlsSettings) -> None:
    try:
        context.load_cert_chain(str(tls.cert_file), str(tls.key_file))
    except (OSError, ssl.SSLError) as exc:
        raise ValueError(f"tls.cert_file/key_file: cannot load ({exc})") from None


def token_authority(config: BallastConfig) -> TokenAuthority | None:
    """What checks tokens when `auth.mode` is ``jwt``; None otherwise."""
    return TokenAuthority(config.auth) if config.auth.mode == "jwt" else None


def interceptors(
    authority: TokenAuthority | None, on_refused: Callable[[str, str], None]
) -> list[WrappingInterceptor]:
    """The token check when there is an `authority`; nothing otherwise."""
    return [] if authority is None else [AuthInterceptor(authority, on_refused)]
