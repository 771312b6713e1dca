"""Where tables live: a local directory, or a bucket of an S3-compatible object store.

Every table of a pipeline is named by a URI under the store root (``/data/pipelines/p/state/t``
or ``s3://bucket/prefix/p/state/t``).  The readers and writers that need more than the URI
(delta-rs's storage options, pyarrow's file system, Spark's Hadoop settings) ask this module
with it: a process registers the settings of each bucket it uses once (:func:`use`, done by
the store resource), and a table URI under that bucket finds them.  Executor-side writers
cannot see a registry of the driver's process: they are handed the :class:`ObjectStore`
itself (see :class:`storage.delta.Target`).

Commits on S3 stay atomic by S3's conditional put: delta-rs writes a version's log file with
``If-None-Match: *`` (``conditional_put: etag``), so of two writers of one version exactly
one succeeds, as on a local disk (docs/design.md, "The store on object storage").  Spark only
reads the store (its ``s3a://`` file system, ``hadoop-aws``); the executors' Python writers
write data files through pyarrow, and delta-rs commits them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cache
from urllib.parse import urlparse

import pyarrow.fs as pafs

from .errors import StoreUnreachableError

S3_SCHEMES = ("s3", "s3a")


@dataclass(frozen=True)
class ObjectStore:
    """How to reach an S3-compatible store: ``endpoint`` (empty: AWS's own, by ``region``),
    and the access key (empty: the AWS SDK's default chain: environment, profile, instance role)."""

    endpoint: str = ""
    region: str = "us-east-1"
    access_key_id: str = ""
    secret_access_key: str = field(default="", repr=False)

    @property
    def _http(self) -> bool:
        return self.endpoint.startswith("http://")

    def delta_options(self) -> dict[str, str]:
        """delta-rs's storage options: commits by conditional put (see the module)."""
        options = {"AWS_REGION": self.region, "conditional_put": "etag"}
        if self.endpoint:
            options |= {"AWS_ENDPOINT_URL": self.endpoint, "AWS_ALLOW_HTTP": str(self._http).lower()}
        if self.access_key_id:
            options |= {"AWS_ACCESS_KEY_ID": self.access_key_id, "AWS_SECRET_ACCESS_KEY": self.secret_access_key}
        return options

    def filesystem(self) -> pafs.FileSystem:
        return _s3_filesystem(self)

    def hadoop_conf(self) -> dict[str, str]:
        """Spark's ``s3a`` settings for this store, set on a session (Hadoop takes a session's
        ``fs.*`` settings into the configuration of its reads, executors' too)."""
        conf = {"fs.s3a.endpoint.region": self.region}
        if self.endpoint:
            conf |= {
                "fs.s3a.endpoint": self.endpoint,
                "fs.s3a.path.style.access": "true",
                "fs.s3a.connection.ssl.enabled": str(not self._http).lower(),
            }
        if self.access_key_id:
            conf |= {
                "fs.s3a.aws.credentials.provider": "org.apache.hadoop.fs.s3a.SimpleAWSCredentialsProvider",
                "fs.s3a.access.key": self.access_key_id,
                "fs.s3a.secret.key": self.secret_access_key,
            }
        return conf


@cache
def _s3_filesystem(store: ObjectStore) -> pafs.FileSystem:
    parsed = urlparse(store.endpoint)
    return pafs.S3FileSystem(
        region=store.region,
        endpoint_override=parsed.netloc or None,
        scheme=parsed.scheme or "https",
        access_key=store.access_key_id or None,
        secret_key=store.secret_access_key or None,
    )


_BUCKETS: dict[str, ObjectStore] = {}


def use(root: str, store: ObjectStore) -> None:
    """Makes this process reach the bucket of ``root`` (``s3://bucket/...``) with ``store``."""
    _BUCKETS[_bucket(root)] = store


def remote(uri: str) -> bool:
    return urlparse(uri).scheme in S3_SCHEMES


def _bucket(uri: str) -> str:
    parsed = urlparse(uri)
    if parsed.scheme not in S3_SCHEMES or not parsed.netloc:
        raise ValueError(f"{uri!r} is not an s3:// URI")
    return parsed.netloc


def store_of(uri: str) -> ObjectStore | None:
    """The settings of ``uri``'s bucket; None for a local path.  A bucket not registered is
    reached with the AWS SDK's defaults."""
    return _BUCKETS.get(_bucket(uri), ObjectStore()) if remote(uri) else None


def delta_options(uri: str) -> dict[str, str] | None:
    """delta-rs's ``storage_options`` for the table at ``uri`` (None for a local one)."""
    store = store_of(uri)
    return None if store is None else store.delta_options()


def filesystem(uri: str, store: ObjectStore | None = None) -> tuple[pafs.FileSystem, str]:
    """pyarrow's file system for ``uri`` and the path in it (``bucket/key`` on S3); ``store``
    instead of the registry's, where the registry is not this process's (an executor)."""
    if not remote(uri):
        return pafs.LocalFileSystem(), uri.removeprefix("file://")
    parsed = urlparse(uri)
    return (store or store_of(uri)).filesystem(), f"{parsed.netloc}{parsed.path}"


def reach_spark(spark, uri: str) -> None:
    """Makes ``spark``'s reads reach ``uri``'s store (its ``s3a`` settings, on the session;
    one set serves every bucket); nothing for a local path."""
    store = store_of(uri)
    conf = {} if store is None else store.hadoop_conf()
    if any(spark.conf.get(k, None) != v for k, v in conf.items()):
        for key, value in conf.items():
            spark.conf.set(key, value)


def s3_uri(uri: str) -> str:
    """An object store's ``uri`` as the engine names it: ``s3://`` (also for ``s3a://``)."""
    return "s3://" + uri.split("://", 1)[1]


def spark_path(uri: str) -> str:
    """``uri`` as Spark's Hadoop file systems name it (``s3a://`` for S3)."""
    return "s3a://" + uri.split("://", 1)[1] if urlparse(uri).scheme == "s3" else uri


def exists(uri: str) -> bool:
    fs, path = filesystem(uri)
    return fs.get_file_info(path).type != pafs.FileType.NotFound


def listdir(uri: str) -> list[str]:
    """The names directly under the folder ``uri`` (none when it does not exist)."""
    fs, path = filesystem(uri)
    found = fs.get_file_info(pafs.FileSelector(path, allow_not_found=True))
    return sorted(info.base_name for info in found)


def makedirs(uri: str) -> None:
    """Creates the folder ``uri`` on a local disk (an object store has no folders to make)."""
    if not remote(uri):
        pafs.LocalFileSystem().create_dir(uri.removeprefix("file://"), recursive=True)


def write_text(uri: str, text: str) -> None:
    """Writes the file ``uri`` whole or not at all (a put is; a local file is renamed into place)."""
    fs, path = filesystem(uri)
    written = path if remote(uri) else f"{path}.tmp"
    if not remote(uri):
        fs.create_dir(path.rpartition("/")[0], recursive=True)
    with fs.open_output_stream(written) as out:
        out.write(text.encode())
    if written != path:
        fs.move(written, path)


def read_text(uri: str) -> str:
    fs, path = filesystem(uri)
    with fs.open_input_stream(path) as f:
        return f.read().decode()


_REACHED: set[tuple[str, ObjectStore]] = set()
_REFUSED = ("ACCESS_DENIED", "INVALID_ACCESS_KEY_ID", "SIGNATURE_DOES_NOT_MATCH", "InvalidAccessKeyId", "403")


def reach_store(root: str, store: ObjectStore) -> None:
    """Makes this process reach the bucket of ``root`` with ``store`` (see :func:`use`),
    after asking the store for the bucket once per process.  Raises
    :class:`~storage.errors.StoreUnreachableError` naming the setting at fault."""
    if (root, store) in _REACHED:
        return
    bucket, where = _bucket(root), store.endpoint or f"AWS S3 ({store.region})"
    try:
        found = store.filesystem().get_file_info(bucket)
    except OSError as e:
        if any(code in str(e) for code in _REFUSED):
            raise StoreUnreachableError(
                "access_key_id", f"{where} refused the credentials for bucket {bucket!r}: {e}"
            ) from e
        if "NETWORK_CONNECTION" in str(e) or "curlCode" in str(e):
            raise StoreUnreachableError("endpoint", f"nothing answers at {where}: {e}") from e
        raise StoreUnreachableError("root", f"asking {where} for bucket {bucket!r} failed: {e}") from e
    if found.type == pafs.FileType.NotFound:
        raise StoreUnreachableError("root", f"bucket {bucket!r} does not exist at {where}; create it, or name another")
    use(root, store)
    _REACHED.add((root, store))


def remove_tree(uri: str) -> None:
    """Deletes the folder ``uri`` and everything under it, when there is one."""
    fs, path = filesystem(uri)
    if fs.get_file_info(path).type != pafs.FileType.NotFound:
        fs.delete_dir(path)
