"""A drafter that runs an exported decoder (INT4/INT8 MatMulNBits) on a plain ONNX Runtime session.

We drive the session step by step instead of using onnxruntime-genai's generator, because a
drafter must truncate its KV cache to whatever the target accepted (the bookkeeping is in
`cached.py`).

The builder's GroupQueryAttention models declare `past_present_share_buffer`: then each
layer's K/V live in one fixed-capacity buffer bound as both the past input and the present
output, GQA writes the new positions in place and attends only up to the attention mask's
length, so a step copies no cache and truncation is free. Other models (plain attention that
concatenates past and new) keep numpy arrays that the model returns one step longer each call.
"""

import json
import re
from pathlib import Path

import numpy as np
import onnxruntime as ort
import torch

from devices import ort_placement
from orchestrator.drafters.cached import CachedDrafter, CachedSequence
from orchestrator.drafters.onnx_slots import Slot, SlotPool
from orchestrator.errors import CheckpointError, HetspecError, InvalidRequestError
from orchestrator.models import find_onnx_model

_PAST = re.compile(r"^past_key_values\.(\d+)\.(key|value)$")
_PRESENT = re.compile(r"^present\.(\d+)\.(key|value)$")
_ORT_DTYPES = {"tensor(float)": np.float32, "tensor(float16)": np.float16,
               "tensor(int64)": np.int64, "tensor(int32)": np.int32}


class OnnxDrafter(CachedDrafter):
    """Runs the ONNX decoder on one device's ONNX Runtime execution provider. With shared-buffer
    K/V on the host (the builder's GQA models on the CPU provider) one run drafts a position for
    every sequence drafting (`onnx_slots.SlotPool`); otherwise one run per sequence.

    `device` (cpu, cuda:N, npu:N) picks the provider, its options and where the KV buffers
    live; `providers` overrides the provider list (the KV buffers still follow `device`).
    """

    name = "onnx"

    def __init__(self, model_dir: Path, device: str = "cpu", providers: list[str] | None = None,
                 provider_options: dict | None = None, num_threads: int | None = None):
        placement = ort_placement(device, provider_options)
        self.device = device
        self.model_path = find_onnx_model(Path(model_dir))
        if providers:
            session_providers, options = list(providers), None
        else:
            session_providers, options = [placement.provider.name], [placement.options]
        self.session = open_session(self.model_path, session_providers, options, num_threads)
        self._bind_io(_read_genai_config(self.model_path.parent))
        self._kv_device = (placement.memory, placement.device_id)  # OrtValue device type and id
        batched = self._share_buffer and placement.memory == "cpu" and self._attention_mask is not None
        self._slots = SlotPool(self) if batched else None
        self.batched = batched
        super().__init__()

    # --- the cache, for CachedDrafter ------------------------------------------------------

    def _open(self, seq_id: int, prompt_ids: list[int]) -> "Slot | _SharedKV | _ConcatKV":
        if self._slots is not None:
            return self._slots.acquire(len(prompt_ids))
        return _SharedKV(self, len(prompt_ids)) if self._share_buffer else _ConcatKV(self)

    def _truncate(self, seq_id: int, seq: CachedSequence, length: int) -> None:
        seq.cache.truncate(length)

    def _close(self, seq_id: int, seq: CachedSequence) -> None:
        if isinstance(seq.cache, Slot):
            seq.cache.release()

    def _run_batch(self, items: list[tuple[int, CachedSequence, list[int]]]) -> list[torch.Tensor]:
        if self._slots is None:
            return super()._run_batch(items)
        # ORT's GQA runs several new tokens over a past for one row only: catch-ups (longer than a
        # step's two tokens) run one by one. The drafting rows share runs of one token each, aligned
        # at their last token: the two-token rows (a full accept's last draft and bonus) run their
        # first together, then every row its last; a lone two-token row runs alone in one run
        out: list[torch.Tensor | None] = [None] * len(items)
        pairs = sum(len(new_ids) == 2 for _, _, new_ids in items)
        joined = 2 if pairs >= 2 else 1  # the most new tokens of a row that shares runs
        rows = [i for i, (_, _, new_ids) in enumerate(items) if len(new_ids) <= joined]
        for i, (_, seq, new_ids) in enumerate(items):
            if len(new_ids) > joined:
                out[i] = torch.from_numpy(self._slots.run([(seq.cache.index, new_ids)])[0])
        for back in reversed(range(max((len(items[i][2]) for i in rows), default=0))):
            column = [i for i in rows if len(items[i][2]) > back]
            logits = self._slots.run([(items[i][1].cache.index, [items[i][2][-back - 1]]) for i in column])
            if back == 0:
                for row, i in enumerate(column):
                    out[i] = torch.from_numpy(logits[row])
        return out

    def _run(self, seq_id: int, seq: CachedSequence, new_ids: list[int]) -> torch.Tensor:
        if self._slots is not None:
            return self._run_batch([(seq_id, seq, new_ids)])[0]
        past_len = len(seq.cached_ids)
        feed = {self._input_ids: np.asarray([new_ids], dtype=self._ids_dtype)}  # [1, num_new]
        if self._attention_mask:
            feed[self._attention_mask] = np.ones((1, past_len + len(new_ids)), self._mask_dtype)
        if self._position_ids:
            positions = np.arange(past_len, past_len + len(new_ids))[None]  # [1, num_new]
            feed[self._position_ids] = positions.astype(self._position_dtype)
        logits = seq.cache.run(feed, past_len, len(new_ids))  # [1, num_new, vocab]
        return torch.from_numpy(logits[0, -1]).float()

    def start_with_kv(self, seq_id: int, prompt_ids: list[int], kv: torch.Tensor) -> None:
        """Open a sequence whose first T prompt tokens' K/V are given (KV handoff): no prefill for them.

        kv: [num_layers, 2 (key, value), kv_heads, T, head_dim], T <= len(prompt_ids).
        """
        want = (self.num_layers, 2, self.num_kv_heads, kv.shape[3], self.head_dim)
        if tuple(kv.shape) != want or kv.shape[3] > len(prompt_ids):
            raise InvalidRequestError(f"handed-off KV has shape {tuple(kv.shape)}; this drafter needs {want} "
                                      f"with at most {len(prompt_ids)} tokens")
        self.start(seq_id, prompt_ids)
        seq = self._opened(seq_id, self._seqs[seq_id])
        seq.cache.write_prefix(kv.to(torch.float32).numpy().astype(self._kv_dtype, copy=False))
        seq.cached_ids = list(prompt_ids[:kv.shape[3]])

    def host_kv(self, seq_id: int) -> list[np.ndarray]:
        """The sequence's cached K/V where it is on the host, one [kv_heads, capacity, head_dim]
        array per past input (layer 0 key, layer 0 value, ...); valid up to `cached_length`."""
        cache = self._seq(seq_id).cache
        if isinstance(cache, Slot):
            return cache.host_kv()
        if isinstance(cache, _SharedKV) and cache.host is not None:
            return [array[0] for array in cache.host]
        if isinstance(cache, _ConcatKV):
            return [array[0] for array in cache.past]
        raise HetspecError(f"sequence {seq_id} has no K/V on the host")

    def close(self) -> None:
        for seq_id in list(self._seqs):
            self.finish(seq_id)
        self.session = None

    def _bind_io(self, genai: dict) -> None:
        """Map the session's inputs and outputs by name; check they form a KV-cache decoder."""
        inputs = {i.name: i for i in self.session.get_inputs()}
        outputs = {o.name for o in self.session.get_outputs()}
        if "input_ids" not in inputs or "logits" not in outputs:
            raise CheckpointError(f"{self.model_path} is not a decoder: it needs an input_ids "
                                  f"input and a logits output")
        self._input_ids = "input_ids"
        self._ids_dtype = _np_dtype(inputs["input_ids"])
        self._attention_mask = "attention_mask" if "attention_mask" in inputs else None
        self._mask_dtype = _np_dtype(inputs["attention_mask"]) if self._attention_mask else None
        self._position_ids = "position_ids" if "position_ids" in inputs else None
        self._position_dtype = _np_dtype(inputs["position_ids"]) if self._position_ids else None
        pasts = sorted((int(m[1]), m[2]) for n in inputs if (m := _PAST.match(n)))
        presents = sorted((int(m[1]), m[2]) for n in outputs if (m := _PRESENT.match(n)))
        if not pasts or pasts != presents:
            raise CheckpointError(
                f"{self.model_path} has no matching past_key_values.*/present.* KV-cache I/O")
        self.num_layers = len(pasts) // 2
        # one list order for past inputs and present outputs: layer 0 key, layer 0 value, ...
        self._past_inputs = [f"past_key_values.{i}.{kv}" for i, kv in pasts]
        self._outputs = ["logits"] + [f"present.{i}.{kv}" for i, kv in pasts]
        logits = next(o for o in self.session.get_outputs() if o.name == "logits")
        # float32 logits of a static width can be written straight into a buffer of ours (0: cannot)
        static = logits.type == "tensor(float)" and isinstance(logits.shape[-1], int)
        self.logits_width = logits.shape[-1] if static else 0
        first = inputs[self._past_inputs[0]]
        self._kv_dtype = _np_dtype(first)
        decoder = genai.get("model", {}).get("decoder", {})
        self.num_kv_heads = _static_dim(first.shape[1], decoder.get("num_key_value_heads"), "kv heads")
        self.head_dim = _static_dim(first.shape[3], decoder.get("head_size"), "head dim")
        self.max_length = int(genai.get("model", {}).get("context_length", 1 << 31))
        self.vocab_size = genai.get("model", {}).get("vocab_size")
        self._share_buffer = bool(genai.get("search", {}).get("past_present_share_buffer", False))


class _ConcatKV:
    """K/V as numpy arrays; the model returns them concatenated with the new positions."""

    def __init__(self, drafter: OnnxDrafter):
        self.drafter = drafter
        shape = (1, drafter.num_kv_heads, 0, drafter.head_dim)
        self.past = [np.zeros(shape, drafter._kv_dtype) for _ in drafter._past_inputs]

    def run(self, feed: dict, num_past: int, num_new: int) -> np.ndarray:
        d = self.drafter
        feed.update(zip(d._past_inputs, self.past))
        # present: [1, kv_heads, num_past + num_new, head_dim] each
        logits, *self.past = d.session.run(d._outputs, feed)
        return logits

    def truncate(self, length: int) -> None:
        # a contiguous copy, so the dropped tail's memory is actually released
        self.past = [np.ascontiguousarray(p[:, :, :length]) for p in self.past]

    def write_prefix(self, kv: np.ndarray) -> None:
        """kv: [num_layers, 2, kv_heads, T, head_dim] becomes the whole cache."""
        self.past = [np.ascontiguousarray(kv[i // 2, i % 2][None]) for i in range(len(self.past))]


class _SharedKV:
    """K/V in fixed-capacity buffers bound as both past input and present output (GQA)."""

    BLOCK = 256  # capacity grows in multiples of this many positions

    def __init__(self, drafter: OnnxDrafter, num_tokens: int):
        self.drafter = drafter
        self.device, self.device_id = drafter._kv_device
        self.capacity = 0
        self.buffers = []  # [2 * num_layers] OrtValue [1, kv_heads, capacity, head_dim]
        self.host: list[np.ndarray] | None = None  # the buffers' memory when they live on the host
        self._grow(num_tokens + 64, num_valid=0)

    def run(self, feed: dict, num_past: int, num_new: int) -> np.ndarray:
        if num_past + num_new > self.capacity:
            self._grow(num_past + num_new, num_valid=num_past)
        for name, value in feed.items():
            self.binding.bind_cpu_input(name, value)
        # rebind every run: a kept output OrtValue would be reused with last run's shape
        self.binding.bind_output("logits", self.device, self.device_id)
        self.drafter.session.run_with_iobinding(self.binding)
        return self.binding.get_outputs()[0].numpy()  # logits, bound first

    def truncate(self, length: int) -> None:
        """Nothing to do: positions >= length are masked out and overwritten by later steps."""

    def write_prefix(self, kv: np.ndarray) -> None:
        """kv: [num_layers, 2, kv_heads, T, head_dim] fills positions [0, T) of every buffer."""
        T = kv.shape[3]
        if T > self.capacity:
            self._grow(T, num_valid=0)
        for i, value in enumerate(self.buffers):  # past inputs: layer 0 key, layer 0 value, ...
            if self.host is not None:  # host buffers alias numpy arrays: write in place
                self.host[i][0, :, :T] = kv[i // 2, i % 2]
            else:
                full = value.numpy()
                full[0, :, :T] = kv[i // 2, i % 2]
                value.update_inplace(full)

    def _grow(self, num_needed: int, num_valid: int) -> None:
        d = self.drafter
        if num_needed > d.max_length:
            raise InvalidRequestError(
                f"{num_needed} tokens exceed the drafter's context length of {d.max_length}")
        capacity = max(2 * self.capacity, -(-num_needed // self.BLOCK) * self.BLOCK)
        capacity = min(capacity, d.max_length)
        shape = (1, d.num_kv_heads, capacity, d.head_dim)
        on_host = self.device == "cpu"
        buffers, host = [], []
        for old in self.buffers or [None] * len(d._past_inputs):
            array = np.zeros(shape, d._kv_dtype)
            if old is not None and num_valid:  # rare: copy the valid prefix
                array[:, :, :num_valid] = old.numpy()[:, :, :num_valid]
            if on_host:  # a CPU OrtValue aliases its numpy array: writes go straight in
                buffers.append(ort.OrtValue.ortvalue_from_numpy(array))
                host.append(array)
            else:
                new = ort.OrtValue.ortvalue_from_shape_and_type(shape, d._kv_dtype, self.device, self.device_id)
                new.update_inplace(array)
                buffers.append(new)
        self.buffers, self.capacity, self.host = buffers, capacity, host if on_host else None
        self.binding = d.session.io_binding()
        self.binding.bind_output("logits", self.device, self.device_id)
        for past, present, value in zip(d._past_inputs, d._outputs[1:], buffers):
            self.binding.bind_ortvalue_input(past, value)
            self.binding.bind_ortvalue_output(present, value)


def open_session(path: Path, providers: list[str], provider_options, num_threads: int | None):
    available = ort.get_available_providers()
    absent = [p for p in providers if p not in available]
    if absent:
        raise HetspecError(
            f"ONNX Runtime execution provider(s) {', '.join(absent)} not available in this "
            f"onnxruntime build; available: {', '.join(available)}")
    options = ort.SessionOptions()
    # fatal only: load errors reach the caller as exceptions, not also as log lines on stderr
    options.log_severity_level = 4
    # The target runs on the same cores between drafts: ORT's idle workers must sleep, not
    # spin, or they steal the CPU from the verify forward.
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    options.add_session_config_entry("session.inter_op.allow_spinning", "0")
    if num_threads is not None:
        options.intra_op_num_threads = num_threads
    try:
        return ort.InferenceSession(str(path), options, providers=providers,
                                    provider_options=provider_options)
    except Exception as e:  # ORT raises its own pybind exception types for corrupt models
        raise CheckpointError(f"cannot load ONNX drafter {path} (corrupt, truncated or "
                              f"incompatible?): {_ort_error_detail(e)}") from e


def _ort_error_detail(e: Exception) -> str:
    """The innermost ORT message without C++ source locations and signatures."""
    text = " ".join(str(e).split()) or type(e).__name__
    detail = text.split("[ONNXRuntimeError]")[-1]  # nested errors: the last is the cause
    detail = re.sub(r"^ : \d+ : ", "", detail)  # status code
    detail = re.sub(r"\S+\.(cc|h|cpp):\d+ \S+ ?", "", detail)  # file.cc:123 Function
    return detail.strip()[:500]


def _read_genai_config(model_dir: Path) -> dict:
    path = model_dir / "genai_config.json"
    if not path.is_file():
        return {}
    try:
        return json.loads(path.read_text())
    except ValueError as e:
        raise CheckpointError(f"{path} is not valid JSON: {e}") from e


def _np_dtype(node_arg) -> type:
    try:
        return _ORT_DTYPES[node_arg.type]
    except KeyError:
        raise CheckpointError(f"unsupported ONNX input type {node_arg.type} for {node_arg.name}") from None


def _static_dim(dim, fallback, what: str) -> int:
    if isinstance(dim, int):
        return dim
    if fallback is None:
        raise CheckpointError(f"the drafter's {what} is symbolic ({dim}) and genai_config.json lacks it")
    return int(fallback)
