"""Indexing on every axis: the batch axis (``_batch``), slices of the ragged axis (``_slicing``),
``take``/``filter``/``pad``/``truncate``/``first``/``last`` (``_take``) and ``x[...]`` (``_getitem``)."""
