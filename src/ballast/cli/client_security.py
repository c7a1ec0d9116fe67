"""TLS, mTLS and token options of `ballast produce` / `consume` (the client's own options)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any

import typer

__all__ = ["ClientSecurity", "TlsCaOption", "TlsCertOption", "TlsKeyOption", "TokenOption"]

TlsCaOption = Annotated[
    str | None,
    typer.Option("--tls-ca", envvar="BALLAST_TLS_CA", help="CA (PEM) to trust: TLS."),
]
TlsCertOption = Annotated[
    str | None,
    typer.Option("--tls-cert", envvar="BALLAST_TLS_CERT", help="Client certificate: mTLS."),
]
TlsKeyOption = Annotated[
    str | None,
    typer.Option("--tls-key", envvar="BALLAST_TLS_KEY", help="Client key (PEM): mTLS."),
]
TokenOption = Annotated[
    str | None,
    typer.Option("--token", envvar="BALLAST_TOKEN", help="JWT (forces TLS, as the client does)."),
]


@dataclass(frozen=True)
class ClientSecurity:
    """What `with_tls` / `with_mtls` / `with_token` the client builder gets."""

    ca: str | None = None
    cert: str | None = None
    key: str | None = None
    token: str | None = None

    def __post_init__(self) -> None:
        if (self.cert is None) != (self.key is None):
            raise ValueError("--tls-cert and --tls-key go together (mTLS)")
        if self.cert is not None and self.ca is None:
            raise ValueError("mTLS needs --tls-ca too")

    def apply(self, builder: Any) -> Any:
        """Configure a `DanubeClientBuilder`."""
        if self.cert is not None and self.key is not None and self.ca is not None:
            builder = builder.with_mtls(self.ca, self.cert, self.key)
        elif self.ca is not None:
            builder = builder.with_tls(self.ca)
        if self.token:
            builder = builder.with_token(self.token)
        return builder

    @property
    def secure(self) -> bool:
        return self.ca is not None or bool(self.token)
