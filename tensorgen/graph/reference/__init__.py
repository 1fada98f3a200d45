"""Peers and oracles, not the product path: the graph run node by node (PyTorch, or each node compiled naively),
the zoo as PyTorch modules, and the side-by-side comparison of a compiled model with ONNX Runtime and PyTorch."""
