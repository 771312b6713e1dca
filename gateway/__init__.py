"""The source gateway: runs many sources that read raw bytes on a few asyncio event loops.

:mod:`.pool` holds the I/O buffer pool, :mod:`.sources` the source interface and the
provided sources, :mod:`.executor` the loops that drive them, :mod:`.errors` the errors.
"""
