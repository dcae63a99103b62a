"""Hands the target's last-layer hidden states to a drafter that reads them (an MTP drafter).

The verify forward keeps the hidden states of all its new positions (`capture`); once the step is
committed the rows of committed positions leave as one HIDDEN_STATE block per sequence (`deliver`),
packed by the engine's transport (inline, or shared memory), the same block a remote drafter gets
over its session. A device target's rows go to the host first.
"""

import torch

import protocol
from orchestrator.engine.drafter import Drafter
from orchestrator.tracing import HOST_TRACK, Tracer


class HiddenFeed:
    def __init__(self, drafter: Drafter, model_id: str, transport: str = "inline", tracer: Tracer | None = None):
        self.drafter = drafter
        self.model_id = model_id
        self.packer = protocol.BlockPacker(transport)
        self.tracer = tracer or Tracer(enabled=False)
        self.bytes_sent = 0
        self._pending: dict[int, tuple[int, torch.Tensor]] = {}  # seq_id -> (first position, [n, hidden])

    def capture(self, seq_ids: list[int], starts: list[int], outputs) -> None:
        """A forward's outputs (`TargetOutput`, hidden states kept): sequence i's rows are its positions
        [starts[i], starts[i] + rows)."""
        for seq_id, start, out in zip(seq_ids, starts, outputs):
            self._pending[seq_id] = (start, out.hidden)

    def deliver(self, seq_id: int, end: int, step: int | None = None) -> None:
        """The captured rows of positions [start, end) (the committed ones) to the drafter."""
        captured = self._pending.pop(seq_id, None)
        if captured is None:
            return
        start, hidden = captured
        if end <= start:
            return
        with self.tracer.span("serialize", HOST_TRACK, step, seq_id) as span:
            rows = hidden[:end - start].detach().to("cpu").contiguous()
            enc = protocol.encode(rows, kind=protocol.TensorKind.HIDDEN_STATE, layout=protocol.Layout.TOKENS_HIDDEN,
                                  model_id=self.model_id, sequence_id=seq_id, tokens=(start, end),
                                  source_device=_device_name(hidden.device))
            block = self.packer.pack(enc)
            self.bytes_sent += enc.descriptor.byte_length
            if span is not None:
                span.args["nbytes"] = enc.descriptor.byte_length
        self.drafter.accept_hidden(seq_id, block)

    def forget(self, seq_id: int) -> None:
        self._pending.pop(seq_id, None)

    def close(self) -> None:
        self.packer.close()


def _device_name(device: torch.device) -> str:
    return f"{device.type}:{device.index or 0}"
