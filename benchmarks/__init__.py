"""Benchmarks, run as python -m benchmarks.NAME.

A regular package: a "benchmarks" package in site-packages would shadow a namespace package.
"""
