"""Heterogeneous pool-based pipeline planner (PPipe, paper 004), the control plane.

`cluster` (GPU pools), `profiles` (PPipe block timings), `blocks` (layerbatch.profile/1 files
grouped into N equal-time blocks), `candidates` (configurations meeting the SLO, dominance
pruning), `screening` (exact LP bounds), `milp` (the MILP; PPipe and NP), `dart` (DART-r),
`shares` (several models), `plan` (the answer and its JSON).
"""
