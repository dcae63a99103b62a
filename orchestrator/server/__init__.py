"""The service layer: gRPC servicers, the engine loop, the remote-drafter client, and every
protobuf <-> domain conversion. The only room above `protocol/` that imports generated code.

    served = start_server(ServerOptions(port=0), [GenerationServicer(loop, tokenizer, 4096).register])
    with GenerationClient(f"127.0.0.1:{served.port}") as client: client.generate("hi")

Rooms: `generation` (Generate, GetServerStatus) over `engine_loop` (the engine on its own
thread); `drafter_service` (Drafter sessions serving a local drafter); `remote_drafter` and
`remote_session` (the `Drafter` interface over such a session, with failover); `convert`
(messages <-> domain objects); `parsing` (requests naming their bad field); `interceptors`
(exceptions -> status codes, bearer token); `serve` (limits, TLS, health, reflection);
`channels` and `client` (the client side); `metrics` (Prometheus, fed by the engine's spans).
"""

from orchestrator.server.channels import ChannelOptions, open_channel, token_from_env
from orchestrator.server.client import GenerationClient
from orchestrator.server.drafter_service import DrafterServicer
from orchestrator.server.engine_loop import EngineLoop
from orchestrator.server.generation import GenerationServicer
from orchestrator.server.metrics import EngineMetrics
from orchestrator.server.remote_drafter import RemoteDrafter, build_remote_drafter
from orchestrator.server.serve import Served, ServerOptions, server_options, start_server

__all__ = ["ChannelOptions", "DrafterServicer", "EngineLoop", "EngineMetrics", "GenerationClient",
           "GenerationServicer", "RemoteDrafter", "Served", "ServerOptions", "build_remote_drafter", "open_channel",
           "server_options", "start_server", "token_from_env"]
