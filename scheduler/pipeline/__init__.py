"""Heterogeneous pool-based pipeline planner (PPipe, paper 004): block profiles and the MILP."""
