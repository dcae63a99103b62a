"""The MTP drafter: an EAGLE-like layer trained for its target, reading the target's hidden states.

Per sequence it holds the committed tokens, the target's last-layer hidden state of every committed
position but the newest (they arrive as HIDDEN_STATE blocks after each verify, `accept_hidden`), and
the K/V of its own layer for the pairs (h_i, x_{i+1}) it has run. Drafting first runs the pairs it
has not seen (one call), then feeds its own predicted feature back with each token it drafts; those
K/V rows are scratch, overwritten next time. A block from another model, of another hidden size, or
whose token range leaves a gap or runs past the committed tokens is refused.
"""

from dataclasses import dataclass

import torch

import protocol
from devices import DeviceUnavailable, resolve_torch_device
from orchestrator.engine import Drafter, DraftProposal
from orchestrator.engine.sampling import logits_to_probs, sample
from orchestrator.errors import HetspecError, InvalidRequestError
from orchestrator.mtp.model import MtpModel

_GROW = 256  # cache rows added at a time


@dataclass
class _Seq:
    tokens: list[int]
    hidden: torch.Tensor  # [capacity, H]: rows [0, num_hidden) are the target's
    cache: torch.Tensor  # [2, kv_heads, capacity, D]: rows [0, num_run) are committed pairs
    num_hidden: int = 0
    num_run: int = 0
    feature: torch.Tensor | None = None  # the output at pair num_run - 1 (predicts h_{num_run})


class MtpDrafter(Drafter):
    reads_hidden = True
    overlaps = False  # drafting ahead would need hidden states the target has not computed yet

    def __init__(self, path, device: str = "cpu", dtype: torch.dtype = torch.float32):
        """`device`: cpu, cuda:N or npu:N (torch-npu); the layer is small, so any dtype will do."""
        try:
            torch_device = resolve_torch_device(device)
        except DeviceUnavailable as e:
            raise HetspecError(str(e)) from e
        self.model = MtpModel.load(path, dtype=dtype, device=torch_device)
        self.config = self.model.config
        self.device = str(device)
        self.name = "mtp"
        self.dtype = dtype
        self.unpacker = protocol.BlockUnpacker()
        self._seqs: dict[int, _Seq] = {}

    @property
    def model_id(self) -> str:
        return self.config.target_model_id

    # ---- the Drafter interface -------------------------------------------------------

    def start(self, seq_id: int, prompt_ids: list[int]) -> None:
        if seq_id in self._seqs:
            raise InvalidRequestError(f"sequence {seq_id} is already open in the drafter")
        if not prompt_ids:
            raise InvalidRequestError("the drafter needs a non-empty prompt")
        capacity = len(prompt_ids) + _GROW
        H, model = self.config.hidden_size, self.model
        self._seqs[seq_id] = _Seq(tokens=[int(t) for t in prompt_ids],
                                  hidden=model.embed.new_zeros(capacity, H), cache=model.new_cache(capacity))

    def accept_hidden(self, seq_id: int, block) -> None:
        """A HIDDEN_STATE block (validated, checksum verified) with the target's states of positions
        [start, end): start must not leave a gap, end must not pass the committed tokens."""
        seq = self._seq(seq_id)
        d, payload = self.unpacker.unpack(block)
        if d.kind != protocol.TensorKind.HIDDEN_STATE or d.layout != protocol.Layout.TOKENS_HIDDEN:
            raise protocol.BlockError("kind", "expected a HIDDEN_STATE block in LAYOUT_TOKENS_HIDDEN")
        if d.model_id != self.model_id:
            raise protocol.BlockError("model_id", f"hidden states of model {d.model_id!r}; this drafter was "
                                      f"trained for {self.model_id!r} ({self.config.target_name})")
        if d.shape[-1] != self.config.hidden_size:
            raise protocol.BlockError("shape", f"hidden size {d.shape[-1]}, the drafter needs "
                                      f"{self.config.hidden_size}")
        start, end = d.tokens.start, d.tokens.end
        if start > seq.num_hidden or end > len(seq.tokens) or end - start != d.shape[0]:
            raise protocol.BlockError("tokens", f"covers [{start}, {end}) of sequence {seq_id}; the drafter "
                                      f"holds states for [0, {seq.num_hidden}) of {len(seq.tokens)} tokens")
        rows = protocol.decode(d, payload, dtype=self.dtype, verified=True).to(seq.hidden.device)
        self._reserve(seq, end + 1)
        seq.hidden[start:end] = rows
        if start < seq.num_run:  # states rewritten under pairs already run (a recomputed prefix)
            seq.num_run, seq.feature = start, None
        seq.num_hidden = max(seq.num_hidden, end)

    @torch.inference_mode()
    def propose(self, seq_id: int, k: int, temperature: float = 0.0, top_k: int = 0, top_p: float = 1.0,
                generator: torch.Generator | None = None, min_confidence: float = 0.0) -> DraftProposal:
        seq = self._seq(seq_id)
        last = len(seq.tokens) - 1  # pairs (h_i, x_{i+1}) for i < last predict the newest token's state
        if k <= 0 or seq.num_hidden < last or last < 1:
            return DraftProposal(draft_ids=[])  # states not here (yet): nothing to draft from
        self._reserve(seq, last + k + 1)
        model = self.model
        if seq.num_run < last or seq.feature is None:
            start = min(seq.num_run, last - 1)
            ids = torch.tensor(seq.tokens[start + 1:last + 1], device=seq.hidden.device)
            seq.feature = model.step(seq.hidden[start:last], ids, seq.cache, start)[-1]
            seq.num_run = last
        feature, ids, probs, confidence = seq.feature, [], [], []
        for j in range(k):
            logits = model.logits(feature)  # [draft vocab]
            if temperature > 0:
                full = logits.new_full((self.config.vocab_size,), float("-inf"))
                full[model.draft_ids] = logits
                p = logits_to_probs(full, temperature, top_k, top_p)
                token = int(sample(p, generator))
                conf = float(p[token])
            else:
                i = int(torch.argmax(logits))
                token = int(model.draft_ids[i])
                conf = float(1.0 / torch.exp(logits - logits[i]).sum())
            if conf < min_confidence:
                break
            ids.append(token)
            confidence.append(conf)
            if temperature > 0:
                probs.append(p)
            if j + 1 < k:  # scratch rows past the committed pairs
                feature = model.step(feature[None], torch.tensor([token], device=feature.device), seq.cache,
                                     last + j)[0]
        return DraftProposal(draft_ids=ids, draft_probs=torch.stack(probs).cpu() if probs else None,
                             confidence=confidence)

    def extend(self, seq_id: int, token_ids: list[int]) -> None:
        self._seq(seq_id).tokens.extend(int(t) for t in token_ids)

    def rollback(self, seq_id: int, n: int) -> None:
        seq = self._seq(seq_id)
        if not 0 <= n <= len(seq.tokens):
            raise InvalidRequestError(f"cannot roll back {n} of {len(seq.tokens)} committed tokens of "
                                      f"sequence {seq_id}")
        del seq.tokens[len(seq.tokens) - n:]
        seq.num_hidden = min(seq.num_hidden, len(seq.tokens))
        if seq.num_run > max(0, len(seq.tokens) - 1):
            seq.num_run, seq.feature = max(0, len(seq.tokens) - 1), None

    def finish(self, seq_id: int) -> None:
        self._seqs.pop(seq_id, None)

    def close(self) -> None:
        self.unpacker.close()

    # ---- internals -------------------------------------------------------------------

    def _seq(self, seq_id: int) -> _Seq:
        try:
            return self._seqs[seq_id]
        except KeyError:
            raise InvalidRequestError(f"sequence {seq_id} is not open in the drafter") from None

    def _reserve(self, seq: _Seq, rows: int) -> None:
        capacity = seq.hidden.shape[0]
        if rows <= capacity:
            return
        grow = max(rows, capacity + _GROW) - capacity
        seq.hidden = torch.cat([seq.hidden, seq.hidden.new_zeros(grow, seq.hidden.shape[1])])
        c = seq.cache
        seq.cache = torch.cat([c, c.new_zeros(c.shape[0], c.shape[1], grow, c.shape[3])], dim=2)
