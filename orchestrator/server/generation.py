"""`hetspec.v1.Generation`: a thin adapter from gRPC to the engine loop.

protobuf -> `SamplingParams` and prompt ids (`convert`) -> `EngineLoop.submit` -> each step's
tokens and text as messages -> a final message with usage and speculation stats.
"""

from collections.abc import Iterator

import grpc

from orchestrator.errors import InvalidRequestError
from orchestrator.models import encode_prompt
from orchestrator.server.convert import final_to_pb, sampling_params, status_to_pb
from orchestrator.server.engine_loop import Done, EngineLoop
from orchestrator.server.parsing import lenient
from protocol.pb import generation_pb2 as pb

SERVICE = "hetspec.v1.Generation"


class GenerationServicer:
    """Validates requests at the edge, streams each step's tokens and text, then usage and stats."""

    def __init__(self, loop: EngineLoop, tokenizer, max_new_tokens_limit: int):
        self.loop = loop
        self.tokenizer = tokenizer
        self.max_new_tokens_limit = max_new_tokens_limit

    def register(self, server: grpc.Server) -> str:
        handlers = {
            "Generate": grpc.unary_stream_rpc_method_handler(
                self.Generate, request_deserializer=lenient(pb.GenerateRequest),
                response_serializer=pb.GenerateResponse.SerializeToString),
            "GetServerStatus": grpc.unary_unary_rpc_method_handler(
                self.GetServerStatus, request_deserializer=lenient(pb.ServerStatusRequest),
                response_serializer=pb.ServerStatus.SerializeToString),
        }
        server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE, handlers),))
        return SERVICE

    def Generate(self, request: pb.GenerateRequest, context: grpc.ServicerContext) -> Iterator[pb.GenerateResponse]:
        params = sampling_params(request, self.max_new_tokens_limit)
        prompt_ids = self._prompt_ids(request)
        seq_id, events = self.loop.submit(prompt_ids, params)
        # runs when the call ends for any reason: a client cancel or an expired deadline frees the KV
        if not context.add_callback(lambda: self.loop.cancel(seq_id)):
            self.loop.cancel(seq_id)  # it ended already
            return
        while True:
            event = events.get()
            if isinstance(event, Done):
                if event.error is not None:
                    if not context.is_active():
                        return
                    raise event.error
                yield pb.GenerateResponse(final=final_to_pb(event.result))
                return
            if event.token_ids or event.text:
                yield pb.GenerateResponse(token_ids=event.token_ids, text=event.text)

    def GetServerStatus(self, request, context) -> pb.ServerStatus:
        return status_to_pb(self.loop.status())

    def _prompt_ids(self, request: pb.GenerateRequest) -> list[int]:
        which = request.WhichOneof("input")
        if which == "token_ids":
            ids = list(request.token_ids.ids)
            if not ids:
                raise InvalidRequestError("token_ids: is empty", "token_ids")
            return ids  # range-checked against the vocabulary by the engine
        if which is None or not request.prompt.strip():
            raise InvalidRequestError("prompt: is empty (send `prompt` text or `token_ids`)", "prompt")
        return encode_prompt(self.tokenizer, request.prompt, chat=not request.raw)
