"""Session 10 (reused in 11): the profile's elementwise part alone, as runtime/profiler/build.py measures it in a full profile
(copy bandwidth, then the runtime's memory-bound kernels at 32768 x 4096 tokens x hidden), written as a partial
profile for benchmarks/compose_profile.py --elementwise-from."""
import json
import sys

import torch

from runtime.profiler import environment, kernels

dev = torch.device("cuda")
copy_bw, _ = kernels.copy_bandwidth(dev, 256 << 20)
tokens, hidden = 32768, 4096
elem = kernels.time_elementwise(dev, tokens, hidden, copy_bw)
prov = environment.describe(dev, 1)
prov["parts"] = [{"part": "elementwise_efficiency", "status": "measured",
                  "how": "LayerNorm, RMSNorm (alone, with the residual add fused, backward with the residual "
                         "gradient merged: runtime/norm.py), GELU, bias-GELU (runtime/bias_gelu.py), SwiGLU, rotary, residual add, forward and "
                         "backward; minimum bytes moved / time / copy bandwidth (per kernel in extras.elementwise); "
                         "gpu/elem_part.py, the same calls as a full profile"}]
out = {"provenance": prov, "copy_bandwidth_measured_here": copy_bw,
       "elementwise_efficiency": kernels.elementwise_efficiency(elem, copy_bw),
       "extras": {"elementwise": {"tokens": tokens, "hidden": hidden, "kernels": elem,
                                  "efficiency_rule": "sum(bytes) / sum(seconds) / copy bandwidth over these kernels"}}}
json.dump(out, open(sys.argv[1], "w"), indent=1)
for k, v in elem.items():
    print(f"{k:22s} {v['seconds'] * 1e6:9.1f} us  {v['fraction_of_copy']:.2f} of copy")
