"""S3 (and S3-compatible servers: MinIO, SeaweedFS, Ceph) through obstore (Rust's object_store; chosen by
measurement, bench/results/s3-copy-down/).

Endpoint and credentials as the AWS tools take them: the environment (``AWS_ENDPOINT_URL``,
``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``, ``AWS_SESSION_TOKEN``, ``AWS_REGION``, web identity and
instance metadata, read by object_store itself), else the shared files (``AWS_SHARED_CREDENTIALS_FILE``,
default ``~/.aws/credentials``; ``AWS_CONFIG_FILE``, default ``~/.aws/config``) for ``AWS_PROFILE``
(default ``default``). A plain ``http://`` endpoint is allowed (a server on loopback or in the cluster).
"""

from __future__ import annotations

import configparser
import os
from pathlib import Path
from typing import Any, cast

import obstore
from obstore.store import S3Store as _Obstore

from offgraph.objectstore.base import Location, ObjectInfo, ObjectStore, ObjectStoreError

_FROM_FILES = {  # object_store's config key: (credentials-file key, config-file key)
    "access_key_id": "aws_access_key_id",
    "secret_access_key": "aws_secret_access_key",
    "session_token": "aws_session_token",
    "region": "region",
    "endpoint": "endpoint_url",
}
_ENV = {  # object_store's config key: the variables that already give it
    "access_key_id": ("AWS_ACCESS_KEY_ID",),
    "secret_access_key": ("AWS_SECRET_ACCESS_KEY",),
    "session_token": ("AWS_SESSION_TOKEN",),
    "region": ("AWS_REGION", "AWS_DEFAULT_REGION"),
    "endpoint": ("AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL"),
}

ENV_VARIABLES = frozenset(
    {
        *(v for names in _ENV.values() for v in names),
        "AWS_PROFILE",
        "AWS_SHARED_CREDENTIALS_FILE",
        "AWS_CONFIG_FILE",
        # read by object_store itself: web identity (an IAM role for a Kubernetes service account), a
        # container's credentials endpoint (ECS), plain HTTP
        "AWS_WEB_IDENTITY_TOKEN_FILE",
        "AWS_ROLE_ARN",
        "AWS_ROLE_SESSION_NAME",
        "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI",
        "AWS_ALLOW_HTTP",
    }
)
"""The AWS variables this provider reads: the ones a deployment may give a process that reads s3://."""


def _profile_settings() -> dict[str, str]:
    """The shared files' settings of ``AWS_PROFILE`` that the environment does not give."""
    profile = os.environ.get("AWS_PROFILE", "default")
    home = Path.home() / ".aws"
    found: dict[str, str] = {}
    for path, section in (
        (os.environ.get("AWS_SHARED_CREDENTIALS_FILE", home / "credentials"), profile),
        (os.environ.get("AWS_CONFIG_FILE", home / "config"), profile if profile == "default" else f"profile {profile}"),
    ):
        parser = configparser.ConfigParser()
        try:
            parser.read(path)
        except configparser.Error as e:
            raise ObjectStoreError(f"{path}: unreadable AWS settings: {e}") from None
        if parser.has_section(section):
            for key, file_key in _FROM_FILES.items():
                if file_key in parser[section] and key not in found:
                    found[key] = parser[section][file_key]
    return {k: v for k, v in found.items() if not any(os.environ.get(e) for e in _ENV[k])}


def _info(meta: Any) -> ObjectInfo:  # obstore's ObjectMeta: a TypedDict
    return ObjectInfo(str(meta["path"]), int(meta["size"]), meta.get("e_tag"))


class S3ObjectStore(ObjectStore):
    def __init__(self, location: Location) -> None:
        self.location = location
        config = _profile_settings()
        endpoint = config.get("endpoint") or next((os.environ[e] for e in _ENV["endpoint"] if os.environ.get(e)), None)
        if endpoint:
            config["endpoint"] = endpoint
        client = {"allow_http": True} if (endpoint or "").startswith("http://") else {}
        try:
            self._store = _Obstore(location.bucket, config=cast(Any, config), client_options=cast(Any, client))
        except Exception as e:  # noqa: BLE001 - obstore's configuration errors: say which URI
            raise ObjectStoreError(f"{location}: {e}") from None

    def _fail(self, what: str, key: str, e: Exception) -> ObjectStoreError:
        return ObjectStoreError(f"{what} s3://{self.location.bucket}/{key}: {type(e).__name__}: {e}")

    def list(self, prefix: str) -> list[ObjectInfo]:
        try:
            out = [_info(m) for batch in obstore.list(self._store, prefix or None) for m in batch]
        except Exception as e:  # noqa: BLE001
            raise self._fail("listing", prefix, e) from None
        return sorted(out, key=lambda o: o.key)

    def head(self, key: str) -> ObjectInfo | None:
        try:
            return _info(obstore.head(self._store, key))
        except FileNotFoundError:
            return None
        except Exception as e:  # noqa: BLE001
            raise self._fail("reading the head of", key, e) from None

    def get_range(self, key: str, start: int, length: int) -> memoryview:
        try:
            return memoryview(obstore.get_range(self._store, key, start=start, length=length))
        except Exception as e:  # noqa: BLE001
            raise self._fail(f"reading bytes {start}-{start + length} of", key, e) from None

    async def get_range_async(self, key: str, start: int, length: int) -> memoryview:
        try:  # on obstore's own runtime: no Python thread waits on the network
            return memoryview(await obstore.get_range_async(self._store, key, start=start, length=length))
        except Exception as e:  # noqa: BLE001
            raise self._fail(f"reading bytes {start}-{start + length} of", key, e) from None

    def put_file(self, key: str, path: Path, *, part_bytes: int, concurrency: int) -> ObjectInfo:
        try:  # obstore reads the file in parts of part_bytes: memory is part_bytes x concurrency
            with open(path, "rb") as f:
                r = obstore.put(self._store, key, f, chunk_size=part_bytes, max_concurrency=concurrency)
        except Exception as e:  # noqa: BLE001
            raise self._fail(f"writing {path} to", key, e) from None
        return ObjectInfo(key, Path(path).stat().st_size, r.get("e_tag"))

    def put_bytes(self, key: str, data: bytes) -> ObjectInfo:
        try:
            r = obstore.put(self._store, key, data, use_multipart=False)
        except Exception as e:  # noqa: BLE001
            raise self._fail("writing", key, e) from None
        return ObjectInfo(key, len(data), r.get("e_tag"))

    def delete(self, key: str) -> None:
        try:
            obstore.delete(self._store, key)
        except FileNotFoundError:
            pass
        except Exception as e:  # noqa: BLE001
            raise self._fail("deleting", key, e) from None


def store_for(location: Location) -> ObjectStore:
    return S3ObjectStore(location)
