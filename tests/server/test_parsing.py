"""Requests parsed at the edge: unknown fields named wherever they sit, valid frames untouched."""

import pytest

from orchestrator.errors import InvalidRequestError
from orchestrator.server.parsing import SIZE_CHECK_MAX_BYTES, parse
from protocol.pb import drafter_pb2 as pb

UNKNOWN = b"\xb8\x06\x01"  # field 103, varint 1


def _with_unknown(message):
    """A copy of `message` that also holds field 103 (unknown to every hetspec.v1 message)."""
    out = type(message)()
    out.MergeFromString(message.SerializeToString() + UNKNOWN)
    return out


def _propose(request: pb.DraftRequest) -> pb.DrafterRequest:
    return pb.DrafterRequest(protocol_version=1, request_id=5, propose=pb.ProposeBatch(
        results=[pb.VerifyResult(sequence_id=1, num_accepted=2, rollback_to=100, bonus_token_id=7, append_ids=[3])],
        requests=[request]))


def test_a_valid_frame_parses_to_itself():
    frame = _propose(pb.DraftRequest(sequence_id=1, num_draft=4))
    assert parse(pb.DrafterRequest, frame.SerializeToString()) == frame


@pytest.mark.parametrize("data, where", [
    (_propose(pb.DraftRequest(sequence_id=1, num_draft=4)).SerializeToString() + UNKNOWN, "field #103"),
    (_propose(_with_unknown(pb.DraftRequest(sequence_id=1, num_draft=4))).SerializeToString(),
     "propose.requests[0].field #103"),
    # past the size check: the walk alone finds it
    (pb.DrafterRequest(protocol_version=1, request_id=2, open=_with_unknown(pb.OpenSequence(
        sequence_id=1, prompt_ids=list(range(SIZE_CHECK_MAX_BYTES))))).SerializeToString(), "open.field #103"),
])
def test_unknown_fields_are_named_wherever_they_sit(data, where):
    with pytest.raises(InvalidRequestError) as e:
        parse(pb.DrafterRequest, data)
    assert str(e.value).startswith(f"{where}: unknown field")


def test_a_field_given_twice_is_not_unknown():
    """Not canonical (the last value wins), but valid protobuf: accepted, not taken for an unknown field."""
    frame = pb.DrafterRequest(protocol_version=1, request_id=5)
    data = frame.SerializeToString() + pb.DrafterRequest(request_id=6).SerializeToString()
    assert parse(pb.DrafterRequest, data).request_id == 6
