"""How a broker calls another broker: the cluster's TLS and a token of the cluster's own.

The consumer relay and the dead-letter producer dial other brokers of the same cluster;
in a secured cluster those serve TLS and check JWT tokens, so they dial with the `tls`
section's credentials (the CA, and the broker's own certificate for mTLS) and present a
token of the principal `CLUSTER_SUBJECT` with ``admin`` on every namespace, signed with the
`auth` section's key (a broker that only verifies, RS256 with a public key, reads it from
`auth.cluster_token_file`).
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

import grpc

from ballast.config import BallastConfig
from ballast.wire.auth import ANY_NAMESPACE, Permission, TokenAuthority
from ballast.wire.security import channel_credentials

__all__ = ["CLUSTER_SUBJECT", "ClusterDialer"]

log = logging.getLogger(__name__)

CLUSTER_SUBJECT = "ballast-cluster"
# Tokens this broker issues for itself live this long and are renewed at half-life.
TOKEN_TTL_SECONDS = 600.0


class ClusterDialer:
    """Channels to other brokers and the metadata (the bearer token) to call them with."""

    def __init__(self, config: BallastConfig) -> None:
        self.credentials = channel_credentials(config.tls)
        auth = config.auth
        self._authority: TokenAuthority | None = None
        self._fixed: str | None = None
        if auth.mode == "jwt":
            if auth.cluster_token_file:
                path = Path(auth.cluster_token_file)
                try:
                    self._fixed = path.read_text().strip()
                except OSError as exc:
                    raise ValueError(
                        f"auth.cluster_token_file {path}: cannot read ({exc.strerror})"
                    ) from None
            elif auth.secret or auth.secret_file or auth.private_key_file:
                self._authority = TokenAuthority(auth)
            else:
                log.warning(
                    "auth: this broker cannot sign a cluster token (RS256 without "
                    "private_key_file): set auth.cluster_token_file, or moving consumers "
                    "are not relayed and dead letters to other brokers are refused"
                )
        self._token: tuple[float, str] | None = None

    def channel(self, url: str) -> grpc.aio.Channel:
        """A new channel to `url` (TLS when the cluster serves TLS); the caller closes it."""
        if self.credentials is None:
            return grpc.aio.insecure_channel(url)
        return grpc.aio.secure_channel(url, self.credentials)

    def metadata(self) -> tuple[tuple[str, str], ...]:
        """The call metadata: the cluster's bearer token (nothing without `auth`)."""
        token = self._fixed
        if token is None and self._authority is not None:
            now = time.time()
            if self._token is None or now >= self._token[0]:
                issued = self._authority.issue(
                    CLUSTER_SUBJECT, {ANY_NAMESPACE: [Permission.ADMIN]}, TOKEN_TTL_SECONDS, now
                )
                self._token = (now + TOKEN_TTL_SECONDS / 2, issued)
            token = self._token[1]
        return () if token is None else (("authorization", f"Bearer {token}"),)
