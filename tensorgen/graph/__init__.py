"""Whole models: graph IR, ONNX frontend, passes, fusion into tasks, model build."""

from tensorgen.graph.ir import Graph, GraphError, Node, Value


def __getattr__(name: str):
    """The heavier entry points load on first use (they pull in onnx and the compiler)."""
    lazy = {
        "import_onnx": "tensorgen.graph.frontend.onnx_import", "export_onnx": "tensorgen.graph.frontend.onnx_import",
        "optimize": "tensorgen.graph.passes", "load_graph": "tensorgen.graph.load",
        "partition": "tensorgen.graph.passes.fusion", "extract_tasks": "tensorgen.graph.backend.tasks",
        "build_model": "tensorgen.graph.backend.build", "compare": "tensorgen.graph.reference.compare",
        "list_models": "tensorgen.graph.zoo", "load_model": "tensorgen.graph.zoo",
    }
    if name not in lazy:
        raise AttributeError(f"module 'tensorgen.graph' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(lazy[name]), name)


__all__ = ["Graph", "GraphError", "Node", "Value", "build_model", "compare", "export_onnx", "extract_tasks",
           "import_onnx", "list_models", "load_graph", "load_model", "optimize", "partition"]
