"""ortools' CP-SAT module (the layer split's solver, planner/search/stages.py), loaded without pandas.

ortools.sat.python.cp_model imports pandas at its top for its pandas-indexed helpers (new_int_var_series and the
like), which the planner never calls; pandas alone takes longer to import than the rest of CP-SAT, a sizeable share
of a plan's wall time (benchmarks/results/plan-speed/). Where pandas is not loaded yet, a stand-in module holding the
two names cp_model reads while it loads (its annotations name pandas.Index and pandas.Series) sits in sys.modules
for that import only, so pandas imported afterwards, by anything, is the real one."""
from __future__ import annotations

import sys
import threading
import types

_LOADING = threading.Lock()
"""The search solves on several threads: one of them loads the module, the others wait for it."""
_LOADED: list = []
"""The module once its import has finished (sys.modules holds it from the import's start)."""


def cp_model():
    """ortools.sat.python.cp_model, imported once (without pandas unless pandas is loaded already)."""
    if not _LOADED:
        with _LOADING:
            if not _LOADED:
                _LOADED.append(_import())
    return _LOADED[0]


def _import():
    if "pandas" in sys.modules:
        from ortools.sat.python import cp_model as module
        return module
    stand_in = types.ModuleType("pandas", "stands in for pandas while ortools' cp_model loads (planner/search/"
                                          "cp_sat.py); its pandas-indexed helpers are not for use")
    stand_in.Index = type("Index", (), {})
    stand_in.Series = type("Series", (), {})
    sys.modules["pandas"] = stand_in
    try:
        from ortools.sat.python import cp_model as module
    except Exception:  # an ortools that reads more of pandas while it loads: import it with the real one
        sys.modules.pop("ortools.sat.python.cp_model", None)
        module = None
    finally:
        if sys.modules.get("pandas") is stand_in:
            del sys.modules["pandas"]
    if module is None:
        from ortools.sat.python import cp_model as module
    return module
