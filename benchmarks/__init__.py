"""Benchmarks (python -m benchmarks.NAME). A regular package: a site-packages "benchmarks" would shadow a namespace one."""
