"""Cluster: GPU kinds, nodes, links, and a networkx graph of the topology used to place and price groups.

The graph has one vertex per GPU, one NVSwitch vertex per node and one network-fabric vertex; edges
carry the per-GPU unidirectional bandwidth of the link. A parallel group is priced by the link kind its
ranks need ('nvlink' when every rank sits on one node, else 'network') and by the bottleneck bandwidth
on the paths between its ranks.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from functools import lru_cache

from planner.errors import PlanError, read_json
from planner.limits import MAX_GPUS, MAX_GPUS_PER_NODE, MAX_NETWORK_GB_PER_S, is_number


@dataclass(frozen=True)
class GPUKind:
    name: str
    memory_gib: float
    """Device memory as CUDA reports it (total_memory), GiB."""
    peak_bf16_tflops: float
    """Dense bf16 datasheet peak, the denominator of MFU."""
    hbm_tb_per_s: float
    nvlink_gb_per_s: float
    """Per-GPU unidirectional NVLink bandwidth (datasheet)."""


# Datasheet figures (NVIDIA H200 / H100 SXM5 / A100 80GB SXM4 / H800 SXM5); memory as nvidia-smi reports it.
GPU_KINDS: dict[str, GPUKind] = {
    "h200-sxm": GPUKind("h200-sxm", 143771 / 1024, 989.0, 4.8, 450.0),
    "h100-sxm": GPUKind("h100-sxm", 81559 / 1024, 989.0, 3.35, 450.0),
    "a100-80gb": GPUKind("a100-80gb", 81920 / 1024, 312.0, 2.04, 300.0),   # NVLink 3: 12 links x 25 GB/s
    # H800 SXM: the H100 SXM die and HBM with NVLink cut to 400 GB/s bidirectional (DeepSeek-V3 report's cluster)
    "h800": GPUKind("h800", 81559 / 1024, 989.0, 3.35, 200.0),
    # H100 SXM with 96 GB HBM2e at 2.4 TB/s: the H100 SXM die, clocks and NVLink 4 (torchtitan docs/performance.md:
    # "96GB HBM2e with 2.4 TB/sec"); memory nominal, 96 GB = 98304 MiB (no nvidia-smi report of this part is known)
    "h100-96gb": GPUKind("h100-96gb", 98304 / 1024, 989.0, 2.4, 450.0),
    # the runtime's CPU/gloo mode: numbers only matter relative to each other in tests
    "cpu": GPUKind("cpu", 16.0, 1.0, 0.02, 5.0),
}


DEFAULT_HEADROOM_SHARE = 0.05
"""Share of a GPU's memory a plan leaves free unless told otherwise (`plan --headroom-gib`): a plan at the edge of a
prediction is one that may run out of memory under a slightly different driver, allocator or data."""


@dataclass(frozen=True)
class ClusterSpec:
    gpu: str = "h200-sxm"
    num_gpus: int = 8
    gpus_per_node: int = 8
    inter_node_gb_per_s: float = 50.0
    """Network bandwidth per GPU, unidirectional (default one 400 Gb/s NDR InfiniBand NIC per GPU)."""
    inter_node_latency_us: float = 10.0
    memory_headroom_gib: float | None = None
    """Memory per GPU the plan leaves free below the planner's own allowance (a margin for another driver,
    allocator or data than the prediction's; other processes); None: DEFAULT_HEADROOM_SHARE of the GPU's memory."""

    @property
    def headroom_gib(self) -> float:
        """memory_headroom_gib, the default resolved."""
        if self.memory_headroom_gib is None:
            return DEFAULT_HEADROOM_SHARE * self.kind.memory_gib
        return self.memory_headroom_gib

    @property
    def kind(self) -> GPUKind:
        return GPU_KINDS[self.gpu]

    @property
    def num_nodes(self) -> int:
        return (self.num_gpus + self.gpus_per_node - 1) // self.gpus_per_node

    def to_dict(self) -> dict:
        """The cluster as plan files save it: the headroom as the GiB it came to."""
        return {**asdict(self), "memory_headroom_gib": self.headroom_gib}

    @staticmethod
    def from_dict(d: dict) -> "ClusterSpec":
        try:
            c = ClusterSpec(**d)
        except TypeError as exc:
            raise PlanError(f"cluster description is malformed ({exc})") from None
        validate_cluster(c)
        return c


def validate_cluster(c: ClusterSpec) -> None:
    if c.gpu not in GPU_KINDS:
        raise PlanError(f"unknown GPU kind '{c.gpu}'; known: {', '.join(GPU_KINDS)}")
    if isinstance(c.num_gpus, bool) or not isinstance(c.num_gpus, int) or not 1 <= c.num_gpus <= MAX_GPUS:
        raise PlanError(f"the GPU count must be a whole number from 1 to {MAX_GPUS}, got {c.num_gpus!r}")
    if isinstance(c.gpus_per_node, bool) or not isinstance(c.gpus_per_node, int) or not 1 <= c.gpus_per_node <= MAX_GPUS_PER_NODE:
        raise PlanError(f"GPUs per node must be a whole number from 1 to {MAX_GPUS_PER_NODE}, got {c.gpus_per_node!r}")
    if c.memory_headroom_gib is not None and not is_number(c.memory_headroom_gib):  # None: 5% of the GPU's memory
        raise PlanError(f"memory headroom must be a finite number of GiB, got {c.memory_headroom_gib!r}")
    if c.num_gpus > c.gpus_per_node and c.num_gpus % c.gpus_per_node:
        raise PlanError(f"{c.num_gpus} GPUs do not fill whole nodes of {c.gpus_per_node}; "
                        f"use a multiple of {c.gpus_per_node}")
    if not isinstance(c.memory_headroom_gib, (int, float, type(None))) or not 0 <= c.headroom_gib < c.kind.memory_gib:
        raise PlanError(f"memory headroom {c.memory_headroom_gib} GiB is not within the {c.kind.memory_gib:.0f} GiB "
                        f"of a {c.gpu}")
    if not is_number(c.inter_node_gb_per_s) or not 0 < c.inter_node_gb_per_s <= MAX_NETWORK_GB_PER_S:
        raise PlanError(f"inter-node bandwidth must be a positive number of GB/s up to {MAX_NETWORK_GB_PER_S:g}, "
                        f"got {c.inter_node_gb_per_s!r}")
    if not is_number(c.inter_node_latency_us) or c.inter_node_latency_us < 0:
        raise PlanError(f"inter-node latency must be a finite number of microseconds >= 0, got {c.inter_node_latency_us!r}")


def load_cluster_file(path: str) -> ClusterSpec:
    """A cluster file (`--cluster`) as a ClusterSpec. An inter-node latency other than the default is refused: the
    network collectives' per-step latency comes from the profile (planner/profile/physics.py, fitted to published
    nccl-tests figures), and a value that silently changed nothing would mislead."""
    d = read_json(path, "cluster file")
    if not isinstance(d, dict):
        raise PlanError(f"cluster file '{path}' is not a JSON object")
    latency = d.get("inter_node_latency_us", ClusterSpec.inter_node_latency_us)
    if latency != ClusterSpec.inter_node_latency_us:
        raise PlanError(f"cluster file '{path}': inter_node_latency_us {latency!r} is not used by the planner, whose "
                        "network latency comes from the profile's collectives (planner/profile/physics.py); remove it")
    return ClusterSpec.from_dict(d)


@lru_cache(maxsize=64)
def topology_graph(c: ClusterSpec, max_nodes: int = 2):
    """networkx graph of (at most `max_nodes` of) the cluster; nodes are alike, so two stand for all."""
    import networkx as nx

    g = nx.Graph()
    g.add_node("fabric", kind="network")
    nodes = min(c.num_nodes, max_nodes)
    for n in range(nodes):
        sw = f"nvswitch{n}"
        g.add_node(sw, kind="nvswitch")
        for i in range(min(c.gpus_per_node, c.num_gpus)):
            gpu = n * c.gpus_per_node + i
            g.add_node(gpu, kind="gpu", node=n)
            g.add_edge(gpu, sw, link="nvlink", gb_per_s=c.kind.nvlink_gb_per_s)
            g.add_edge(gpu, "fabric", link="network", gb_per_s=c.inter_node_gb_per_s)
    return g


@dataclass(frozen=True)
class GroupPlacement:
    link: str
    """'nvlink' when the group sits inside one node, 'network' when it spans nodes."""
    bottleneck_gb_per_s: float
    ranks_per_node: int


@lru_cache(maxsize=4096)
def place_group(c: ClusterSpec, size: int, stride: int) -> GroupPlacement:
    """Where a group of `size` ranks spaced `stride` apart (rank order of planner.plan) sits, and the
    bottleneck bandwidth of a ring through it, found on the topology graph."""
    import networkx as nx

    if size <= 1:
        return GroupPlacement("none", float("inf"), 1)
    span = (size - 1) * stride + 1
    nodes_touched = span > c.gpus_per_node
    # place the group's first member at rank 0; if it spans nodes, members on node 0 and node 1 stand
    # for all (nodes are alike)
    members = [i * stride for i in range(size)]
    g = topology_graph(c, max_nodes=2 if nodes_touched else 1)
    node_of = lambda r: r // c.gpus_per_node  # noqa: E731
    ranks_per_node = sum(1 for r in members if node_of(r) == 0)

    def local(r):  # fold ranks onto the two modelled nodes
        return (min(node_of(r), 1)) * c.gpus_per_node + r % c.gpus_per_node

    ring = [local(r) for r in members]
    ring = list(dict.fromkeys(ring))
    bottleneck = float("inf")
    for a, b in zip(ring, ring[1:] + ring[:1]):
        if a == b:
            continue
        # route over the fastest links: NVSwitch inside a node, the fabric across nodes
        path = nx.shortest_path(g, a, b, weight=lambda u, v, d: 1.0 / d["gb_per_s"])
        for u, v in zip(path, path[1:]):
            bottleneck = min(bottleneck, g.edges[u, v]["gb_per_s"])
    link = "network" if nodes_touched else "nvlink"
    return GroupPlacement(link, bottleneck, ranks_per_node)
