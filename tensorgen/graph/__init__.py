"""Whole models: graph IR, ONNX frontend, passes, fusion into tasks, model build."""

from tensorgen.graph.ir import Graph, GraphError, Node, Value

__all__ = ["Graph", "GraphError", "Node", "Value"]
