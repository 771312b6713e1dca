"""The code location ``workspace.yaml`` loads: every configured pipeline and its resources.

Which pipelines: see :mod:`dagster_project.config` (``$DBSP_CONFIG``, ``./dbsp.yaml``, or
the built-in Nexmark demo).  A configuration error stops loading with a message naming
the setting and the fix.
"""

from .config import load_project
from .factory import build_definitions

defs = build_definitions(load_project())
