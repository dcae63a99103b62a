"""`hetspec devices`: the devices and runtimes this machine has."""

import argparse
import json

from devices import list_devices


def add_parser(sub) -> None:
    d = sub.add_parser("devices", help="list the devices and runtimes this machine has")
    d.add_argument("--json", action="store_true", help="print one JSON object")
    d.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    found = list_devices()
    print(json.dumps(found, indent=2) if args.json else format_devices(found))
    return 0


def format_devices(found: dict) -> str:
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
