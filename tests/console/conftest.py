"""Fixtures for the console tests: the shared etcd server of the control-plane tests."""

from __future__ import annotations

from tests.etcd_fixtures import etcd_server

__all__ = ["etcd_server"]
