"""The API reference's map of the package, and the resolution of references to re-exported names.

Every public object is documented once, on the page of the module that defines it (the deepest
module whose ``__all__`` lists it); a package's page lists its re-exported names in a summary
table that links there. A reference resolves to that one description when it names

* any public path of the object (``deepgp_gi.DeepGP``, ``deepgp_gi.posteriors.MeanFieldPosterior``),
* a name as the module holding the docstring sees it (``:class:`DeepPosterior``` in a module that
  imports it), or a method or property a class inherits (described on the base that defines it),
* or a bare name that exactly one documented object of the role's kind has (a summary table shows
  a docstring's first sentence away from its module).

A reference that names no documented object, or a bare name several objects share, still fails
the strict build, as do private names (they are not documented).
"""
from __future__ import annotations

import importlib
import inspect
import pkgutil
import re
from dataclasses import dataclass, field

import sphinx.ext.autosummary as autosummary
from sphinx.application import Sphinx
from sphinx.environment import BuildEnvironment

PACKAGE = "deepgp_gi"


@dataclass
class Member:
    name: str
    kind: str  # "module", "class", "exception", "function" or "data"
    target: str  # the full name it is documented under
    here: bool  # documented on this module's page (otherwise a link to where it is)
    # a class with private bases: the public classes of its MRO, whose members are not repeated
    # (the members it inherits from its private bases are described with it)
    inherited_from_private: str = ""


@dataclass
class Module:
    name: str
    submodules: list[str] = field(default_factory=list)
    members: list[Member] = field(default_factory=list)


def _kind(obj) -> str:
    if inspect.ismodule(obj):
        return "module"
    if inspect.isclass(obj):
        return "exception" if issubclass(obj, BaseException) else "class"
    if callable(obj) and (inspect.isroutine(obj) or hasattr(obj, "__wrapped__")):
        return "function"
    return "data"


def _public_names(module) -> list[str]:
    names = getattr(module, "__all__", None)
    if names is not None:
        return list(names)
    return [name for name, value in vars(module).items()
            if not name.startswith("_") and not inspect.ismodule(value)
            and getattr(value, "__module__", None) == module.__name__]


def _stop_classes(cls) -> str:
    """For a class of the package with a private base class of the package, the names of the
    public classes it inherits from (``:inherited-members:`` stops there); else ``""``."""
    ancestors = cls.__mro__[1:]
    if not any(base.__name__.startswith("_") and base.__module__.startswith(f"{PACKAGE}.")
               for base in ancestors):
        return ""
    public = (base.__name__ for base in ancestors if not base.__name__.startswith("_"))
    return ", ".join(dict.fromkeys(public))


def scan(package: str = PACKAGE) -> dict[str, Module]:
    """Import every module of ``package`` and decide where each public name is documented."""
    root = importlib.import_module(package)
    found = pkgutil.walk_packages(root.__path__, f"{package}.")
    names = [package] + sorted(info.name for info in found
                               if not any(part.startswith("_") for part in info.name.split(".")))
    modules = {name: importlib.import_module(name) for name in names}
    # (name, object) -> the modules that export it
    exporters: dict[tuple[str, int], list[str]] = {}
    for modname, module in modules.items():
        for name in _public_names(module):
            obj = getattr(module, name)
            if not inspect.ismodule(obj):
                exporters.setdefault((name, id(obj)), []).append(modname)

    def home(name: str, obj, candidates: list[str]) -> str:
        defining = [m for m in candidates if getattr(obj, "__module__", None) == m]
        if defining:
            return defining[0]
        return sorted(candidates, key=lambda m: (-m.count("."), m))[0]

    result = {name: Module(name) for name in names}
    for modname, module in modules.items():
        entry = result[modname]
        entry.submodules = [n for n in names if n.rpartition(".")[0] == modname]
        for name in _public_names(module):
            obj = getattr(module, name)
            kind = _kind(obj)
            if kind == "module":
                if obj.__name__ not in entry.submodules:
                    entry.members.append(Member(name, kind, obj.__name__, False))
                continue
            where = home(name, obj, exporters[(name, id(obj))])
            stop = _stop_classes(obj) if kind in ("class", "exception") else ""
            entry.members.append(Member(name, kind, f"{where}.{name}", where == modname, stop))
    return result


# -- resolving references -------------------------------------------------------------------------

def _import_path(path: str):
    """The object a dotted path names, importing the longest module prefix; ``None`` if none."""
    parts = path.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except Exception:  # not a module (or one that fails to import): a shorter prefix
            continue
        try:
            for part in parts[cut:]:
                obj = getattr(obj, part)
        except AttributeError:
            return None
        return obj
    return None


class Resolver:
    def __init__(self, api: dict[str, Module]):
        self.documented: dict[tuple[str, int], str] = {}
        for module in api.values():
            for member in module.members:
                if member.here:
                    obj = getattr(importlib.import_module(module.name), member.name)
                    self.documented[(member.name, id(obj))] = member.target

    def canonical(self, path: str) -> list[str]:
        """Full names the object at ``path`` may be documented under, best first."""
        parts = path.split(".")
        out = []
        # a documented object, or an attribute of one (of the class that defines it: a method or
        # property a class inherits is described on its base)
        for cut in range(len(parts), 0, -1):
            obj = _import_path(".".join(parts[:cut]))
            if obj is None:
                continue
            target = self.documented.get((parts[cut - 1], id(obj)))
            if target is None:
                continue
            rest = parts[cut:]
            out.append(".".join([target, *rest]))
            if inspect.isclass(obj) and rest:
                for base in obj.__mro__[1:]:
                    base_target = self.documented.get((base.__name__, id(base)))
                    if base_target is not None and rest[0] in vars(base):
                        out.append(".".join([base_target, *rest]))
            break
        return out


_resolver: Resolver | None = None


def _missing_reference(app: Sphinx, env: BuildEnvironment, node, contnode):
    """Resolve a Python reference that Sphinx could not, by importing what it names."""
    if node.get("refdomain") != "py" or _resolver is None:
        return None
    target = node["reftarget"].lstrip(".~")
    modname, clsname = node.get("py:module"), node.get("py:class")
    paths = []
    if modname and clsname:
        paths.append(f"{modname}.{clsname}.{target}")
    if modname:
        paths.append(f"{modname}.{target}")
    paths.append(target)
    domain = env.get_domain("py")
    candidates = [candidate for path in paths if path == PACKAGE or path.startswith(f"{PACKAGE}.")
                  for candidate in _resolver.canonical(path)]
    if not target.startswith("_") and "." not in target:
        # the one documented object of that name and kind (a name used in a summary table away
        # from its module, or a sibling module's name); none or several: unresolved
        objtypes = set(domain.objtypes_for_role(node["reftype"]) or ())
        same = [name for name, entry in domain.objects.items()
                if name.rpartition(".")[2] == target and not entry.aliased
                and entry.objtype in objtypes]
        if len(same) == 1:
            candidates.append(same[0])
    for candidate in candidates:
        if candidate not in domain.objects:
            continue
        new = node.deepcopy()
        new["reftarget"] = candidate
        new["refspecific"] = False
        new["py:module"] = None
        new["py:class"] = None
        resolved = domain.resolve_xref(env, node["refdoc"], app.builder, node["reftype"],
                                       candidate, new, contnode)
        if resolved is None:  # the role names another kind (``:func:`` for a class)
            found = domain.resolve_any_xref(env, node["refdoc"], app.builder, candidate, new,
                                            contnode)
            resolved = found[0][1] if found else None
        if resolved is not None:
            return resolved
    return None


def _public_bases(app: Sphinx, name: str, obj, options, bases: list) -> None:
    """Show a class's public ancestors in its "Bases:" line, in place of its private bases."""
    def public(base) -> list:
        if not getattr(base, "__name__", "").startswith("_") or not inspect.isclass(base):
            return [base]
        return [ancestor for parent in base.__bases__ for ancestor in public(parent)]

    replaced = [ancestor for base in bases for ancestor in public(base)]
    bases[:] = [base for i, base in enumerate(replaced) if base not in replaced[:i]]


# -- summary tables ------------------------------------------------------------------------------

# stands for a period that ends no sentence while autosummary looks for the first sentence
_KEEP = "\ue000"
_ABBREVIATION = re.compile(
    r"\b(App|Apps|Eq|Eqs|Sec|Fig|Tab|al|e\.g|i\.e|cf|vs|resp|approx)\.(?=\s|$)")
_LONE_PERIODS = re.compile(r"(?<=\S\s)\.+(?=\s|$)")  # ``0 .. n``, ``a . b``
_extract_summary = autosummary.extract_summary


def _first_sentence(doc: list[str], document) -> str:
    """autosummary's first sentence of a docstring, not cut after "App." or inside ``0 .. n``."""
    kept = [_ABBREVIATION.sub(lambda m: m.group(1) + _KEEP, line) for line in doc]
    kept = [_LONE_PERIODS.sub(lambda m: _KEEP * len(m.group()), line) for line in kept]
    return _extract_summary(kept, document).replace(_KEEP, ".")


def _builder_inited(app: Sphinx) -> None:
    global _resolver
    _resolver = Resolver(app.config.autosummary_context["api"])


def setup(app: Sphinx):
    autosummary.extract_summary = _first_sentence
    app.connect("builder-inited", _builder_inited)
    app.connect("missing-reference", _missing_reference)
    app.connect("autodoc-process-bases", _public_bases)
    return {"parallel_read_safe": True, "parallel_write_safe": True}


__all__ = ["Member", "Module", "scan", "Resolver", "setup"]
