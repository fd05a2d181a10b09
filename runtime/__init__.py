"""The runtime: carries out a plan (see runtime/README.md). Imports torch; the planner never imports this."""
