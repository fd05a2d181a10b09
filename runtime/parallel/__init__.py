"""Parallel layers and wrappers: tensor (TP+SP), data (DP / distributed optimizer / FSDP2), and, from
their own files, context (ring attention), expert (MoE) and pipeline schedules."""
