"""Training data for an MTP drafter, all of it offline, the target's outputs computed once and cached.

Two sources, both on any machine: the target's own greedy responses to a built-in prompt set
(`prompts`; self-distillation: what it will be asked to draft for), and Python standard library source
shipped with the interpreter (code). The target's last-layer hidden state (float16) and greedy token at
every position are kept: for the responses as their generation computes them, for the source by one
teacher pass. Training never reruns the target (its soft distributions over the draft vocabulary come
back from the cached hidden states through its frozen lm_head). Every 20th sequence is held out. Each
response's start is kept too: the held-out report counts what the drafter is asked at inference (the
response), not the chat template and prompt before it.
"""

import hashlib
import json
import sysconfig
from dataclasses import dataclass, field
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from tqdm import tqdm

from orchestrator.models import Checkpoint, TargetRunner, cache_root, encode_prompt, eos_token_ids
from orchestrator.mtp.prompts import training_prompts

HELD_OUT_EVERY = 20
TEACHER_NAME = "teacher.safetensors"

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


@torch.inference_mode()
def self_distill(ckpt: Checkpoint, tokenizer, prompts: list[str], max_new_tokens: int, num_tokens: int,
                 progress: bool = True, batch_size: int = 64) -> list[tuple[list[int], torch.Tensor, torch.Tensor, int]]:
    """The target's greedy responses to `prompts` (chat template), up to `num_tokens` response tokens in
    all, batched: new prompts are prefilled in the same forward as the others' next tokens. The target's
    hidden state and greedy token at every position are kept as the forward computes them, so these
    sequences need no teacher pass. Each is (prompt + response but its last token, whose state was never
    computed; hidden [n, H] float16; argmax [n], the token after each position; the prompt's length,
    where the response starts). A sequence still running when the budget is spent is kept as far as it
    got."""
    eos = set(eos_token_ids(ckpt, tokenizer))
    pending = [encode_prompt(tokenizer, p, chat=True) for p in prompts]
    pending.reverse()  # pop() takes them in order
    longest = max((len(p) for p in pending), default=1)
    target = TargetRunner(ckpt, max_kv_tokens=batch_size * (longest + max_new_tokens + 16))
    running: dict[int, _Response] = {}
    done, total, next_id = [], 0, 0
    bar = tqdm(total=num_tokens, desc="self-distill", unit="tok", disable=not progress)
    while (pending or running) and total < num_tokens:
        batch = [(i, [r.tokens[-1]], 1) for i, r in running.items()]
        while pending and len(running) < batch_size:
            prompt = pending.pop()
            running[next_id] = _Response(tokens=list(prompt), prompt_len=len(prompt))
            batch.append((next_id, prompt, len(prompt)))
            next_id += 1
        for (i, _, _), out in zip(batch, target.forward(batch, return_hidden=True)):
            r, argmax = running[i], out.logits.argmax(-1)
            token = int(argmax[-1])
            r.hidden.append(out.hidden.to(torch.float16))
            r.argmax.append(argmax)
            r.tokens.append(token)
            r.generated += 1
            if token in eos or r.generated >= max_new_tokens:
                done.append(running.pop(i).finish())
                target.free(i)
        total += len(batch)
        bar.update(len(batch))
    bar.close()
    return done + [r.finish() for r in running.values()]


@dataclass
class _Response:
    tokens: list[int]
    prompt_len: int
    hidden: list[torch.Tensor] = field(default_factory=list)
    argmax: list[torch.Tensor] = field(default_factory=list)
    generated: int = 0

    def finish(self) -> tuple[list[int], torch.Tensor, torch.Tensor, int]:
        return self.tokens[:-1], torch.cat(self.hidden), torch.cat(self.argmax), self.prompt_len


@dataclass(frozen=True)
class DataOptions:
    tokens: int = 240_000  # training-token budget (both sources)
    distill_share: float = 0.7  # of it from self-distillation, at most (the prompt set may give less)
    response_tokens: int = 192
    chunk_tokens: int = 512

    def key(self, ckpt: Checkpoint) -> str:
        blob = json.dumps({"target": ckpt.key, **self.__dict__, "v": 3}, sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()[:16]


@dataclass
class TeacherData:
    """Every sequence's tokens, the target's hidden state and greedy token at each position."""

    tokens: torch.Tensor  # [N] int64, sequences concatenated
    hidden: torch.Tensor  # [N, H] float16
    argmax: torch.Tensor  # [N] int64: the target's greedy token after each position
    offsets: torch.Tensor  # [S + 1] int64
    distilled: torch.Tensor  # [S] bool: a greedy self-distilled sequence (tokens follow argmax)
    starts: torch.Tensor  # [S] int64: where the response begins (its prompt's length; 0 for source)

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
def teacher_pass(ckpt: Checkpoint, sequences: list[list[int]],
                 progress: bool = True) -> list[tuple[list[int], torch.Tensor, torch.Tensor]]:
    """The target run once over each sequence: (ids, hidden [n, H] float16, argmax [n]) per sequence."""
    if not sequences:
        return []
    target = TargetRunner(ckpt, max_kv_tokens=max(len(s) for s in sequences) + 16)
    out = []
    for ids in tqdm(sequences, desc="teacher pass", unit="seq", disable=not progress):
        (o,) = target.forward([(0, ids, len(ids))], return_hidden=True)
        target.free(0)
        out.append((ids, o.hidden.to(torch.float16), o.logits.argmax(-1)))
    return out


def _assemble(items: list[tuple[list[int], torch.Tensor, torch.Tensor, int]], distilled: list[bool]) -> TeacherData:
    """items: (ids, hidden, argmax, response start) per sequence."""
    lengths = torch.tensor([0] + [len(ids) for ids, *_ in items])
    return TeacherData(tokens=torch.tensor([t for ids, *_ in items for t in ids]),
                       hidden=torch.cat([h for _, h, _, _ in items]), argmax=torch.cat([a for _, _, a, _ in items]),
                       offsets=lengths.cumsum(0), distilled=torch.tensor(distilled, dtype=torch.bool),
                       starts=torch.tensor([start for *_, start in items], dtype=torch.int64))


def assemble_responses(items: list[tuple[list[int], torch.Tensor, torch.Tensor, int]]) -> TeacherData:
    """`self_distill`'s responses as teacher data (to score a drafter on prompts of one's own)."""
    return _assemble(items, [True] * len(items))


def build_teacher_data(ckpt: Checkpoint, tokenizer, options: DataOptions, progress: bool = True) -> TeacherData:
    """The cached teacher data for this target and these options (built on first use): the self-distilled
    responses with the states their generation computed, then stdlib source through a teacher pass."""
    path = cache_root() / "mtp-teacher" / options.key(ckpt) / TEACHER_NAME
    if path.is_file():
        t = load_file(str(path))
        return TeacherData(t["tokens"], t["hidden"], t["argmax"], t["offsets"], t["distilled"].bool(), t["starts"])
    distill_budget = int(options.tokens * options.distill_share)
    distilled = self_distill(ckpt, tokenizer, training_prompts(), options.response_tokens, distill_budget,
                             progress) if distill_budget else []
    num_distilled = sum(len(ids) for ids, _, _, _ in distilled)
    code = teacher_pass(ckpt, stdlib_chunks(tokenizer, max(0, options.tokens - num_distilled),
                                            options.chunk_tokens), progress)
    data = _assemble(distilled + [(*item, 0) for item in code], [True] * len(distilled) + [False] * len(code))
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".partial")
    save_file({"tokens": data.tokens, "hidden": data.hidden.contiguous(), "argmax": data.argmax,
               "offsets": data.offsets, "distilled": data.distilled.to(torch.uint8), "starts": data.starts}, str(tmp))
    tmp.replace(path)
    return data
