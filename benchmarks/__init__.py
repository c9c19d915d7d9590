"""asv benchmarks (bench_models.py) and stand-alone measurement scripts."""
