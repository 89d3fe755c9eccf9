"""FLOPs of a compiled program read from its HLO, every loop body counted as often as it runs.

XLA's ``cost_analysis()`` counts a ``while`` body once, so a DiT step whose layers run in a
``lax.scan`` reports about one layer's FLOPs. Here the compiled HLO text is walked from its entry
computation: each ``dot`` and ``convolution`` (a TPU compile turns products into convolutions)
counts ``2 x output elements x contraction size``, each Pallas call its ``pl.CostEstimate``, and a
called computation counts once per call, a ``while`` body once per iteration (the trip count read
from its condition: the loop counter compared with a constant), a ``conditional`` its largest branch.
A Pallas call without an estimate (JAX's own splash kernel) inside an attention call's named scope
(:meth:`~wanjax.kernels.common.AttentionShape.label`) counts that attention's analytic FLOPs.
Products whose two operands are int8 (``s8 x s8``: W8A8, :mod:`wanjax.models.w8a8`) are counted
apart too: how many run and their FLOPs.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Iterator

from wanjax.kernels.common import AttentionShape
from wanjax.tools.flops import attention_flops

__all__ = ["FlopCount", "UnknownTripCount", "count_flops", "program_flops"]


class UnknownTripCount(ValueError):
    """A loop whose iteration count the HLO does not state as a constant bound."""


@dataclasses.dataclass(frozen=True)
class _Instruction:
    name: str
    shape: str
    opcode: str
    operands: tuple[str, ...]
    attributes: str
    root: bool


_HEADER = re.compile(r"^(ENTRY\s+)?%(\S+)\s.*\{\s*$")
_INSTRUCTION = re.compile(r"^\s*(ROOT\s+)?%(\S+)\s*=\s*(.*)$", re.DOTALL)
_ARRAY = re.compile(r"^[a-z]+\d*\[([\d,]*)\]")
_CALLS = re.compile(r"\b(calls|to_apply|body|condition|true_computation|false_computation)=%([\w.\-]+)")
_BRANCHES = re.compile(r"branch_computations=\{([^}]*)\}")
_COST = re.compile(r'"cost_estimate":\{"flops":"(\d+)"')
_KNOWN_TRIPS = re.compile(r'"known_trip_count":\{"n":"(\d+)"')
_OP_NAME = re.compile(r'op_name="([^"]*)"')


def _closing(text: str, start: int) -> int:
    """Index just past the bracket group opening at ``text[start]``."""
    pairs = {"(": ")", "[": "]", "{": "}"}
    depth = []
    for i in range(start, len(text)):
        c = text[i]
        if c in pairs:
            depth.append(pairs[c])
        elif depth and c == depth[-1]:
            depth.pop()
            if not depth:
                return i + 1
    raise ValueError(f"unbalanced HLO text: {text[start : start + 80]!r}")


def _parse_instruction(line: str) -> _Instruction | None:
    m = _INSTRUCTION.match(line)
    if m is None:
        return None
    root, name, rest = bool(m[1]), m[2], m[3]
    if rest.startswith("("):
        end = _closing(rest, 0)
    else:
        end = rest.index(" ")
        if "{" in rest[:end]:  # a layout such as {1,0:T(8,128)} belongs to the shape
            end = _closing(rest, rest.index("{"))
    shape, rest = rest[:end], rest[end:].lstrip()
    opcode, _, rest = rest.partition("(")
    close = _closing("(" + rest, 0) - 1
    operands = tuple(part.split()[-1].lstrip("%") for part in _split_top(rest[: close - 1]) if part.strip())
    return _Instruction(name, shape, opcode.strip(), operands, rest[close:], root)


def _split_top(text: str) -> Iterator[str]:
    """``text`` split at its top-level commas."""
    start, depth = 0, 0
    for i, c in enumerate(text):
        if c in "([{":
            depth += 1
        elif c in ")]}":
            depth -= 1
        elif c == "," and depth == 0:
            yield text[start:i]
            start = i + 1
    yield text[start:]


def _logical_lines(hlo: str) -> Iterator[str]:
    """The HLO text's instructions and headers one per line: a Pallas call's metadata spans several
    physical lines (one may start with ``}}``), joined back to its instruction."""
    line = ""
    for physical in hlo.splitlines():
        starts = (
            physical.startswith(("  %", "  ROOT ", "%", "ENTRY ", "HloModule")) or physical.rstrip() == "}"
        )
        if starts and line:
            yield line
            line = ""
        line = line + "\n" + physical if line else physical
    if line:
        yield line


def _computations(hlo: str) -> tuple[dict[str, list[_Instruction]], str]:
    """Every computation's instructions by name, and the entry computation's name."""
    computations: dict[str, list[_Instruction]] = {}
    entry, current = "", None
    for line in _logical_lines(hlo):
        header = _HEADER.match(line)
        if header and not line.startswith(" "):
            current = header[2]
            computations[current] = []
            if header[1]:
                entry = current
        elif line.startswith("}"):
            current = None
        elif current is not None:
            instruction = _parse_instruction(line)
            if instruction is not None:
                computations[current].append(instruction)
    if not entry:
        raise ValueError("no ENTRY computation in the HLO text")
    return computations, entry


def _dims(shape: str) -> tuple[int, ...]:
    m = _ARRAY.match(shape)
    return () if m is None or not m[1] else tuple(int(d) for d in m[1].split(","))


def _attribute(attributes: str, key: str) -> str | None:
    m = re.search(rf"\b{key}=(\{{[^}}]*\}}|[^,\s]+)", attributes)
    return None if m is None else m[1]


def _own_flops(ins: _Instruction, shapes: dict[str, str]) -> int:
    """The FLOPs of one instruction itself (not of the computations it calls)."""
    if ins.opcode == "convolution":
        return _convolution_flops(ins, shapes)
    if ins.opcode == "dot":
        lhs = _dims(shapes[ins.operands[0]])
        contracting = (_attribute(ins.attributes, "lhs_contracting_dims") or "{}").strip("{}")
        size = math.prod(lhs[int(d)] for d in contracting.split(",") if d)
        return 2 * math.prod(_dims(ins.shape)) * size
    if _is_pallas(ins):
        if _estimate(ins):
            return _estimate(ins)
        op_name = _OP_NAME.search(ins.attributes)
        labels = AttentionShape.parse(op_name[1]) if op_name else []
        if labels:
            _, s = labels[-1]
            return attention_flops(s.batch, s.heads, s.q_len, s.k_len, s.head_dim)
    return 0


def _is_int8_product(ins: _Instruction, shapes: dict[str, str]) -> bool:
    """A ``dot`` or ``convolution`` of two int8 operands."""
    return ins.opcode in ("dot", "convolution") and all(shapes[o].startswith("s8[") for o in ins.operands[:2])


def _is_pallas(ins: _Instruction) -> bool:
    return ins.opcode == "custom-call" and "tpu_custom_call" in ins.attributes


def _estimate(ins: _Instruction) -> int:
    """A Pallas call's ``pl.CostEstimate`` FLOPs (0: none given)."""
    cost = _COST.search(ins.attributes)
    return 0 if cost is None else int(cost[1])


def _convolution_flops(ins: _Instruction, shapes: dict[str, str]) -> int:
    """``2 x batch x output features x input features (per group) x valid taps``, the taps counted
    per spatial dimension as XLA's cost analysis counts them: those landing on a real input element,
    not on padding or on the holes of an input dilation (XLA writes a batched matrix product as a
    convolution whose batch dimensions are dilated spatial ones)."""
    lhs_labels, rest = (_attribute(ins.attributes, "dim_labels") or "").split("_", 1)
    rhs_labels, out_labels = rest.split("->")
    lhs, rhs, out = _dims(shapes[ins.operands[0]]), _dims(shapes[ins.operands[1]]), _dims(ins.shape)
    window = _window(ins.attributes, len(rhs) - 2)
    taps = 1
    for d, (stride, (low, _), lhs_dilate, rhs_dilate) in enumerate(window):
        n, k, o = lhs[lhs_labels.index(str(d))], rhs[rhs_labels.index(str(d))], out[out_labels.index(str(d))]
        extent = (n - 1) * lhs_dilate + 1
        taps *= sum(
            1
            for i in range(o)
            for j in range(k)
            if 0 <= (p := i * stride + j * rhs_dilate - low) < extent and p % lhs_dilate == 0
        )
    features_in = rhs[rhs_labels.index("i")]
    return 2 * out[out_labels.index("b")] * out[out_labels.index("f")] * features_in * taps


def _window(attributes: str, spatial: int) -> list[tuple[int, tuple[int, int], int, int]]:
    """Per spatial dimension of a convolution: stride, (padding low, high), lhs and rhs dilation."""
    m = re.search(r"window=\{([^}]*)\}", attributes)
    fields = dict(f.split("=") for f in m[1].split()) if m else {}

    def per_dim(key: str, default: str) -> list[str]:
        return fields[key].split("x") if key in fields else [default] * spatial

    pads = [tuple(int(v) for v in p.split("_")) for p in per_dim("pad", "0_0")]
    return list(
        zip(
            (int(v) for v in per_dim("stride", "1")),
            pads,
            (int(v) for v in per_dim("lhs_dilate", "1")),
            (int(v) for v in per_dim("rhs_dilate", "1")),
            strict=True,
        )
    )


def _trip_count(
    ins: _Instruction, computations: dict[str, list[_Instruction]], caller: dict[str, _Instruction]
) -> int:
    """Iterations of a ``while``: the ``known_trip_count`` XLA wrote beside it, else its condition's
    ``counter < constant`` (or ``constant > counter``, possibly wrapped in a fusion), the counter's
    start read from the loop's initial tuple where it is a constant (else 0, as a ``lax.scan``'s)."""
    known = _KNOWN_TRIPS.search(ins.attributes)
    if known is not None:
        return int(known[1])
    condition = computations[_attribute(ins.attributes, "condition").lstrip("%")]
    by_name = {i.name: i for i in condition}
    root = next(i for i in condition if i.root)
    operands = root.operands
    if root.opcode == "fusion":  # XLA's wrapped_compare: the comparison inside, on the fusion's operands
        fused = computations[_attribute(root.attributes, "calls").lstrip("%")]
        params = {i.name: int(i.operands[0]) for i in fused if i.opcode == "parameter"}
        root = next(i for i in fused if i.root)
        operands = tuple(operands[params[o]] if o in params else o for o in root.operands)
    direction = _attribute(root.attributes, "direction")
    if root.opcode == "compare" and direction in ("LT", "GT") and len(operands) == 2:
        counter, bound = operands if direction == "LT" else operands[::-1]
        counter_ins, bound_ins = by_name.get(counter), by_name.get(bound)
        if bound_ins is not None and bound_ins.opcode == "constant" and counter_ins is not None:
            start = 0
            index = _attribute(counter_ins.attributes, "index")
            initial = caller.get(ins.operands[0]) if ins.operands else None
            if counter_ins.opcode == "get-tuple-element" and index and initial and initial.opcode == "tuple":
                first = caller.get(initial.operands[int(index)])
                if first is not None and first.opcode == "constant":
                    start = int(_constant(first))
            return max(int(_constant(bound_ins)) - start, 0)
    raise UnknownTripCount(f"while {ins.name}: its condition is not a counter compared with a constant")


def _constant(ins: _Instruction) -> str:
    """A scalar ``constant(4)``'s value."""
    return ins.operands[0]


@dataclasses.dataclass(frozen=True)
class FlopCount:
    """A compiled program's FLOPs: every loop iteration counted (``flops``) and each loop body once
    (``once``, as XLA's cost analysis counts), and how many Pallas calls carry no cost estimate
    (``unestimated_kernels``: their FLOPs come from their attention label; the cost model sees none);
    the ``s8 x s8`` products run (``int8_products``, every iteration) and their FLOPs (``int8_flops``)."""

    flops: int
    once: int
    unestimated_kernels: int
    int8_products: int = 0
    int8_flops: int = 0


def program_flops(hlo: str) -> int:
    """FLOPs of one device's compiled program (``compiled.as_text()``), loops counted per iteration;
    :class:`UnknownTripCount` where a loop's count cannot be read."""
    return count_flops(hlo).flops


def count_flops(hlo: str) -> FlopCount:
    """:class:`FlopCount` of one device's compiled program (``compiled.as_text()``)."""
    computations, entry = _computations(hlo)
    shapes = {i.name: i.shape for body in computations.values() for i in body}
    memo: dict[tuple[str, bool], tuple[int, int, int]] = {}

    def work(name: str, loops: bool) -> tuple[int, int, int]:
        """(FLOPs, s8 x s8 products, their FLOPs) of a computation and what it calls."""
        if (name, loops) in memo:
            return memo[name, loops]
        body = computations[name]
        by_name = {i.name: i for i in body}
        total = (0, 0, 0)

        def add(part: tuple[int, int, int], times: int = 1) -> tuple[int, int, int]:
            return tuple(a + times * b for a, b in zip(total, part, strict=True))  # type: ignore[return-value]

        for ins in body:
            own = _own_flops(ins, shapes)
            total = add((own, 1, own) if _is_int8_product(ins, shapes) else (own, 0, 0))
            if ins.opcode == "while":
                trips = _trip_count(ins, computations, by_name) if loops else 1
                total = add(work(_attribute(ins.attributes, "body").lstrip("%"), loops), trips)
                continue
            branches = _BRANCHES.search(ins.attributes)
            called = [c.strip().lstrip("%") for c in branches[1].split(",")] if branches else []
            called += [m[2] for m in _CALLS.finditer(ins.attributes)]
            if ins.opcode == "conditional":
                total = add(max((work(c, loops) for c in called), default=(0, 0, 0)))
            else:
                for c in called:
                    total = add(work(c, loops))
        memo[name, loops] = total
        return total

    unestimated = sum(
        1 for body in computations.values() for ins in body if _is_pallas(ins) and not _estimate(ins)
    )
    flops, products, int8_flops = work(entry, True)
    return FlopCount(flops, work(entry, False)[0], unestimated, products, int8_flops)
