"""Kylix for Python: safetensors loading from a Kylix mount (or any file).

kylix.safetensors parses headers (pure Python, strict, bounded);
kylix.torch is a drop-in for safetensors.torch.load_file and safe_open,
with a tensor-parallel form that reads only one rank's slices;
kylix.vllm registers the "kylix" load format for vLLM;
kylix.data reads data sets (files grouped into samples, or tar shards that
`kylix shards` makes) for torch.utils.data, shared per rank and worker.

Everything works without libkylix and without a Kylix node: the fast paths
(libkylix reads from the packs, the node filling GPU memory) are taken when
present and reported by kylix.torch.last_load_info().
"""

__version__ = "0.1.0"
