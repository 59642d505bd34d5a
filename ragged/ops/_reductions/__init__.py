"""Reductions: the driver (``_reduce``), sums and extrema, statistics, logical reductions."""
