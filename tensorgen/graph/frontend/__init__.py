"""ONNX in and out: import (normalized to the graph IR contract, constants folded), export, and ONNX's own
node evaluation."""
