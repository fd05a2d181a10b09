"""Exposed communication from kernel intervals, against hand-computed timelines."""
from runtime.trace_analysis import exposed_communication


def test_hidden_partly_and_fully():
    k = [("gemm", 0.0, 10.0), ("ncclDevKernel_AllGather", 2.0, 4.0),      # fully hidden
         ("ncclDevKernel_ReduceScatter", 9.0, 13.0),                     # 1 hidden, 3 exposed
         ("elementwise", 12.0, 12.5),                                    # hides 0.5 more
         ("ncclKernel_AllReduce", 20.0, 21.0)]                           # exposed
    x = exposed_communication(k)
    assert x["span"] == 21.0
    assert x["communication"] == 2.0 + 4.0 + 1.0
    assert x["compute"] == 10.5
    assert abs(x["exposed_communication"] - (2.5 + 1.0)) < 1e-12
    assert abs(x["busy"] - (13.0 + 1.0)) < 1e-12


def test_no_communication():
    x = exposed_communication([("gemm", 0.0, 1.0)])
    assert x["exposed_communication"] == 0.0 and x["communication"] == 0.0
