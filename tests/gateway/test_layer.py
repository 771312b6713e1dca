"""The gateway is a layer of its own beside ``sensors``: a process that imports it loads no
PySpark, delta-rs or pyarrow, and none of the layers that do (``storage``, ``sensors``)."""

import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FORBIDDEN = ("pyspark", "deltalake", "pyarrow", "storage", "sensors", "dagster_project", "dagster")


def test_importing_every_gateway_module_loads_no_spark_delta_arrow_or_higher_layer():
    code = (
        "import importlib, json, pkgutil, sys, gateway\n"
        "for m in pkgutil.iter_modules(gateway.__path__): importlib.import_module('gateway.' + m.name)\n"
        "print(json.dumps(sorted(sys.modules)))"
    )
    env = os.environ | {"PYTHONPATH": ROOT}
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    loaded = json.loads(done.stdout)
    assert "gateway.gateway" in loaded and "gateway.workers" in loaded
    assert [m for m in loaded if m.split(".")[0] in FORBIDDEN] == []
