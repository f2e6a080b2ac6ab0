"""Benchmarks (`rhymectl bench spec|sched`): drivers that measure, and their figures."""
