"""The kernel is the unit of extension (issue 14).

- No code outside meshrt/kernels/ tests for a concrete mesh_kernel op class,
  compares a kernel's kind with a kind name, or guesses a kind from a
  kernel's name: everything a kind answers is asked through its interface.
- A kind added in one folder outside the tree (a test fixture, found through
  MESHRT_KERNEL_PATH) compiles to segments, runs with numerics checked
  against NumPy, and emits CSL that lints.
- Bad kind folders and unknown kinds / compute ops are one-line errors
  naming the kind and the op.
"""

from __future__ import annotations

import ast
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from meshrt import driver
from meshrt.kernels import registry

ROOT = Path(__file__).resolve().parents[2]
PKG = ROOT / "meshrt"
FIXTURES = Path(__file__).parent / "fixtures" / "kernels"


# --------------------------------------------------------------------------
# the static check
# --------------------------------------------------------------------------


def _imports(tree: ast.Module, module: str) -> dict[str, str]:
    """Local name -> the dotted module or module.attribute it is bound to."""
    out: dict[str, str] = {}
    pkg = module.rsplit(".", 1)[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                out[a.asname or a.name.split(".")[0]] = a.name if a.asname else a.name.split(".")[0]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = pkg.split(".")
                base = ".".join(parts[: len(parts) - node.level + 1] + ([base] if base else []))
            for a in node.names:
                out[a.asname or a.name] = f"{base}.{a.name}"
    return out


def _resolve(node: ast.expr, imports: dict[str, str]) -> str | None:
    if isinstance(node, ast.Name):
        return imports.get(node.id)
    if isinstance(node, ast.Attribute):
        base = _resolve(node.value, imports)
        return f"{base}.{node.attr}" if base else None
    return None


def _class_refs(node: ast.expr) -> list[ast.expr]:
    """The class expressions of an isinstance() second argument (tuples, unions)."""
    if isinstance(node, ast.Tuple):
        return [c for e in node.elts for c in _class_refs(e)]
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr):
        return _class_refs(node.left) + _class_refs(node.right)
    return [node]


def _reads_kind(node: ast.expr) -> bool:
    """`x.kind.data` (an event.kernel's kind) or `x.kernel_kind()`."""
    if isinstance(node, ast.Attribute) and node.attr == "data":
        return isinstance(node.value, ast.Attribute) and node.value.attr == "kind"
    return isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
        and node.func.attr == "kernel_kind"


def _strings(node: ast.expr) -> list[str]:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [node.value]
    if isinstance(node, ast.Tuple | ast.List | ast.Set):
        return [s for e in node.elts for s in _strings(e)]
    return []


def kind_violations(root: Path, kinds: set[str], op_classes: set[str]) -> list[str]:
    """Places under `root` (a meshrt/ tree) outside kernels/ that test for a concrete kind."""
    found = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root.parent)
        if rel.parts[1] == "kernels":
            continue
        module = ".".join(rel.with_suffix("").parts)
        tree = ast.parse(path.read_text(), str(path))
        imports = _imports(tree, module)

        def concrete(expr: ast.expr) -> bool:
            target = _resolve(expr, imports) or ""
            name = target.rsplit(".", 1)[-1]
            return name in op_classes and (target.startswith("meshrt.kernels.")
                                           or target.startswith("meshrt.dialects.mesh_kernel"))

        for node in ast.walk(tree):
            where = f"{rel}:{getattr(node, 'lineno', 0)}"
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) \
                    and node.func.id in ("isinstance", "issubclass") and len(node.args) == 2:
                if any(concrete(c) for c in _class_refs(node.args[1])):
                    found.append(f"{where}: isinstance test for a concrete kernel op")
            elif isinstance(node, ast.MatchClass) and concrete(node.cls):
                found.append(f"{where}: match case on a concrete kernel op")
            elif isinstance(node, ast.Compare):
                sides = [node.left, *node.comparators]
                if any(_reads_kind(s) for s in sides) and any(
                        s in kinds for side in sides for s in _strings(side)):
                    found.append(f"{where}: a kernel's kind compared with a kind name")
                if isinstance(node.ops[0], ast.In | ast.NotIn) and _strings(node.left) and any(
                        isinstance(c, ast.Attribute) and c.attr in ("kernel", "kernel_name")
                        for c in node.comparators):
                    found.append(f"{where}: a kernel kind guessed from the kernel's name")
            elif isinstance(node, ast.Call) and any(s in kinds for a in node.args[1:] for s in _strings(a)):
                func = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
                if "kind" in func:
                    found.append(f"{where}: {func}() called with a kind name")
    return sorted(found, key=lambda f: (f.split(":")[0], int(f.split(":")[1])))


def _kinds() -> tuple[set[str], set[str]]:
    ks = registry.kernels()
    return set(ks), {op.__name__ for op in ks.values()}


def test_no_code_outside_kernels_tests_for_a_kind():
    kinds, classes = _kinds()
    assert kind_violations(PKG, kinds, classes) == []


def test_the_check_finds_kind_tests(tmp_path):
    """The check is not vacuous: each pattern it forbids is reported."""
    kinds, classes = _kinds()
    pkg = tmp_path / "meshrt"
    (pkg / "passes").mkdir(parents=True)
    (pkg / "passes" / "bad.py").write_text(
        "from meshrt.dialects import mesh_kernel as mk\n"
        "from meshrt.kernels.gemv.op import GemvOp\n"
        "from meshrt.dialects import graph\n"
        "def f(op, k, sub, prog):\n"
        "    if isinstance(op, mk.GemvOp | mk.AllReduceOp): pass\n"
        "    if isinstance(op, (GemvOp,)): pass\n"
        "    if isinstance(op, graph.EmbedOp): pass\n"  # a graph op: allowed
        "    match op:\n"
        "        case GemvOp(): pass\n"
        "    if k.kind.data == 'expert_ffn': pass\n"
        "    if k.kind.data == 'rmsnorm': pass\n"  # not a kernel kind
        "    if 'experts' in sub.kernel: pass\n"
        "    kernels_of_kind(prog, 'handoff')\n"
    )
    got = kind_violations(pkg, kinds, classes)
    assert [g.split(": ", 1)[0] for g in got] == [
        "meshrt/passes/bad.py:5", "meshrt/passes/bad.py:6", "meshrt/passes/bad.py:9",
        "meshrt/passes/bad.py:10", "meshrt/passes/bad.py:12", "meshrt/passes/bad.py:13"]


def test_registry_derives_the_closed_sets():
    from meshrt.dialects.mesh_kernel import MeshKernel
    from meshrt.tools.viz import kind_colors

    ks = registry.kernels()
    assert {op.name for op in MeshKernel.operations} == {"mesh_kernel.program"} | {op.name for op in ks.values()}
    assert set(kind_colors()) == set(ks)
    # every compute op the kinds' roles run is declared by the kind that runs it
    from meshrt.kernels.interface import KernelContext
    kctx = KernelContext(1, 1, 2, 2, 2, 1, ())
    module = driver.compile(str(ROOT / "examples" / "tiny_moe.mrt"), "test32", to="kernels")
    for op in driver.program_of(module).kernels():
        roles, _ = op.roles(kctx)
        ran = {e[1] for r in roles for e in r.events if e[0] == "compute"}
        assert ran <= {c.name for c in op.COMPUTE}, op.kernel_kind()


def test_unknown_kind_and_compute_op_are_errors():
    with pytest.raises(registry.UnknownKernel, match=r'unknown kernel kind "conv2d"'):
        registry.kind("conv2d")
    with pytest.raises(registry.UnknownKernel, match=r'kernel kind "gemv" has no compute op "exp"'):
        registry.compute_op("exp", "gemv")
    with pytest.raises(registry.UnknownKernel, match=r'unknown compute op "conv"'):
        registry.compute_op("conv")


# --------------------------------------------------------------------------
# a kind added in one folder
# --------------------------------------------------------------------------


def _tool(module: str, *args: str, env_path: Path | None) -> subprocess.CompletedProcess:
    """`python -m module args`, with `env_path` (if any) as the extra kind folders."""
    env = dict(os.environ)
    if env_path is not None:
        env[registry.PATH_VARIABLE] = str(env_path)
    return subprocess.run([sys.executable, "-m", module, *args], capture_output=True,
                          text=True, env=env, cwd=ROOT, timeout=600)


def _cli(*args: str, env_path: Path | None = FIXTURES) -> subprocess.CompletedProcess:
    return _tool("meshrt.tools.cli", *args, env_path=env_path)


def _opt(*args: str, env_path: Path | None = FIXTURES) -> subprocess.CompletedProcess:
    return _tool("meshrt.tools.meshrt_opt", *args, env_path=env_path)




@pytest.fixture(scope="module")
def scaled_kernels(tmp_path_factory) -> Path:
    """tiny_dense's kernel IR with a `mesh_kernel.scale` (the fixture kind) before the sampler."""
    out = tmp_path_factory.mktemp("scale")
    r = _cli("compile", "examples/tiny_dense.mrt", "--target", "test32", "--emit", "kernels",
             "-o", str(out / "plain.mlir"), env_path=None)
    assert r.returncode == 0, r.stderr
    lines = (out / "plain.mlir").read_text().splitlines()
    sample = re.compile(r"^(\s*)(%\S+) = mesh_kernel.sample @sample\((%\S+)\) on (<[^>]*>) "
                        r"\{(layer = .*), eos = \d+ : i64\} : (\S+) -> (\S+)$")
    i, m = next((n, sample.match(line)) for n, line in enumerate(lines) if sample.match(line))
    indent, result, operand, region, props, act, _ = m.groups()
    lines[i] = lines[i].replace(f"@sample({operand})", "@sample(%scaled)")
    lines.insert(i, f"{indent}%scaled = mesh_kernel.scale @logits_x2({operand}) on {region} "
                    f"{{{props}, factor = 2.000000e+00 : f64}} : {act} -> {act}")
    path = out / "scaled.mlir"
    path.write_text("\n".join(lines) + "\n")
    return path


def test_fixture_kind_is_registered_from_its_folder():
    r = subprocess.run([sys.executable, "-c", "from meshrt.kernels import registry; "
                        "print(sorted(registry.kernels()))"], capture_output=True, text=True,
                       env={**os.environ, registry.PATH_VARIABLE: str(FIXTURES)}, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "'scale'" in r.stdout
    assert "'scale'" not in subprocess.run([sys.executable, "-c", "from meshrt.kernels import registry; "
                                            "print(sorted(registry.kernels()))"],
                                           capture_output=True, text=True, timeout=120).stdout


def test_fixture_kind_compiles_to_segments(scaled_kernels, tmp_path):
    r = _opt(str(scaled_kernels), "-p", "synthesize-schedules,materialize-segments,color-routes,"
             "insert-route-handshakes,check-segments")
    assert r.returncode == 0, r.stderr
    assert 'event.kernel @logits_x2 "scale"' in r.stdout
    assert 'event.compute "scale_by" work' in r.stdout
    (tmp_path / "seg.mlir").write_text(r.stdout)
    # without the folder on the path the kind is unknown: a located one-line error
    r = _opt(str(scaled_kernels), "-p", "synthesize-schedules", env_path=None)
    assert r.returncode == 1
    assert "scale" in r.stderr and len(r.stderr.strip().splitlines()) == 1


def test_fixture_kind_runs_and_matches_numpy(scaled_kernels, tmp_path):
    r = _opt(str(scaled_kernels), "-p", "synthesize-schedules,materialize-segments,color-routes,"
             "insert-route-handshakes,check-segments", "-o", str(tmp_path / "seg.mlir"))
    assert r.returncode == 0, r.stderr
    r = _cli("run", str(tmp_path / "seg.mlir"), "--requests", "3", "--json")
    assert r.returncode == 0, r.stderr
    summary = json.loads(r.stdout)
    run = summary.get("meshrt", summary)
    assert run["outputs_match_reference"] is True
    assert run["requests_completed"] == 3


def test_fixture_kind_emits_csl_that_lints(scaled_kernels, tmp_path):
    seg = tmp_path / "seg.mlir"
    r = _opt(str(scaled_kernels), "-p", "synthesize-schedules,materialize-segments,color-routes,"
             "insert-route-handshakes,check-segments", "-o", str(seg))
    assert r.returncode == 0, r.stderr
    r = _opt(str(seg), "-t", "csl")
    assert r.returncode == 0, r.stderr
    # one bundle, "// ----- FILE: name" before each file
    files = []
    for chunk in r.stdout.split("// ----- FILE: ")[1:]:
        name, text = chunk.split("\n", 1)
        if name.endswith(".csl"):
            files.append(tmp_path / name)
            files[-1].write_text(text)
    body = "\n".join(f.read_text() for f in files)
    assert "@fmul" in body and "// y = x * 2.0" in body
    r = _cli("csl-lint", *map(str, files))
    assert r.returncode == 0, r.stderr + r.stdout


@pytest.mark.parametrize("body, message", [
    ("X = 1\n", "exports no OP"),
    ("raise ImportError('boom')\n", "failed to load: ImportError: boom"),
    ("from meshrt.kernels.gemv.op import GemvOp as OP\n", "kernel kind 'gemv' is defined twice"),
    ("from meshrt.kernels.gemv.op import GemvOp\n"
     "from meshrt.kernels.compute import ComputeOp\n"
     "class OP(GemvOp):\n"
     "    name = 'mesh_kernel.gemv2'\n"
     "    COMPUTE = (ComputeOp('fma2', 'flops', lambda b: []),)\n", "has cost key 'flops'"),
    ("from meshrt.kernels.gemv.op import GemvOp\n"
     "from meshrt.kernels.compute import ComputeOp\n"
     "class OP(GemvOp):\n"
     "    name = 'mesh_kernel.gemv2'\n"
     "    COMPUTE = (ComputeOp('fma2', ('fmac', 'exp'), lambda b: []),)\n",
     "names several cost keys but no price formula"),
    ("from meshrt.kernels.gemv.op import GemvOp\n"
     "from meshrt.kernels.compute import ComputeOp\n"
     "class OP(GemvOp):\n"
     "    name = 'mesh_kernel.gemv2'\n"
     "    COMPUTE = (ComputeOp('fma2', ('fmac', 'flops'), lambda b: [], price=lambda c, w, p: w),)\n",
     "has cost key 'flops'"),
])
def test_bad_kind_folder_is_one_line(tmp_path, body, message):
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "__init__.py").write_text(body)
    # the folders load before the input is read, whatever it is
    r = _opt(str(ROOT / "examples" / "tiny_dense.mrt"), env_path=tmp_path)
    assert r.returncode == 1
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0] and str(tmp_path / "bad") in lines[0], r.stderr
    assert "Traceback" not in r.stderr
