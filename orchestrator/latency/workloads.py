"""Workloads for profiling runs: built-in prompt sets and a validated JSONL format.

JSONL: one JSON object per line, blank lines ignored:
    {"prompt": "Summarize: ...", "max_new_tokens": 96, "chat": true}
`prompt` (non-empty string) is required; `max_new_tokens` (positive int, default: the run's)
and `chat` (bool: apply the chat template, default true) are optional; other keys are refused.
"""

import json
from dataclasses import dataclass
from pathlib import Path

from orchestrator.errors import HetspecError


@dataclass(frozen=True)
class WorkloadPrompt:
    prompt: str
    max_new_tokens: int | None = None  # None = the run's --max-new-tokens
    chat: bool = True


_CHAT = [
    "Explain in three sentences why the sky is blue.",
    "Write a short, friendly email inviting a colleague to lunch on Friday.",
    "What are three good habits for getting better sleep?",
    "Describe how a refrigerator keeps food cold.",
    "Give me a packing list for a two-day hiking trip.",
    "Why do leaves change colour in autumn?",
]

_GROUNDED_TEXT = (
    "The Great Barrier Reef is the world's largest coral reef system, made of over 2,900 "
    "individual reefs and 900 islands stretching for over 2,300 kilometres. It lies in the Coral "
    "Sea, off the coast of Queensland, Australia. The reef can be seen from outer space and is the "
    "world's biggest single structure made by living organisms. It was selected as a World "
    "Heritage Site in 1981. Climate change, pollution and crown-of-thorns starfish threaten it."
)
_GROUNDED = [
    f"Rewrite the following paragraph in simpler words, keeping all the facts.\n\n{_GROUNDED_TEXT}",
    f"Summarize the following paragraph in two sentences.\n\n{_GROUNDED_TEXT}",
    f"List every number mentioned in this paragraph, with what it measures.\n\n{_GROUNDED_TEXT}",
    f"Rewrite this paragraph as a short news report, keeping every fact.\n\n{_GROUNDED_TEXT}",
]

_CODE = [
    "Write a Python function that returns the n-th Fibonacci number iteratively.",
    "Write a Python function that checks whether a string is a palindrome, with a docstring.",
    "Write a Python class for a stack with push, pop and peek methods.",
    "Write a Python function that reads a CSV file and returns the sum of its second column.",
    "Write a JavaScript function that removes duplicate values from an array.",
]

BUILTIN = {
    "chat": _CHAT,
    "grounded": _GROUNDED,
    "code": _CODE,
}


def load_workload(ref: str) -> tuple[str, list[WorkloadPrompt]]:
    """A built-in name (chat, grounded, code) or a JSONL file -> (name, prompts)."""
    if ref in BUILTIN:
        return ref, [WorkloadPrompt(p) for p in BUILTIN[ref]]
    path = Path(ref)
    if not path.is_file():
        raise HetspecError(f"workload {ref!r} is neither a built-in ({', '.join(BUILTIN)}) nor a JSONL file")
    prompts = [p for i, line in enumerate(path.read_text().splitlines(), 1)
               if (p := _parse_line(path.name, i, line)) is not None]
    if not prompts:
        raise HetspecError(f"{path.name}: no prompts (expected one JSON object per line)")
    return path.stem, prompts


def _parse_line(name: str, lineno: int, line: str) -> WorkloadPrompt | None:
    if not line.strip():
        return None
    where = f"{name} line {lineno}"
    try:
        obj = json.loads(line)
    except json.JSONDecodeError as e:
        raise HetspecError(f"{where}: not valid JSON ({e.msg} at column {e.colno})") from None
    if not isinstance(obj, dict):
        raise HetspecError(f"{where}: expected a JSON object, got {type(obj).__name__}")
    unknown = sorted(set(obj) - {"prompt", "max_new_tokens", "chat"})
    if unknown:
        raise HetspecError(f"{where}: unknown field {unknown[0]!r} (allowed: prompt, max_new_tokens, chat)")
    prompt = obj.get("prompt")
    if not isinstance(prompt, str) or not prompt.strip():
        raise HetspecError(f"{where}: field 'prompt' must be a non-empty string")
    max_new = obj.get("max_new_tokens")
    if max_new is not None and (type(max_new) is not int or max_new <= 0):
        raise HetspecError(f"{where}: field 'max_new_tokens' must be a positive integer, got {max_new!r}")
    chat = obj.get("chat", True)
    if not isinstance(chat, bool):
        raise HetspecError(f"{where}: field 'chat' must be true or false, got {chat!r}")
    return WorkloadPrompt(prompt, max_new, chat)
