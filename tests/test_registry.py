"""Plugin discovery: entry points one by one, broken plugins, misspelled hooks, duplicates, switches."""

from __future__ import annotations

import json
import subprocess
import sys
import types

import pytest

from star_engine import hookimpl
from star_engine.errors import PluginError, UserError
from star_engine.config.registry import Registry


class FakeDist:
    def __init__(self, name: str, version: str):
        self.name, self.version = name, version


class FakeEP:
    def __init__(self, name: str, module: types.ModuleType | Exception, dist: str, version: str = "1.0"):
        self.name, self.value, self._module = name, f"{dist.replace('-', '_')}.plugin", module
        self.dist = FakeDist(dist, version)

    def load(self):
        if isinstance(self._module, Exception):
            raise self._module
        return self._module


def plugin(**hooks) -> types.ModuleType:
    mod = types.ModuleType("fake_plugin")
    for name, fn in hooks.items():
        setattr(mod, name, hookimpl(fn))
    return mod


class Sched:
    def __init__(self, k: int = 1):
        self.k = k

    def steps(self, iteration, n_examples, batch_size, grad_accum):
        return self.k


def good():
    return plugin(register_schedules=lambda register: register("good_sched", Sched))


def use(monkeypatch, *eps):
    monkeypatch.delenv("STAR_ENGINE_DISABLE_AUTOLOAD", raising=False)
    monkeypatch.delenv("STAR_ENGINE_BLOCK_PLUGINS", raising=False)
    monkeypatch.delenv("STAR_ENGINE_PLUGINS", raising=False)
    monkeypatch.setattr("star_engine.config.registry.metadata.entry_points", lambda group: list(eps))


def test_entry_points_register_components(monkeypatch):
    use(monkeypatch, FakeEP("good", good(), "star-good", "2.1"))
    reg = Registry()
    info = reg.plugins["good"]
    assert (info.distribution, info.version, info.error) == ("star-good", "2.1", None)
    assert info.hooks == ["register_schedules"] and info.components == {"schedule": ["good_sched"]}
    assert reg.create("schedule", "good_sched", {"k": 4}, "training.schedule").steps(1, 10, 1, 1) == 4
    assert "star-good==2.1" in reg.requirements()


def test_broken_import_is_recorded_and_others_load(monkeypatch):
    use(monkeypatch, FakeEP("bad", ImportError("No module named 'torch'"), "star-bad", "0.3"),
        FakeEP("good", good(), "star-good"))
    reg = Registry()
    assert "No module named 'torch'" in reg.plugins["bad"].error
    assert reg.names("schedule") == ["good_sched"]
    with pytest.raises(PluginError) as e:  # fatal only when something it may provide is asked for
        reg.get("schedule", "bad_sched", "training.schedule")
    assert "star-bad 0.3" in str(e.value) and "available: good_sched" in str(e.value)


def test_misspelled_hook_fails_that_plugin_only(monkeypatch):
    typo = plugin(register_schedule=lambda register: register("typo_sched", Sched))
    use(monkeypatch, FakeEP("typo", typo, "star-typo"), FakeEP("good", good(), "star-good"))
    reg = Registry()
    err = reg.plugins["typo"].error
    assert "'register_schedule' is not a star_engine hook" in err and "register_schedules" in err
    assert reg.names("schedule") == ["good_sched"] and reg.plugins["good"].error is None


def test_wrong_hook_signature(monkeypatch):
    wrong = plugin(register_schedules=lambda register, extra: None)
    use(monkeypatch, FakeEP("wrong", wrong, "star-wrong"))
    reg = Registry()
    assert "extra" in reg.plugins["wrong"].error


def test_duplicate_component_names_name_both_distributions(monkeypatch):
    use(monkeypatch, FakeEP("a", good(), "star-a", "1.0"), FakeEP("b", good(), "star-b", "2.0"))
    reg = Registry()
    with pytest.raises(PluginError) as e:
        reg.get("schedule", "good_sched", "training.schedule")
    assert "star-a 1.0" in str(e.value) and "star-b 2.0" in str(e.value)


def test_block_and_autoload_switches(monkeypatch):
    use(monkeypatch, FakeEP("a", good(), "star-a"), FakeEP("b", good(), "star-b"))
    monkeypatch.setenv("STAR_ENGINE_BLOCK_PLUGINS", "b")
    reg = Registry()
    assert set(reg.plugins) == {"a"} and reg.get("schedule", "good_sched", "k").plugin.distribution == "star-a"
    monkeypatch.setenv("STAR_ENGINE_DISABLE_AUTOLOAD", "1")
    assert Registry().plugins == {}


def test_register_hook_raising_is_recorded(monkeypatch):
    def boom(register):
        raise RuntimeError("half-built")
    use(monkeypatch, FakeEP("boom", plugin(register_schedules=boom), "star-boom"))
    assert "RuntimeError: half-built" in Registry().plugins["boom"].error


def test_observer_failure_names_plugin_and_hook(monkeypatch, tmp_path):
    def on_iteration_end(run_dir, iteration, metrics, losses):
        if iteration == 3:
            raise ValueError("tracker down")
    use(monkeypatch, FakeEP("tracker", plugin(on_iteration_end=on_iteration_end), "star-tracker", "0.9"))
    reg = Registry()
    reg.notify("on_iteration_end", run_dir=tmp_path, iteration=2, metrics=[], losses=[])
    with pytest.raises(PluginError) as e:
        reg.notify("on_iteration_end", run_dir=tmp_path, iteration=3, metrics=[], losses=[])
    assert "star-tracker 0.9" in str(e.value) and "on_iteration_end" in str(e.value) and "tracker down" in str(e.value)


def test_component_method_failure_names_plugin(monkeypatch):
    class Broken(Sched):
        def steps(self, iteration, n_examples, batch_size, grad_accum):
            return 1 // 0
    mod = plugin(register_schedules=lambda register: register("broken", Broken))
    use(monkeypatch, FakeEP("brk", mod, "star-brk", "3.3"))
    reg = Registry()
    sched = reg.create("schedule", "broken", {}, "training.schedule")
    with pytest.raises(PluginError) as e, reg.calling(sched, "steps"):
        sched.steps(1, 1, 1, 1)
    assert "star-brk 3.3" in str(e.value) and "'broken'.steps" in str(e.value) and "ZeroDivisionError" in str(e.value)


BUILTINS = {
    "task": {"cqa", "gsm8k", "addition", "math", "reasoning_gym"},
    "hint": {"cqa_correct", "gsm8k_answer", "addition_target", "math_answer", "reasoning_gym_answer"},
    "checker": {"exact", "mc_letter", "numeric", "regex", "math_verify", "gsm8k_strict", "gsm8k_flexible",
                "reasoning_gym_score"},
    "filter": {"hint_leak", "dedup", "length_cap"},
    "schedule": {"epochs", "steady_grow", "exponential_grow"},
    "sampler": {"uniform", "adaptive", "curriculum"},
    "backend": {"haiku_xmap"},
}


def test_builtins_come_through_entry_points():
    """The built-in components are registered exactly as a third party's would be."""
    env = {k: v for k, v in __import__("os").environ.items() if not k.startswith("STAR_ENGINE_")}
    res = subprocess.run([sys.executable, "-m", "star_engine", "plugins", "--json"], capture_output=True,
                         text=True, env=env, timeout=120)
    assert res.returncode == 0, res.stderr
    plugins = json.loads(res.stdout)
    found: dict[str, set[str]] = {}
    for p in plugins:
        assert p["error"] is None, p
        assert p["distribution"].startswith("star-engine-") and p["version"]
        for kind, names in p["components"].items():
            found.setdefault(kind, set()).update(names)
    for kind, names in BUILTINS.items():
        assert names <= found.get(kind, set()), (kind, found.get(kind))


class Hello:
    help = "print a greeting"

    def add_arguments(self, parser):
        parser.add_argument("name")

    def run(self, args):
        if args.name == "nobody":
            from star_engine.errors import UserError
            raise UserError("hello: nobody to greet")
        print(f"hello {args.name}")
        return 0


def test_register_commands_adds_subcommands(monkeypatch, capsys):
    from star_engine.cli import main

    use(monkeypatch, FakeEP("cmds", plugin(register_commands=lambda register: register("hello", Hello)), "star-cmd"))
    assert main(["hello", "world"]) == 0
    assert capsys.readouterr().out == "hello world\n"
    assert main(["hello", "nobody"]) == 2
    assert "error: hello: nobody to greet" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["--help"])
    assert "hello" in capsys.readouterr().out


def test_command_cannot_shadow_builtin(monkeypatch, capsys):
    from star_engine.cli import main

    use(monkeypatch, FakeEP("cmds", plugin(register_commands=lambda register: register("plugins", Hello)), "star-cmd"))
    assert main(["plugins", "--requirements"]) == 0
    assert "star-engine==" in capsys.readouterr().out


def test_create_returns_the_component_itself_and_calling_names_its_plugin(monkeypatch):
    """``create`` returns what the factory made, its attributes as they are (a backend's jax Mesh
    is a context decorator); where the core calls a method, ``Registry.calling`` names the plugin
    when it raises, and lets the core's own errors and other objects' failures through."""

    class Decorator:
        def __call__(self, fn):
            return fn

    class Backend:
        mesh = Decorator()
        table = dict

        def __init__(self):
            pass

        def boom(self):
            raise ValueError("bad")

    mod = plugin(register_backends=lambda register: register("b", Backend))
    use(monkeypatch, FakeEP("p", mod, "star-p", "0.2"))
    reg = Registry()
    backend = reg.create("backend", "b", {}, "model")
    assert type(backend) is Backend and backend.mesh is Backend.mesh and backend.table is dict
    with pytest.raises(PluginError, match=r"plugin 'p' \(star-p 0.2\): backend 'b'\.boom raised ValueError: bad at "):
        with reg.calling(backend, "boom"):
            backend.boom()
    with pytest.raises(UserError, match="mine"), reg.calling(backend, "boom"):
        raise UserError("mine")  # the core's own errors pass as they are
    with pytest.raises(ValueError, match="bad"), reg.calling(Backend(), "boom"):
        Backend().boom()  # not made by this registry: nobody to name
