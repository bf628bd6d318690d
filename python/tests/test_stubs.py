"""The type stubs nanobind's stubgen writes next to the built module: a stub package
phasekv/_core/ with one file per submodule, each valid Python naming what the module binds."""

import ast
import pathlib

import pytest

import phasekv as pk
from phasekv import _core


def stub_dir():
    d = pathlib.Path(_core.__file__).parent / "_core"
    if not (d / "__init__.pyi").exists():
        pytest.skip("no stubs next to the module (built without the phasekv_core_stub target)")
    return d


@pytest.mark.parametrize("name,module", [("__init__", _core), ("eval", _core.eval),
                                         ("serving", _core.serving)])
def test_stubs_cover_every_submodule(name, module):
    tree = ast.parse((stub_dir() / f"{name}.pyi").read_text())
    defined = {n.name for n in tree.body if isinstance(n, (ast.ClassDef, ast.FunctionDef))}
    public = {k for k, v in vars(module).items()
              if not k.startswith("_") and (isinstance(v, type) or callable(v))}
    missing = public - defined - {"eval", "serving"}
    assert not missing, f"{name}.pyi lacks {sorted(missing)}"
    assert pk.serving.DecodePlan is _core.serving.DecodePlan
