"""The file ``spark-submit`` runs: ``backfill`` and ``bootstrap`` with the submitted settings.

``spark-submit`` wants a Python file, not a module, so this file is it::

    spark-submit --master yarn --py-files app.zip \\
        --packages org.apache.spark:spark-sql-kafka-0-10_2.13:<spark version> \\
        "$(python -m streamjoin.spark.submit --path)" \\
        backfill ad_clicks -A myapp:app --from-kafka broker:9092 --output joined

The arguments after the file are those of ``streamjoin backfill`` / ``streamjoin bootstrap``.
The SparkSession is built from what ``spark-submit`` was given (master, ``--packages``,
``--conf``, ``--py-files``), before the command runs, so the command's ``--master`` and
connector defaults do not apply. See ``docs/spark.md``.
"""

from __future__ import annotations

import os
import sys

if __name__ == "__main__" and not __package__:
    # Run as a file, Python puts this file's directory (streamjoin/spark) first on the path,
    # where its modules (cli, session, testing...) would shadow top-level ones.
    _here = os.path.dirname(os.path.abspath(__file__))
    if sys.path and os.path.abspath(sys.path[0] or ".") == _here:
        del sys.path[0]

from collections.abc import Sequence

__all__ = ["main"]

USAGE = (
    "usage: spark-submit [spark options] <this file> backfill|bootstrap ARGS...\n"
    "       python -m streamjoin.spark.submit --path   (print this file's path)"
)


def main(argv: Sequence[str] | None = None) -> None:
    """Run ``backfill`` or ``bootstrap`` on the session ``spark-submit`` configured."""
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] == ["--path"]:
        print(os.path.abspath(__file__))
        return
    if not args or args[0] in ("-h", "--help"):
        print(USAGE)
        return
    import click

    from streamjoin.spark._deps import require_pyspark
    from streamjoin.spark.cli import backfill_command, bootstrap_command

    require_pyspark()
    from pyspark.sql import SparkSession

    group = click.Group(
        "streamjoin.spark.submit", commands=[backfill_command, bootstrap_command], help=USAGE
    )
    # the session of spark-submit's settings; the commands reuse the active session
    spark = SparkSession.builder.appName(f"streamjoin {' '.join(args[:2])}").getOrCreate()
    try:
        group.main(args=args, prog_name="streamjoin.spark.submit")
    finally:
        spark.stop()


if __name__ == "__main__":
    main()
