"""planner/search/cp_sat.py: CP-SAT's module loads without pandas, whole on every thread, and leaves pandas real."""
from __future__ import annotations

import subprocess
import sys
import textwrap


def test_cp_model_loads_without_pandas_on_many_threads_and_pandas_stays_real():
    """In a fresh interpreter (pandas not loaded): threads that ask for the module at once each get it whole (the
    search solves on several threads, and sys.modules holds a module from the start of its import), pandas is not
    imported by it, and pandas imported afterwards is the real one."""
    code = textwrap.dedent("""
        import sys, threading
        from planner.search.cp_sat import cp_model
        got = []
        threads = [threading.Thread(target=lambda: got.append(cp_model().CpModel)) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert len(got) == 4 and all(g is got[0] for g in got), got
        assert "pandas" not in sys.modules
        m = cp_model().CpModel()
        x = m.NewIntVar(0, 3, "x")
        m.Maximize(x)
        solver = cp_model().CpSolver()
        assert solver.Solve(m) == cp_model().OPTIMAL and solver.Value(x) == 3
        import pandas
        assert hasattr(pandas, "DataFrame")
        print("ok")
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr
