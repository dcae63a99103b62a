"""`hetspec profile check` and `hetspec devices`: the profile verbs this package owns."""

import argparse


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
    from orchestrator.errors import HetspecError

    raise HetspecError("profile check is not implemented yet")


def _devices(args: argparse.Namespace) -> int:
    from orchestrator.errors import HetspecError

    raise HetspecError("devices is not implemented yet")
