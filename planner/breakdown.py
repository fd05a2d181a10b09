"""The terms of a predicted step's breakdown (Prediction.breakdown_s): their order in tables and their labels."""

BREAKDOWN_ORDER = ("compute", "host", "recompute", "tp_comm", "cp_comm", "ep_comm", "pp_comm", "bubble", "dp_comm", "optimizer")
BREAKDOWN_LABEL = {"compute": "compute", "host": "host-bound (kernels issued slower than run)", "recompute": "recompute", "tp_comm": "exposed TP comm",
                   "cp_comm": "exposed CP comm", "ep_comm": "exposed EP comm", "pp_comm": "exposed PP comm",
                   "bubble": "pipeline bubble", "dp_comm": "exposed DP comm",
                   "optimizer": "optimizer + grad accumulation"}
BREAKDOWN_SHORT_LABEL = {**BREAKDOWN_LABEL, "host": "host-bound", "optimizer": "optimizer"}
"""For table cells (planner/search/alternatives.py)."""
