"""Fusion: partition the graph into kernel groups (anchor + elementwise epilogue).

A group is one ``Fused`` node holding an ``ir.FusedGroup``: its members in order, the anchor first
when the group starts with an op whose lowering takes an epilogue (``OpDef.epilogue``). Each group
lowers to one kernel, or to one GEMM call plus at most one epilogue kernel. Scatters that share
their indices (a decoder's K and V cache writes) are one group of siblings: one kernel, each
member writing its own output over the same iterations.
"""

from __future__ import annotations

from ..ir import FusedGroup, Graph, Node
from ..ops.registry import flag, kind_of
from .passes import register_pass


def is_elementwise(node: Node) -> bool:
    return kind_of(node.op) == "elementwise"


def takes_epilogue(node: Node) -> bool:
    """The anchor's lowering yields one output element at a time, so a tail may follow."""
    return bool(flag(node.op, "epilogue"))


# ops whose rows kernels run side by side in one: one iteration count for equal shapes and
# attributes, each member writing only its own output
SIBLINGS = ("ScatterND", "ScatterElements")


def _sibling_of(node: Node, groups, group_of, users) -> int | None:
    """The group of one earlier scatter that ``node`` can share a kernel with: the same op,
    attributes, indices and shapes, and neither reading what the other makes."""
    if node.op not in SIBLINGS:
        return None
    idx = node.inputs[1]
    for s in users.get(id(idx), []):
        gi = group_of.get(id(s.outputs[0]))
        if gi is None or s is node or len(groups[gi]) != 1 or groups[gi][0] is not s:
            continue
        same = s.op == node.op and s.attrs == node.attrs and s.inputs[1] is idx
        # each widens its own updates (a float16 one is read so): their dtypes may differ
        shapes = [(v.shape, v.dtype) for v in s.inputs[:2] + s.outputs] + [s.inputs[2].shape]
        if not same or shapes != [(v.shape, v.dtype) for v in node.inputs[:2] + node.outputs] + [
            node.inputs[2].shape
        ]:
            continue
        mine, theirs = {id(node.inputs[0]), id(node.inputs[2])}, {id(v) for v in s.inputs}
        if id(s.outputs[0]) in mine or id(s.inputs[0]) in mine or id(node.inputs[0]) in theirs:
            continue  # one's write would be read by the other (in place: its data)
        return gi
    return None


def _group_node(members: list[Node], graph_outputs: set[int], users: dict[int, list[Node]]) -> Node:
    member_ids = {id(m) for m in members}
    produced = {id(o) for m in members for o in m.outputs}
    inputs, seen = [], set()
    for m in members:
        for v in m.inputs:
            if v is not None and id(v) not in produced and id(v) not in seen:
                seen.add(id(v))
                inputs.append(v)
    outputs = [
        o
        for m in members
        for o in m.outputs
        if id(o) in graph_outputs or any(id(u) not in member_ids for u in users.get(id(o), []))
    ]
    anchor = None if is_elementwise(members[0]) else members[0]
    node = Node("Fused", inputs, outputs, name=members[-1].name, group=FusedGroup(members, anchor))
    for o in outputs:
        o.producer = node
    return node


def _partition(graph: Graph, fuse: bool) -> list[list[Node]]:
    users = graph.consumers()
    position = {id(n): i for i, n in enumerate(graph.nodes)}
    groups: list[list[Node]] = []
    group_of: dict[int, int] = {}  # id(Value) -> index of the group that produces it
    first_pos: list[int] = []
    for pos, node in enumerate(graph.nodes):
        if kind_of(node.op) == "view":
            continue
        target = None
        if fuse and not is_elementwise(node):
            target = _sibling_of(node, groups, group_of, users)
            if target is not None and _read_in_between(
                groups[target], first_pos[target], pos, users, position
            ):
                target = None
        if fuse and is_elementwise(node):
            shape, fits = node.outputs[0].shape, []
            for v in node.inputs:
                gi = group_of.get(id(v)) if v is not None else None
                if gi is None:
                    continue
                g = groups[gi]
                anchor = None if is_elementwise(g[0]) else g[0]
                if anchor is not None and not takes_epilogue(anchor):
                    continue
                if g[-1].outputs[0].shape != shape or (anchor and anchor.outputs[0].shape != shape):
                    continue
                if anchor is not None and len(users.get(id(v), [])) > 1:
                    continue  # an anchor's epilogue is a chain: a shared value ends it
                if _read_in_between(g, first_pos[gi], pos, users, position):
                    continue
                fits.append(gi)
            target = next(
                (gi for gi in fits if _kernel_anchor(groups[gi])), fits[0] if fits else None
            )
            if target is not None and _kernel_anchor(groups[target]):
                _absorb(node, target, groups, group_of, first_pos, users)
        if target is None:
            groups.append([node])
            first_pos.append(pos)
            target = len(groups) - 1
        else:
            groups[target].append(node)
        for o in node.outputs:
            group_of[id(o)] = target
    return [g for g in groups if g]


def _kernel_anchor(group: list[Node]) -> bool:
    """The group starts with an op other than a GEMM whose kernel takes an epilogue."""
    return not is_elementwise(group[0]) and kind_of(group[0].op) != "gemm"


def _absorb(node: Node, target: int, groups, group_of, first_pos, users) -> None:
    """Move into the target group, before ``node``, the anchor-free groups that feed only
    ``node`` and read nothing of the target: their elements are computed in its epilogue (a
    rotary x * cos + swap(x) * sin: the Mul by cos joins the Gather's kernel)."""
    shape, ours = node.outputs[0].shape, {id(o) for m in groups[target] for o in m.outputs}
    for v in node.inputs:
        gi = group_of.get(id(v)) if v is not None else None
        g = groups[gi] if gi is not None and gi != target else None
        if not g or not is_elementwise(g[0]) or any(m.outputs[0].shape != shape for m in g):
            continue
        inside = {id(m) for m in g} | {id(node)}
        if any(id(u) not in inside for m in g for o in m.outputs for u in users.get(id(o), [])):
            continue
        if any(id(x) in ours for m in g for x in m.inputs if x is not None):
            continue
        groups[target] += g
        groups[gi] = []
        first_pos[target] = min(first_pos[target], first_pos[gi])
        for m in g:
            ours.update(id(o) for o in m.outputs)
            group_of.update((id(o), target) for o in m.outputs)


def _read_in_between(group: list[Node], start: int, end: int, users, position) -> bool:
    """True if a node outside ``group`` placed in (start, end) reads a value the group makes:
    the group runs at its last member's place, so such a reader would run too early."""
    members = {id(m) for m in group}
    for m in group:
        for o in m.outputs:
            for u in users.get(id(o), []):
                if id(u) not in members and start < position[id(u)] < end:
                    return True
    return False


def fuse_graph(graph: Graph, fuse: bool = True) -> Graph:
    """Replace nodes by Fused group nodes; views stay as they are (lowered to aliases)."""
    users = graph.consumers()
    graph_outputs = {id(v) for v in graph.outputs}
    groups = _partition(graph, fuse)
    last_member = {id(g[-1]): g for g in groups}
    new_nodes = []
    for node in graph.nodes:
        if kind_of(node.op) == "view":
            new_nodes.append(node)
        elif id(node) in last_member:
            new_nodes.append(_group_node(last_member[id(node)], graph_outputs, users))
    graph.nodes = new_nodes
    return graph


@register_pass("fuse")
def fuse(graph: Graph) -> Graph:
    return fuse_graph(graph, True)


@register_pass("no_fuse")
def no_fuse(graph: Graph) -> Graph:
    return fuse_graph(graph, False)
