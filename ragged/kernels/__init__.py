"""Kernels: plain tensors in, plain tensors out.

The layer between the core (``RaggedArray``, ``Partition``) and the ops: segment reductions and
softmax over a ``Segments`` grouping, exact segmented scans, pair-map blocks and the attention
buckets and tiles. Nothing here knows a ``RaggedArray``; a kernel may read a ``RowPartition``
(core). Every kernel keeps the contracts the ops rely on (forward AD, double backward, vmap
rules, one compiled graph, no host sync) or says which it lacks.
"""
