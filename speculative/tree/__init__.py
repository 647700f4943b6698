"""Tree drafting (EAGLE-2's dynamic tree) for EAGLE-3 heads: the tree's shape, its growth from the
draft's distributions, its attention mask, and the rules that accept the longest path the target
agrees with (greedy, and sampled without loss over the siblings). These are the pieces on tensors;
the speculator that runs them on the engine's kernels comes on top."""
