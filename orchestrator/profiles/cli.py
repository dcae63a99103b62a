"""`hetspec profile check` and `hetspec devices`: the profile verbs this package owns."""

import argparse
import json


def add_parsers(psub) -> None:
    """Register this package's verbs on the `profile` group (`psub` is its subparsers action)."""
    c = psub.add_parser("check", help="check a profile against the devices on this machine")
    c.add_argument("profile", metavar="FILE|NAME", help="a shipped profile name (e.g. cpu) or a YAML file")
    c.add_argument("--json", action="store_true", help="print the placement plan as JSON")
    c.set_defaults(func=_check)


def add_devices_parser(sub) -> None:
    """Register `hetspec devices` on the top-level subparsers."""
    d = sub.add_parser("devices", help="list the devices and runtimes this machine has")
    d.add_argument("--json", action="store_true", help="print one JSON object")
    d.set_defaults(func=_devices)


def _check(args: argparse.Namespace) -> int:
    """Exit 0 when the profile runs here, 1 when it cannot (the plan says why)."""
    from orchestrator.profiles import load_profile
    from orchestrator.profiles.check import check_profile, format_check

    report = check_profile(load_profile(args.profile))
    print(json.dumps(report, indent=2) if args.json else format_check(report))
    return 0 if report["ok"] else 1


def _devices(args: argparse.Namespace) -> int:
    from devices.probe import list_devices

    found = list_devices()
    print(json.dumps(found, indent=2) if args.json else _format_devices(found))
    return 0


def _format_devices(found: dict) -> str:
    lines = []
    for kind, entry in found["backends"].items():
        if not entry["devices"]:
            lines.append(f"{kind:<5} absent: {entry['reason']}")
        for d in entry["devices"]:
            mem = f", {d['total_memory'] / (1 << 30):.1f} GiB" if d["total_memory"] else ""
            model = d["extra"].get("model") or f"{d['extra'].get('cores', '?')} cores"
            lines.append(f"{d['name']:<5} present: {model}{mem}, dtypes {' '.join(d['dtypes'])}, "
                         f"pinned memory {'yes' if d['pinned_memory'] else 'no'}")
    ort = found["onnxruntime"]
    lines.append(f"onnxruntime providers: {', '.join(ort['providers']) or ort['reason']}")
    lines.append("packages: " + ", ".join(f"{p} {'yes' if ok else 'no'}" for p, ok in found["packages"].items()))
    return "\n".join(lines)
