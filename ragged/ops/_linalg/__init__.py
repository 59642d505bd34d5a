"""Linear algebra: ``matmul``/``linear`` with dense operands (``_matmul``) and ``einsum``."""
