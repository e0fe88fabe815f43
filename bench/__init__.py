"""Benchmarks: pytriton's bound models against plain Python-backend models on the same server.

Run with ``make bench`` (or ``python -m bench``); see docs/performance.md (figures) and docs/benchmark.md (how it is organised).
"""
