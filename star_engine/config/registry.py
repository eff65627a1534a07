"""Plugin discovery and the component registry (a typed façade over ``pm.hook``).

Entry points of the ``star_engine`` group are loaded one at a time: a plugin
that fails to import, has a hook with a wrong signature or a misspelled hook is
recorded with its distribution and version and left out; it is fatal only when
an experiment names one of its components (or, for unknown components, when a
broken plugin might have provided them).

Environment switches:
    STAR_ENGINE_DISABLE_AUTOLOAD=1   load no entry points (tests register by hand)
    STAR_ENGINE_BLOCK_PLUGINS=a,b    skip the named entry points
    STAR_ENGINE_PLUGINS=mod1,mod2    also load these importable modules as plugins
"""

from __future__ import annotations

import importlib
import dataclasses
import json
import os
import traceback
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, field
from importlib import metadata
from types import ModuleType
from typing import Any
from collections.abc import Callable, Iterator, Mapping

import pluggy

from .. import hooks
from ..errors import PluginError, StarEngineError, UserError
from .schema import REQUIRED, close_matches, declared, open_ended, validate

GROUP = "star_engine"
KINDS = {  # kind -> the register_* hook that fills it
    "task": "register_tasks",
    "checker": "register_checkers",
    "hint": "register_hint_formatters",
    "filter": "register_filters",
    "schedule": "register_schedules",
    "sampler": "register_samplers",
    "tuner": "register_tuners",
    "backend": "register_backends",
    "engine": "register_engines",
    "command": "register_commands",
}
OBSERVER_HOOKS = ("on_run_start", "on_iteration_start", "on_iteration_end", "on_run_end")


@dataclass
class PluginInfo:
    name: str
    distribution: str
    version: str
    hooks: list[str] = field(default_factory=list)
    components: dict[str, list[str]] = field(default_factory=dict)
    error: str | None = None

    @property
    def label(self) -> str:
        return f"plugin '{self.name}' ({self.distribution} {self.version})"

    def as_dict(self) -> dict[str, Any]:
        return {"name": self.name, "distribution": self.distribution, "version": self.version,
                "hooks": self.hooks, "components": self.components, "error": self.error}


@dataclass
class Component:
    kind: str
    name: str
    factory: Callable[..., Any]
    plugin: PluginInfo

    @property
    def label(self) -> str:
        """``plugin 'p' (dist 1.0): checker 'name'``: who to blame for what it does."""
        return f"{self.plugin.label}: {self.kind} '{self.name}'"


def _short_error(exc: BaseException) -> str:
    frame = traceback.extract_tb(exc.__traceback__)[-1:] if exc.__traceback__ else []
    where = f" at {frame[0].filename}:{frame[0].lineno}" if frame else ""
    return f"{type(exc).__name__}: {exc}{where}"


@contextmanager
def calling(origin: Component | None, method: str) -> Iterator[None]:
    """Blame ``origin`` (the component whose ``method`` the block calls) for what the call raises:
    an exception that is not the core's own (``StarEngineError``) nor Ctrl-C becomes a
    ``PluginError`` naming its plugin, the component, the method and where it was raised (the
    exception is its ``__cause__``). Keep the block to that one call. ``origin`` None (an object
    no registry built: a test's double) lets everything through."""
    try:
        yield
    except (StarEngineError, KeyboardInterrupt):
        raise
    except Exception as e:  # noqa: BLE001 -- any other failure of a plugin's method is the plugin's
        if origin is None:
            raise
        raise PluginError(f"{origin.label}.{method} raised {_short_error(e)}") from e


class Registry:
    def __init__(self, autoload: bool | None = None, blocked: set[str] | None = None):
        self.pm = pluggy.PluginManager(GROUP)
        self.pm.add_hookspecs(hooks)
        self.plugins: dict[str, PluginInfo] = {}
        self.components: dict[str, dict[str, Component]] = {k: {} for k in KINDS}
        self.conflicts: dict[tuple[str, str], list[PluginInfo]] = {}
        self._built: list[tuple[Any, Component]] = []  # what ``create`` returned, and from what
        if autoload is None:
            autoload = os.environ.get("STAR_ENGINE_DISABLE_AUTOLOAD", "") in ("", "0")
        if blocked is None:
            blocked = {b.strip() for b in os.environ.get("STAR_ENGINE_BLOCK_PLUGINS", "").split(",") if b.strip()}
        self.blocked = blocked
        if autoload:
            self._load_entry_points()
        for mod in filter(None, (m.strip() for m in os.environ.get("STAR_ENGINE_PLUGINS", "").split(","))):
            self._load_module(mod)

    # -- loading ------------------------------------------------------------------
    def _load_entry_points(self) -> None:
        eps = sorted(metadata.entry_points(group=GROUP), key=lambda e: e.name)
        for ep in eps:
            if ep.name in self.blocked:
                continue
            dist = ep.dist.name if ep.dist else "unknown"
            version = ep.dist.version if ep.dist else "unknown"
            info = PluginInfo(ep.name, dist, version)
            try:
                module = ep.load()
            except Exception as e:  # noqa: BLE001 -- any import failure is the plugin's, not ours
                info.error = f"failed to import {ep.value}: {_short_error(e)}"
                self.plugins[ep.name] = info
                continue
            self.add(module, info)

    def _load_module(self, name: str) -> None:
        info = PluginInfo(name, "<STAR_ENGINE_PLUGINS>", "0")
        try:
            module = importlib.import_module(name)
        except Exception as e:  # noqa: BLE001
            info.error = f"failed to import {name}: {_short_error(e)}"
            self.plugins[name] = info
            return
        self.add(module, info)

    def add(self, plugin: ModuleType | object, info: PluginInfo | None = None) -> PluginInfo:
        """Register one plugin object (a module or instance with hook implementations)."""
        if info is None:
            name = getattr(plugin, "__name__", type(plugin).__name__)
            info = PluginInfo(name, "<local>", "0")
        self.plugins[info.name] = info
        try:
            self.pm.register(plugin, name=info.name)
            self.pm.check_pending()  # misspelled hooks fail here, one plugin at a time
        except pluggy.PluginValidationError as e:
            if self.pm.is_registered(plugin):
                self.pm.unregister(plugin)
            info.error = self._explain_validation(plugin, e)
            return info
        except ValueError as e:  # duplicate plugin name
            info.error = str(e)
            return info
        info.hooks = sorted(h.name for h in self.pm.get_hookcallers(plugin) or [])
        for kind, hook in KINDS.items():
            impls = [i for i in getattr(self.pm.hook, hook).get_hookimpls() if i.plugin is plugin]
            for impl in impls:
                try:
                    impl.function(register=self._registrar(kind, info))
                except Exception as e:  # noqa: BLE001
                    info.error = f"{hook} raised {_short_error(e)}"
        return info

    def _explain_validation(self, plugin: object, e: pluggy.PluginValidationError) -> str:
        known = sorted(n for n in dir(hooks) if n.startswith(("register_", "on_")))
        for attr in dir(plugin):
            fn = getattr(plugin, attr, None)
            if callable(fn) and hasattr(fn, "star_engine_impl") and attr not in known:
                return f"hook '{attr}' is not a star_engine hook{close_matches(attr, known)}"
        detail = "; ".join(line.strip() for line in str(e).splitlines() if line.strip())  # one line
        return f"invalid hook implementation: {detail}"

    def _registrar(self, kind: str, info: PluginInfo) -> Callable[[str, Callable[..., Any]], None]:
        def register(name: str, factory: Callable[..., Any]) -> None:
            if not isinstance(name, str) or not name or not callable(factory):
                raise TypeError(f"register(name, factory) needs a name and a callable, got {name!r}, {factory!r}")
            table = self.components[kind]
            if name in table and table[name].plugin is not info:
                self.conflicts.setdefault((kind, name), [table[name].plugin]).append(info)
            table[name] = Component(kind, name, factory, info)
            info.components.setdefault(kind, []).append(name)
        return register

    # -- lookup -------------------------------------------------------------------
    def names(self, kind: str) -> list[str]:
        self._kind(kind)
        return sorted(self.components[kind])

    def _kind(self, kind: str) -> None:
        if kind not in KINDS:
            raise ValueError(f"unknown component kind {kind!r}; kinds: {', '.join(KINDS)}")

    def get(self, kind: str, name: str, key: str) -> Component:
        """The component ``name`` of ``kind``; ``key`` is the TOML key path for errors."""
        self._kind(kind)
        if (kind, name) in self.conflicts:
            who = " and ".join(f"{p.distribution} {p.version}" for p in self.conflicts[(kind, name)])
            raise PluginError(f"{key}: {kind} '{name}' is registered by both {who}; block one with "
                              f"STAR_ENGINE_BLOCK_PLUGINS", key=key)
        comp = self.components[kind].get(name)
        if comp is not None:
            if comp.plugin.error:
                raise PluginError(f"{key}: {kind} '{name}' comes from broken {comp.plugin.label}: {comp.plugin.error}", key=key)
            return comp
        available = self.names(kind)
        msg = (f"{key}: unknown {kind} '{name}'; available: {', '.join(available) or '(none)'}"
               f"{close_matches(name, available)}")
        broken = [p for p in self.plugins.values() if p.error]
        if broken:
            msg += "; broken plugins that may provide it: " + "; ".join(f"{p.label}: {p.error}" for p in broken)
        raise PluginError(msg, key=key)

    def create(self, kind: str, name: str, options: Mapping[str, Any], key: str,
               options_key: str | None = None) -> Any:
        """Build a component from its TOML options, after checking them against the options its
        factory declares (``schema.declared``: names, types, ranges; defaults filled in).
        ``key`` is the TOML key path of the component's name, ``options_key`` that of its
        options (default: ``key``, for a component given as a table with ``name``). A
        ``UserError`` the factory raises itself (a rule across options) gets the options' key."""
        comp = self.get(kind, name, key)
        okey = options_key or key
        checked = check_options(comp.factory, options, okey, f"{kind} '{name}'")
        try:
            obj = construct(comp.factory, checked)
        except UserError as e:
            raise _within(e, okey, checked) from None
        except Exception as e:  # noqa: BLE001
            raise PluginError(f"{key}: {comp.plugin.label} failed to create {kind} '{name}': {_short_error(e)}",
                              key=key) from e
        self._built.append((obj, comp))
        return obj

    def origin(self, obj: Any) -> Component | None:
        """The component ``obj`` was created from (``create``), or None when this registry did not
        create it."""
        return next((comp for built, comp in self._built if built is obj), None)

    def calling(self, obj: Any, method: str) -> AbstractContextManager[None]:
        """``with registry.calling(task, "prompt"): task.prompt(kind)``: a failure of the call
        names the plugin that provides ``obj`` (``calling``). Where the core calls a
        component's method, it calls it so."""
        return calling(self.origin(obj), method)

    def returned(self, obj: Any, method: str, value: Any, ok: bool, expected: str) -> Any:
        """``value``, what ``obj.method`` returned, when ``ok``; else a ``PluginError`` naming the
        plugin that provides ``obj`` (a component broke its protocol: its fault, not the core's)."""
        if not ok:
            comp = self.origin(obj)
            who = comp.label if comp is not None else type(obj).__name__
            shown = repr(value)
            raise PluginError(f"{who}.{method} returned {shown[:200]}{'...' if len(shown) > 200 else ''}, "
                              f"expected {expected}")
        return value

    # -- observers ----------------------------------------------------------------
    def notify(self, hook: str, **kwargs: Any) -> None:
        """Call an observer hook on every plugin, naming the plugin if one fails
        (a run's process 0 only: ``Experiment.notify``)."""
        assert hook in OBSERVER_HOOKS
        for impl in getattr(self.pm.hook, hook).get_hookimpls():
            info = self.plugins.get(self.pm.get_name(impl.plugin) or "")
            try:
                impl.function(**{k: kwargs[k] for k in impl.argnames})
            except StarEngineError:
                raise
            except Exception as e:  # noqa: BLE001
                label = info.label if info else repr(impl.plugin)
                raise PluginError(f"{label} failed in hook {hook}: {_short_error(e)}") from e

    def describe(self) -> list[dict[str, Any]]:
        return [self.plugins[n].as_dict() for n in sorted(self.plugins)]

    def requirements(self) -> list[str]:
        # Plugins loaded by hand (tests, STAR_ENGINE_PLUGINS) have no distribution to pin.
        dists = {(p.distribution, p.version) for p in self.plugins.values() if not p.distribution.startswith("<")}
        dists.add(("star-engine", metadata.version("star-engine")))
        return sorted(f"{d}=={v}" for d, v in dists)


def _within(e: UserError, okey: str, options: Mapping[str, Any]) -> UserError:
    """A factory's own ``UserError`` (a rule across options, a file an option names) placed in
    its options table ``okey``: an option it names first (``"stop: ..."``, or ``key="stop"``)
    makes the key ``okey.stop``; any other message is the table's."""
    message = str(e)
    head = e.key or message.split(":", 1)[0]
    if head in options and message.startswith(f"{head}:"):
        return type(e)(f"{okey}.{message}", key=f"{okey}.{head}")
    return type(e)(prefix_key(okey, message), key=okey)


def prefix_key(key: str, message: str) -> str:
    """``key: message``, unless the message already starts with that key path
    (``model.n_layer: ...`` from a backend whose options live in ``[model]``)."""
    if message == key or message.startswith((f"{key}.", f"{key}:", f"{key}[")):
        return message
    return f"{key}: {message}"


def options_type(factory: Callable[..., Any]) -> type | None:
    """The dataclass a factory takes its options as (``factory.Options``), if it declares one:
    the registry then calls ``factory(factory.Options(**checked))``; otherwise the options are
    the factory's keyword parameters, and it is called with them."""
    t = getattr(factory, "Options", None)
    return t if isinstance(t, type) and dataclasses.is_dataclass(t) else None


def declared_options(factory: Callable[..., Any]) -> dict[str, Any] | None:
    """What ``factory`` declares (``schema.declared``), or None without a readable signature."""
    try:
        return declared(options_type(factory) or factory)
    except (TypeError, ValueError):
        return None


def check_options(factory: Callable[..., Any], options: Mapping[str, Any], key: str, what: str) -> dict[str, Any]:
    """``options`` checked against what ``factory`` declares (``schema.validate``) and
    completed with its defaults; a factory without a readable signature takes them as given."""
    found = declared_options(factory)
    if found is None:
        return dict(options)
    open_ = options_type(factory) is None and open_ended(factory)
    return validate(options, found, f"{key}.", what=what, extra=open_)


def construct(factory: Callable[..., Any], checked: Mapping[str, Any]) -> Any:
    """The component, from options ``check_options`` returned."""
    t = options_type(factory)
    return factory(t(**checked)) if t is not None else factory(**checked)


def option_defaults(factory: Callable[..., Any]) -> dict[str, Any]:
    """A factory's options with a default and their defaults, as JSON values (a tuple as a
    list); one whose default JSON cannot hold (an object) is left out."""
    out = {}
    for name, opt in (declared_options(factory) or {}).items():
        if opt.default is REQUIRED:
            continue
        try:
            out[name] = json.loads(json.dumps(opt.default, allow_nan=False))
        except (TypeError, ValueError):
            continue
    return out
