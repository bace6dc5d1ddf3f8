"""GPU011 helpers for modules built late through a project function: `self.mm_projector =
build_vision_projector(self.config)` in `initialize_vision_modules()` (LLaVA's shape) makes an
nn.Linear in float32 when the function it calls returns a new module without dtype=. pyrules
records which imported function a late method calls (the project pass judges it) and which
functions of a file return such a module (`Facts.builders`); the project pass pairs them with the
calls made after a cast, as it does for classes.
"""
from __future__ import annotations

import ast

from gpudoctor.lint.pysource import PySource, dotted


def imported_function(src: PySource, node: ast.Call) -> str | None:
    """The name of a lower-case function this file imports (absolutely or relatively) and calls
    without dtype=: whether it returns a float32 module only the project can say."""
    func = node.func
    if not isinstance(func, ast.Name) or not func.id[:1].islower():
        return None
    if func.id not in src.imports and func.id not in src.relative and func.id not in src._conflicts:
        return None
    q = src.qualify(func.id) or src.imports.get(func.id, "")
    if q.startswith(("torch.", "copy.", "deepcopy")) or func.id in ("deepcopy", "getattr"):
        return None
    return func.id


def builders(src: PySource, creates) -> set[str]:
    """Top-level functions of the file that return a new float32 module on some path:
    `return nn.Linear(a, b)`, or a name assigned one (`proj = nn.Sequential(nn.Linear(...)); return
    proj`). `creates(node)`: pyrules' test of one expression."""
    out: set[str] = set()
    for fn in src.tree.body:
        if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        made: set[str] = set()
        for st in src.scope_statements(fn):
            if isinstance(st, ast.Assign) and len(st.targets) == 1 and isinstance(st.targets[0], ast.Name) and \
                    creates(st.value):
                made.add(st.targets[0].id)
            elif isinstance(st, ast.Return) and st.value is not None and \
                    (creates(st.value) or (isinstance(st.value, ast.Name) and st.value.id in made)):
                out.add(fn.name)
                break
    return out


def receiver(node: ast.AST) -> str | None:
    """A receiver written as a chain through calls: `model.get_model()` (LLaVA's
    `model.get_model().initialize_vision_modules(...)`); its leading names are the cast object."""
    plain = dotted(node)
    if plain:
        return plain
    if isinstance(node, ast.Call) and not node.args and not node.keywords and isinstance(node.func, ast.Attribute):
        inner = receiver(node.func.value)
        return f"{inner}.{node.func.attr}()" if inner else None
    if isinstance(node, ast.Attribute):
        inner = receiver(node.value)
        return f"{inner}.{node.attr}" if inner else None
    return None


# Methods never taken for late builders: dunders, forward, loading and resetting.
NEVER_LATE = ("__", "forward", "extra_repr", "load", "_load", "from_", "reset", "_reset")


def late_method(name: str, builder_named: bool, text: str) -> bool:
    """Whether a method that creates modules can run after the model was cast. Builder names
    (`initialize_vision_modules`, `build_projector`) count only when the file never calls them on
    self (a constructor would); the call after the cast is the rest of the evidence."""
    if name.startswith(NEVER_LATE):
        return False
    return not builder_named or f"self.{name}(" not in text
