"""The data plane's configuration sections and namespace keys."""

from __future__ import annotations

import pytest

from ballast.config import ConfigError, parse_config
from ballast.metadata import keys
from ballast.metadata.directory import partition_index
from ballast.wire.address import split_url


def test_data_plane_and_storage_sections() -> None:
    config = parse_config({"storage": {"data_dir": "/d"}, "data_plane": {"unacked_window": 5}})
    assert config.storage.object_store_url() == "/d/objects"
    assert config.data_plane.unacked_window == 5
    assert config.data_plane.max_message_bytes < 4 * 1024 * 1024  # the client's receive limit
    with pytest.raises(ConfigError, match=r"data_plane\.max_message_bytes"):
        parse_config({"data_plane": {"max_message_bytes": 8 * 1024 * 1024}})
    old_name = parse_config({"data_plane": {"max_payload_bytes": 1000}})  # still read
    assert old_name.data_plane.max_message_bytes == 1000
    with pytest.raises(ConfigError, match="give only one"):
        parse_config({"data_plane": {"max_payload_bytes": 1, "max_message_bytes": 2}})
    with pytest.raises(ConfigError, match=r"storage\.fsync_policy"):
        parse_config({"storage": {"fsync_policy": "sometimes"}})


def test_namespace_keys_and_partition_names() -> None:
    assert keys.namespace("default") == "/namespaces/default"
    assert keys.parse_namespace_key("/namespaces/shop") == "shop"
    with pytest.raises(ValueError, match="invalid namespace 'a/b'"):
        keys.namespace("a/b")
    with pytest.raises(keys.KeyLayoutError):
        keys.parse_namespace_key("/namespaces/a/b")
    assert partition_index("t", "t-part-3") == 3
    assert partition_index("t", "t2-part-3") is None
    assert partition_index("t", "t-part-x") is None


def test_broker_urls() -> None:
    assert split_url("http://127.0.0.1:6650") == ("127.0.0.1", 6650)
    assert split_url("localhost:0") == ("localhost", 0)
    with pytest.raises(ValueError, match="host:port"):
        split_url("nohost")
