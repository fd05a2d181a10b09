"""The planner's memory model, in one package: `model` counts the bytes of every tensor a pipeline rank holds
(weights, gradients, optimizer states, activations per layer as the runtime saves them, the schedule's in-flight
micro-batches, workspaces and the allowance outside the allocator); `ranks` is the cost model's per-rank view of
it (MemoryTermsOfRanks: a rank's stages, their peak and the lower bound the search prunes with); `fsdp` the
buffers FSDP2 adds under sharding 'full'.

`from planner import memory as mem` reads the counts (`mem.state_bytes`, `mem.layer_activations`, ...)."""
from planner.memory.fsdp import *  # noqa: F401,F403 (the package's public names are FSDP's terms
from planner.memory.model import *  # noqa: F401,F403 and the model's)
