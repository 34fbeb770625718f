"""Every rule id the gate answers with is listed in `gate/policy/rules.py`, in its docstring and in its
sets, and each listed id is answered somewhere: the audit trail and the metrics count refusals by
them, and SECURITY.md sends readers to that list."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from rediacc_core.gate.policy import rules

CORE = Path(rules.__file__).resolve().parent.parent
# Where a call carries a rule id: the positional argument, or the keyword.
_POSITION = {"refuse": 0, "_finding": 0, "_Refusal": 1, "ProtocolError": 2, "_refuse": 3}
_KEYWORDS = ("rule", "rules")


def _strings(node: ast.AST) -> set[str]:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return {node.value}
    if isinstance(node, (ast.Tuple, ast.List)):
        return {s for element in node.elts for s in _strings(element)}
    if isinstance(node, ast.IfExp):
        return _strings(node.body) | _strings(node.orelse)
    return set()


def answered() -> dict[str, str]:
    """Each rule id written in the core's calls (and `rule = …` / `RULE = …` assignments), with one place."""
    found: dict[str, str] = {}
    for path in sorted(CORE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            ids: set[str] = set()
            if isinstance(node, ast.Call):
                func = node.func
                name = (
                    func.id
                    if isinstance(func, ast.Name)
                    else func.attr
                    if isinstance(func, ast.Attribute)
                    else ""
                )
                position = _POSITION.get(name)
                if position is not None and len(node.args) > position:
                    ids |= _strings(node.args[position])
                ids |= {s for k in node.keywords if k.arg in _KEYWORDS for s in _strings(k.value)}
            elif isinstance(node, ast.Assign) and any(
                isinstance(t, ast.Name) and t.id.lower() == "rule" for t in node.targets
            ):
                ids |= _strings(node.value)
            for rule in ids:
                found.setdefault(rule, f"{path.relative_to(CORE.parent)}:{getattr(node, 'lineno', '?')}")
    return found


def test_every_rule_id_answered_is_listed() -> None:
    unlisted = {rule: where for rule, where in answered().items() if rule not in rules.ALL_RULE_IDS}
    assert unlisted == {}, (
        "add these to gate/policy/rules.py (RULE_IDS or PROTOCOL_RULE_IDS) and its docstring"
    )


def test_every_listed_rule_id_is_answered_somewhere() -> None:
    assert sorted(rules.ALL_RULE_IDS - set(answered())) == []


def test_the_rules_docstring_lists_exactly_the_rule_ids() -> None:
    doc = rules.__doc__ or ""
    listed = set(re.findall(r"`([a-z]+(?:-[a-z]+)*)`", doc.split("Rule ids", 1)[1].split("Some rules", 1)[0]))
    assert sorted(listed ^ rules.ALL_RULE_IDS) == []


def test_security_md_sends_readers_to_the_list() -> None:
    text = (Path(__file__).resolve().parents[1] / "SECURITY.md").read_text(encoding="utf-8")
    assert "Every rule id the gate answers with is listed in `rediacc_core/gate/policy/rules.py`" in text
