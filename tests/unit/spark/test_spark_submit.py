"""The job submission path: ``spark-submit --py-files app.zip <entry> backfill ...`` in local
mode writes what the Python API writes."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import zipfile
from collections import Counter
from pathlib import Path
from types import ModuleType

import pytest

import streamjoin
from examples.ad_traffic import generate
from streamjoin.spark import submit
from tests.unit.spark.history_files import write_records

APP_SOURCE = '''
"""A user's app module, shipped to spark-submit in app.zip."""
import os
from datetime import timedelta

import streamjoin

# One whole line appended per import (driver and Python workers): printed to stderr, the
# line could be cut by the JVM's log lines written to the same pipe.
if os.environ.get("SUBMIT_TEST_IMPORTS"):
    with open(os.environ["SUBMIT_TEST_IMPORTS"], "a") as imports:
        imports.write(f"{streamjoin.__file__}\\n")

app = streamjoin.App("submit-test")
impressions = app.topic("impressions", key_serializer="str", partitions=4)
clicks = app.topic("clicks", key_serializer="str", partitions=4)
joined = app.topic("joined", key_serializer="str", partitions=4)


@app.join(impressions, clicks, window=timedelta(minutes=10), grace=timedelta(seconds=30),
          how="left", output=joined, name="attributed")
def attributed(auction, impression, click):
    return {"auction": auction, "imp": impression["impression_id"],
            "click": click and click["click_id"]}
'''


def load_module(path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location("submit_test_app", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def package_zip(target: Path, app_module: Path) -> None:
    """The app module and streamjoin itself, as a user would ship them with --py-files."""
    package = Path(streamjoin.__file__).parent
    with zipfile.ZipFile(target, "w") as zf:
        zf.write(app_module, app_module.name)
        for path in sorted(package.rglob("*")):
            if path.suffix in (".py", ".typed") and "__pycache__" not in path.parts:
                zf.write(path, str(Path("streamjoin") / path.relative_to(package)))


def outputs(directory: Path) -> Counter[str]:
    files = directory.glob("part-*.json")
    return Counter(line for f in files for line in f.read_text().splitlines())


def test_path_option_prints_the_entry_file(capsys: pytest.CaptureFixture[str]) -> None:
    submit.main(["--path"])
    printed = capsys.readouterr().out.strip()
    assert printed == os.path.abspath(submit.__file__) and printed.endswith(".py")


@pytest.mark.spark
def test_spark_submit_local_mode_equals_the_python_api(tmp_path: Path) -> None:
    from streamjoin.spark import FileSink, FileSource, backfill
    from streamjoin.spark.testing import shared_test_session

    traffic = generate(400, seed=21)
    history = tmp_path / "history.json"
    write_records(history, traffic.records)
    app_module = tmp_path / "submit_test_app.py"
    app_module.write_text(APP_SOURCE)
    package_zip(tmp_path / "app.zip", app_module)

    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "SPARK_HOME")}
    env["PYSPARK_PYTHON"] = env["PYSPARK_DRIVER_PYTHON"] = sys.executable
    imports = tmp_path / "imports.txt"
    env["SUBMIT_TEST_IMPORTS"] = str(imports)
    command = [
        str(Path(sys.executable).parent / "spark-submit"),
        "--master",
        "local[2]",
        "--conf",
        "spark.ui.enabled=false",
        "--conf",
        "spark.sql.shuffle.partitions=4",
        "--py-files",
        "app.zip",
        submit.__file__,
        "backfill",
        "attributed",
        "-A",
        "submit_test_app:app",
        "--input",
        "history.json",
        "--output",
        "submitted",
        "--output-format",
        "json",
        "--parallelism",
        "8",
        "--quiet",
    ]
    done = subprocess.run(
        command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stdout + done.stderr[-4000:]
    assert "backfill attributed:" in done.stdout and "(8 tasks)" in done.stdout
    # the driver ran the shipped code, not an installed streamjoin
    shipped = imports.read_text().splitlines()
    assert shipped and all(line.endswith("app.zip/streamjoin/__init__.py") for line in shipped), (
        shipped
    )

    direct = tmp_path / "direct"
    backfill(
        load_module(app_module).app,
        "attributed",
        source=FileSource([str(history)]),
        output=FileSink(str(direct), "json"),
        spark=shared_test_session(),
    )
    submitted = outputs(tmp_path / "submitted")
    assert submitted and submitted == outputs(direct)
    values = [json.loads(json.loads(line)["value"]) for line in submitted.elements()]
    assert {(v["auction"], v["imp"], v["click"]) for v in values if v["click"]} == (
        traffic.expected_joins
    )
