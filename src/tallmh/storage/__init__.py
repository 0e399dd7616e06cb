"""Storage and data sources: where items, draws and checkpoints live.

``data`` (keyed permutations, ``take``, ``from_npy``), ``datasource`` (data in memory, on disk, on devices),
``drawstore`` (draws streamed to disk), ``checkpoint`` (saving and restoring a run), ``safe_io`` (atomic
writes), ``runfolder`` (the ``--out`` folder of ``tallmh run``). Nothing is imported here.
"""
