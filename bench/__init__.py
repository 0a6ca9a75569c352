"""Benchmarks of postbox: figures against raw PostgreSQL measured in the same run.

`python -m bench --help`. Not part of the test suite: it prints figures, it does not
pass or fail.
"""
