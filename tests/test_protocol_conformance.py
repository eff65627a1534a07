"""Every built-in component is checked against its protocol structurally (issue #40: the
implementers do not import ``Task``, ``Checker``, ``Backend``, ...; this test is the check an
import would not give): each method the protocol declares exists on the component's class,
callable, and takes the protocol's parameters by the same names, in the same order (it may add
parameters with defaults)."""

from __future__ import annotations

import inspect
from typing import Protocol

import pytest

from star_engine import api
from star_engine.config.registry import Registry

PROTOCOLS = {"task": api.Task, "checker": api.Checker, "hint": api.HintFormatter, "filter": api.RationaleFilter,
             "schedule": api.StepSchedule, "sampler": api.QuestionSampler, "tuner": api.SamplingTuner,
             "backend": api.Backend}


def declared_methods(protocol: type) -> dict[str, inspect.Signature]:
    """The methods a protocol declares (its own body, not Protocol's machinery)."""
    return {name: inspect.signature(value) for name, value in vars(protocol).items()
            if inspect.isfunction(value) and not name.startswith("_")}


def mismatches(cls: type, protocol: type) -> list[str]:
    out = []
    for name, wanted in declared_methods(protocol).items():
        have = getattr(cls, name, None)
        if not callable(have):
            out.append(f"{name}: missing")
            continue
        try:
            got = inspect.signature(have)
        except (TypeError, ValueError):
            continue  # a builtin or C method: nothing to compare
        want = [p for p in wanted.parameters.values() if p.name != "self"]
        params = [p for p in got.parameters.values() if p.name != "self"]
        if any(p.kind is p.VAR_POSITIONAL for p in params):
            continue
        names = [p.name for p in params[:len(want)]]
        extra = params[len(want):]
        if names != [p.name for p in want] or any(p.default is p.empty and p.kind is not p.VAR_KEYWORD
                                                   for p in extra):
            out.append(f"{name}{got} vs the protocol's {name}{wanted}")
    return out


def components() -> list[tuple[str, str, type]]:
    registry = Registry()
    return [(kind, name, comp.factory) for kind in PROTOCOLS for name, comp in sorted(registry.components[kind].items())
            if isinstance(comp.factory, type)]


def test_the_protocols_declare_methods():
    assert all(issubclass(p, Protocol) for p in PROTOCOLS.values())  # type: ignore[arg-type]
    assert {"load", "context", "prompt", "extract", "gold_completion"} <= set(declared_methods(api.Task))
    assert {"generate", "train"} <= set(declared_methods(api.Backend))
    assert len(components()) >= 30  # every built-in plugin is read


@pytest.mark.parametrize(("kind", "name", "cls"), components(), ids=lambda v: v if isinstance(v, str) else "")
def test_each_built_in_component_has_its_protocol_s_methods(kind, name, cls):
    assert mismatches(cls, PROTOCOLS[kind]) == []


def test_a_component_that_drifts_from_its_protocol_is_named():
    class Drifted:
        def check(self, text, gold):  # the protocol's is check(generation, extracted, gold)
            return None

    class Missing:
        pass

    assert mismatches(Drifted, api.Checker) and mismatches(Missing, api.Checker) == ["check: missing"]
