"""`hetspec drafter serve`: one of a profile's local drafters as `hetspec.v1.Drafter` sessions."""

import argparse

from orchestrator.assemble import build_drafter_servicer
from orchestrator.cli.common import on_signal, ready
from orchestrator.cli.serve import add_server_args, cpu_latency, latency_note
from orchestrator.errors import HetspecError
from orchestrator.profiles import load_profile
from orchestrator.server import server_options, start_server
from orchestrator.server.one_thread import OneThread


def add_parser(sub, parser_class) -> None:
    d = sub.add_parser("drafter", help="drafter workers for remote targets")
    dsub = d.add_subparsers(dest="drafter_command", required=True, parser_class=parser_class)
    ds = dsub.add_parser("serve", help="serve a local drafter as hetspec.v1.Drafter sessions over gRPC")
    add_server_args(ds, "server.drafter_port")
    ds.add_argument("--drafter", default=None, metavar="NAME",
                    help="which of the profile's drafters to serve (default: speculation.drafter)")
    ds.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    profile = load_profile(args.profile)
    name = args.drafter or profile.speculation.drafter
    if name is None:
        raise HetspecError(f"profile {profile.source} names no drafter (speculation.drafter); pass --drafter NAME")
    if name not in profile.drafters:
        raise HetspecError(f"--drafter: profile {profile.source} has no drafter {name!r} "
                           f"(it has {', '.join(profile.drafters) or 'none'})")
    options = server_options(profile, args.host, args.port, profile.server.drafter_port)
    latency = cpu_latency(args, profile)
    servicer, config = build_drafter_servicer(profile, name)
    # a torch model on the CPU runs on this (main) thread, where torch loaded it: on gRPC's threads a
    # torch drafter ran 1.5x slower (server/one_thread.py); others run on gRPC's threads, without the
    # hand-over's two thread wake-ups per call
    main = OneThread()
    if servicer.drafter.torch_on_cpu:
        servicer.drafter_thread = main
    served = start_server(options, [servicer.register])

    def shutdown() -> None:  # the drafter keeps answering meanwhile: open sessions get their grace
        served.stop()
        main.stop()

    on_signal(shutdown)
    ready(f"serving hetspec.v1.Drafter ({config.drafter_kind}) on {options.host}:{served.port} "
          f"(profile {profile.source}{latency_note(latency)})")
    main.run()  # the drafter's calls if handed over, else only the wait for a signal
    servicer.drafter.close()
    if latency is not None:
        latency.close()
    return 0
