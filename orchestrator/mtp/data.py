"""Training data for an MTP drafter, all of it offline, and the teacher pass cached once.

Two sources, both on any machine: the target's own greedy responses to a built-in prompt set
(self-distillation: what it will be asked to draft for), and Python standard library source shipped
with the interpreter (code). The teacher pass runs the target once over every sequence and keeps its
last-layer hidden states (float16) and its greedy token at every position; training never reruns the
target (its soft distributions over the draft vocabulary come back from the cached hidden states
through its frozen lm_head). Every 20th sequence is held out.
"""

import hashlib
import json
import sysconfig
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from tqdm import tqdm

from orchestrator.models import Checkpoint, TargetRunner, cache_root, encode_prompt, eos_token_ids

HELD_OUT_EVERY = 20
TEACHER_NAME = "teacher.safetensors"

# Prompts disjoint from the profiling workloads (`orchestrator.latency.workloads`) the benches measure.
_SUBJECTS = [
    "photosynthesis", "the water cycle", "compound interest", "learning a new language", "volcanoes",
    "time management", "electric cars", "the phases of the moon", "recycling", "public speaking",
    "a healthy breakfast", "how the internet works", "growing tomatoes", "saving money", "rainbows", "honey bees",
    "daily exercise", "brewing coffee", "earthquakes", "working from home", "chess openings", "ocean tides",
    "vaccines", "solar panels", "reading habits", "making friends", "cooking pasta", "camping safety",
    "practising an instrument", "cloud computing", "bicycle maintenance", "dinosaurs", "index funds",
    "meditation", "volunteering", "bird migration", "snowflakes", "high-speed trains", "visiting museums",
    "writing a resume", "black holes", "the Roman Empire", "caring for a puppy", "first aid for burns",
]
_CHAT_TEMPLATES = [
    "Explain {} to a curious twelve-year-old.",
    "What are the pros and cons of {}?",
    "Write a short paragraph about {}.",
    "Give me three practical tips about {}.",
    "Describe {} in simple words.",
]
_TASKS = [
    "reverses a singly linked list", "counts the words in a string", "merges two dictionaries",
    "finds the largest number in a list without using max()", "computes the factorial of n recursively",
    "checks whether a number is prime", "flattens a nested list", "sorts a list of tuples by their second item",
    "removes the vowels from a string", "converts Celsius to Fahrenheit", "computes the greatest common divisor",
    "returns the unique items of a list in their original order", "counts how often each character occurs",
    "checks whether two strings are anagrams", "implements binary search on a sorted list",
    "loads a JSON file into a dictionary", "writes a list of dictionaries to a CSV file",
    "returns the mean and the median of a list", "validates an email address with a regular expression",
    "generates the first n prime numbers", "transposes a matrix given as a list of lists",
    "finds the longest word in a sentence", "rotates a list by k positions", "implements bubble sort",
    "capitalizes every word in a sentence", "splits a list into chunks of size n",
    "computes the dot product of two vectors", "parses an ISO date string into a datetime",
    "returns the second largest number in a list", "implements a queue with two stacks",
    "counts the lines of a text file", "converts a Roman numeral to an integer",
]
_CODE_TEMPLATES = [
    "Write a Python function that {}.",
    "Write a Python function that {}, with type hints and a docstring.",
    "Show how to write a Python function that {}, and give an example call.",
]


def training_prompts() -> list[str]:
    """The built-in prompt set: 220 chat and 96 code prompts, interleaved."""
    chat = [t.format(s) for s in _SUBJECTS for t in _CHAT_TEMPLATES]
    code = [t.format(s) for s in _TASKS for t in _CODE_TEMPLATES]
    out = []
    for i in range(max(len(chat), len(code))):
        out += chat[i:i + 1] + code[i:i + 1]
    return out


def stdlib_chunks(tokenizer, num_tokens: int, chunk_tokens: int) -> list[list[int]]:
    """Python standard library source, tokenized, cut into chunks: sorted file order, so the same
    interpreter gives the same corpus."""
    root = Path(sysconfig.get_paths()["stdlib"])
    chunks, total = [], 0
    for path in sorted(root.glob("*.py")):
        if total >= num_tokens:
            break
        try:
            ids = tokenizer(path.read_text(encoding="utf-8"), add_special_tokens=False).input_ids
        except (OSError, UnicodeDecodeError):
            continue
        for i in range(0, len(ids) - 16, chunk_tokens):
            chunk = ids[i:i + chunk_tokens][: num_tokens - total]
            chunks.append(chunk)
            total += len(chunk)
            if total >= num_tokens:
                break
    return chunks


def self_distill(ckpt: Checkpoint, tokenizer, prompts: list[str], max_new_tokens: int, num_tokens: int,
                 progress: bool = True, max_num_seqs: int = 32) -> list[list[int]]:
    """The target's greedy responses (target only, batched), each returned with its prompt's ids."""
    from orchestrator.config import SamplingParams
    from orchestrator.engine import Engine

    target = TargetRunner(ckpt, max_kv_tokens=max_num_seqs * 1024)
    engine = Engine(target, tokenizer, max_num_seqs=max_num_seqs, eos_token_ids=eos_token_ids(ckpt, tokenizer))
    params = SamplingParams(max_new_tokens=max_new_tokens)
    pending = [encode_prompt(tokenizer, p, chat=True) for p in prompts]
    ids = {}
    seqs, total = [], 0
    bar = tqdm(total=num_tokens, desc="self-distill", unit="tok", disable=not progress)
    while (pending or engine.has_work()) and total < num_tokens:
        while pending and len(ids) - len(seqs) < max_num_seqs:
            prompt = pending.pop(0)
            ids[engine.add_request(prompt, params)] = prompt
        for out in engine.step():
            bar.update(len(out.token_ids))
            if out.finished:
                seq = engine.release(out.seq_id)
                seqs.append(ids[out.seq_id] + seq.output_ids)
                total += len(seq.output_ids)
    bar.close()
    return seqs


@dataclass(frozen=True)
class DataOptions:
    tokens: int = 200_000  # training-token budget (both sources)
    distill_share: float = 0.5  # of it from self-distillation, at most (the prompt set may give less)
    response_tokens: int = 192
    chunk_tokens: int = 512

    def key(self, ckpt: Checkpoint) -> str:
        blob = json.dumps({"target": ckpt.key, **self.__dict__, "v": 1}, sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()[:16]


@dataclass
class TeacherData:
    """Every sequence's tokens, the target's hidden state and greedy token at each position."""

    tokens: torch.Tensor  # [N] int64, sequences concatenated
    hidden: torch.Tensor  # [N, H] float16
    argmax: torch.Tensor  # [N] int64: the target's greedy token after each position
    offsets: torch.Tensor  # [S + 1] int64
    distilled: torch.Tensor  # [S] bool: a greedy self-distilled sequence (tokens follow argmax)

    def sequence(self, i: int) -> slice:
        return slice(int(self.offsets[i]), int(self.offsets[i + 1]))

    @property
    def num_sequences(self) -> int:
        return len(self.offsets) - 1

    def split(self) -> tuple[list[int], list[int]]:
        """(training, held-out) sequence indices."""
        every = range(self.num_sequences)
        return [i for i in every if i % HELD_OUT_EVERY], [i for i in every if not i % HELD_OUT_EVERY]


@torch.inference_mode()
def teacher_pass(ckpt: Checkpoint, sequences: list[list[int]], distilled: list[bool],
                 progress: bool = True) -> TeacherData:
    longest = max(len(s) for s in sequences)
    target = TargetRunner(ckpt, max_kv_tokens=longest + 16)
    hidden, argmax = [], []
    for ids in tqdm(sequences, desc="teacher pass", unit="seq", disable=not progress):
        (out,) = target.forward([(0, ids, len(ids))], return_hidden=True)
        target.free(0)
        hidden.append(out.hidden.to(torch.float16))
        argmax.append(out.logits.argmax(-1))
    lengths = torch.tensor([0] + [len(s) for s in sequences])
    return TeacherData(tokens=torch.tensor([t for s in sequences for t in s]), hidden=torch.cat(hidden),
                       argmax=torch.cat(argmax), offsets=lengths.cumsum(0), distilled=torch.tensor(distilled))


def build_teacher_data(ckpt: Checkpoint, tokenizer, options: DataOptions, progress: bool = True) -> TeacherData:
    """The cached teacher data for this target and these options (built on first use)."""
    path = cache_root() / "mtp-teacher" / options.key(ckpt) / TEACHER_NAME
    if path.is_file():
        t = load_file(str(path))
        return TeacherData(t["tokens"], t["hidden"], t["argmax"], t["offsets"], t["distilled"].bool())
    distill_budget = int(options.tokens * options.distill_share)
    distilled = self_distill(ckpt, tokenizer, training_prompts(), options.response_tokens, distill_budget,
                             progress) if distill_budget else []
    num_distilled = sum(len(s) for s in distilled)
    code = stdlib_chunks(tokenizer, max(0, options.tokens - num_distilled), options.chunk_tokens)
    sequences = distilled + code
    data = teacher_pass(ckpt, sequences, [True] * len(distilled) + [False] * len(code), progress)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".partial")
    save_file({"tokens": data.tokens, "hidden": data.hidden.contiguous(), "argmax": data.argmax,
               "offsets": data.offsets, "distilled": data.distilled.to(torch.uint8)}, str(tmp))
    tmp.replace(path)
    return data
