"""Inlining `@ct.function` helpers: their body is built into the caller's IR at each call."""

from __future__ import annotations

import ast
import inspect
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from cutile_py.frontend.capture import capture_helper
from cutile_py.frontend.errors import CompileError

if TYPE_CHECKING:
    from cutile_py.frontend.build_ir import KernelBuilder

#: Deeper nesting than this is taken as unbounded recursion.
MAX_DEPTH = 32


def inline_helper(
    kb: KernelBuilder,
    fn: Callable[..., Any],
    args: list[Any],
    kwargs: dict[str, Any],
    node: ast.Call,
) -> Any:
    """Evaluate the helper's body with its parameters bound to the call's values; the value of
    its final `return` is the call's value."""
    cap = capture_helper(fn)
    name = cap.name
    if len(kb.helper_stack) >= MAX_DEPTH:
        kb.fail(
            f"helper '{name}' nests more than {MAX_DEPTH} deep (recursion is not supported)", node
        )
    try:
        bound = inspect.signature(fn).bind(*args, **kwargs)
    except TypeError as e:
        kb.fail(f"{name}(): {e}", node)
    bound.apply_defaults()
    call_site = kb.cap.location(node)
    saved = kb.cap, kb.env, kb.globals, kb.node
    kb.cap, kb.env, kb.globals = cap, dict(bound.arguments), cap.visible_names()
    kb.helper_stack.append(name)
    try:
        body = cap.tree.body
        result: Any = None
        for k, stmt in enumerate(body):
            if isinstance(stmt, ast.Return):
                if k != len(body) - 1:
                    kb.fail("return is only supported as the last statement of a helper", stmt)
                result = kb.expr(stmt.value) if stmt.value is not None else None
            else:
                kb.block([stmt])
        return result
    except CompileError as e:
        raise e.through_helper(name, call_site, saved[0].name) from None
    finally:
        kb.helper_stack.pop()
        kb.cap, kb.env, kb.globals, kb.node = saved
