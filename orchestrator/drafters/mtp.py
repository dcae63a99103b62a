"""The MTP drafter: an EAGLE-like layer trained for its target, reading the target's hidden states.

Per sequence it holds the committed tokens, the target's last-layer hidden state of every committed
position but the newest (they arrive as HIDDEN_STATE blocks after each verify, `accept_hidden`), and
the K/V of its own layer for the pairs (h_i, x_{i+1}) it has run. Drafting first runs the pairs it
has not seen (one call), then feeds its own predicted feature back with each token it drafts; those
K/V rows are scratch, overwritten next time. A block from another model, of another hidden size, or
whose token range leaves a gap or runs past the committed tokens is refused.

The layer runs on torch (cpu, cuda:N, npu:N through torch-npu) or, `runtime="onnx"`, as the ONNX
export (`orchestrator.mtp.export`, INT4/INT8/fp32) on the ONNX Runtime provider of the device (CPU,
CUDA, CANN). `runtime="auto"` times both at start-up, the torch layer against its fp32 export (the
same weights), on the call drafting makes most (one token after a context), and keeps the faster:
which wins is the machine's (a 2-core EPYC VM: ONNX Runtime 1.62 ms, torch 3.59 ms a call for
SmolLM2's drafter, bench/figures/mtp-cpu-epyc-auto.json).
"""

import logging
import statistics
import time
from dataclasses import dataclass
from pathlib import Path

import torch

import protocol
from devices import DeviceUnavailable, ort_placement, resolve_torch_device
from orchestrator.drafters.onnx_drafter import open_session
from orchestrator.engine import Drafter, DraftProposal
from orchestrator.engine.sampling import logits_to_probs, sample
from orchestrator.errors import CheckpointError, HetspecError, InvalidRequestError
from orchestrator.mtp.model import WEIGHTS_NAME, MtpModel

log = logging.getLogger(__name__)

_GROW = 256  # cache rows added at a time
AUTO_PRECISION = "fp32"  # auto weighs the torch layer against its unquantized export (INT8 was 5x slower)


@dataclass
class _Seq:
    tokens: list[int]
    hidden: torch.Tensor  # [capacity, H]: rows [0, num_hidden) are the target's
    cache: torch.Tensor  # [2, kv_heads, capacity, D]: rows [0, num_run) are committed pairs
    num_hidden: int = 0
    num_run: int = 0
    feature: torch.Tensor | None = None  # the output at pair num_run - 1 (predicts h_{num_run})
    logits: torch.Tensor | None = None  # the draft head's on it [draft vocab]


class _TorchRunner:
    """The layer on torch; K/V cache [2, kv_heads, capacity, head_dim] on the device."""

    def __init__(self, path, device: torch.device, dtype: torch.dtype):
        self.model = MtpModel.load(path, dtype=dtype, device=device)
        self.config, self.draft_ids, self.device = self.model.config, self.model.draft_ids, device
        self.dtype = dtype

    def new_cache(self, capacity: int) -> torch.Tensor:
        return self.model.new_cache(capacity)

    def grow(self, cache: torch.Tensor, rows: int) -> torch.Tensor:
        return torch.cat([cache, cache.new_zeros(cache.shape[0], cache.shape[1], rows, cache.shape[3])], dim=2)

    def step(self, hidden, next_ids, cache, start):
        """-> features [T, H], draft logits of the last row [draft vocab]."""
        features = self.model.step(hidden, next_ids, cache, start)
        return features, self.model.logits(features[-1])


class _OrtRunner:
    """The ONNX export on ONNX Runtime; K/V cache [2, capacity, kv_heads, head_dim] on the host."""

    def __init__(self, path, device: str, precision: str, providers: list[str] | None = None):
        from safetensors import safe_open

        from orchestrator.mtp.export import MODEL_FILE, export_mtp

        model_dir = export_mtp(Path(path), precision)
        placement = ort_placement(device)
        names, options = (list(providers), None) if providers else ([placement.provider.name], [placement.options])
        self.session = open_session(model_dir / MODEL_FILE, names, options, None)
        self.config = MtpModel.read_config(path)
        with safe_open(str(Path(path) / WEIGHTS_NAME), "pt") as f:
            self.draft_ids = f.get_tensor("draft_ids").long()
        self.device, self.dtype = torch.device("cpu"), torch.float32

    def new_cache(self, capacity: int) -> torch.Tensor:
        c = self.config
        return torch.zeros(2, capacity, c.num_kv_heads, c.head_dim)

    def grow(self, cache: torch.Tensor, rows: int) -> torch.Tensor:
        return torch.cat([cache, cache.new_zeros(cache.shape[0], rows, *cache.shape[2:])], dim=1)

    def step(self, hidden, next_ids, cache, start):
        T = hidden.shape[0]
        feats, logits, k, v = self.session.run(None, {
            "hidden": hidden.float().contiguous().numpy(), "next_ids": next_ids.long().numpy(),
            "positions": torch.arange(start, start + T).numpy(),
            "past_key": cache[0, :start].numpy(), "past_value": cache[1, :start].numpy()})
        cache[0, start:start + T] = torch.from_numpy(k)
        cache[1, start:start + T] = torch.from_numpy(v)
        return torch.from_numpy(feats), torch.from_numpy(logits[-1])


def _torch_runner(path, device: str, dtype: torch.dtype) -> _TorchRunner:
    try:
        torch_device = resolve_torch_device(device)
    except DeviceUnavailable as e:
        raise HetspecError(str(e)) from e
    return _TorchRunner(path, torch_device, dtype)


@torch.inference_mode()
def time_call(runner, context: int = 128, calls: int = 24, warmup: int = 4) -> float:
    """Median seconds of the call drafting makes most: one token after `context` pairs (random states,
    draft-vocabulary tokens; the cost does not depend on their values)."""
    g = torch.Generator().manual_seed(0)
    hidden = torch.randn(context + 1, runner.config.hidden_size, generator=g).to(runner.device, runner.dtype)
    ids = runner.draft_ids[torch.randint(0, len(runner.draft_ids), (context + 1,), generator=g)].to(runner.device)
    cache = runner.new_cache(context + 1)
    runner.step(hidden[:context], ids[:context], cache, 0)
    times = []
    for _ in range(warmup + calls):
        t = time.perf_counter()
        _, logits = runner.step(hidden[context:], ids[context:], cache, context)
        float(logits[0])  # waits for a device's queue
        times.append(time.perf_counter() - t)
    return statistics.median(times[warmup:])


def _fastest(path, device: str, dtype: torch.dtype, providers) -> tuple:
    """Both runtimes that can run here, each timed: (the faster's runner, its name, ms per call of each)."""
    MtpModel.read_config(path)  # not a drafter at all: said as such, not as "no runtime can run it"
    runners, errors = {}, []
    for runtime, build in (("torch", lambda: _torch_runner(path, device, dtype)),
                           ("onnx", lambda: _OrtRunner(path, device, AUTO_PRECISION, providers))):
        try:
            runners[runtime] = build()
        except CheckpointError:
            raise  # the drafter's files are broken: no runtime would read them
        except (HetspecError, DeviceUnavailable, OSError) as e:  # OSError: the export cannot be written
            errors.append(f"{runtime}: {e}")
            log.warning("mtp runtime auto: %s cannot run on %s (%s)", runtime, device, e)
    if not runners:
        raise HetspecError(f"mtp runtime auto: neither runtime can run on {device} ({'; '.join(errors)})")
    timings = {runtime: 1e3 * time_call(r) for runtime, r in runners.items()}
    runtime = min(timings, key=timings.get)
    log.info("mtp runtime auto on %s: %s (ms per call: %s)", device, runtime,
             ", ".join(f"{k} {v:.2f}" for k, v in timings.items()))
    return runners[runtime], runtime, timings


class MtpDrafter(Drafter):
    reads_hidden = True
    overlaps = False  # drafting ahead would need hidden states the target has not computed yet

    def __init__(self, path, device: str = "cpu", dtype: torch.dtype = torch.float32, runtime: str = "torch",
                 precision: str = "int4", providers: list[str] | None = None):
        """`runtime` torch: the layer on `device` (cpu, cuda:N, npu:N through torch-npu) in `dtype`;
        onnx: its ONNX export at `precision` on the device's ONNX Runtime provider (or `providers`);
        auto: whichever of torch and the fp32 export a timed call runs faster on (`timings_ms`)."""
        self.timings_ms: dict[str, float] = {}  # runtime="auto": each runtime's measured call
        if runtime == "onnx":
            self.runner = _OrtRunner(path, device, precision, providers)
        elif runtime == "torch":
            self.runner = _torch_runner(path, device, dtype)
        elif runtime == "auto":
            self.runner, runtime, self.timings_ms = _fastest(path, device, dtype, providers)
            precision = AUTO_PRECISION
        else:
            raise HetspecError(f"mtp runtime must be torch, onnx or auto, got {runtime!r}")
        self.runtime = runtime
        self.config = self.runner.config
        self.device = str(device)
        self.name = "mtp" if runtime == "torch" else f"mtp-onnx-{precision}"
        self.torch_on_cpu = runtime == "torch" and self.runner.device.type == "cpu"
        self.dtype = self.runner.dtype
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
        runner = self.runner
        self._seqs[seq_id] = _Seq(tokens=[int(t) for t in prompt_ids], cache=runner.new_cache(capacity),
                                  hidden=torch.zeros(capacity, self.config.hidden_size, dtype=runner.dtype,
                                                     device=runner.device))

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
        runner = self.runner
        if seq.num_run < last or seq.feature is None:
            start = min(seq.num_run, last - 1)
            ids = torch.tensor(seq.tokens[start + 1:last + 1], device=seq.hidden.device)
            features, seq.logits = runner.step(seq.hidden[start:last], ids, seq.cache, start)
            seq.feature, seq.num_run = features[-1], last
        feature, logits, ids, probs, confidence, joint = seq.feature, seq.logits, [], [], [], 1.0
        for j in range(k):  # logits: [draft vocab] after the last token
            if temperature > 0:
                full = logits.new_full((self.config.vocab_size,), float("-inf"))
                full[runner.draft_ids] = logits
                p = logits_to_probs(full, temperature, top_k, top_p)
                token = int(sample(p, generator))
                conf = float(p[token])
            else:
                i = int(torch.argmax(logits))
                token = int(runner.draft_ids[i])
                conf = float(1.0 / torch.exp(logits - logits[i]).sum())
            if joint * conf < min_confidence:  # early stop: the draft up to here is doubtful
                break
            joint *= conf
            ids.append(token)
            confidence.append(conf)
            if temperature > 0:
                probs.append(p)
            if j + 1 < k:  # scratch rows past the committed pairs
                features, logits = runner.step(feature[None], torch.tensor([token], device=feature.device),
                                               seq.cache, last + j)
                feature = features[0]
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
        seq.cache = self.runner.grow(seq.cache, grow)
