"""Operations: what a running worker tells and answers about itself.

Owns the monitor (snapshot, lag, status line), the web server and status page, the
interactive query endpoint, and moving a stopped group's committed offsets. Reads the
other runtime parts to report on them; only the worker imports it. (What the runtime
counts is ``runtime.metrics``, below every folder: the hot paths bump its counters.)
"""
