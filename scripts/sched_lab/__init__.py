"""Research helpers of the scheduling scripts (scripts/sched_*.py, scripts/sim_speed.py):
production-shaped traces, tail batching simulated over several steps, and placement with
better length knowledge than training has. Not part of the library: `pipeline` never
imports them. The scripts import them as `sched_lab.*` (their own directory is on the
path); tests add the scripts directory to the path first."""
