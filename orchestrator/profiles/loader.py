"""YAML file or shipped name -> validated `Profile`; every failure is one line naming the key path."""

from importlib import resources
from pathlib import Path

import yaml
from pydantic import ValidationError

from orchestrator.errors import ProfileError
from orchestrator.profiles.profile import Profile
from orchestrator.profiles.schema import DRAFTER_KINDS

SHIPPED_PACKAGE = "orchestrator.profiles.shipped"
MAX_PROFILE_BYTES = 1 << 20


def shipped_profiles() -> list[str]:
    """Names of the profiles that ship inside the package (`cpu`, `cpu-ngram`, ...)."""
    files = resources.files(SHIPPED_PACKAGE).iterdir()
    return sorted(f.name[:-5] for f in files if f.name.endswith(".yaml"))


def load_profile(ref: str) -> Profile:
    """A shipped profile name (e.g. `cpu`) or a path to a YAML file -> a validated `Profile`."""
    return parse_profile(*_read(str(ref)))


def read_profile_text(ref: str) -> tuple[str, str]:
    """(YAML text, source) of a shipped name or a file: what travels to another host's process."""
    return _read(str(ref))


def parse_profile(text: str, source: str) -> Profile:
    """A profile's YAML text -> a validated `Profile` (`source` names it in errors)."""
    data = _parse_yaml(text, source)
    try:
        profile = Profile.model_validate(data)
    except ValidationError as e:
        raise ProfileError(f"profile {source}: {_first_error(e)}") from None
    _check_references(profile, source)
    profile._source = source
    return profile


def _read(ref: str) -> tuple[str, str]:
    path = Path(ref).expanduser()
    if ref in shipped_profiles() and not path.exists():
        return (resources.files(SHIPPED_PACKAGE) / f"{ref}.yaml").read_text(), ref
    if not path.exists():
        raise ProfileError(f"no profile file {ref!r} and no shipped profile of that name "
                           f"(shipped: {', '.join(shipped_profiles())})")
    if not path.is_file():
        raise ProfileError(f"profile {ref}: not a file")
    if path.stat().st_size > MAX_PROFILE_BYTES:
        raise ProfileError(f"profile {ref}: larger than {MAX_PROFILE_BYTES} bytes; not a profile")
    try:
        return path.read_text(encoding="utf-8"), str(path)
    except (OSError, UnicodeDecodeError) as e:
        raise ProfileError(f"profile {ref}: cannot read it as UTF-8 text ({e})") from None


class _UniqueKeyLoader(yaml.SafeLoader):
    """SafeLoader that refuses a key given twice in one mapping (YAML would keep the last silently)."""

    def construct_mapping(self, node, deep=False):
        seen = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if isinstance(key, (str, int, float, bool)) and key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"duplicate key {key!r}", key_node.start_mark)
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


def _parse_yaml(text: str, source: str) -> dict:
    try:
        data = yaml.load(text, Loader=_UniqueKeyLoader)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise ProfileError(f"profile {source}: not valid YAML{where}: {problem}") from None
    if data is None:
        raise ProfileError(f"profile {source}: empty file (a profile needs at least `version: 1` and `target:`)")
    if not isinstance(data, dict):
        raise ProfileError(f"profile {source}: (top level): expected a mapping of sections, "
                           f"got {type(data).__name__}")
    return data


def _first_error(e: ValidationError) -> str:
    """pydantic's first error as `key.path: message`, plus how many more there were."""
    errors = e.errors(include_url=False)
    err = errors[0]
    loc = list(err["loc"])
    if len(loc) > 2 and loc[0] == "drafters" and loc[2] in DRAFTER_KINDS:
        del loc[2]  # the discriminated union's tag, not a key the user wrote
    path = ".".join(str(p) for p in loc if p != "[key]") or "(top level)"
    more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
    return f"{path}: {_message(err)}{more}"


def _message(err: dict) -> str:
    kind, msg = err["type"], err["msg"]
    if kind == "missing":
        return "missing required key"
    if kind == "union_tag_not_found":
        return f"missing 'kind' (one of {', '.join(DRAFTER_KINDS)})"
    if kind == "union_tag_invalid":
        return f"unknown kind {err['input'].get('kind')!r} (one of {', '.join(DRAFTER_KINDS)})"
    if kind == "string_pattern_mismatch":
        return f"{err['input']!r}: names may use only letters, digits, '_', '.' and '-'"
    if kind == "literal_error":
        return f"{msg}, got {err['input']!r}"
    if msg.startswith("Value error, "):
        return msg[len("Value error, "):]
    got = err.get("input")
    shown = repr(got) if isinstance(got, (str, int, float, bool, type(None))) else type(got).__name__
    return f"{msg}, got {shown}"


def _check_references(profile: Profile, source: str) -> None:
    """speculation.drafter(s) and every fallback name a defined drafter; fallbacks have no loops."""
    names = set(profile.drafters)
    known = ", ".join(sorted(names)) or "none defined"
    s = profile.speculation
    refs = ([("speculation.drafter", s.drafter)] if s.drafter is not None else []) + \
        [(f"speculation.drafters.{i}", name) for i, name in enumerate(s.drafters)]
    for key, name in refs:
        if name not in names:
            raise ProfileError(f"profile {source}: {key}: unknown drafter {name!r} (drafters: {known})")
    for name, spec in profile.drafters.items():
        for i, other in enumerate(spec.fallback):
            if other not in names:
                raise ProfileError(f"profile {source}: drafters.{name}.fallback.{i}: unknown drafter "
                                   f"{other!r} (drafters: {known})")
    for name in profile.drafters:
        loop = _find_loop(profile, [name])
        if loop:
            raise ProfileError(f"profile {source}: drafters.{loop[0]}.fallback: fallback loop "
                               f"{' -> '.join(loop)}")


def _find_loop(profile: Profile, path: list[str]) -> list[str] | None:
    """A fallback cycle reachable from path[-1], as the names along it, or None."""
    for other in profile.drafters[path[-1]].fallback:
        if other in path:
            return path[path.index(other):] + [other]
        loop = _find_loop(profile, path + [other])
        if loop:
            return loop
    return None
