"""A small Python client for `hetspec.v1.Generation`.

    from orchestrator.server.client import GenerationClient
    with GenerationClient("127.0.0.1:50051") as client:
        for delta in client.stream("Tell me a joke.", max_new_tokens=64):
            print(delta.text, end="", flush=True)
        result = client.generate("Tell me a joke.")   # dict shaped like `hetspec generate --json`
"""

from collections.abc import Callable, Iterator
from dataclasses import dataclass

from orchestrator.errors import HetspecError
from orchestrator.server.channels import ChannelOptions, call_metadata, open_channel
from orchestrator.server.convert import result_from_final
from protocol.pb import generation_pb2 as pb
from protocol.pb import generation_pb2_grpc


@dataclass
class Delta:
    token_ids: list[int]
    text: str
    final: pb.Final | None = None  # on the last one


class GenerationClient:
    def __init__(self, address: str = "127.0.0.1:50051", options: ChannelOptions | None = None):
        self.address = address
        self.channel = open_channel(address, options)
        self.stub = generation_pb2_grpc.GenerationStub(self.channel)
        self._metadata = call_metadata(options)

    def request(self, prompt: str | None = None, *, token_ids: list[int] | None = None, raw: bool = False,
                max_new_tokens: int | None = None, temperature: float | None = None, top_k: int | None = None,
                top_p: float | None = None, seed: int | None = None, stop: tuple[str, ...] = (),
                speculate: bool | None = None, num_speculative_tokens: int | None = None,
                ignore_eos: bool = False, acceptance: str | None = None,
                acceptance_options: dict[str, float] | None = None) -> pb.GenerateRequest:
        fields = dict(max_new_tokens=max_new_tokens, temperature=temperature, top_k=top_k, top_p=top_p, seed=seed,
                      speculate=speculate, num_speculative_tokens=num_speculative_tokens, acceptance=acceptance)
        req = pb.GenerateRequest(raw=raw, stop=list(stop), ignore_eos=ignore_eos,
                                 acceptance_options=acceptance_options or {},
                                 **{k: v for k, v in fields.items() if v is not None})
        if token_ids is not None:
            req.token_ids.ids.extend(token_ids)
        elif prompt is not None:
            req.prompt = prompt
        return req

    def stream(self, prompt: str | None = None, *, timeout: float | None = None, **kwargs) -> Iterator[Delta]:
        """Yield each committed delta; the last has `final`. Closing the iterator cancels the request."""
        call = self.stub.Generate(self.request(prompt, **kwargs), timeout=timeout, metadata=self._metadata)
        try:
            for msg in call:
                yield Delta(list(msg.token_ids), msg.text, msg.final if msg.HasField("final") else None)
        finally:
            call.cancel()  # no-op once complete

    def generate(self, prompt: str | None = None, *, timeout: float | None = None,
                 on_delta: Callable[[Delta], None] | None = None, **kwargs) -> dict:
        """Run to completion: `text`, `token_ids`, `finish_reason`, `usage`, `stats` (as `hetspec generate --json`).

        `on_delta` sees each delta as it arrives (to stream the text while waiting for the result).
        """
        ids, text = [], []
        for delta in self.stream(prompt, timeout=timeout, **kwargs):
            if on_delta is not None:
                on_delta(delta)
            ids += delta.token_ids
            text.append(delta.text)
            if delta.final is not None:
                return result_from_final(ids, "".join(text), delta.final)
        raise HetspecError(f"{self.address}: the stream ended without a final message")

    def status(self, timeout: float = 10.0) -> pb.ServerStatus:
        return self.stub.GetServerStatus(pb.ServerStatusRequest(), timeout=timeout, metadata=self._metadata)

    def close(self) -> None:
        self.channel.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
