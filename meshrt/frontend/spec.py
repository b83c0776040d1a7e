"""Parser for `.mrt` model specs (grammar in spec.lark).

`parse_spec(text, filename)` returns a validated `ModelSpec`. Every error is
a `FrontendError` at `FILE:LINE:COL`: syntax errors name what was expected,
unknown fields list the known ones, and impossible numbers point at the
field that holds them.
"""

from __future__ import annotations

import difflib
import functools
from pathlib import Path
from typing import Any

import lark

from meshrt.frontend.errors import FrontendError, Loc
from meshrt.frontend.model import (
    DEFAULT_DYNAMISM,
    DEFAULT_MAX_SEQ,
    MappingSpec,
    ModelShape,
    ModelSpec,
    RectChoice,
)

INT, FLOAT, INTS, NAMES, NAME = "integer", "number", "list of integers", "list of names", "name"

MODEL_FIELDS: dict[str, str] = {
    "layers": INT, "hidden": INT, "heads": INT, "kv_heads": INT, "head_dim": INT,
    "vocab": INT, "ffn": INT, "experts": INT, "top_k": INT, "expert_ffn": INT,
    "shared_experts": INT, "moe_layers": INTS, "dtype_bytes": FLOAT,
    "expert_dtype_bytes": FLOAT, "kv_bytes": FLOAT, "max_seq": INT, "eos_token": INT,
    "act_format": NAME,
}
REQUIRED_MODEL_FIELDS = ("layers", "hidden", "heads", "vocab")
RUNTIME_FIELDS: dict[str, str] = {"dynamism": NAMES, "micro_batch": INT, "wafers": INT}
MAPPING_FIELDS: dict[str, str] = {"stages": INT, "experts_per_region": INT, "placement": NAME,
                                  "block_height": INT, "width_scale": FLOAT}


@functools.lru_cache(maxsize=1)
def _parser() -> lark.Lark:
    grammar = (Path(__file__).parent / "spec.lark").read_text()
    return lark.Lark(grammar, parser="lalr", propagate_positions=True)


def parse_spec_file(path: str | Path) -> ModelSpec:
    try:
        text = Path(path).read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise FrontendError("spec file is not UTF-8 text", str(path))
    except OSError as e:
        raise FrontendError(f"cannot read spec file: {e.strerror or e}", str(path))
    return parse_spec(text, str(path))


def parse_spec(text: str, filename: str = "<spec>") -> ModelSpec:
    try:
        tree = _parser().parse(text)
    except lark.exceptions.UnexpectedInput as e:
        raise _syntax_error(e, text, filename) from None
    return _Builder(filename).build(tree)


# ---------------------------------------------------------------------------
# Syntax errors
# ---------------------------------------------------------------------------


def _describe_terminal(name: str) -> str:
    if name == "$END":
        return "end of file"
    try:
        pattern = _parser().get_terminal(name).pattern
    except KeyError:
        return name
    if isinstance(pattern, lark.lexer.PatternStr):
        return f"'{pattern.value}'"
    return {"NAME": "a name", "NUMBER": "a number", "ESCAPED_STRING": "a string"}.get(name, name)


def _expected(names) -> str:
    items = sorted({_describe_terminal(n) for n in names if not n.startswith("__")})
    if not items:
        return ""
    if len(items) == 1:
        return f", expected {items[0]}"
    return ", expected one of " + ", ".join(items)


def _syntax_error(e: lark.exceptions.UnexpectedInput, text: str, filename: str) -> FrontendError:
    if isinstance(e, lark.exceptions.UnexpectedCharacters):
        ch = text[e.pos_in_stream] if e.pos_in_stream < len(text) else ""
        return FrontendError(f"unexpected character {ch!r}{_expected(e.allowed)}",
                             Loc(filename, e.line, e.column))
    if isinstance(e, lark.exceptions.UnexpectedEOF) or (
        isinstance(e, lark.exceptions.UnexpectedToken) and e.token.type == "$END"
    ):
        line = text.count("\n") + 1
        col = len(text) - (text.rfind("\n") + 1) + 1
        expected = getattr(e, "accepts", None) or getattr(e, "expected", None) or []
        return FrontendError(f"unexpected end of file{_expected(expected)}", Loc(filename, line, col))
    assert isinstance(e, lark.exceptions.UnexpectedToken)
    tok = e.token
    expected = e.accepts or e.expected
    return FrontendError(f"unexpected '{tok}'{_expected(expected)}",
                         Loc(filename, tok.line, tok.column))


# ---------------------------------------------------------------------------
# Tree to ModelSpec
# ---------------------------------------------------------------------------


class _Builder:
    def __init__(self, filename: str):
        self.file = filename

    def loc(self, node: Any) -> Loc:
        if isinstance(node, lark.Token):
            return Loc(self.file, node.line or 0, node.column or 0)
        meta = getattr(node, "meta", None)
        if meta is not None and not meta.empty:
            return Loc(self.file, meta.line, meta.column)
        return Loc(self.file)

    def err(self, msg: str, node: Any) -> FrontendError:
        return FrontendError(msg, self.loc(node))

    def build(self, tree: lark.Tree) -> ModelSpec:
        blocks: dict[str, lark.Tree] = {}
        for b in tree.children:
            kind = b.data.removesuffix("_block")
            if kind in blocks:
                raise self.err(f"a spec has at most one '{kind}' block (first at line "
                               f"{blocks[kind].meta.line})", b)
            blocks[kind] = b
        if "model" not in blocks:
            raise FrontendError("the spec has no 'model' block", Loc(self.file, 1, 1))
        shape = self.shape(blocks["model"])
        runtime, rlocs = self.fields(blocks.get("runtime"), RUNTIME_FIELDS, "runtime")
        mapping = self.mapping(blocks.get("mapping"))
        return ModelSpec(
            shape=shape,
            dynamism=tuple(runtime.get("dynamism", DEFAULT_DYNAMISM)),
            micro_batch=runtime.get("micro_batch", 1),
            wafers=runtime.get("wafers"),
            mapping=mapping,
            source=self.file,
            locs=rlocs,
        )

    # -- fields ----------------------------------------------------------
    def fields(self, block: lark.Tree | None, schema: dict[str, str], what: str,
               items: list | None = None) -> tuple[dict[str, Any], dict[str, Loc]]:
        vals: dict[str, Any] = {}
        locs: dict[str, Loc] = {}
        if block is None:
            return vals, locs
        for f in items if items is not None else block.children:
            if not isinstance(f, lark.Tree) or f.data != "field":
                continue
            key_tok, value = f.children
            key = str(key_tok)
            if key not in schema:
                hint = difflib.get_close_matches(key, schema, n=1)
                did = f" (did you mean '{hint[0]}'?)" if hint else ""
                raise self.err(f"unknown {what} field '{key}'{did}, expected one of "
                               + ", ".join(schema), key_tok)
            if key in vals:
                raise self.err(f"{what} field '{key}' is given twice (first at line "
                               f"{locs[key].line})", key_tok)
            vals[key] = self.value(value, schema[key], key)
            locs[key] = self.loc(value)
            if value.data == "list":  # so a bad item is blamed, not the list
                for i, c in enumerate(c for c in value.children if c is not None):
                    locs[f"{key}[{i}]"] = self.loc(c)
        return vals, locs

    def value(self, node: lark.Tree, kind: str, key: str) -> Any:
        if kind in (INT, FLOAT):
            if node.data != "number":
                raise self.err(f"field '{key}' expects {'an' if kind == INT else 'a'} {kind}", node)
            return self.number(node.children[0], kind == INT, key)
        if kind == NAME:
            if node.data != "name":
                raise self.err(f"field '{key}' expects a name", node)
            return str(node.children[0])
        if node.data != "list":
            raise self.err(f"field '{key}' expects a {kind} in brackets", node)
        items = [c for c in node.children if c is not None]
        if kind == INTS:
            for c in items:
                if c.data != "number":
                    raise self.err(f"field '{key}' expects a {kind}", c)
            return tuple(self.number(c.children[0], True, key) for c in items)
        for c in items:
            if c.data != "name":
                raise self.err(f"field '{key}' expects a {kind}", c)
        return tuple(str(c.children[0]) for c in items)

    def number(self, tok: lark.Token, integer: bool, key: str) -> int | float:
        s = str(tok).replace("_", "")
        try:
            if integer:
                if any(c in s for c in ".eE"):
                    raise ValueError
                return int(s)
            return float(s)
        except ValueError:
            raise self.err(f"field '{key}' expects an integer, got {tok}", tok) from None

    # -- model -----------------------------------------------------------
    def shape(self, block: lark.Tree) -> ModelShape:
        name_node = block.children[0]
        name = str(name_node.children[0])
        if name_node.data == "string":
            name = name[1:-1]
            if not name.strip():
                raise self.err("the model's name is empty", name_node)
        vals, locs = self.fields(block, MODEL_FIELDS, "model", block.children[1:])
        for key, default in (("expert_dtype_bytes", "dtype_bytes"),
                             ("kv_bytes", "max(dtype_bytes, 2)")):
            if vals.get(key) == 0:  # 0 is how ModelShape spells "not given"
                raise FrontendError(f"{key} must be positive, got 0 (leave it out for the "
                                    f"default, {default})", locs[key])
        for key in REQUIRED_MODEL_FIELDS:
            if key not in vals:
                raise self.err(f"model '{name}' is missing the field '{key}'", block)
        heads = vals["heads"]
        if heads < 1:
            raise FrontendError(f"heads must be at least 1, got {heads}", locs["heads"])
        if "head_dim" not in vals:
            if vals["hidden"] % heads:
                raise FrontendError(
                    f"hidden size {vals['hidden']} is not divisible by heads {heads}", locs["hidden"])
            vals["head_dim"] = vals["hidden"] // heads
        for key in MODEL_FIELDS:  # defaulted fields are blamed on the block header
            locs.setdefault(key, self.loc(block))
        vals.setdefault("kv_heads", heads)
        vals.setdefault("max_seq", DEFAULT_MAX_SEQ)
        return ModelShape(name=name, **vals, source=self.file, locs=locs)

    # -- mapping ---------------------------------------------------------
    def mapping(self, block: lark.Tree | None) -> MappingSpec:
        if block is None:
            return MappingSpec()
        vals, locs = self.fields(block, MAPPING_FIELDS, "mapping")
        locs["mapping"] = self.loc(block)
        layers: dict[int, RectChoice] = {}
        experts: dict[int, tuple[RectChoice, ...]] = {}
        ends: dict[str, RectChoice] = {}
        for item in block.children:
            if item.data == "field":
                continue
            if item.data in ("embed_region", "lm_head_region"):
                key = item.data.removesuffix("_region")
                if key in ends:
                    raise self.err(f"{key} region is given twice", item)
                ends[key] = self.rects(item.children)[0]
                continue
            layer = int(self.number(item.children[0], True, "layer"))
            table = layers if item.data == "layer_region" else experts
            if layer in table:
                raise self.err(f"layer {layer} {item.data.removeprefix('layer_')} given twice", item)
            rects = self.rects(item.children[1:])
            table[layer] = rects[0] if item.data == "layer_region" else tuple(rects)
        return MappingSpec(
            stages=vals.get("stages"),
            experts_per_region=vals.get("experts_per_region"),
            placement=vals.get("placement", "contiguous"),
            block_height=vals.get("block_height"),
            width_scale=vals.get("width_scale"),
            layers=layers,
            experts=experts,
            embed=ends.get("embed"),
            lm_head=ends.get("lm_head"),
            locs=locs,
        )

    def rects(self, children: list) -> list[RectChoice]:
        wafer = 0
        trees = [c for c in children if isinstance(c, lark.Tree)]
        if trees and trees[-1].data == "wafer":
            wafer = int(self.number(trees[-1].children[0], True, "wafer"))
            if wafer < 0:
                raise self.err(f"wafer must not be negative, got {wafer}", trees[-1])
            trees = trees[:-1]
        out = []
        for r in trees:
            x, y, w, h = (int(self.number(t, True, "region")) for t in r.children)
            out.append(RectChoice(x, y, w, h, wafer, self.loc(r)))
        return out
