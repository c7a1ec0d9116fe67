"""Local paths and `s3://` (any fsspec URL) for the job's input and output.

Spark reads and writes local (or cluster-shared) paths here. It could read `s3a://`
itself, but that needs the hadoop-aws and AWS SDK jars, which pyspark does not ship. So a
remote history is first copied through fsspec into a local temporary directory, the job
runs on local paths, and the outputs are uploaded through fsspec at the end. Credentials
and endpoints come from the usual AWS environment (`AWS_ACCESS_KEY_ID`,
`AWS_ENDPOINT_URL`, ...) or from explicit fsspec storage options.

With a multi-host Spark cluster, use paths every node sees (a shared filesystem): the
staged copy of a remote history lives on the driver's machine only.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

import fsspec

from ballast.load_history import HISTORY_GLOB


def is_remote(url: str) -> bool:
    """True for URLs with a scheme other than `file://` (s3://, gs://, memory://...)."""
    scheme = url.split("://", 1)[0] if "://" in url else ""
    return scheme not in ("", "file", "local")


def local_path(url: str) -> str:
    """The local filesystem path of a plain path or `file://` URL."""
    return url[len("file://") :] if url.startswith("file://") else url


def _fs(url: str, options: Mapping[str, Any]) -> tuple[Any, str]:
    return fsspec.core.url_to_fs(url, **dict(options))


def history_file_sizes(root: str, options: Mapping[str, Any] | None = None) -> dict[str, int]:
    """History files under `root` as {path relative to root: size in bytes}."""
    fs, base = _fs(root, options or {})
    base = base.rstrip("/")
    if not fs.exists(base):
        return {}
    found = fs.glob(f"{base}/{HISTORY_GLOB}", detail=True)
    return {
        os.path.relpath(path, base).replace(os.sep, "/"): int(info.get("size") or 0)
        for path, info in sorted(found.items())
        if info.get("type", "file") == "file"
    }


def download_files(
    root: str, relatives: list[str], local_dir: str, options: Mapping[str, Any] | None = None
) -> None:
    """Copy the given files (relative to `root`) to the same relative paths in `local_dir`."""
    fs, base = _fs(root, options or {})
    base = base.rstrip("/")
    for relative in relatives:
        target = os.path.join(local_dir, relative)
        os.makedirs(os.path.dirname(target), exist_ok=True)
        fs.get(f"{base}/{relative}", target)


def download_tree(url: str, local_dir: str, options: Mapping[str, Any] | None = None) -> None:
    """Copy every file under `url` (if it exists) into `local_dir`, keeping the layout."""
    fs, base = _fs(url, options or {})
    base = base.rstrip("/")
    if not fs.exists(base):
        return
    for path in fs.find(base):
        target = os.path.join(local_dir, os.path.relpath(path, base))
        os.makedirs(os.path.dirname(target), exist_ok=True)
        fs.get(path, target)


def upload_file(local: str, url: str, options: Mapping[str, Any] | None = None) -> None:
    """Upload one file."""
    fs, target = _fs(url, options or {})
    fs.put_file(local, target)


def replace_tree(local_dir: str, url: str, options: Mapping[str, Any] | None = None) -> None:
    """Replace the directory at `url` with the files of `local_dir`."""
    remove_tree(url, options)
    upload_tree(local_dir, url, options)


def upload_tree(local_dir: str, url: str, options: Mapping[str, Any] | None = None) -> None:
    """Upload every file under `local_dir` to `url`, keeping relative paths."""
    fs, base = _fs(url, options or {})
    base = base.rstrip("/")
    for directory, _, names in os.walk(local_dir):
        for name in names:
            source = os.path.join(directory, name)
            relative = os.path.relpath(source, local_dir).replace(os.sep, "/")
            fs.put_file(source, f"{base}/{relative}")


def remove_tree(url: str, options: Mapping[str, Any] | None = None) -> None:
    """Delete a directory tree if it exists (used to replace an earlier run's output)."""
    fs, base = _fs(url, options or {})
    if fs.exists(base):
        fs.rm(base, recursive=True)
