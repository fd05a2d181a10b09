"""Stated models for what a profile cannot measure on the host the profiler runs on. Every figure here is labelled
modelled in the profile, with its model and source.

- NVSwitch groups larger than the largest measured one (4 and 8 GPUs when only 2 are available): the same
  bus bandwidth as the largest measured group (on NVSwitch every GPU drives its own NVLinks, so per-GPU bus
  bandwidth does not fall with the group), latency scaled by the ring's (n-1) steps. This is the rule
  planner.profile._collective_lookup applies; writing the entries out makes them visible in provenance.
- Inter-node 'network' links: one NIC per GPU (DGX H100/H200: 8x ConnectX-7, 400 Gb/s NDR InfiniBand =
  50 GB/s per GPU per direction), ~10 us per hop; latency growing with log2(n) (NCCL's tree algorithms), twice
  for all-reduce (reduce then broadcast). Matches planner.cluster.ClusterSpec's defaults.
- One GPU only: NVLink from the datasheet bandwidth times the efficiency measured on 2x H200.
- Overlap: see OVERLAP.

What differs between collectives (NIC hops, a pair whatever the group) is read from planner.collectives.
"""
from __future__ import annotations

from planner.collectives import COLLECTIVES
from planner.profile import CollectiveFit

NIC_GB_PER_S = 50.0
NIC_LATENCY_US = 10.0
NIC_SOURCE = ("modelled: one 400 Gb/s NDR InfiniBand NIC per GPU (ConnectX-7 as in DGX H100/H200) = 50 GB/s per "
              "GPU per direction, ~10 us per hop, latency x ceil(log2 n) (x2 for all-reduce); nominal, not measured "
              "(planner.cluster.ClusterSpec defaults)")
NETWORK_GROUP_SIZES = tuple(2 ** i for i in range(1, 13))   # 2 .. 4096 ranks


def nvswitch_groups(fits: list[CollectiveFit], max_group: int, link: str = "nvlink") -> list[CollectiveFit]:
    """Modelled entries on `link` for group sizes up to max_group (powers of two) that were not measured.
    send_recv is a pair whatever the group: its entries copy the measured pair."""
    out = []
    measured = [f for f in fits if f.link == link and f.measured]
    sizes = []
    g = 2
    while g <= max_group:
        sizes.append(g)
        g *= 2
    for op, coll in COLLECTIVES.items():
        mine = [f for f in measured if f.op == op]
        if not mine:
            continue
        base = max(mine, key=lambda f: f.group_size)
        have = {f.group_size for f in mine}
        for n in sizes:
            if n in have:
                continue
            steps = 1.0 if coll.pairwise else (n - 1) / max(base.group_size - 1, 1)
            out.append(CollectiveFit(op=op, link=link, group_size=n, latency_s=base.latency_s * steps,
                                     bus_bandwidth_bytes_per_s=base.bus_bandwidth_bytes_per_s, measured=False))
    return out


def network_links(nic_gb_per_s: float = NIC_GB_PER_S, latency_us: float = NIC_LATENCY_US) -> list[CollectiveFit]:
    """The nominal network entries (NETWORK_GROUP_SIZES) of every collective: one NIC of nic_gb_per_s per rank,
    latency_us per hop, hops from the collective's network_hops (planner.collectives)."""
    out = []
    for op, coll in COLLECTIVES.items():
        for n in NETWORK_GROUP_SIZES:
            hops = coll.network_hops(n)
            out.append(CollectiveFit(op=op, link="network", group_size=n, latency_s=latency_us * 1e-6 * hops,
                                     bus_bandwidth_bytes_per_s=nic_gb_per_s * 1e9, measured=False))
    return out


# 2x H200 NV18, NCCL 2.28: 1 GiB all-reduce bus bandwidth 321 GB/s over the datasheet's 450 GB/s per direction
# (../shared/reference/h200x2-ceilings.jsonl); small messages are latency bound at 35-75 us.
NVLINK_EFFICIENCY = 321.0 / 450.0
NVLINK_LATENCY_S = 35e-6


def single_gpu_nvlink(nvlink_gb_per_s: float, max_group: int = 8) -> list[CollectiveFit]:
    """When only one GPU was available: NVLink modelled from the datasheet bandwidth x NVLINK_EFFICIENCY."""
    out = []
    for op, coll in COLLECTIVES.items():
        n = 2
        while n <= max_group:
            lat = NVLINK_LATENCY_S * (1 if coll.pairwise else (n - 1))
            out.append(CollectiveFit(op=op, link="nvlink", group_size=n, latency_s=lat,
                                     bus_bandwidth_bytes_per_s=nvlink_gb_per_s * 1e9 * NVLINK_EFFICIENCY,
                                     measured=False))
            n *= 2
    return out


# -- overlap ----------------------------------------------------------------------------------------------------
# TP: ../shared/reference/tp-overlap-2xh200.jsonl (2x H200 NV18, torch 2.11, TP2 shapes of a 7B layer,
# tokens 16384, hidden 4096; probes in ../shared/anchors). Hidden fraction = (serial - overlapped) / exposed comm.
TP_OVERLAP_PROBES = {
    # NCCL all-gather on a side stream beside the FC1 GEMM, CUDA_DEVICE_MAX_CONNECTIONS=1
    "nccl_side_stream_conn1": (2.3227 - 2.2480) / 0.3292,
    # the same with CUDA_DEVICE_MAX_CONNECTIONS=32 (overlap made it slower)
    "nccl_side_stream_conn32": max(0.0, (2.2807 - 2.3459) / 0.3758),
    # copy-engine push into the peer's symmetric-memory buffer, naive overlap
    "copy_engine_push": (2.4233 - 2.2756) / (2.4233 - 1.8511),
    # torch fused_all_gather_matmul, QKV and FC1 shapes
    "fused_all_gather_matmul": max(0.0, (1.4158 - 1.4235) / (1.4158 - 0.9821), (2.4090 - 2.4554) / (2.4090 - 2.0401)),
}
TP_OVERLAP_CHOSEN = "nccl_side_stream_conn1"

OVERLAP = {
    "tp": round(TP_OVERLAP_PROBES[TP_OVERLAP_CHOSEN], 3),
    "dp": 0.5,
    "pp": 0.5,
    "cp": 0.5,
    "ep": 0.0,
}
OVERLAP_PROVENANCE = {
    "tp": {"status": "reference-measurement",
           "source": "../shared/reference/tp-overlap-2xh200.jsonl (2x H200, NCCL all-gather on a side stream beside "
                     "the TP2 FC1 GEMM, CUDA_DEVICE_MAX_CONNECTIONS=1: (serial - overlapped) / all-gather time)",
           "alternatives": {k: round(v, 3) for k, v in TP_OVERLAP_PROBES.items()}},
    "dp": {"status": "modelled", "source": "placeholder: bucketed gradient reduce-scatter / parameter all-gather beside "
                                           "a whole backward/forward; NCCL shares SMs with the GEMMs (see tp). "
                                           "Calibration (plan validate) replaces it"},
    "pp": {"status": "modelled", "source": "placeholder: asynchronous P2P sends beside the next micro-batch's compute; "
                                           "calibration replaces it"},
    "cp": {"status": "modelled", "source": "placeholder: ring-attention KV exchange beside the current block's "
                                           "attention; calibration replaces it"},
    "ep": {"status": "modelled", "source": "all-to-all dispatch/combine sits on the critical path between router and "
                                           "experts: nothing hidden"},
}
