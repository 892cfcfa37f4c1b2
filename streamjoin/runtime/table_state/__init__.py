"""Table state at run time: local stores, flushing, restoration and standbys.

Owns the stores of this worker's table partitions, the state service that restores and
follows changelogs through our own changelog reader, and the lock on the state
directory. May import ``streamjoin.state`` and the declarations; never tasks or the group.
"""
