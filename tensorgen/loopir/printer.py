"""Loop IR as indented pseudo-code (what `State.to_loops()` shows)."""

from __future__ import annotations

from tensorgen.loopir.nodes import Allocate, For, If, Seq, Stmt, Store


def stmt_str(s: Stmt, depth: int = 0) -> str:
    pad = "  " * depth
    if isinstance(s, Seq):
        return "\n".join(stmt_str(x, depth) for x in s.stmts)
    if isinstance(s, For):
        kind = "" if s.kind == "serial" else f" ({s.kind})"
        return f"{pad}for {s.var.name} in range({s.extent}){kind}:\n{stmt_str(s.body, depth + 1)}"
    if isinstance(s, Store):
        return f"{pad}{s.buffer.name}[{s.index}] = {s.value}"
    if isinstance(s, If):
        return f"{pad}if {s.cond}:\n{stmt_str(s.then, depth + 1)}"
    if isinstance(s, Allocate):
        b = s.buffer
        return f"{pad}{b.name} = alloc_{b.scope}({b.dtype}{list(b.shape)})\n{stmt_str(s.body, depth)}"
    raise TypeError(f"cannot print {type(s).__name__}")
