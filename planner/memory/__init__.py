"""The planner's memory model, in one package: `model` counts the bytes of the states a pipeline rank holds
(weights, gradients, optimizer states), the gradient reduction's buffers, workspaces and the allowance outside the
allocator; `activations` the activations per layer as the runtime saves them and the ends' per-micro-batch tensors;
`in_flight` the schedule's in-flight micro-batches; `ranks` is the cost model's per-rank view of
it (MemoryTermsOfRanks: a rank's stages, their peak and the lower bound the search prunes with); `fsdp` the
buffers FSDP2 adds under sharding 'full'.

`from planner import memory as mem` reads the counts (`mem.state_bytes`, `mem.layer_activations`, ...)."""
from planner.memory.activations import *  # noqa: F401,F403 (the package's public names are the activations',
from planner.memory.fsdp import *  # noqa: F401,F403 FSDP's terms
from planner.memory.model import *  # noqa: F401,F403 and the model's)
