"""Operations: what a running worker tells and answers about itself.

Owns metrics (pure counters), the monitor (snapshot, lag, status line), the web server
and status page, the interactive query endpoint, and moving a stopped group's committed
offsets. Reads the other runtime parts; nothing below it imports it except the counters
in ``metrics``.
"""
