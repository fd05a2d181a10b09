"""parallel-plan's planner: model and cluster specs, the cost model and the OR-Tools search. No torch here."""
