"""A remote MTP drafter's hidden states on the target side: kept per sequence, sent as blocks.

The mirror of a sequence keeps the target's hidden states of its committed positions (float16: the
wire dtype) and how many of them the drafter of the current session has; the rest travel as
HIDDEN_STATE blocks in hidden-only verify results (no token change), split to fit a message. A new
session (after a failover) gets all of them again.
"""

import torch

import protocol
from protocol import BlockError
from protocol.pb import drafter_pb2 as pb


class HiddenRows:
    """One sequence's hidden states of positions [0, num) and the `sent` the drafter holds."""

    def __init__(self):
        self._rows = torch.empty(0, 0, dtype=torch.float16)
        self._parts: list[torch.Tensor] = []
        self.num = 0
        self.sent = 0

    def add(self, start: int, rows: torch.Tensor) -> None:
        if start > self.num:
            raise BlockError("tokens", f"hidden states from position {start} leave a gap after {self.num}")
        self.trim(start)
        self._parts.append(rows.to(torch.float16))
        self.num = start + len(rows)

    def trim(self, keep: int) -> None:
        """Keep positions [0, keep)."""
        if keep >= self.num:
            return
        self._rows = self.rows()[:keep]
        self._parts = []
        self.num = keep
        self.sent = min(self.sent, keep)

    def rows(self) -> torch.Tensor:
        if self._parts:
            self._rows = torch.cat([self._rows, *self._parts]) if self._rows.numel() else torch.cat(self._parts)
            self._parts = []
        return self._rows

    def results(self, seq_id: int, num_committed: int, model_id: str, max_bytes: int,
                packer: protocol.BlockPacker) -> list[pb.VerifyResult]:
        """Hidden-only verify results carrying the rows the drafter lacks; they count as sent."""
        if self.sent >= self.num:
            return []
        rows = self.rows()[self.sent:self.num]
        per_block = max(1, max_bytes // (rows.element_size() * rows.shape[1]))
        out = []
        for a in range(0, len(rows), per_block):
            part = rows[a:a + per_block].contiguous()
            start = self.sent + a
            enc = protocol.encode(part, kind=protocol.TensorKind.HIDDEN_STATE, layout=protocol.Layout.TOKENS_HIDDEN,
                                  model_id=model_id, sequence_id=seq_id, tokens=(start, start + len(part)))
            result = pb.VerifyResult(sequence_id=seq_id, rollback_to=num_committed)
            result.hidden_states.CopyFrom(packer.pack(enc))
            out.append(result)
        self.sent = self.num
        return out
