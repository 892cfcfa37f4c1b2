"""Joins: the pure join core (``core``, ``state``) and the join declarations (``api``).

A regular package, not a namespace one: Python cannot import namespace packages from a
zip, and a Spark cluster is given streamjoin as a zip (``--py-files``).
"""
