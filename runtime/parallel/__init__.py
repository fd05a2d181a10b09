"""Parallel layers and wrappers: tensor (TP+SP), context (ring attention), data (DP: flat_buffer,
distributed_optimizer, fsdp, adamw), expert (MoE: router, expert_mlp, expert_dispatch), pipeline schedules,
the vocabulary-parallel cross-entropy and FP8 linear layers."""
