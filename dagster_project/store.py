"""The store's settings (``resources.store``) with no Dagster: the source gateway's process
reads them here (its cursors may live on the store), the Dagster resource
(:class:`~dagster_project.resources.StoreResource`) adds itself on top."""

from __future__ import annotations

from urllib.parse import urlparse

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from storage import location
from storage.errors import StoreUnreachableError
from storage.location import reach_store

from .config import ConfigError, ProjectSpec, home, resource_settings


class StoreSettings(BaseModel):
    """Where each pipeline keeps its Delta tables: ``<root>/<pipeline>`` (default
    ``$DBSP_HOME/pipelines``): a local (or mounted) directory, or ``s3://bucket/prefix`` on
    AWS S3 or an S3-compatible store (``endpoint``), reached with the access key given here
    (``{env: NAME}`` values; never logged) or the AWS SDK's default chain.  The same S3
    settings reach the pipelines' Delta table inputs on S3 (``delta:s3://...``)."""

    model_config = ConfigDict(extra="forbid")

    root: str = Field("", description="a local directory, file:// URL or s3://bucket/prefix for the pipelines' tables")
    endpoint: str = Field("", description="an S3-compatible store's URL, http(s)://host:port (empty: AWS S3)")
    region: str = Field("us-east-1", description="the S3 region of the bucket")
    access_key_id: str = Field("", description="the S3 access key id (empty: the AWS SDK's default credentials)")
    secret_access_key: str = Field("", description="the S3 secret access key, as {env: NAME}")

    @field_validator("root")
    @classmethod
    def _known_scheme(cls, root: str) -> str:
        scheme = urlparse(root).scheme
        if scheme not in ("", "file", *location.S3_SCHEMES):
            raise ValueError(
                f"root={root!r}: a store is a local (or mounted) directory or s3://bucket/prefix, not {scheme}://; "
                "mount any other store and give its mount path"
            )
        if scheme in location.S3_SCHEMES and not urlparse(root).netloc:
            raise ValueError(f"root={root!r}: name the bucket, as s3://bucket/prefix")
        return location.s3_uri(root.rstrip("/")) if scheme in location.S3_SCHEMES else root.removeprefix("file://")

    @field_validator("endpoint")
    @classmethod
    def _url(cls, endpoint: str) -> str:
        if endpoint and urlparse(endpoint).scheme not in ("http", "https"):
            raise ValueError(f"endpoint={endpoint!r}: expected http://host:port or https://host")
        return endpoint.rstrip("/")

    @model_validator(mode="after")
    def _both_keys(self) -> StoreSettings:
        if bool(self.access_key_id) != bool(self.secret_access_key):
            raise ValueError("access_key_id and secret_access_key: give both, or neither (the AWS SDK's default chain)")
        return self

    def pipeline_root(self, name: str) -> str:
        """Where pipeline ``name``'s tables live (see :meth:`reach`)."""
        return self.reach(f"{self.root or home('pipelines')}/{name}")

    def gateway_cursors(self, setting: str) -> str:
        """The gateway's cursors: at its ``gateway.cursors`` ``setting``, else beside the
        pipelines on an object store, else in the home (``$DBSP_HOME/gateway/cursors``)."""
        if setting:
            return self.reach(setting)
        return self.reach(f"{self.root}/_gateway_cursors") if location.remote(self.root) else home("gateway", "cursors")

    def reach(self, uri: str) -> str:
        """``uri``, reachable by this process from now on when it is on the object store: the
        bucket is asked for once per process, and an error names the setting to fix."""
        if location.remote(uri):
            store = location.ObjectStore(self.endpoint, self.region, self.access_key_id, self.secret_access_key)
            try:
                reach_store(uri, store)
            except StoreUnreachableError as e:
                value = "(hidden)" if e.setting == "access_key_id" else repr(getattr(self, e.setting))
                raise ConfigError(f"resources.store.{e.setting}={value}: {e}") from None
        return uri


def store_settings(project: ProjectSpec) -> StoreSettings:
    """The project's ``resources.store`` (see :func:`~dagster_project.config.resource_settings`)."""
    return resource_settings(project, "store", StoreSettings)
