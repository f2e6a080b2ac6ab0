"""HistoPipe's second tier: the groups predicted longest run on reserved workers, a few
sequences each.

A step's makespan is at least its longest response's own time, and a response running
inside a full batch pays every pass at the full batch's cost (and, with speculation,
loses it above `spec_max_batch`). Tier 2 reserves round(tier2_workers_frac * W) workers
(the last ones) for the requests of the longest predicted groups: groups longest first,
their requests dealt round-robin over the reserved workers until each holds
`tier2_max_seqs`; the other groups are dealt to the other workers by tier 1 (LPT on
predicted worker time, `pipeline.sched.placement.HistoPipePolicy`). Online it migrates
overrunning responses exactly like tier 1.

With tier2_workers_frac = 0 it is tier 1. Reserve too many workers and tier 1's workers
run longer; the right share is about the share of the work the long groups hold.
"""

from __future__ import annotations

from pipeline.sched.placement import HistoPipePolicy
from pipeline.sched.types import Request, check_workers, longest_first, lpt


class Tier2Policy(HistoPipePolicy):
    name = "tier2"

    def assign(self, groups, workers, step=0):
        check_workers(groups, workers)
        reserved = min(workers - 1, round(self.params.tier2_workers_frac * workers))
        if reserved < 1:
            return super().assign(groups, workers, step)
        # the reserve takes single requests of the longest predicted groups (a long group's
        # siblings run on several reserved workers: few sequences each is the point)
        cap = self.params.tier2_max_seqs
        by_length = sorted(range(len(groups)), key=lambda g: (-groups[g].predicted, g))
        tier2: list[list[Request]] = [[] for _ in range(reserved)]
        room, taken, g_next = reserved * cap, set(), 0
        while g_next < len(by_length) and groups[by_length[g_next]].n <= room:
            g = by_length[g_next]
            for s in range(groups[g].n):
                tier2[(reserved * cap - room) % reserved].append(Request(g, s))
                room -= 1
            taken.add(g)
            g_next += 1
        rest_groups = [g for g in range(len(groups)) if g not in taken]
        if len(rest_groups) >= workers - reserved:  # whole groups, as tier 1 deals them
            units = [[Request(g, s) for s in range(groups[g].n)] for g in rest_groups]
        else:
            units = [[Request(g, s)] for g in rest_groups for s in range(groups[g].n)]
        lengths = [groups[unit[0].group].predicted for unit in units]
        if not units or not taken:  # nothing for one of the tiers: tier 1 alone
            return super().assign(groups, workers, step)
        plan1 = longest_first(lpt(units, lengths, workers - reserved, self.params), units, lengths)
        return (plan1[::-1] if step % 2 else plan1) + tier2


__all__ = ["Tier2Policy"]
