"""What several verbs share: the parser class, common flags, the per-request flags, output."""

import argparse
import json
import signal
import sys
import threading
from collections.abc import Callable

from orchestrator.acceptance_policy import LOSSLESS, POLICIES, parse_option_pairs
from orchestrator.config import MAX_SPECULATIVE_TOKENS, SamplingParams
from orchestrator.errors import HetspecError, InvalidRequestError

PRECISIONS = ("int4", "int8", "fp32")


class UsageError(HetspecError):
    """A bad flag found after parsing (a policy option, say): exit 2, like argparse's own."""


class Parser(argparse.ArgumentParser):
    def error(self, message: str):  # one line, not usage + message
        self.exit(2, f"{self.prog}: error: {message}\n")


def positive(text: str) -> int:
    value = int(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be positive, got {value}")
    return value


def k_value(text: str) -> int | str:
    """`-k auto` or `-k N` (0..32)."""
    if text == "auto":
        return text
    try:
        k = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be auto or a number, got {text!r}") from None
    if not 0 <= k <= MAX_SPECULATIVE_TOKENS:
        raise argparse.ArgumentTypeError(f"must be in 0..{MAX_SPECULATIVE_TOKENS}, got {k}")
    return k


def add_model_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default=None,
                   help="HF checkpoint dir, GGUF file, or smollm2-135m / gemma3-270m (default smollm2-135m)")


def add_export_args(p: argparse.ArgumentParser, defaults: bool = True) -> None:
    """The ONNX drafter's weights; with `defaults=False` unset flags stay None (a profile decides)."""
    p.add_argument("--precision", choices=PRECISIONS, default="int4" if defaults else None,
                   help="ONNX drafter weights (default int4); with --drafter mtp: run the MTP drafter's ONNX "
                        "export at this precision (without it: torch or the fp32 export, whichever a timed "
                        "call runs faster)")
    p.add_argument("--block-size", type=positive, default=32 if defaults else None,
                   help="quantization block size (default 32)")
    p.add_argument("--int8-lm-head", action=argparse.BooleanOptionalAction, default=True if defaults else None,
                   help="keep the sensitive lm_head at 8 bits (INT4 only; default on: better acceptance)")


def add_sampling_args(p: argparse.ArgumentParser) -> None:
    """The per-request flags shared by `generate` and `client`."""
    p.add_argument("--no-spec", action="store_true", help="target only, no speculation")
    # unset: the profile's (generate) or the server's (client) k
    p.add_argument("-k", "--num-speculative-tokens", type=k_value, default=None, metavar="auto|N",
                   help="draft length: auto (a cost model picks each sequence's k every step, 0 where "
                        "speculation does not pay) or a fixed N (default: the profile's, auto)")
    lossy = ", ".join(x for x in POLICIES if x not in LOSSLESS)
    p.add_argument("--acceptance", choices=POLICIES, default=None,
                   help=f"acceptance policy (default: the profile's, rejection: lossless). LOSSY, greedy only: {lossy}")
    p.add_argument("--acceptance-option", action="append", default=[], metavar="KEY=VALUE",
                   help="an option of the acceptance policy, e.g. delta=0.15 or budget=0.05 (repeatable)")
    p.add_argument("--max-new-tokens", type=positive, default=128)
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--top-k", type=int, default=0)
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")
    p.add_argument("--raw", action="store_true", help="do not apply the model's chat template")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of streaming")


def sampling_params(args: argparse.Namespace) -> SamplingParams:
    """The per-request flags as validated `SamplingParams` (with a non-empty prompt)."""
    if not args.prompt.strip():
        raise HetspecError("prompt is empty")
    k = args.num_speculative_tokens
    try:
        options = tuple(sorted(parse_option_pairs(args.acceptance_option).items()))
        params = SamplingParams(max_new_tokens=args.max_new_tokens, temperature=args.temperature, top_k=args.top_k,
                                top_p=args.top_p, seed=args.seed, stop=tuple(args.stop), speculate=not args.no_spec,
                                num_speculative_tokens=None if k == "auto" else k,  # a request's cap
                                acceptance=args.acceptance, acceptance_options=options)
        params.validate()
    except InvalidRequestError as e:
        _usage(e)
    return params


def check_acceptance(params: SamplingParams, default) -> None:
    """Options given without a policy name apply to the profile's default policy: checked against it."""
    try:
        params.policy(default)
    except InvalidRequestError as e:
        _usage(e)


def _usage(e: InvalidRequestError):
    if (e.field or "").startswith(("acceptance", "--acceptance")):
        raise UsageError(str(e).replace("acceptance_options.", "--acceptance-option ")) from None
    raise e


def print_result(result: dict, as_json: bool) -> None:
    """After streaming: one JSON object (--json), or a newline and the summary line on stderr."""
    if as_json:
        print(json.dumps(result))
    else:
        print()
        print(summary_line(result), file=sys.stderr)


def summary_line(result: dict) -> str:
    s = result["stats"]
    line = (f"[hetspec] {result['usage']['completion_tokens']} tokens, {s['tokens_per_s']:.1f} tok/s, "
            f"TTFT {s['ttft_s'] * 1000:.0f} ms, finish={result['finish_reason']}")
    if s["drafter"] != "none":
        per_pos = " ".join(f"{a:.2f}" for a in s["acceptance_per_position"])
        line += (f" | drafter {s['drafter']} k={s['k']}: accepted {s['num_accepted']}/{s['num_drafted']}, "
                 f"mean accepted length {s['mean_accepted_length']:.2f}, per position [{per_pos}]")
    if s.get("lossy"):
        spent = s.get("budget_exhausted_at", -1)
        line += (f" | acceptance {s['acceptance']} (LOSSY): {s['tokens_differing']} tokens the target would not "
                 f"have chosen" + (f", budget spent at token {spent}" if spent >= 0 else ""))
    return line


def ready(line: str) -> None:
    """A server's status line on stderr (tests and scripts wait for 'serving ...')."""
    print(f"hetspec: {line}", file=sys.stderr, flush=True)


def on_signal(shutdown: Callable[[], None]) -> None:
    """At the first SIGINT or SIGTERM run `shutdown` on a thread of its own (the main thread is busy:
    it steps the engine), once."""
    started = threading.Event()

    def handle(*_) -> None:
        if not started.is_set():
            started.set()
            ready("shutting down (in-flight requests get 5 s)")
            threading.Thread(target=shutdown, name="hetspec-shutdown").start()

    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, handle)
