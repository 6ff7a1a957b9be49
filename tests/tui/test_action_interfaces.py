"""The operator's actions use of the app exactly what their Protocol lists: each
`self.app.<name>` in the module is a member of it, and each member is used (a Protocol
that lists more than is used says the action needs what it does not)."""

from __future__ import annotations

import ast
import inspect

import pytest

from tui import attach_action, run_actions
from tui.app import TracksideApp


def app_names_used(module) -> set[str]:
    return {
        node.attr
        for node in ast.walk(ast.parse(inspect.getsource(module)))
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Attribute)
        and node.value.attr == "app" and isinstance(node.value.value, ast.Name) and node.value.value.id == "self"
    }  # fmt: skip


def members(protocol: type) -> set[str]:
    # Protocol's own bookkeeping is private (`_is_protocol`, `_abc_impl`); the members are not.
    return {name for name in [*vars(protocol), *getattr(protocol, "__annotations__", {})] if not name.startswith("_")}


@pytest.mark.parametrize("module, protocol", [(run_actions, "ActionsApp"), (attach_action, "AttachApp")])
def test_the_actions_use_what_their_protocol_lists_and_the_app_has_it(module, protocol):
    declared = members(getattr(module, protocol))
    assert app_names_used(module) == declared
    app = TracksideApp([])
    assert [name for name in declared if not (hasattr(TracksideApp, name) or name in vars(app))] == []
