"""The reference workloads shared by samples/tutorial (recorded with tracekit) and samples/plain.

This package must never import tracekit: samples/plain is the same workload with no tracekit
code at all, so that it can be recorded "zero-code" from the outside.
"""
