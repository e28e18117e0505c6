"""A PyYAML safe loader for manifests that refuses what plain `yaml.safe_load` lets through silently.

- A key given twice in one mapping is an error naming both lines (PyYAML keeps the last one).
- A number in exponent form without a dot (`1e-3`, `5E+6`) is a float, as YAML 1.2 and kubectl read it
  (PyYAML's YAML 1.1 reads it as text, and a learning rate of `1e-6` would be refused as a string).
- Aliases may not expand a document past `MAX_EXPANDED_NODES` nodes (a "billion laughs" file of a
  few hundred bytes would otherwise become gigabytes once pydantic walks it), and may not refer to
  themselves.

Errors are `yaml.MarkedYAMLError`s, so callers report them with the line like any YAML error.
"""

from __future__ import annotations

import re
from typing import Any

import yaml
from yaml.constructor import ConstructorError
from yaml.nodes import MappingNode, Node, SequenceNode

MAX_EXPANDED_NODES = 10_000
"""The most nodes a document may hold once every alias is expanded (a large manifest has a few hundred)."""


class ManifestLoader(yaml.SafeLoader):
    """`yaml.SafeLoader` that refuses duplicate keys and aliases expanded without limit."""

    def __init__(self, stream: Any):
        super().__init__(stream)
        self._sizes: dict[int, int] = {}
        self._expanded = 0
        self._open: set[str] = set()  # anchors of the nodes being composed now

    def compose_node(self, parent: Any, index: Any) -> Node:
        event = self.peek_event()
        if isinstance(event, yaml.AliasEvent):
            if event.anchor in self._open:
                raise ConstructorError(
                    None, None, f"alias *{event.anchor} refers to the node that contains it", event.start_mark
                )
            node = super().compose_node(parent, index)
            self._expanded += self._size(node)
            if self._expanded > MAX_EXPANDED_NODES:
                raise ConstructorError(
                    None,
                    None,
                    f"aliases expand the document past {MAX_EXPANDED_NODES} nodes (alias *{event.anchor})",
                    event.start_mark,
                )
            return node
        anchor = getattr(event, "anchor", None)
        if anchor is not None:
            self._open.add(anchor)
        try:
            return super().compose_node(parent, index)
        finally:
            self._open.discard(anchor)

    def _size(self, node: Node) -> int:
        """Nodes under a fully composed `node`, with aliases expanded (memoised per node)."""
        key = id(node)
        if key not in self._sizes:
            if isinstance(node, SequenceNode):
                self._sizes[key] = 1 + sum(self._size(child) for child in node.value)
            elif isinstance(node, MappingNode):
                self._sizes[key] = 1 + sum(self._size(k) + self._size(v) for k, v in node.value)
            else:
                self._sizes[key] = 1
        return self._sizes[key]

    def construct_mapping(self, node: MappingNode, deep: bool = False) -> dict[Any, Any]:
        if isinstance(node, MappingNode):
            first: dict[Any, Node] = {}
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":
                    continue  # `<<: *base` merges: explicit keys may override merged ones
                key = self.construct_object(key_node, deep=True)
                try:
                    hash(key)
                except TypeError:
                    continue  # SafeLoader reports unhashable keys itself
                if key in first:
                    raise ConstructorError(
                        None,
                        None,
                        f"duplicate key {key!r} (first given at line {first[key].start_mark.line + 1})",
                        key_node.start_mark,
                    )
                first[key] = key_node
        return super().construct_mapping(node, deep=deep)


def load_all(text: str) -> list[Any]:
    """Every document of `text`, parsed with `ManifestLoader`."""
    return list(yaml.load_all(text, Loader=ManifestLoader))  # noqa: S506 (a SafeLoader subclass)


ManifestLoader.add_implicit_resolver("tag:yaml.org,2002:float", re.compile(r"^[-+]?[0-9][0-9_]*[eE][-+]?[0-9]+$"),
                                     list("-+0123456789"))
